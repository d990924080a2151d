"""Pre-registered scores of one run's reward curve (DESIGN.md section 5), used by ``harness.status``
(collapsed?) and ``harness.tune`` (the objective and the values a pruner sees).

- smoothed reward: trailing moving average over ``window`` steps (the same as the run summary's);
- collapse onset: the first step s after the running peak P at which the smoothed reward drops
  below ``P - max(delta_abs, delta_rel * (P - R0))`` and stays there for ``hold`` consecutive steps
  (R0 = the first smoothed value), or the first step with a non-finite loss;
- objective ``tail_mean``: the mean smoothed reward over the last ``tail_frac`` of the planned
  steps; a collapsed run is scored at its post-collapse value (the mean over the tail steps at or
  after the onset; if the onset precedes the tail, that is the tail itself); a run that stopped on a
  non-finite loss scores ``diverged_score``.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional, Sequence


@dataclass
class CollapseRule:
    window: int = 10
    delta_rel: float = 0.3
    delta_abs: float = 0.05
    hold: int = 20


@dataclass
class Objective:
    name: str = "tail_mean"
    tail_frac: float = 0.2
    window: int = 10
    delta_rel: float = 0.3
    delta_abs: float = 0.05
    hold: int = 20
    diverged_score: float = 0.0

    @property
    def rule(self) -> CollapseRule:
        return CollapseRule(self.window, self.delta_rel, self.delta_abs, self.hold)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[dict], key: str = "tune.objective") -> "Objective":
        from harness.launch.sweep import SweepError

        data = dict(data or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise SweepError(f"{key}.{unknown[0]}: unknown key; allowed: {', '.join(names)}", key=f"{key}.{unknown[0]}")
        obj = cls(**data)
        if obj.name != "tail_mean":
            raise SweepError(f"{key}.name: unknown objective {obj.name!r}; allowed: tail_mean", key=f"{key}.name")
        if not 0 < float(obj.tail_frac) <= 1:
            raise SweepError(f"{key}.tail_frac: must be in (0, 1], got {obj.tail_frac}", key=f"{key}.tail_frac")
        for k in ("window", "hold"):
            v = getattr(obj, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SweepError(f"{key}.{k}: expected an integer >= 1, got {v!r}", key=f"{key}.{k}")
        return obj


def smooth(xs: Sequence[float], window: int = 10) -> list[float]:
    out, acc = [], []
    for x in xs:
        acc.append(x)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def collapse_onset(rewards: Sequence[float], rule: CollapseRule = CollapseRule(),
                   losses: Sequence[float] | None = None) -> Optional[int]:
    """Index of the collapse onset in ``rewards`` (one value per step from step 0), or None."""
    first_bad = None
    if losses is not None:
        first_bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    s = smooth(rewards, rule.window)
    onset = None
    if s:
        r0, peak, start, run = s[0], -math.inf, None, 0
        for i, v in enumerate(s):
            if not math.isfinite(v):
                onset = i
                break
            if v > peak and start is None:
                peak = v
            thr = peak - max(rule.delta_abs, rule.delta_rel * (peak - r0))
            if v < thr:
                if start is None:
                    start, run = i, 0
                run += 1
                if run >= rule.hold:
                    onset = start
                    break
            else:
                start, run = None, 0
                peak = max(peak, v)
    if first_bad is not None and (onset is None or first_bad < onset):
        return first_bad
    return onset


def score(rewards: Sequence[float], steps_planned: int, objective: Objective = Objective(),
          diverged: bool = False, losses: Sequence[float] | None = None) -> tuple[float, Optional[int]]:
    """``(value, collapse onset)`` of one run under the pre-registered objective."""
    onset = collapse_onset(rewards, objective.rule, losses)
    if diverged or (losses is not None and any(not math.isfinite(v) for v in losses)):
        return float(objective.diverged_score), onset
    s = smooth(rewards, objective.window)
    if not s:
        return float(objective.diverged_score), onset
    tail = max(1, math.ceil(objective.tail_frac * steps_planned))
    start = max(0, steps_planned - tail)
    if onset is not None:
        start = max(start, onset)
    part = s[start:] if start < len(s) else s[-1:]
    return sum(part) / len(part), onset

"""Pre-registered scores of one run's reward curve, used by ``harness.status`` (collapsed?) and
``harness.tune`` (the objective). The definitions are those of DESIGN.md section 5 as coded once in
``analysis.measures`` (smoothing, drop-from-peak collapse onset); the defaults come from
``analysis.config.AnalysisConfig`` (centred moving average over 10 steps; onset when the smoothed
reward stays below ``P - max(0.1, 0.3 (P - R0))`` for 20 consecutive steps, or at the first
non-finite loss or reward).

Objective ``tail_mean``: the mean smoothed reward over the last ``tail_frac`` of the planned
steps. A collapsed run is scored at its post-collapse value (the mean over the tail steps at or
after the onset; if the onset precedes the tail, that is the tail itself). A run stopped by a
non-finite loss scores ``diverged_score``.

What a pruner sees while a trial runs cannot use the future: ``harness.tune`` reports a trailing
mean over ``window`` steps (:func:`trailing_mean`).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Optional, Sequence

import numpy as np

from analysis.config import AnalysisConfig
from analysis.measures import drop_onset_index
from analysis.measures import smooth as _smooth

_A = AnalysisConfig()


@dataclass
class CollapseRule:
    window: int = _A.smooth_window
    kind: str = _A.smooth_kind
    delta_rel: float = _A.collapse_delta_rel
    delta_abs: float = _A.collapse_delta_abs
    hold: int = _A.collapse_hold


@dataclass
class Objective:
    name: str = "tail_mean"
    tail_frac: float = 0.2
    window: int = _A.smooth_window
    smooth: str = _A.smooth_kind  # centred | ema
    delta_rel: float = _A.collapse_delta_rel
    delta_abs: float = _A.collapse_delta_abs
    hold: int = _A.collapse_hold
    diverged_score: float = 0.0

    @property
    def rule(self) -> CollapseRule:
        return CollapseRule(self.window, self.smooth, self.delta_rel, self.delta_abs, self.hold)

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
        if obj.smooth not in ("centred", "ema"):
            raise SweepError(f"{key}.smooth: unknown smoothing {obj.smooth!r}; allowed: centred, ema", key=f"{key}.smooth")
        if isinstance(obj.tail_frac, bool) or not isinstance(obj.tail_frac, (int, float)) or not 0 < obj.tail_frac <= 1:
            raise SweepError(f"{key}.tail_frac: must be in (0, 1], got {obj.tail_frac!r}", key=f"{key}.tail_frac")
        for k in ("window", "hold"):
            v = getattr(obj, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SweepError(f"{key}.{k}: expected an integer >= 1, got {v!r}", key=f"{key}.{k}")
        return obj


def smooth(xs: Sequence[float], window: int = _A.smooth_window, kind: str = _A.smooth_kind) -> list[float]:
    return [float(v) for v in _smooth(np.asarray(xs, dtype=float), window, kind)] if len(xs) else []


def trailing_mean(xs: Sequence[float], window: int) -> float:
    part = [x for x in xs[-window:] if math.isfinite(x)]
    return sum(part) / len(part) if part else math.nan


def collapse_onset(rewards: Sequence[float], rule: CollapseRule = CollapseRule(),
                   losses: Sequence[float] | None = None) -> Optional[int]:
    """Index of the collapse onset in ``rewards`` (one value per step from step 0), or None."""
    bad = [i for i, v in enumerate(rewards) if not math.isfinite(v)]
    if losses is not None:
        bad += [i for i, v in enumerate(losses) if not math.isfinite(v)]
    first_bad = min(bad) if bad else None
    onset = None
    if len(rewards):
        s = np.asarray(smooth(rewards, rule.window, rule.kind))
        onset = drop_onset_index(s, float(s[0]), rule.delta_rel, rule.delta_abs, rule.hold)
    if first_bad is not None and (onset is None or first_bad < onset):
        return first_bad
    return onset


def score(rewards: Sequence[float], steps_planned: int, objective: Objective = Objective(),
          diverged: bool = False, losses: Sequence[float] | None = None) -> tuple[float, Optional[int]]:
    """``(value, collapse onset)`` of one run under the pre-registered objective."""
    onset = collapse_onset(rewards, objective.rule, losses)
    nonfinite = any(not math.isfinite(v) for v in list(rewards) + list(losses or []))
    if diverged or nonfinite or not len(rewards):
        return float(objective.diverged_score), onset
    s = smooth(rewards, objective.window, objective.smooth)
    tail = max(1, math.ceil(objective.tail_frac * steps_planned))
    start = max(0, steps_planned - tail)
    if onset is not None:
        start = max(start, onset)
    part = s[start:] if start < len(s) else s[-1:]
    return sum(part) / len(part), onset

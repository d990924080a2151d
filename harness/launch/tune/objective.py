"""The pre-registered objective of a tune study: the score of one trial's reward curve."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

from harness import curves
from harness.collapse import CollapseRule, collapse_onset_index
from harness.launch.spec import SweepError


_A = CollapseRule()


@dataclass
class Objective:
    """The pre-registered score of one trial's reward curve, ``tail_mean``: the mean smoothed reward
    (``harness.curves.smooth``, W = ``window``) over the last ``tail_frac`` of the planned steps. A run
    that collapsed (``harness.collapse.collapse_onset_index``: the report's persistent-collapse rule
    v2, with the ``collapse_*`` parameters below) is scored at its post-collapse value (the tail steps at
    or after the onset; if the onset precedes the tail, that is the tail itself). A run stopped by a
    non-finite loss scores ``diverged_score``. What a pruner sees while a trial runs cannot use the
    future: a trailing mean over ``window`` steps (:func:`trailing_mean`)."""

    name: str = "tail_mean"
    tail_frac: float = 0.2
    window: int = _A.smooth_window
    smooth: str = _A.smooth_kind  # centred | ema
    collapse_noise_z: float = _A.collapse_noise_z
    collapse_gain_frac: float = _A.collapse_gain_frac
    collapse_persist: int = _A.collapse_persist
    collapse_gap: int = _A.collapse_gap
    diverged_score: float = 0.0

    @property
    def rule(self) -> CollapseRule:
        return CollapseRule(smooth_window=self.window, smooth_kind=self.smooth, collapse_noise_z=self.collapse_noise_z,
                            collapse_gain_frac=self.collapse_gain_frac, collapse_persist=self.collapse_persist,
                            collapse_gap=self.collapse_gap)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[dict], key: str = "tune.objective") -> "Objective":
        from dataclasses import fields

        data = dict(data or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise SweepError(f"{key}.{unknown[0]}: unknown key; allowed: {', '.join(names)}", key=f"{key}.{unknown[0]}")
        obj = cls(**data)
        if obj.name != "tail_mean":
            raise SweepError(f"{key}.name: unknown objective {obj.name!r}; allowed: tail_mean", key=f"{key}.name")
        if obj.smooth not in curves.SMOOTH_KINDS:
            raise SweepError(f"{key}.smooth: unknown smoothing {obj.smooth!r}; allowed: centred, ema", key=f"{key}.smooth")
        if isinstance(obj.tail_frac, bool) or not isinstance(obj.tail_frac, (int, float)) or not 0 < obj.tail_frac <= 1:
            raise SweepError(f"{key}.tail_frac: must be in (0, 1], got {obj.tail_frac!r}", key=f"{key}.tail_frac")
        for k in ("window", "collapse_persist", "collapse_gap"):
            v = getattr(obj, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SweepError(f"{key}.{k}: expected an integer >= 1, got {v!r}", key=f"{key}.{k}")
        try:
            obj.rule
        except (ValueError, TypeError) as exc:
            raise SweepError(f"{key}: {exc}", key=key) from None
        return obj


def trailing_mean(xs: list[float], window: int) -> float:
    part = [x for x in xs[-window:] if math.isfinite(x)]
    return sum(part) / len(part) if part else math.nan


def score(rewards: list[float], steps_planned: int, objective: Objective = Objective(),
          diverged: bool = False, losses: Optional[list[float]] = None) -> tuple[float, Optional[int]]:
    """``(value, collapse onset index)`` of one run under the pre-registered objective."""
    onset = collapse_onset_index(rewards, objective.rule, losses) if len(rewards) else None
    nonfinite = any(not math.isfinite(v) for v in list(rewards) + list(losses or []))
    if diverged or nonfinite or not len(rewards):
        return float(objective.diverged_score), onset
    s = list(curves.smooth(rewards, objective.window, objective.smooth))
    tail = max(1, math.ceil(objective.tail_frac * steps_planned))
    start = max(0, steps_planned - tail)
    if onset is not None:
        start = max(start, onset)
    part = s[start:] if start < len(s) else s[-1:]
    return sum(part) / len(part), onset

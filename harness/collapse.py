"""The collapse rule (drop-from-peak rule v2; docs/analysis.md, "Collapse"): one definition that the report
(``analysis.measures``), ``harness.status`` and the tuner's objective (``harness.launch.tune``) all call, and the
one home of its parameters' defaults (:class:`CollapseRule`; ``analysis.config.AnalysisConfig`` takes them from
here). Pure numpy over :mod:`harness.curves`: a leaf both ``harness`` and ``analysis`` import from below.

A rule is anything with the six attributes of :class:`CollapseRule` (an ``AnalysisConfig`` is one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness import curves


@dataclass(frozen=True)
class CollapseRule:
    """The rule's parameters: the smoothing window W and kind, the margin ``max(z sigma_S, f (P - R0))`` (z
    ``collapse_noise_z``, f ``collapse_gain_frac``), ``collapse_persist`` steps below it, stretches closer than
    ``collapse_gap`` steps joined. A ValueError naming the parameter when one is out of range."""

    smooth_window: int = curves.DEFAULT_WINDOW
    smooth_kind: str = "centred"
    collapse_noise_z: float = 7.0
    collapse_gain_frac: float = 0.2
    collapse_persist: int = 5
    collapse_gap: int = 10

    def __post_init__(self) -> None:
        checks = ((self.smooth_window >= 1, f"smooth_window must be >= 1, got {self.smooth_window}"),
                  (self.smooth_kind in curves.SMOOTH_KINDS, f"smooth_kind must be centred|ema, got {self.smooth_kind!r}"),
                  (self.collapse_noise_z > 0, f"collapse_noise_z must be > 0, got {self.collapse_noise_z}"),
                  (0 < self.collapse_gain_frac < 1, f"collapse_gain_frac must be in (0, 1), got {self.collapse_gain_frac}"),
                  (self.collapse_persist >= 1, f"collapse_persist must be >= 1, got {self.collapse_persist}"),
                  (self.collapse_gap >= 1, f"collapse_gap must be >= 1, got {self.collapse_gap}"))
        for ok, what in checks:
            if not ok:
                raise ValueError(f"collapse rule: {what}")


@dataclass(frozen=True)
class Detection:
    """What the drop rule says about one curve (indices into the curve; see the module docstring)."""

    kind: str  # persistent | transient | stable
    onset: int | None  # first index of the persistent collapse's descent
    dips: tuple[int, ...]  # first index of each transient dip's descent
    sigma: float  # noise sd of the smoothed curve: harness.curves.noise_sd / sqrt W
    margin: float  # the margin at the onset (persistent), at the first dip, else at the end

    @property
    def collapsed(self) -> bool:
        return self.kind == PERSISTENT


PERSISTENT, TRANSIENT, STABLE = "persistent", "transient", "stable"


def _episodes(below: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """Maximal stretches [a, b] of ``below``, joining stretches separated by fewer than ``gap`` steps."""
    idx = np.flatnonzero(below)
    if not len(idx):
        return []
    out = [[int(idx[0]), int(idx[0])]]
    for i in idx[1:]:
        if i - out[-1][1] - 1 < gap:
            out[-1][1] = int(i)
        else:
            out.append([int(i), int(i)])
    return [(a, b) for a, b in out]


def rule_margin(sigma: float, gain, rule: "CollapseRule"):
    """``m = max(z sigma_S, f gain)``: the margin below the running peak (module docstring)."""
    return np.maximum(rule.collapse_noise_z * sigma, rule.collapse_gain_frac * np.maximum(gain, 0.0))


def detect(values: np.ndarray, rule: "CollapseRule") -> Detection:
    """The drop rule v2 on one raw reward curve (non-finite values ignored; see the module docstring)."""
    x = np.asarray(values, dtype=float)
    S = curves.smooth(x, rule.smooth_window, rule.smooth_kind)
    ok = np.isfinite(S)
    sigma = curves.noise_sd(x) / math.sqrt(rule.smooth_window)
    if not ok.any():
        return Detection(STABLE, None, (), sigma, math.nan)
    r0 = float(S[np.argmax(ok)])
    P = np.fmax.accumulate(np.where(ok, S, -np.inf))
    gain = np.maximum(P - r0, 0.0)
    margin = rule_margin(sigma, gain, rule)
    below = ok & (S < P - margin)
    descending = ok & (S < P - 0.75 * margin)
    episodes = [(a, b) for a, b in _episodes(below, rule.collapse_gap) if b - a + 1 >= rule.collapse_persist]

    def descent(a: int) -> int:  # walk back while the smoothed reward is below P - 3m/4
        while a > 0 and descending[a - 1]:
            a -= 1
        return a

    last = len(S) - 1 - int(np.argmax(ok[::-1]))  # the last index with a smoothed value
    tail = x[np.isfinite(x)][-rule.collapse_persist:]
    ends_down = len(tail) > 0 and float(np.median(tail)) < P[last] - margin[last]
    onset, dips = None, []
    for a, b in episodes:
        if b >= last and ends_down:
            onset = descent(a)
        else:
            dips.append(descent(a))
    if onset is not None:
        return Detection(PERSISTENT, onset, tuple(dips), sigma, float(margin[onset]))
    if dips:
        return Detection(TRANSIENT, None, tuple(dips), sigma, float(margin[dips[0]]))
    return Detection(STABLE, None, (), sigma, float(margin[last]))


def collapse_onset_index(rewards, rule: "CollapseRule", losses=None) -> int | None:
    """Index of a curve's collapse onset (one value per step from step 0): the persistent collapse of
    :func:`detect` or the first non-finite reward/loss, the earlier of the two; None if neither.
    What ``harness.status`` and ``harness.tune`` call (the same rule as the report)."""
    x = np.asarray(rewards, dtype=float)
    bad = [int(np.argmax(~np.isfinite(v))) for v in (x, np.asarray(losses if losses is not None else [], float))
           if len(v) and not np.isfinite(v).all()]
    onset = detect(x, rule).onset if len(x) else None
    first_bad = min(bad) if bad else None
    if first_bad is not None and (onset is None or first_bad <= onset):
        return first_bad
    return onset

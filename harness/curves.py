"""Reward-curve definitions shared by the run summary, ``harness.status``, ``harness.tune`` and the
analysis: one definition of each quantity, pure numpy (a leaf module: imports nothing of the project).

A curve is the list of per-step values ``r[0..T-1]`` (one per logged step, in step order).

- **Smoothed** ``S`` (:func:`smooth`): the centred moving average over W steps,
  ``S[i] = mean r[i - W//2 .. i + W - W//2 - 1]`` with partial windows at the ends and non-finite
  values ignored (NaN only where no finite value is in reach); or an EMA, ``kind="ema"``,
  ``S[i] = sum_j (1-a)^(i-j) r[j] / sum_j (1-a)^(i-j)`` over the finite ``r[j]``, ``a = 2/(W+1)``.
- **Peak** (:func:`peak`): ``max_i S[i]`` and its index.
- **Final** (:func:`final`): the mean of the last ``window`` finite raw values (the reward the run ends
  with; raw, not smoothed, so it does not depend on W).
- **Noise sd** (:func:`noise_sd`): ``sigma = median |r[i+1] - r[i]| / 0.6745 / sqrt 2``, the robust
  per-step noise scale (for iid noise around a slowly moving mean, a first difference has sd
  ``sigma sqrt 2`` and its median absolute value is ``0.6745`` of that sd; a jump or a trend barely
  moves the median).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

DEFAULT_WINDOW = 10  # W, steps of the smoothing window
DEFAULT_FINAL_WINDOW = 10  # steps averaged by :func:`final`
SMOOTH_KINDS = ("centred", "ema")


def _array(values: Sequence[float]) -> np.ndarray:
    x = np.asarray(values, dtype=float).reshape(-1)
    return np.where(np.isfinite(x), x, np.nan)


def smooth(values: Sequence[float], window: int = DEFAULT_WINDOW, kind: str = "centred") -> np.ndarray:
    """The smoothed curve ``S`` (module docstring); same length as ``values``."""
    x = _array(values)
    if kind not in SMOOTH_KINDS:
        raise ValueError(f"unknown smoothing {kind!r}; allowed: {', '.join(SMOOTH_KINDS)}")
    if window < 1:
        raise ValueError(f"smoothing window must be >= 1, got {window}")
    T = len(x)
    if T == 0:
        return x
    ok = np.isfinite(x)
    if kind == "centred":
        csum = np.concatenate([[0.0], np.cumsum(np.where(ok, x, 0.0))])
        ccount = np.concatenate([[0], np.cumsum(ok)])
        i = np.arange(T)
        lo = np.clip(i - window // 2, 0, T)
        hi = np.clip(i + window - window // 2, 0, T)
        n = ccount[hi] - ccount[lo]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, (csum[hi] - csum[lo]) / np.maximum(n, 1), np.nan)
    a = 2.0 / (window + 1.0)
    out = np.full(T, np.nan)
    num = den = 0.0
    for t in range(T):
        if ok[t]:
            num = (1 - a) * num + x[t]
            den = (1 - a) * den + 1.0
        if den > 0:
            out[t] = num / den
    return out


def peak(values: Sequence[float], window: int = DEFAULT_WINDOW, kind: str = "centred") -> tuple[float, int]:
    """``(max S, its index)``; ``(nan, -1)`` when no value is finite."""
    S = smooth(values, window, kind)
    if not np.isfinite(S).any():
        return math.nan, -1
    i = int(np.nanargmax(S))
    return float(S[i]), i


def final(values: Sequence[float], window: int = DEFAULT_FINAL_WINDOW) -> float:
    """Mean of the last ``window`` finite raw values; NaN when none is finite."""
    x = _array(values)
    x = x[np.isfinite(x)]
    return float(x[-window:].mean()) if len(x) else math.nan


def noise_sd(values: Sequence[float]) -> float:
    """Robust per-step noise sd of the finite values (module docstring); 0 for fewer than 2 values.

    When more than half the first differences are exactly 0 (a quantised or saturated curve), the
    sd of the differences / sqrt 2 is used instead, so the scale is 0 only for a constant curve.
    """
    x = _array(values)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return 0.0
    d = np.diff(x)
    sigma = float(np.median(np.abs(d))) / 0.6745 / math.sqrt(2)
    if sigma <= 0:
        sigma = float(np.std(d)) / math.sqrt(2)
    return sigma

"""The labelled synthetic benchmark of the collapse detector: curves with known answers, from one seed.

:func:`synthetic_set` draws ``n`` curves (default 1200) from ``numpy.random.default_rng(seed)``, every
parameter drawn per curve:

- **length** T in [150, 500] steps; **start** r0 ~ U(0.05, 0.5); **gain** G ~ U(0.25, 0.6) (plateau
  r0 + G <= 0.92); **noise**: iid normal, sd ~ U(0.01, 0.08); rewards clipped to [0, 1];
- **rise shape**: linear ramp to the plateau over R ~ U(30, 150) steps, exponential approach
  ``1 - exp(-t / (R/3))``, or a logistic ``1 / (1 + exp(-(t - R/2) / (R/10)))``;
- **collapse** at onset t0 (after 60 % of the rise, >= 20 steps before the end): the clean curve falls
  by ``d = f G`` linearly over D steps (the **drop speed**; D = 1 is a step) and stays down; some
  curves are **truncated** at t0 + k, k ~ U{5..50} (published curves often stop once a run collapsed).

Kinds (the label is the kind; the truth onset t0 is the first step of the descent):

=============  ======================================================================  =========
kind           curve                                                                    label
=============  ======================================================================  =========
collapse       drop f ~ U(0.25, 0.6) of the gain, realised drop >= 2.5 noise sds    collapse
truncated      the same, cut at t0 + k, k in 5..50 (realised drop ``d min(1, k/D)``)  collapse
recovery       a dip of f ~ U(0.3, 0.8) lasting L ~ U(20, 80) steps, then back up      transient
small_drop     a persistent drop of f ~ U(0.05, 0.10) of the gain                      stable
rise           rise and plateau, no drop                                               stable
flat           flat noisy curve at a level ~ U(0.1, 0.85), never learns                 stable
wander         the same plus a slow AR(1) wander of the level (phi 0.9, sd 0.25-0.5 x   stable
               the noise sd): what first differences do not see
grey           drop f ~ U(0.10, 0.25), or >= 0.25 but below ``SNR_MIN`` sigma          (none)
=============  ======================================================================  =========

The grey set is the transition band of any drop rule (a tenth to a quarter of the gain, or a drop the
curve's own noise can hide): it is reported with its flag rate, and counted in neither precision nor
recall. Precision = flagged collapse-labelled / all flagged (labelled kinds); recall = flagged /
collapse-labelled; onset error = |detected onset - t0| over the collapses found.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

N_DEFAULT = 1200
SEED_DEFAULT = 12
SNR_MIN = 2.5  # a labelled collapse drops by at least 2.5 per-step noise sds
# share of the set per kind (sums to 1)
MIX = {"collapse": 0.30, "truncated": 0.25, "recovery": 0.12, "small_drop": 0.08, "rise": 0.10,
       "flat": 0.08, "wander": 0.04, "grey": 0.03}
LABEL = {"collapse": "collapse", "truncated": "collapse", "recovery": "transient", "small_drop": "stable",
         "rise": "stable", "flat": "stable", "wander": "stable", "grey": ""}
SHAPES = ("linear", "exponential", "logistic")


@dataclass
class LabelledCurve:
    """One benchmark curve: its values (one per step from step 0), kind, label and truth onset."""

    name: str
    kind: str
    label: str  # collapse | transient | stable | "" (grey: no label)
    onset: float  # truth: first step of the descent (NaN when none)
    values: np.ndarray
    noise: float
    drop_frac: float = math.nan
    shape: str = ""


def _rise(t: np.ndarray, shape: str, R: float) -> np.ndarray:
    if shape == "linear":
        return np.minimum(t / R, 1.0)
    if shape == "exponential":
        return 1 - np.exp(-t / (R / 3))
    return 1 / (1 + np.exp(-(t - R / 2) / (R / 10)))


def _drop(t: np.ndarray, t0: int, D: int) -> np.ndarray:
    """0 before t0, then a linear fall to 1 over D steps."""
    return np.clip((t - t0 + 1) / D, 0.0, 1.0) * (t >= t0)


def _one(rng: np.random.Generator, kind: str, i: int) -> LabelledCurve:
    T = int(rng.integers(150, 501))
    r0 = float(rng.uniform(0.05, 0.5))
    G = float(min(rng.uniform(0.25, 0.6), 0.92 - r0))
    sd = float(rng.uniform(0.01, 0.08))
    shape = SHAPES[int(rng.integers(len(SHAPES)))]
    R = float(rng.uniform(30, 150))
    t = np.arange(T, dtype=float)
    clean = r0 + G * _rise(t, shape, R)
    onset, frac, label = math.nan, math.nan, LABEL[kind]
    rise_end = int(0.6 * R) if shape != "logistic" else int(0.8 * R)
    if kind in ("flat", "wander"):
        clean = np.full(T, float(rng.uniform(0.1, 0.85)))
        if kind == "wander":  # a slow AR(1) level wander (phi 0.9) of stationary sd ~ U(0.25, 0.5) sd
            e = rng.normal(0.0, rng.uniform(0.25, 0.5) * sd * math.sqrt(1 - 0.81), T)
            for j in range(1, T):
                e[j] += 0.9 * e[j - 1]
            clean = clean + e
    elif kind in ("collapse", "truncated", "small_drop", "grey"):
        t0 = int(rng.integers(rise_end, T - 20))
        D = int(rng.choice([1, 1, int(rng.integers(2, 10)), int(rng.integers(10, 41))]))
        if kind == "small_drop":
            frac = float(rng.uniform(0.05, 0.10))
        elif kind == "grey":
            frac = float(rng.uniform(0.10, 0.25))
        else:
            frac = float(rng.uniform(0.25, 0.6))
        level = clean[min(t0, T - 1)]
        clean = clean - _drop(t, t0, D) * (clean - (level - frac * G)).clip(min=0)
        if kind == "truncated":
            k = int(rng.integers(5, 51))
            T = min(T, t0 + k)
            clean, t = clean[:T], t[:T]
        realised = frac * G * min(1.0, (T - t0) / D)
        onset = float(t0) if kind != "small_drop" else math.nan
        if kind in ("collapse", "truncated") and realised < SNR_MIN * sd:
            kind, label = "grey", ""
        if kind == "grey":
            onset = float(t0)
    elif kind == "recovery":
        if T < rise_end + 200:
            T = rise_end + 200
            t = np.arange(T, dtype=float)
            clean = r0 + G * _rise(t, shape, R)
        t0 = int(rng.integers(rise_end, max(rise_end + 1, T - 100)))
        frac = float(rng.uniform(0.3, 0.8))
        L = int(rng.integers(20, 81))
        D = int(rng.choice([1, int(rng.integers(2, 10))]))
        depth = frac * G
        down = _drop(t, t0, D) - _drop(t, t0 + L, D)
        clean = clean - depth * down
        onset = float(t0)
    values = np.clip(clean + rng.normal(0.0, sd, len(clean)), 0.0, 1.0)
    return LabelledCurve(f"{kind}-{i}", kind, label, onset, values, sd, frac, shape)


def synthetic_set(n: int = N_DEFAULT, seed: int = SEED_DEFAULT) -> list[LabelledCurve]:
    """``n`` labelled curves (module docstring); the same ``(n, seed)`` gives the same set."""
    rng = np.random.default_rng(seed)
    kinds = list(MIX)
    counts = [int(round(MIX[k] * n)) for k in kinds]
    counts[0] += n - sum(counts)
    out: list[LabelledCurve] = []
    for kind, c in zip(kinds, counts):
        out += [_one(rng, kind, len(out) + j) for j in range(c)]
    return out

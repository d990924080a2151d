"""Group labels: which runs are replicates (seeds) of the same configuration, and their order.

A run's group is its estimator plus the estimator's knobs found in its tags (the label each estimator
declares, ``harness.estimators.label``)::

    mean_n(n=8)        estimator=mean_n, n=8
    tis(C=2,token)     estimator=tis, clip_c=2.0, level=token
    mis(C=2)           estimator=mis, clip_c=2, level missing / "na"
    rollout            estimator=rollout, n=na, clip_c=na

plus, in brackets, the value of every tag that varies across the experiment among ``model``,
``task``, ``backend``, ``perturbation`` and any key the user asked to group by (``rollout[dense_tiny]``,
``rollout[model=moe_tiny,task=sort]`` when several vary). Groups sort by the canonical estimator
order (``harness.estimators.NAMES``), then by n, C, level and the bracketed tags.

A *sweep family* (:func:`sweep_families`) is a set of groups that differ only in one knob (n or
clip_c), e.g. ``mean_n(n=1)`` .. ``mean_n(n=16)`` or ``tis(C=1.5,token)`` .. ``tis(C=8,token)``.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from harness import estimators

# Tags whose variation inside one experiment splits groups even when the estimator config matches.
CONTEXT_TAGS: tuple[str, ...] = ("model", "task", "backend", "perturbation")
NA = ("", "na", "none", "null", "nan")


def tag_number(value: object) -> float:
    """A numeric tag ("8", "2.0") as float; NaN when absent or "na"."""
    if value is None or str(value).strip().lower() in NA:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def tag_text(value: object) -> str:
    """A text tag, "" when absent or "na"."""
    if value is None or str(value).strip().lower() in NA:
        return ""
    return str(value).strip()


def arm_text(value: object) -> str:
    """``tag_text``, except that an explicit "none" (a control arm: ``perturbation=none``) stays "none"."""
    return tag_text(value) or ("none" if str(value or "").strip().lower() == "none" else "")


def tag_value(value: object) -> object:
    """A tag as the parameter value it records: a number, a text, or None when absent or "na"."""
    x = tag_number(value)
    return x if not math.isnan(x) else (tag_text(value) or None)


def base_label(tags: Mapping[str, str]) -> str:
    """``estimator(knobs)`` from a run's tags: the estimator's own label (``harness.estimators.label``) of
    the parameter values its tags carry (absent ones omitted)."""
    est = tag_text(tags.get("estimator")) or "?"
    return estimators.label(est, {k: tag_value(v) for k, v in tags.items() if k != "estimator"})


def context_suffix(tags: Mapping[str, str], varying: Sequence[str]) -> str:
    """``[value]`` (one varying tag) or ``[k=v,k=v]`` (several); "" when none vary."""
    if not varying:
        return ""
    if len(varying) == 1:
        return f"[{arm_text(tags.get(varying[0])) or 'na'}]"
    return "[" + ",".join(f"{k}={arm_text(tags.get(k)) or 'na'}" for k in varying) + "]"


def sort_key(estimator: str, n: float, clip_c: float, level: str, suffix: str) -> tuple:
    """Canonical order: estimator order, then n, C (missing first), level, context."""
    nan_first = lambda x: (0, 0.0) if math.isnan(x) else (1, x)  # noqa: E731
    return (estimators.rank(estimator), estimator, nan_first(n), nan_first(clip_c), level, suffix)


def sweep_families(runs: pd.DataFrame, x: str, estimators: tuple[str, ...] | None) -> dict[tuple, pd.DataFrame]:
    """Groups of runs that differ only in knob ``x`` (at least 2 distinct finite values)."""
    rest = [c for c in ("estimator", "n", "clip_c", "level") if c != x]
    sub = runs[np.isfinite(runs[x].to_numpy(float))]
    if estimators is not None:
        sub = sub[sub["estimator"].isin(estimators)]
    suffix = sub["label"].str.extract(r"(\[.*\])$", expand=False).fillna("")
    sub = sub.assign(_suffix=suffix, _n=sub["n"].fillna(-1), _c=sub["clip_c"].fillna(-1))
    keys = ["estimator", "_n" if "n" in rest else None, "_c" if "clip_c" in rest else None, "level", "_suffix"]
    keys = [k for k in keys if k]
    fams = {}
    for key, g in sub.groupby(keys, sort=False):
        if g[x].nunique() >= 2:
            fams[key] = g
    return fams


def family_name(g: pd.DataFrame, x: str) -> str:
    """A sweep family's name: the group label without knob ``x`` (``tis(token)``, ``mean_n``)."""
    row = g.iloc[0]
    knobs = []
    if x != "n" and np.isfinite(row["n"]):
        knobs.append(f"n={row['n']:g}")
    if x != "clip_c" and np.isfinite(row["clip_c"]):
        knobs.append(f"C={row['clip_c']:g}")
    if row["level"]:
        knobs.append(row["level"])
    suffix = row["_suffix"]
    return row["estimator"] + (f"({','.join(knobs)})" if knobs else "") + suffix

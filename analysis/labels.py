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
#: The context tags computed from spec keys: sweeping a key under the prefix moves the tag with it.
DERIVED_CONTEXT = {"model": "model.", "task": "task.", "backend": "backend.", "perturbation": "inference."}
#: The knob tags every run of an old store carries ("na" when its estimator has no such knob).
LEGACY_KNOB_TAGS: tuple[str, ...] = ("n", "clip_c", "level")
NA = ("", "na", "none", "null", "nan")
#: estimator parameters that never reach a run's tags (``harness.tags``: of the original six parameters only n, clip_c
#: and level are tagged); a label reads them from the run's logged params ``estimator.<name>`` (gmpo_rs's
#: ``gamma_min``: plain GMPO at 1, ``gmpo(eps=0.4)``, not ``gmpo_rs(eps=0.4)``)
UNTAGGED_KNOBS: tuple[str, ...] = ("alpha", "beta", "gamma_min")


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


def untagged_knobs(params: Mapping[str, str]) -> dict[str, str]:
    """The run's :data:`UNTAGGED_KNOBS` that its params set (``estimator.gamma_min`` -> ``gamma_min``)."""
    out = {}
    for k in UNTAGGED_KNOBS:
        v = (params or {}).get(f"estimator.{k}")
        if v is not None and tag_text(v):
            out[k] = str(v)
    return out


def base_label(tags: Mapping[str, str]) -> str:
    """``estimator(knobs)`` from a run's tags: the estimator's own label (``harness.estimators.label``) of
    the parameter values its tags carry (absent ones omitted)."""
    est = tag_text(tags.get("estimator")) or "?"
    return estimators.label(est, {k: tag_value(v) for k, v in tags.items() if k != "estimator"})


def estimator_part(label: str) -> str:
    """A group label's estimator part, before its ``[context]``: ``tis(C=2,token)[router@k3=0.001]`` -> ``tis(C=2,token)``."""
    return str(label).split("[")[0]


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


def knob_columns() -> tuple[str, ...]:
    """The runs frame's estimator-knob columns: the tags old stores carry for every run (``n``, ``clip_c``,
    ``level``) and every parameter a registered estimator declares (``harness.estimators.parameters``)."""
    return tuple(dict.fromkeys((*LEGACY_KNOB_TAGS, *estimators.parameters())))


def axis_column(key: str) -> str:
    """The runs-frame column of a ``--x`` key: an estimator knob by its bare name (``estimator.n`` -> ``n``), any
    other key as written (``trainer.lr``, ``inference.kl_target``)."""
    bare = key[len("estimator."):] if key.startswith("estimator.") else key
    return bare if bare in knob_columns() else key


def default_axes() -> tuple[str, ...]:
    """The knobs the report sweeps and trend-tests without ``--x``: those a registered estimator declares an
    axis (``knob(..., axis=True)``), in registry order."""
    return estimators.axes()


def _derived(tag: str, x: str) -> bool:
    """True when context tag ``tag`` is computed from spec key ``x`` (the perturbation from ``inference.*``)."""
    prefix = DERIVED_CONTEXT.get(tag)
    return prefix is not None and x.startswith(prefix)


def format_parts(context: Sequence[tuple[str, str]], apart: Sequence[tuple[str, str]]) -> str:
    """A label's bracket from its parts: the varying context tags as :func:`context_suffix` writes them (one: the
    bare value), then the identity keys that tell groups sharing that label apart, ``key=value``; "" when none."""
    items = [context[0][1]] if len(context) == 1 else [f"{k}={v}" for k, v in context]
    items += [f"{k}={v}" for k, v in apart]
    return f"[{','.join(items)}]" if items else ""


def _parts(runs: pd.DataFrame) -> pd.Series:
    """Each run's label parts ``(context, apart)`` (column ``label_parts``, written by :mod:`analysis.load`); a
    frame without them: its label's bracket as one part, which no axis drops."""
    if "label_parts" in runs:
        return runs["label_parts"]
    suffix = runs["label"].str.extract(r"(\[.*\])$", expand=False).fillna("")
    return suffix.map(lambda s: ((), (("", s),)) if s else ((), ()))


def _without(parts: tuple, x: str) -> tuple:
    """Label parts less ``x``'s own and a context tag computed from ``x``."""
    context, apart = parts
    return (tuple(p for p in context if p[0] != x and not _derived(p[0], x)), tuple(p for p in apart if p[0] != x))


def sweep_families(runs: pd.DataFrame, x: str, estimators: tuple[str, ...] | None) -> dict[tuple, pd.DataFrame]:
    """Groups of runs that differ only in ``x`` (at least 2 distinct finite values): an estimator knob (``n``,
    ``clip_c``, a new estimator's own) or any spec key the runs logged (``trainer.lr``, ``inference.kl_target``).

    A family shares the estimator, every other knob and every label part but ``x``'s own (``trainer.lr=...``) and a
    context tag computed from ``x`` (the perturbation, for an ``inference.*`` key). Column ``x`` holds the value as
    a number, column ``_family`` the family's name (:func:`family_name`)."""
    if x not in runs:
        return {}
    values = pd.to_numeric(runs[x], errors="coerce")
    sub = runs.assign(**{x: values})[np.isfinite(values.to_numpy(float))]
    if estimators is not None:
        sub = sub[sub["estimator"].isin(estimators)]
    if sub.empty:
        return {}
    knobs = [c for c in knob_columns() if c in sub and c != x]
    parts = _parts(sub)
    kept = parts.map(lambda ps: _without(ps, x))
    keys = pd.Series([(e, tuple(_knob_key(v) for v in kv), ps) for e, kv, ps in
                      zip(sub["estimator"], sub[knobs].itertuples(index=False, name=None), kept)], index=sub.index)
    names = {}
    for i, k in keys.items():
        if k not in names:
            suffix = (sub.at[i, "label"][len(estimator_part(sub.at[i, "label"])):] if k[2] == parts[i]
                      else format_parts(*k[2]))
            names[k] = estimators_label(k[0], dict(zip(knobs, k[1]))) + suffix
    sub = sub.assign(_family=keys.map(names))
    fams = {}
    for k, g in sub.groupby(keys, sort=False):
        if g[x].nunique() >= 2:
            fams[k] = g
    return fams


def _knob_key(value: object) -> object:
    """A knob value as a family key (absent values alike: NaN, None and "")."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value


def estimators_label(estimator: str, knobs: Mapping[str, object]) -> str:
    """The estimator's label of the knob values that are set (the family's name before its bracket)."""
    return estimators.label(estimator, {k: v for k, v in knobs.items() if _knob_key(v) != ""})


def family_name(g: pd.DataFrame, x: str) -> str:
    """A sweep family's name: the group label without ``x`` (``tis(token)``, ``mean_n``,
    ``recompute[router@k3=0.001]`` over ``trainer.lr``)."""
    return g["_family"].iloc[0]

"""One colour and line style per group, shared by every figure of a report.

Each estimator has a fixed base colour and line style, declared in its module (``harness.estimators``,
its ``style``: a name of :data:`COLOURS`, matplotlib's tab10 in the spirit of the KwaiKAT figures -
recompute blue, mean_n orange, rollout green, r3 red, tis purple - and, tab10 being used up, navy
(``gmpo_rs``), teal (``mean_n_tis``), lime (``geo_rs``) and magenta (``r2``); tab10's gray is no estimator's: it is the colour of an unknown
group and of the reference arms of the small multiples). Every registered estimator has its own colour
(``tests/analysis/test_palette.py``). The variants of one estimator
(``mean_n(n=1)`` .. ``mean_n(n=16)``, ``tis(C=2,token)`` ..) are shades of that colour from light to
a little darker in canonical order (lightened up to 60 %, darkened at most 20 %, so a dark orange
does not turn into mis's brown): on the groups of the ablation every two colours are >= 15 apart
in CIELAB (Delta E 1976), and >= 25 for two estimators. Line style follows the estimator, except that
``token`` / ``sequence`` levels are solid / dashed. The mapping is built once per report from all its
labels, so a group has the same colour in every figure. An estimator the registry does not know (an old
store) takes one of :data:`SPARE` in turn, then gray.

Each estimator also declares its ``camp`` (the family of fixes it belongs to: baseline, re-weighting,
routing replay, sampling noise, nondeterminism); :func:`camp` reads it, and the figures draw one panel per
camp when there are too many groups for one (:mod:`analysis.figures`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from harness import estimators

TAB10 = {
    "blue": "#1f77b4", "orange": "#ff7f0e", "green": "#2ca02c", "red": "#d62728", "purple": "#9467bd",
    "brown": "#8c564b", "pink": "#e377c2", "gray": "#7f7f7f", "olive": "#bcbd22", "cyan": "#17becf",
}
#: the colours an estimator's ``style`` may name: tab10 but gray, and four more far (CIELAB) from all of them
COLOURS = {**{k: v for k, v in TAB10.items() if k != "gray"}, "navy": "#000080", "teal": "#1b9e77",
           "lime": "#7fff00", "magenta": "#ff00ff"}
#: colours for estimators the registry does not know, in turn (then gray)
SPARE = {"violet": "#b000b5", "gold": "#e6ab02"}
UNKNOWN_COLOUR = TAB10["gray"]
#: the reference arms of the small multiples, drawn in every panel: black and gray, thin
REFERENCE_COLOUR = {"recompute": "#000000", "rollout": TAB10["gray"]}
#: each registered estimator's colour and line style (its ``style``)
_STYLES = {name: estimators.get(name).style for name in estimators.NAMES if estimators.get(name).style}
BASE_COLOUR = {name: COLOURS[style.colour] for name, style in _STYLES.items()}
BASE_STYLE = {name: style.linestyle for name, style in _STYLES.items()}
LEVEL_STYLE = {"token": "-", "sequence": "--"}
OTHER_CAMP = "other"


def camp(estimator: str) -> str:
    """The camp an estimator declares (``Estimator.camp``); "other" when it declares none or is unknown."""
    if estimator in estimators.NAMES:
        return estimators.get(estimator).camp or OTHER_CAMP
    return OTHER_CAMP


def camp_order() -> list[str]:
    """The camps in the order of their first estimator in ``harness.estimators.NAMES``, then "other"."""
    out = list(dict.fromkeys(camp(n) for n in estimators.NAMES))
    return [c for c in out if c != OTHER_CAMP] + [OTHER_CAMP]


def _hex_to_rgb(h: str) -> np.ndarray:
    h = h.lstrip("#")
    return np.array([int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)])


def shade(colour: str, amount: float) -> tuple[float, float, float]:
    """Lighten (amount < 0, towards white) or darken (amount > 0, towards black) a hex colour."""
    rgb = _hex_to_rgb(colour)
    out = rgb + (1 - rgb) * (-amount) if amount < 0 else rgb * (1 - amount)
    return tuple(float(v) for v in np.clip(out, 0, 1))


@dataclass(frozen=True)
class Style:
    colour: tuple[float, float, float]
    linestyle: str


class Palette:
    """``palette[label] -> Style``; built from (label, estimator, level) triples in canonical order."""

    def __init__(self, groups: Sequence[tuple[str, str, str]]):
        self._styles: dict[str, Style] = {}
        by_est: dict[str, list[tuple[str, str]]] = {}
        for label, est, level in groups:
            if label not in {lab for lab, _ in by_est.get(est, [])}:
                by_est.setdefault(est, []).append((label, level))
        unknown = [e for e in by_est if e not in BASE_COLOUR]
        extra = [c for c in (*COLOURS.values(), *SPARE.values()) if c not in BASE_COLOUR.values()]
        for est, members in by_est.items():
            base = BASE_COLOUR.get(est)
            if base is None:
                k = unknown.index(est)
                base = extra[k] if k < len(extra) else UNKNOWN_COLOUR
            amounts = [0.0] if len(members) == 1 else np.linspace(-0.6, 0.2, len(members))
            for (label, level), amount in zip(members, amounts):
                style = LEVEL_STYLE.get(level, BASE_STYLE.get(est, "-"))
                self._styles[label] = Style(shade(base, float(amount)), style)

    def __getitem__(self, label: str) -> Style:
        return self._styles.get(label, Style(shade(UNKNOWN_COLOUR, 0.0), "-"))

    def __contains__(self, label: str) -> bool:
        return label in self._styles

    @property
    def labels(self) -> list[str]:
        return list(self._styles)

    @classmethod
    def from_runs(cls, runs) -> "Palette":
        """From an :class:`analysis.load.Experiment`'s ``runs`` frame (already in canonical order)."""
        seen = runs.drop_duplicates("label")
        return cls(list(zip(seen["label"], seen["estimator"], seen["level"])))

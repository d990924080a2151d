"""One colour and line style per group, shared by every figure of a report.

Each estimator has a fixed base colour and line style, declared in its module (``harness.estimators``,
its ``style``: matplotlib's tab10, in the spirit of the KwaiKAT figures: recompute blue, mean_n orange,
rollout green, r3 red, tis purple); the variants of one estimator
(``mean_n(n=1)`` .. ``mean_n(n=16)``, ``tis(C=2,token)`` ..) are shades of that colour from light to
a little darker in canonical order (lightened up to 60 %, darkened at most 20 %, so a dark orange
does not turn into mis's brown): on the 13 groups of the ablation every two colours are >= 15 apart
in CIELAB (Delta E 1976), and >= 25 for two estimators (``tests/analysis/test_figures.py``). Line style follows the estimator, except that ``token`` / ``sequence``
levels are solid / dashed. The mapping is built once per report from all its labels, so a group
has the same colour in every figure.
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
#: each registered estimator's colour and line style (its ``style``)
_STYLES = {name: estimators.get(name).style for name in estimators.NAMES if estimators.get(name).style}
BASE_COLOUR = {name: TAB10[style.colour] for name, style in _STYLES.items()}
BASE_STYLE = {name: style.linestyle for name, style in _STYLES.items()}
UNKNOWN_COLOUR = TAB10["gray"]
LEVEL_STYLE = {"token": "-", "sequence": "--"}


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
        extra = [c for name, c in TAB10.items() if c not in BASE_COLOUR.values() and name != "gray"]
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

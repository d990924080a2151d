"""The dose figure, ``dose.png`` / ``dose.pdf`` (matplotlib, Agg; the style of :mod:`analysis.figures`).

- Left: collapse rate (Wilson CI, vertical bars) against the train-inference KL along training (IQM over
  runs of the per-run mean k3, bootstrap CI as horizontal bars; log x), one line per perturbation kind
  through its arms in dose order, the control a black star.
- Right: the median over an arm's runs of k3 at each step (log y; the report's smoother,
  ``cfg.smooth_window`` steps, so ten arms stay readable), one line per arm, so the reader sees the KL move
  during training. Colours: one tab10 base colour per kind (:data:`KIND_COLOUR`), its arms
  shaded light (low dose) to dark (high dose) with :func:`analysis.palette.shade`.

Points and curve values that cannot sit on a log axis (k3 <= 0 or missing) are left out with a note.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .config import AnalysisConfig  # noqa: E402
from .figures import FORMATS  # noqa: E402
from .measures import smooth  # noqa: E402
from .palette import TAB10, shade  # noqa: E402

KIND_COLOUR = {"router": TAB10["blue"], "logit": TAB10["green"], "bias": TAB10["red"]}
CONTROL_COLOUR = (0.0, 0.0, 0.0)
SIZE = (13, 5)  # inches


def arm_colours(arms: pd.DataFrame) -> dict[str, tuple[float, float, float]]:
    """``{arm: rgb}``: black for the control, shades of the kind's colour in dose order otherwise."""
    out = {}
    for kind, g in arms.groupby("kind", sort=False):
        if kind == "none":
            out.update(dict.fromkeys(g["arm"], CONTROL_COLOUR))
            continue
        amounts = [0.0] if len(g) == 1 else np.linspace(-0.5, 0.25, len(g))
        out.update({a: shade(KIND_COLOUR.get(kind, TAB10["gray"]), float(x)) for a, x in zip(g["arm"], amounts)})
    return out


def _rate_vs_kl(ax, arms: pd.DataFrame, colours: dict, notes: list[str]) -> None:
    ok = arms["k3_iqm"].to_numpy(float) > 0  # NaN compares False
    if (~ok).any():
        notes.append(f"dose figure: no along-training k3 > 0 for {', '.join(arms.loc[~ok, 'arm'])}: left out of the "
                     "left panel.")
    for kind, g in arms[ok].groupby("kind", sort=False):
        x, y = g["k3_iqm"].to_numpy(float), g["collapse_rate"].to_numpy(float)
        xerr = np.nan_to_num(np.abs(np.vstack([x - g["k3_iqm_lo"], g["k3_iqm_hi"] - x])))
        yerr = np.abs(np.vstack([y - g["collapse_rate_lo"], g["collapse_rate_hi"] - y]))
        if kind == "none":
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="*", ms=14, color=CONTROL_COLOUR, capsize=3,
                        label="control (none)", zorder=3)
            continue
        ax.plot(x, y, "-", color=KIND_COLOUR.get(kind, TAB10["gray"]), lw=1.5, label=kind)
        for xi, yi, xe, ye, arm in zip(x, y, xerr.T, yerr.T, g["arm"]):
            ax.errorbar([xi], [yi], xerr=xe[:, None], yerr=ye[:, None], fmt="o", color=colours[arm], capsize=3)
            ax.annotate(arm.split("=")[1], (xi, yi), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xscale("log")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("train-inference KL along training (IQM of per-run mean k3)")
    ax.set_ylabel("collapse rate (Wilson CI)")
    ax.set_title("Collapse rate against KL along training")
    if len(arms[ok]):
        ax.legend(loc="upper left", fontsize=9, framealpha=0.85)


def _k3_vs_step(ax, per_step: dict[str, pd.Series], colours: dict, notes: list[str], cfg: AnalysisConfig) -> None:
    drawn, dropped = 0, []
    for arm in [a for a in colours if a in per_step]:  # the table's dose order
        s = per_step[arm]
        s = s[s > 0]
        if not len(s):
            dropped.append(arm)
            continue
        y = smooth(s.to_numpy(float), cfg.smooth_window, cfg.smooth_kind)
        ax.plot(s.index.to_numpy(), y, color=colours.get(arm, TAB10["gray"]), lw=1.4, label=arm)
        drawn += 1
    if dropped:
        notes.append(f"dose figure: no k3 > 0 logged per step for {', '.join(dropped)}: not in the right panel.")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("Step")
    ax.set_ylabel(f"median k3 over runs (smoothed, W={cfg.smooth_window})")
    ax.set_title("Train-inference KL (k3) during training")
    if drawn:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, framealpha=0.85)


def draw_dose(arms: pd.DataFrame, per_step: dict[str, pd.Series], cfg: AnalysisConfig,
              out: Path) -> tuple[list[Path], list[str]]:
    """Draw ``dose.png``/``.pdf`` into ``out``; returns the paths and the notes on what was left out."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):  # labels drawn as written (analysis.escape)
        return _draw_dose(arms, per_step, cfg, out)


def _draw_dose(arms: pd.DataFrame, per_step: dict[str, pd.Series], cfg: AnalysisConfig,
               out: Path) -> tuple[list[Path], list[str]]:
    notes: list[str] = []
    fig = Figure(figsize=SIZE, dpi=cfg.dpi, layout="constrained")
    left, right = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for ax in (left, right):
        ax.grid(True, linestyle="--", alpha=0.6)
    colours = arm_colours(arms)
    _rate_vs_kl(left, arms, colours, notes)
    _k3_vs_step(right, per_step, colours, notes, cfg)
    paths = []
    for ext in FORMATS:
        path = out / f"dose.{ext}"
        fig.savefig(path, dpi=cfg.dpi, format=ext)
        paths.append(path)
    return paths, notes

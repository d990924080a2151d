"""What every figure shares: sizes, the context, saving, legends, the small-multiples panels (camps)."""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..config import AnalysisConfig  # noqa: E402
from ..load import Experiment  # noqa: E402
from ..measures import smooth  # noqa: E402
from ..palette import REFERENCE_COLOUR, Palette, camp, camp_order  # noqa: E402

FIG_SIZES: dict[str, tuple[float, float]] = {  # forest: width; height by rows (figure_size)
    "reward_vs_step": (10, 6),
    "kl_vs_step": (10, 5),
    "survival": (10, 5),
    "collapse_onset": (10, 5),
    "n_sweep": (12, 5),
    "tis_sensitivity": (12, 5),
    "forest": (13, 6),
}
FORMATS = ("png", "pdf")
SMALL_MULTIPLES_ABOVE = 6  # more groups than this: reward, KL and survival get one panel per camp
MAX_PER_PANEL = 6  # a camp with more groups is split into panels of about equal size (an estimator's variants together)
PANEL_SIZE = (4.4, 3.6)  # inches of one small-multiples panel, its legend below it included
FOREST_ROW, FOREST_PAD = 0.27, 2.0  # inches per forest row, and for titles, axes and legend
FOREST_REST = 20  # exploratory pairs shown beside those that separate (smallest p first)
FOREST_MAX_ROWS = 60


class MissingInput(Exception):
    """The figure cannot be drawn from this experiment; the message says why."""


@dataclass
class FigureContext:
    exp: Experiment
    measures: pd.DataFrame
    cfg: AnalysisConfig
    palette: Palette
    out_dir: Path
    #: the report's verdicts (:func:`analysis.verdict_tables.run_verdicts`); None: the forest plot computes them
    comparisons: list | None = None


def grid_shape(panels: int) -> tuple[int, int]:
    """(rows, columns) of a small-multiples grid of ``panels`` panels."""
    ncols = 1 if panels == 1 else 2 if panels in (2, 4) else 3
    return math.ceil(panels / ncols), ncols


def figure_size(name: str, panels: int = 1, rows: int = 0) -> tuple[float, float]:
    """Inches of figure ``name``: :data:`FIG_SIZES`, a grid of ``panels`` small multiples (> 1), or a forest
    plot of ``rows`` rows."""
    if name == "forest" and rows:
        return FIG_SIZES[name][0], FOREST_PAD + FOREST_ROW * rows
    if panels > 1:
        nr, nc = grid_shape(panels)
        return PANEL_SIZE[0] * nc + 0.4, PANEL_SIZE[1] * nr + 1.0
    return FIG_SIZES[name]


def pixel_size(name: str, dpi: int, panels: int = 1, rows: int = 0) -> tuple[int, int]:
    """(width, height) in pixels of the PNG of figure ``name`` (see :func:`figure_size`)."""
    w, h = figure_size(name, panels, rows)
    return int(round(w * dpi)), int(round(h * dpi))


def _new(name: str, cfg: AnalysisConfig, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=FIG_SIZES.get(name, FIG_SIZES["n_sweep"]), dpi=cfg.dpi, layout="constrained")
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    for ax in axes:
        ax.grid(True, linestyle="--", alpha=0.6)
    return fig, axes


def _save(fig: Figure, ctx: FigureContext, name: str) -> list[Path]:
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = ctx.out_dir / f"{name}.{fmt}"
        fig.savefig(path, dpi=ctx.cfg.dpi, format=fmt)
        paths.append(path)
    return paths


def _legend(ax, n: int) -> None:
    """The legend outside the axes, right of the data (never over the curves)."""
    if not n:
        return
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=9 if n <= 8 else 8,
              framealpha=0.85)


def _panel_legend(ax) -> None:
    """A small-multiples panel's legend, below its axes (outside the data): two columns when the labels are short."""
    handles, labels = ax.get_legend_handles_labels()
    if labels:
        ncol = 1 if len(labels) <= 2 or max(map(len, labels)) > 24 else 2
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncol=ncol, fontsize=8, frameon=False,
                  handlelength=2.5, columnspacing=1.0)


def _suptitle(fig: Figure, title: str, details: str = "") -> None:
    """A figure title, its details on the lines below, wrapped to the figure's width (never clipped)."""
    width = int(fig.get_size_inches()[0] * 11)  # characters per line at 11 pt, with a margin
    fig.suptitle(title + ("\n" + textwrap.fill(details, width) if details else ""), fontsize=11)


def _step_axis(ax) -> None:
    """Integer ticks on a Step axis (steps are whole numbers)."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _group_matrix(ctx: FigureContext, metric: str, label: str, smoothed: bool) -> pd.DataFrame:
    runs = ctx.exp.group_runs(label)
    wide = ctx.exp.wide(metric, runs)
    if wide.empty:
        return wide
    values = wide.to_numpy(dtype=float)
    values = np.where(np.isfinite(values), values, np.nan)
    if smoothed:
        for j in range(values.shape[1]):
            col = values[:, j]
            present = ~np.isnan(col)
            if present.any():  # smooth over the run's own logged steps, then put back in place
                out = np.full_like(col, np.nan)
                out[present] = smooth(col[present], ctx.cfg.smooth_window, ctx.cfg.smooth_kind)
                values[:, j] = out
    return pd.DataFrame(values, index=wide.index, columns=wide.columns)


# ---- small multiples: one panel per camp ----------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    title: str
    labels: tuple[str, ...]


def _estimators(exp: Experiment) -> dict[str, str]:
    seen = exp.runs.drop_duplicates("label")
    return dict(zip(seen["label"], seen["estimator"]))


def reference_arms(exp: Experiment, labels: Sequence[str] | None = None) -> list[str]:
    """The groups drawn in every panel of the small multiples: recompute's and rollout's, each when it is one
    group (several recompute groups, e.g. one per perturbation, get their own panel instead)."""
    est = _estimators(exp)
    labels = list(exp.labels if labels is None else labels)
    out = []
    for name in REFERENCE_COLOUR:
        mine = [lab for lab in labels if est.get(lab) == name]
        if len(mine) == 1:
            out.append(mine[0])
    return out


def _split(members: list[str], est: dict[str, str]) -> list[list[str]]:
    """``members`` in panels of about equal size <= MAX_PER_PANEL, an estimator's variants together where they fit."""
    if len(members) <= MAX_PER_PANEL:
        return [members]
    k = math.ceil(len(members) / MAX_PER_PANEL)
    target = math.ceil(len(members) / k)
    blocks: list[list[str]] = []
    for lab in members:
        if blocks and est.get(blocks[-1][-1]) == est.get(lab) and len(blocks[-1]) < target:
            blocks[-1].append(lab)
        else:
            blocks.append([lab])
    chunks: list[list[str]] = [[]]
    for b in blocks:
        if chunks[-1] and len(chunks[-1]) + len(b) > target:
            chunks.append([])
        chunks[-1].extend(b)
    return chunks


def camp_panels(exp: Experiment, labels: Sequence[str] | None = None) -> tuple[list[str], list[Panel]]:
    """(reference arms, panels): one panel per camp of the groups (``harness.estimators``' ``camp``), in camp
    order, a large camp split (:data:`MAX_PER_PANEL`); the references are in every panel, not in one of their own."""
    est = _estimators(exp)
    labels = [lab for lab in exp.labels if labels is None or lab in set(labels)]
    refs = reference_arms(exp, labels)
    by_camp: dict[str, list[str]] = {}
    for lab in labels:
        if lab not in refs:
            by_camp.setdefault(camp(est.get(lab, "")), []).append(lab)
    order = camp_order()
    panels = []
    for c in sorted(by_camp, key=order.index):
        chunks = _split(by_camp[c], est)
        for i, chunk in enumerate(chunks):
            panels.append(Panel(c if len(chunks) == 1 else f"{c} ({i + 1}/{len(chunks)})", tuple(chunk)))
    return refs, panels


def _grid(name: str, cfg: AnalysisConfig, n: int) -> tuple[Figure, list]:
    """A grid of ``n`` panels sharing the y axis (empty cells removed)."""
    nr, nc = grid_shape(n)
    fig = Figure(figsize=figure_size(name, n), dpi=cfg.dpi, layout="constrained")
    axes = list(fig.subplots(nr, nc, sharey=True, squeeze=False).ravel())
    for ax in axes[n:]:
        fig.delaxes(ax)
    axes = axes[:n]
    for ax in axes:
        ax.grid(True, linestyle="--", alpha=0.6)
        ax.yaxis.set_tick_params(labelleft=True)
    return fig, axes


def _reference_style(exp: Experiment, label: str) -> tuple[tuple | str, str]:
    est = _estimators(exp).get(label, "")
    return REFERENCE_COLOUR.get(est, "black"), "-" if est == "recompute" else "--"


def _reference_handles(exp: Experiment, refs: Sequence[str], extra: Sequence = ()) -> list:
    handles = []
    for r in refs:
        colour, ls = _reference_style(exp, r)
        handles.append(Line2D([], [], color=colour, linestyle=ls, linewidth=1.3, label=f"{r} (reference, every panel)"))
    return handles + list(extra)

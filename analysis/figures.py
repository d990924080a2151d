"""Figures (matplotlib, Agg), each written as ``<name>.png`` and ``<name>.pdf``.

Every figure has a fixed size (:data:`FIG_SIZES`, inches; PNG pixels = inches x ``dpi``) or one set by its
content - a grid of small multiples, a forest plot's rows (:func:`figure_size`) -, the style of the KwaiKAT
reference figures (title, "Step" axis, dashed light grid) with every legend outside the data, and the report's
:class:`analysis.palette.Palette`, so a group has one colour everywhere.

- ``reward_vs_step``: per group, the IQM across seeds of the runs' smoothed reward, with a band - the
  bootstrap CI of the IQM - only for groups with >= ``min_seeds`` seeds (with 2-4 seeds a percentile "CI"
  is about the seeds' min-max range); the title or legend says which groups have one.
- ``kl_vs_step``: the same for the raw ``mismatch/k3``, on a symmetric-log y axis when the positive values
  span a decade or more (linear below the decade under the smallest positive value, so a k3 of exactly 0 -
  the ``rollout`` estimator's denominator is the sampling log-prob itself - stays visible), on a linear axis
  otherwise (a log axis would label no tick).
- More than :data:`SMALL_MULTIPLES_ABOVE` groups: reward, KL and survival become **small multiples**, one
  panel per camp (:func:`camp_panels`: the estimator's declared ``camp``; a camp of more than
  :data:`MAX_PER_PANEL` groups split), a shared y axis, each panel with the reference arms (recompute black,
  rollout gray dashed, thin, no band) and its legend below it. Step axes have integer ticks.
- ``survival``: Kaplan-Meier share of runs not yet collapsed by step s, censoring marked ``+``, the legend
  giving each group's collapsed/runs; the curves of one axes are offset vertically by
  :data:`SURVIVAL_OFFSET` each (the title says by how much at most), so that groups that never collapse do not
  hide one another at 1.0.
- ``collapse_onset``: one point per run: the rule's onset (filled; ``X`` for a non-finite loss), the
  change-point estimate (black ``|``), censored runs as open ``>`` at their last step.
- ``n_sweep`` / ``tis_sensitivity``: collapse rate (Wilson CI) and IQM final reward (bootstrap CI at points
  with >= ``min_seeds`` runs) against n (``mean_n``) / against C (``tis`` and ``mis``, token vs sequence as
  line styles; the title names the levels present). Tick labels at 3 significant figures, thinned so they
  never overprint; no CI band or CI claim when every point has one run.
- ``forest``: the pair comparisons of the verdicts (:mod:`analysis.verdicts`, ``FigureContext.comparisons``):
  one row per pair tested in a family - the primary ones, then the exploratory ones that separate, then
  :data:`FOREST_REST` more by smallest p -, one panel per endpoint, the effect A - B with its simultaneous
  interval, filled when it separates, hollow (gray) when not; seeds and Holm p in a right-hand column.
  Missing when no pair has enough seeds to be tested.

A figure whose inputs are missing raises :class:`MissingInput` with the reason; the report turns it
into a note.
"""
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
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, MaxNLocator, NullFormatter  # noqa: E402

from .config import AnalysisConfig  # noqa: E402
from .load import Experiment  # noqa: E402
from .labels import family_name, sweep_families  # noqa: E402
from .measures import smooth  # noqa: E402
from .palette import (BASE_COLOUR, BASE_STYLE, LEVEL_STYLE, REFERENCE_COLOUR, UNKNOWN_COLOUR, Palette,  # noqa: E402
                      camp, camp_order)
from .stats import curve_band, iqm_ci, survival_at, wilson  # noqa: E402

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


# ---- reward and KL curves ---------------------------------------------------------------------------------------


def _curve(ctx: FigureContext, metric: str, label: str, smoothed: bool):
    """(steps, IQM, lo, hi, seeds) of one group, or None when it logged no ``metric``."""
    m = _group_matrix(ctx, metric, label, smoothed)
    if m.empty:
        return None
    center, lo, hi = curve_band(m.to_numpy().T, ctx.cfg.curve_reps, ctx.cfg.ci, ctx.cfg.seed)
    return m.index.to_numpy(), center, lo, hi, m.shape[1]


def band_note(ctx: FigureContext, seeds: dict[str, int], banded: set[str]) -> str:
    """What the band is, in words: a bootstrap CI of the IQM, drawn only for groups with >= ``min_seeds`` seeds
    (with 2-4 seeds the percentile "CI" is about the min-max range of the seeds)."""
    k = ctx.cfg.min_seeds
    if max(seeds.values()) <= 1:
        return "one seed: no band"
    if not banded:
        return f"no band: < {k} seeds per group"
    if len(banded) == len(seeds):
        return f"band: {ctx.cfg.ci:.0%} bootstrap CI"
    return f"band: {ctx.cfg.ci:.0%} bootstrap CI, groups with >= {k} seeds"


def _curves(ctx: FigureContext, name: str, metric: str, smoothed: bool, title: str, what: str, ylabel: str,
            log: bool) -> Figure:
    if not ctx.exp.has_metric(metric):
        raise MissingInput(f"no run logged `{metric}`")
    data = {lab: d for lab in ctx.exp.labels if (d := _curve(ctx, metric, lab, smoothed)) is not None}
    if not data:
        raise MissingInput(f"no run logged `{metric}`")
    seeds = {lab: d[4] for lab, d in data.items()}
    banded = {lab for lab, d in data.items() if d[4] >= ctx.cfg.min_seeds and np.isfinite(d[2]).any()}
    same = len(set(seeds.values())) == 1

    def legend_label(lab: str) -> str:
        bits = [] if same else [f"{seeds[lab]} seed{'s' if seeds[lab] != 1 else ''}"]
        if banded and lab not in banded and seeds[lab] > 1:
            bits.append("no band")
        return lab + (f" ({', '.join(bits)})" if bits else "")

    def plot(ax, lab: str, n_curves: int, colour=None, ls=None, lw: float = 2.0, band: bool = True) -> None:
        steps, center, lo, hi, _ = data[lab]
        st = ctx.palette[lab]
        ax.plot(steps, center, color=colour or st.colour, linestyle=ls or st.linestyle, linewidth=lw,
                label=None if colour else legend_label(lab), zorder=1.8 if colour else 2.5)  # references beneath
        if band and lab in banded:
            ax.fill_between(steps, lo, hi, color=st.colour, alpha=0.18 if n_curves <= 4 else 0.12, linewidth=0)

    k = next(iter(seeds.values()))
    iqm = (f"IQM across {k} seeds per group" if same else "IQM across seeds") if max(seeds.values()) > 1 else ""
    note = band_note(ctx, seeds, banded)
    if len(data) > SMALL_MULTIPLES_ABOVE:
        refs, panels = camp_panels(ctx.exp, list(data))
        fig, axes = _grid(name, ctx.cfg, len(panels))
        for ax, panel in zip(axes, panels):
            for r in refs:
                colour, ls = _reference_style(ctx.exp, r)
                plot(ax, r, 0, colour, ls, lw=1.3, band=False)
            for lab in panel.labels:
                plot(ax, lab, len(panel.labels))
            ax.set_title(panel.title, fontsize=10)
            ax.set_xlabel("Step", fontsize=9)
            _step_axis(ax)
            _panel_legend(ax)
        for ax in axes[:: grid_shape(len(panels))[1]]:
            ax.set_ylabel(ylabel)
        extra = [Patch(color="0.6", alpha=0.4, label=note)] if banded else []
        fig.legend(handles=_reference_handles(ctx.exp, refs, extra), loc="outside lower center", ncol=3, fontsize=9,
                   frameon=False)
        details = "; ".join(x for x in (what, iqm, "" if banded else note, "one panel per camp, the references in "
                                        "each") if x)
        _suptitle(fig, title, details)
    else:
        fig, (ax,) = _new(name, ctx.cfg)
        axes = [ax]
        for lab in data:
            plot(ax, lab, len(data))
        _suptitle(fig, title, "; ".join(x for x in (what, iqm, note) if x))
        ax.set_xlabel("Step")
        _step_axis(ax)
        ax.set_ylabel(ylabel)
        _legend(ax, len(data))
    if log:
        vals = np.concatenate([np.concatenate(d[1:4]) for d in data.values()])
        pos = vals[np.isfinite(vals) & (vals > 0)]
        lo_pos, hi_pos = (float(pos.min()), float(pos.max())) if len(pos) else (1e-8, 1e-8)
        if hi_pos >= 10 * lo_pos:  # a decade or more: symlog, linear below the decade under the smallest value
            for ax in axes:
                ax.set_yscale("symlog", linthresh=10.0 ** np.floor(np.log10(max(lo_pos, 1e-12))))
            suffix = ", symlog)"
        else:  # less than a decade: a log axis would show no labelled decade; linear keeps exact zeros too
            suffix = ", linear)"
        for ax in axes:
            if ax.get_ylabel():
                ax.set_ylabel(ax.get_ylabel() + suffix)
    return fig


def reward_vs_step(ctx: FigureContext) -> Figure:
    return _curves(ctx, "reward_vs_step", ctx.cfg.reward_metric, True, "Reward vs Step",
                   f"smoothed W={ctx.cfg.smooth_window}", "Reward", log=False)


def kl_vs_step(ctx: FigureContext) -> Figure:
    return _curves(ctx, "kl_vs_step", ctx.cfg.kl_metric, False, "Train-inference KL (k3) vs Step", "",
                   f"KL div (`{ctx.cfg.kl_metric}`", log=True)


# ---- survival ---------------------------------------------------------------------------------------------------

SURVIVAL_OFFSET = 0.006  # vertical offset between the curves of one axes, so that curves at 1.0 stay visible


def _km(ax, g: pd.DataFrame, colour, ls: str, lw: float, dy: float, label: str | None) -> None:
    grid = np.unique(np.concatenate([[0.0], g["collapse_time"].to_numpy(float), [float(g["collapse_time"].max())]]))
    times, events = g["collapse_time"].to_numpy(float), g["collapsed"].to_numpy(bool)
    s = survival_at(grid, times, events)
    ax.step(grid, s + dy, where="post", color=colour, linestyle=ls, linewidth=lw, label=label)
    cens = g[~g["collapsed"]]["collapse_time"].to_numpy(float)
    if len(cens):
        ax.plot(cens, survival_at(cens, times, events) + dy, linestyle="none", marker="+", markersize=9, color=colour)


def _offsets(k: int) -> np.ndarray:
    return (np.arange(k) - (k - 1) / 2) * -SURVIVAL_OFFSET


def survival(ctx: FigureContext) -> Figure:
    m = ctx.measures.dropna(subset=["collapse_time"])
    if m.empty:
        raise MissingInput(f"no run logged `{ctx.cfg.reward_metric}`")
    labels = [lab for lab in ctx.exp.labels if lab in set(m["label"])]
    groups = {lab: m[m["label"] == lab] for lab in labels}
    t_max = float(m["collapse_time"].max())

    def text(lab: str) -> str:
        g = groups[lab]
        return f"{lab}: {int(g['collapsed'].sum())}/{len(g)}"

    def finish(ax) -> None:
        ax.set_ylim(-0.05, 1.08)
        ax.set_xlim(0, max(t_max, 1.0) * 1.02)
        _step_axis(ax)

    title, what = "Share of runs not yet collapsed", "Kaplan-Meier, + censored, legend k/n = collapsed/runs"

    def offset_note(k: int) -> str:
        return f"; curves offset by <= {SURVIVAL_OFFSET * (k - 1) / 2:.3f} so that none hides another" if k > 1 else ""

    if len(labels) > SMALL_MULTIPLES_ABOVE:
        refs, panels = camp_panels(ctx.exp, labels)
        fig, axes = _grid("survival", ctx.cfg, len(panels))
        most = 0
        for ax, panel in zip(axes, panels):
            dys = _offsets(len(refs) + len(panel.labels))
            most = max(most, len(dys))
            for r, dy in zip(refs, dys):
                colour, ls = _reference_style(ctx.exp, r)
                _km(ax, groups[r], colour, ls, 1.3, dy, None)
            for lab, dy in zip(panel.labels, dys[len(refs):]):
                st = ctx.palette[lab]
                _km(ax, groups[lab], st.colour, st.linestyle, 2.0, dy, text(lab))
            ax.set_title(panel.title, fontsize=10)
            ax.set_xlabel("Step", fontsize=9)
            finish(ax)
            _panel_legend(ax)
        for ax in axes[:: grid_shape(len(panels))[1]]:
            ax.set_ylabel("Not yet collapsed")
        handles = []
        for r in refs:
            colour, ls = _reference_style(ctx.exp, r)
            handles.append(Line2D([], [], color=colour, linestyle=ls, linewidth=1.3,
                                  label=f"{text(r)} (reference, every panel)"))
        fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=9, frameon=False)
        _suptitle(fig, title, f"{what}{offset_note(most)}; one panel per camp, the references in each")
        return fig
    fig, (ax,) = _new("survival", ctx.cfg)
    dys = _offsets(len(labels))
    for lab, dy in zip(labels, dys):
        st = ctx.palette[lab]
        _km(ax, groups[lab], st.colour, st.linestyle, 2.0, dy, text(lab))
    finish(ax)
    _suptitle(fig, title, f"{what}{offset_note(len(labels))}")
    ax.set_xlabel("Step")
    ax.set_ylabel("Not yet collapsed")
    _legend(ax, len(labels))
    return fig


def collapse_onset(ctx: FigureContext) -> Figure:
    m = ctx.measures.dropna(subset=["collapse_time"])
    if m.empty:
        raise MissingInput(f"no run logged `{ctx.cfg.reward_metric}`")
    fig, (ax,) = _new("collapse_onset", ctx.cfg)
    labels = [lab for lab in ctx.exp.labels if lab in set(m["label"])]
    rng = np.random.default_rng(ctx.cfg.seed)
    shown = set()

    def once(key: str) -> str | None:
        if key in shown:
            return None
        shown.add(key)
        return key

    for y, label in enumerate(labels):
        g = m[m["label"] == label]
        st = ctx.palette[label]
        jitter = rng.uniform(-0.18, 0.18, size=len(g))
        for (row, dy) in zip(g.itertuples(), jitter):
            if row.collapsed:
                marker = "X" if row.onset_kind == "nonfinite" else "o"
                key = "onset: non-finite loss" if row.onset_kind == "nonfinite" else "onset: drop-from-peak rule"
                ax.plot(row.onset, y + dy, marker=marker, markersize=8, color=st.colour, linestyle="none",
                        label=once(key))
            else:
                ax.plot(row.collapse_time, y + dy, marker=">", markersize=8, markerfacecolor="none",
                        markeredgecolor=st.colour, linestyle="none", label=once("censored (last step)"))
            if np.isfinite(row.cp_onset):
                ax.plot(row.cp_onset, y + dy, marker="|", markersize=12, markeredgewidth=2, color="black",
                        linestyle="none", label=once("change point (ruptures)"))
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=9 if len(labels) <= 10 else 7)
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.invert_yaxis()
    ax.set_xlim(left=0)
    ax.set_title("Collapse onset per run (persistent collapses)")
    ax.set_xlabel("Step")
    _step_axis(ax)
    fig.legend(loc="outside lower center", ncol=4, fontsize=9, frameon=False)
    return fig


def _ticks(values: list[float], min_gap: float = 0.12) -> tuple[list[float], list[str]]:
    """Tick positions on a log2 axis with labels at 3 significant figures, dropping a value closer
    than ``min_gap`` (in log2 units) to the previous kept one, so labels never overprint."""
    kept: list[float] = []
    for v in sorted(values):
        if not kept or np.log2(v) - np.log2(kept[-1]) >= min_gap:
            kept.append(v)
    return kept, [f"{v:.3g}" for v in kept]


def _sweep(ctx: FigureContext, name: str, x: str, estimators: tuple[str, ...] | None, title: str, xlabel: str) -> Figure:
    fams = sweep_families(ctx.exp.runs, x, estimators)
    if not fams:
        what = "/".join(estimators) if estimators else "any estimator"
        raise MissingInput(f"needs runs of {what} at >= 2 values of `{x}`")
    fig, (ax_rate, ax_final) = _new(name, ctx.cfg, ncols=2)
    m = ctx.measures.set_index("run_id")
    most = 0  # the most runs at one point: a CI needs >= 2
    k_min, banded = ctx.cfg.min_seeds, False  # the final reward's bootstrap band: only at points with >= min_seeds runs
    for k, g in enumerate(fams.values()):
        row = g.iloc[0]
        colour = BASE_COLOUR.get(row["estimator"], UNKNOWN_COLOUR)
        ls = LEVEL_STYLE.get(row["level"], BASE_STYLE.get(row["estimator"], "-"))
        xs, rate, rlo, rhi, fin, flo, fhi = [], [], [], [], [], [], []
        for xv, gg in g.groupby(x):
            mm = m.loc[gg["run_id"]]
            most = max(most, len(mm))
            enough = len(mm) >= k_min
            w = wilson(int(mm["collapsed"].sum()), len(mm), ctx.cfg.ci)
            f = iqm_ci(mm["final"].to_numpy(float), ctx.cfg.bootstrap_reps, ctx.cfg.ci, ctx.cfg.seed)
            xs.append(xv)
            rate.append(w.point), rlo.append(w.lo), rhi.append(w.hi)
            fin.append(f.point), flo.append(f.lo if enough else np.nan), fhi.append(f.hi if enough else np.nan)
            banded |= enough
        xs = np.array(xs, float)
        fam = family_name(g, x)
        for ax, c, lo, hi in ((ax_rate, rate, rlo, rhi), (ax_final, fin, flo, fhi)):
            c, lo, hi = (np.array(v, float) for v in (c, lo, hi))
            ax.plot(xs, c, color=colour, linestyle=ls, marker="o", linewidth=2, label=fam)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.any() and most > 1:
                ax.fill_between(xs[ok], lo[ok], hi[ok], color=colour, alpha=0.15, linewidth=0)
    allx = sorted({float(v) for g in fams.values() for v in g[x]})
    log = allx[0] > 0  # a level 0 (a dose's control arm): a linear axis
    ticks, tick_labels = _ticks(allx) if log else (allx, [f"{v:.3g}" for v in allx])
    for ax in (ax_rate, ax_final):
        if log:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.set_xticklabels(tick_labels)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.minorticks_off()
    fig.legend(*ax_rate.get_legend_handles_labels(), loc="outside lower center", ncol=min(len(fams), 4), fontsize=9,
               frameon=False, handlelength=4)
    ci = f"{ctx.cfg.ci:.0%} Wilson CI" if most > 1 else "one run per point: no CI"
    ax_rate.set_ylim(-0.03, 1.05)
    ax_rate.set_ylabel(f"Collapse rate ({ci})")
    ax_rate.set_title("Collapse rate")
    ax_final.set_ylabel(f"Final reward (IQM; {ctx.cfg.ci:.0%} CI at >= {k_min} runs)" if banded else
                        f"Final reward (IQM; no CI: < {k_min} runs per point)" if most > 1 else
                        "Final reward (one run per point: no CI)")
    ax_final.set_title("Final reward")
    fig.suptitle(title)
    return fig


def n_sweep(ctx: FigureContext) -> Figure:
    return _sweep(ctx, "n_sweep", "n", ("mean_n",), "n-sweep: mean_n with n inference passes", "n (passes)")


def tis_sensitivity(ctx: FigureContext) -> Figure:
    runs = ctx.exp.runs
    levels = sorted(set(runs.loc[runs["estimator"].isin(("tis", "mis")), "level"]) - {""})
    what = "token vs sequence level" if len(levels) > 1 else (f"{levels[0]} level" if levels else "level not logged")
    return _sweep(ctx, "tis_sensitivity", "clip_c", ("tis", "mis"), f"Sensitivity to the cap C ({what})", "C")


SWEEP_CAPTION = ("Sweep over the `--x` key: collapse rate (Wilson CI) and final reward (IQM, bootstrap CI) of each "
                 "family of groups that differ only in that key, against its value (log2 axis when every value is "
                 "positive).")


def sweep_figure(ctx: FigureContext, x: str) -> Figure:
    """The sweep figure of any knob or spec key ``x`` (``report --x trainer.lr``); raises :class:`MissingInput`."""
    return _sweep(ctx, "sweep", x, None, f"Sweep over {x}", x)


def draw_sweep(ctx: FigureContext, x: str) -> list[Path]:
    """Draw :func:`sweep_figure` as ``sweep.png|pdf``."""
    return _save(sweep_figure(ctx, x), ctx, "sweep")


# ---- forest plot of the pair comparisons ------------------------------------------------------------------------

FOREST_AXIS = {"collapse": "Collapse rate", "final": "Final reward", "auc": "AUC"}
MINUS = "\u2212"


def _level(level: float) -> str:
    """A simultaneous level as a percentage with the digits that tell it from 100 % (98.8%, 99.984%)."""
    digits = max(1, int(np.ceil(-np.log10(max(1 - level, 1e-12)))) - 1)
    return f"{100 * level:.{digits}f}%"


def _p(p: float) -> str:
    return "-" if not np.isfinite(p) else f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def forest_rows(comparisons: Sequence, alpha: float) -> tuple[list[tuple], dict]:
    """The rows of the forest plot and its counts: ``[("header", text) | ("pair", (a, b), {endpoint: c})]``.
    Pairs tested in a family only (pairs with too few seeds have no interval); the primary ones first, then the
    exploratory ones that separate (on any endpoint), then up to :data:`FOREST_REST` more by smallest p;
    :data:`FOREST_MAX_ROWS` at most."""
    tested = [c for c in comparisons if c.kind == "pair" and c.family in ("primary", "exploratory")]
    pairs: dict[tuple[str, str], dict[str, object]] = {}
    for c in tested:
        pairs.setdefault((c.a, c.b), {})[c.endpoint] = c
    size = {fam: sum(c.family == fam for c in comparisons) for fam in ("primary", "exploratory")}

    def fam(pair) -> str:
        return "primary" if any(c.family == "primary" for c in pairs[pair].values()) else "exploratory"

    def sep(pair) -> bool:
        return any(c.verdict == "separates" for c in pairs[pair].values())

    def p_min(pair) -> float:
        return min((c.p for c in pairs[pair].values() if np.isfinite(c.p)), default=2.0)

    prim = sorted((pr for pr in pairs if fam(pr) == "primary"), key=p_min)
    expl = [pr for pr in pairs if fam(pr) == "exploratory"]
    expl_sep = sorted((pr for pr in expl if sep(pr)), key=p_min)
    expl_rest = sorted((pr for pr in expl if not sep(pr)), key=p_min)[:FOREST_REST]
    room = FOREST_MAX_ROWS - len(prim)
    expl_shown = (expl_sep + expl_rest)[:max(room, 0)]
    rows: list[tuple] = []
    if prim:
        rows.append(("header", f"primary: {sum(map(sep, prim))} of {len(prim)} separate"))
        rows += [("pair", pr, pairs[pr]) for pr in prim]
    if expl_shown:
        rows.append(("header", f"exploratory: {len(expl_sep)} of {len(expl)} separate"))
        rows += [("pair", pr, pairs[pr]) for pr in expl_shown]
    counts = {"shown": len(prim) + len(expl_shown), "tested": len(pairs), "primary": len(prim),
              "more": max(len(expl_shown) - len(expl_sep), 0),
              "too_few": len({(c.a, c.b) for c in comparisons if c.kind == "pair" and c.family == "none"}),
              "levels": {fam: 1 - alpha / m for fam, m in size.items() if m}}
    return rows, counts


def _seeds_text(cs: dict) -> str:
    c = next(iter(cs.values()))
    return f"{c.n_pairs} paired" if c.paired else f"{c.n_a} vs {c.n_b}"


def forest(ctx: FigureContext) -> Figure:
    cs = ctx.comparisons
    if cs is None:
        from .verdict_tables import run_verdicts

        cs = run_verdicts(ctx.exp, ctx.measures, ctx.cfg) if len(ctx.measures) and len(ctx.exp.labels) > 1 else []
    pairs = [c for c in cs if c.kind == "pair"]
    rows, counts = forest_rows(cs, ctx.cfg.alpha)
    if not pairs:
        raise MissingInput("needs >= 2 groups with per-run measures")
    if not counts["tested"]:
        raise MissingInput(f"too few seeds: no pair of groups has >= {ctx.cfg.min_seeds} seeds in each (paired: "
                           "common seeds), so no comparison was tested and none has an interval")
    shown = [r for r in rows if r[0] == "pair"]
    endpoints = [ep for ep in FOREST_AXIS if any(ep in r[2] for r in shown)]
    fig = Figure(figsize=figure_size("forest", rows=len(rows)), dpi=ctx.cfg.dpi, layout="constrained")
    axes = list(fig.subplots(1, len(endpoints), sharey=True, squeeze=False)[0])
    ys = np.arange(len(rows))
    for ax, ep in zip(axes, endpoints):
        ax.grid(True, axis="x", linestyle="--", alpha=0.6)
        ax.axvline(0.0, color="0.3", linewidth=1.0, zorder=1)
        for y, row in zip(ys, rows):
            if row[0] == "header":
                ax.axhspan(y - 0.5, y + 0.5, color="0.92", linewidth=0, zorder=0)
                continue
            c = row[2].get(ep)
            if c is None or not np.isfinite(c.effect):
                continue
            filled = c.verdict == "separates"
            tone = "black" if filled else "0.45"  # what does not separate recedes, its interval included
            if np.isfinite(c.lo) and np.isfinite(c.hi):
                ax.plot([c.lo, c.hi], [y, y], color=tone, linewidth=1.4, solid_capstyle="butt", zorder=2)
            ax.plot([c.effect], [y], marker="o", markersize=6.5, linestyle="none", markeredgecolor=tone,
                    markeredgewidth=1.3, markerfacecolor=tone if filled else "white", zorder=3)
        tests = sorted({r[2][ep].test + (", paired" if r[2][ep].paired else "") for r in shown if ep in r[2]})
        ax.set_title(f"{FOREST_AXIS[ep]}\n{'; '.join(tests)}", fontsize=10)
        paired = all(r[2][ep].paired for r in shown if ep in r[2])
        ax.set_xlabel(f"A {MINUS} B" + (" (rate)" if ep == "collapse" else " (mean per-seed difference)" if paired
                                         else " (difference of means)"))
        if ep == "collapse":
            ax.set_xlim(-1.05, 1.05)
    axes[0].set_ylim(len(rows) - 0.5, -0.5)
    axes[0].set_yticks(ys)
    axes[0].set_yticklabels([r[1] if r[0] == "header" else f"{r[1][0]} {MINUS} {r[1][1]}" for r in rows],
                            fontsize=8 if len(rows) <= 30 else 7)
    for tick, row in zip(axes[0].get_yticklabels(), rows):
        if row[0] == "header":
            tick.set_fontweight("bold")
            tick.set_fontstyle("italic")
    for ax in axes[1:]:
        ax.tick_params(axis="y", left=False)
    right = axes[-1].twinx()  # the right-hand column: seeds and Holm p per endpoint
    right.set_ylim(axes[0].get_ylim())
    right.set_yticks(ys)
    right.set_yticklabels(["seeds | Holm p (" + " / ".join(endpoints) + ")" if r[0] == "header" else
                           f"{_seeds_text(r[2])} | " + " / ".join(_p(r[2][ep].p_holm) if ep in r[2] else "-"
                                                                 for ep in endpoints) for r in rows],
                          fontsize=8 if len(rows) <= 30 else 7)
    right.tick_params(axis="y", right=False)
    handles = [Line2D([], [], marker="o", linestyle="none", color="black", markerfacecolor="black",
                      label=f"separates (Holm p < {ctx.cfg.alpha:g} in its family)"),
               Line2D([], [], marker="o", linestyle="none", color="0.45", markerfacecolor="white",
                      label="not shown (grey)"),
               Line2D([], [], color="black", linewidth=1.4,
                      label=f"bootstrap interval at the family's simultaneous level 1 {MINUS} alpha/m")]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=9, frameon=False)
    n_sep = counts["shown"] - counts["more"] - counts["primary"]
    which = ", ".join(w for w in ("primary" if counts["primary"] else "", "exploratory that separate" if n_sep else "",
                                  f"the next {counts['more']} by smallest p" if counts["more"] else "") if w)
    few = f"; {counts['too_few']} pairs with too few seeds not tested" if counts["too_few"] else ""
    levels = ", ".join(f"{fam} {_level(v)}" for fam, v in counts["levels"].items())
    fig.suptitle(f"Pair comparisons A {MINUS} B: {counts['shown']} of {counts['tested']} tested pairs shown ({which})"
                 f"{few}\nsimultaneous intervals: {levels}", fontsize=11)
    return fig


MULTIPLES = (f"With more than {SMALL_MULTIPLES_ABOVE} groups: one panel per camp of estimators, recompute (black) and "
             "rollout (gray, dashed) in every panel as references.")
FIGURES = {
    "reward_vs_step": (reward_vs_step,
                       "Reward vs step: IQM across seeds of the smoothed reward. The band is the bootstrap CI of the "
                       "IQM, drawn only for groups with >= min_seeds seeds (default 5: with 2-4 seeds a percentile "
                       "interval is about the seeds' min-max range, not a 95% CI); the title or legend says which "
                       "groups have one. " + MULTIPLES),
    "kl_vs_step": (kl_vs_step,
                   "Train-inference mismatch `mismatch/k3` vs step (IQM across seeds; symlog y when the values span "
                   "a decade; band as in the reward figure). " + MULTIPLES),
    "survival": (survival,
                 "Share of runs not yet collapsed by step s (Kaplan-Meier; + marks censored runs; the legend gives "
                 "each group's collapsed/runs). Curves are offset vertically by a few thousandths each (the title "
                 "says how much at most) so that groups at 1.0 do not hide one another. " + MULTIPLES),
    "collapse_onset": (collapse_onset, "Collapse onset per run: drop-from-peak rule (filled), non-finite loss (X), "
                                       "change-point estimate (|), censored runs (open >) at their last step."),
    "forest": (forest,
               "Pair comparisons (forest plot): the effect A - B (collapse-rate difference; final-reward difference, "
               "the mean per-seed difference where seeds pair) with its bootstrap interval at the family's "
               "simultaneous level 1 - alpha/m; filled = separates (Holm p < alpha within its family), hollow gray = "
               "not shown. Primary pairs first, then the exploratory pairs that separate and the next ones by "
               "smallest p (the title says how many of how many); right: seeds and Holm p per endpoint. The verdict "
               "is the test's: with few seeds a percentile interval can exclude 0 for a pair that does not separate "
               "(when every seed's difference has one sign no resample reaches 0, whatever the level). Trend tests "
               "and every comparison: verdicts.md."),
    "n_sweep": (n_sweep, "n-sweep: collapse rate and final reward of mean_n against the number of inference passes n."),
    "tis_sensitivity": (tis_sensitivity, "Sensitivity to the cap C: collapse rate and final reward of TIS (and MIS) "
                                         "against C, token level solid, sequence level dashed."),
}


def figure(name: str, ctx: FigureContext) -> Figure:
    """Build figure ``name`` (a key of :data:`FIGURES`) without saving it; raises :class:`MissingInput`."""
    fn, _ = FIGURES[name]
    return fn(ctx)


def draw(name: str, ctx: FigureContext) -> list[Path]:
    """Draw figure ``name`` and write its PNG and PDF; raises :class:`MissingInput`."""
    return _save(figure(name, ctx), ctx, name)

"""Figures (matplotlib, Agg), each written as ``<name>.png`` and ``<name>.pdf``.

Every figure has a fixed size (:data:`FIG_SIZES`, inches; PNG pixels = inches x ``dpi``), the style
of the KwaiKAT reference figures (title, "Step" axis, dashed light grid, legend upper left) and the
report's :class:`analysis.palette.Palette`, so a group has one colour everywhere.

- ``reward_vs_step``: per group, the IQM across seeds of the runs' smoothed reward, with the
  bootstrap CI band (no band for a single seed).
- ``kl_vs_step``: per group, the IQM across seeds of the raw ``mismatch/k3`` with its band, on a
  symmetric-log y axis when the positive values span a decade or more (linear below the decade under
  the smallest positive value, so a k3 of exactly 0 - the ``rollout`` estimator's denominator is the
  sampling log-prob itself - stays visible), on a linear axis otherwise (a log axis would label no tick).
- More than 6 curves: the legend sits outside the axes, right of the data. Step axes have integer ticks.
- ``survival``: Kaplan-Meier share of runs not yet collapsed by step s, censoring marked ``+``.
- ``collapse_onset``: one point per run: the rule's onset (filled; ``X`` for a non-finite loss), the
  change-point estimate (black ``|``), censored runs as open ``>`` at their last step.
- ``n_sweep`` / ``tis_sensitivity``: collapse rate (Wilson CI) and IQM final reward (bootstrap CI)
  against n (``mean_n``) / against C (``tis`` and ``mis``, token vs sequence as line styles; the
  title names the levels present). Tick labels at 3 significant figures, thinned so they never
  overprint; no CI band or CI claim when every point has one run.

A figure whose inputs are missing raises :class:`MissingInput` with the reason; the report turns it
into a note.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedLocator, MaxNLocator, NullFormatter  # noqa: E402

from .config import AnalysisConfig  # noqa: E402
from .load import Experiment  # noqa: E402
from .labels import family_name, sweep_families  # noqa: E402
from .measures import smooth  # noqa: E402
from .palette import BASE_COLOUR, BASE_STYLE, LEVEL_STYLE, UNKNOWN_COLOUR, Palette  # noqa: E402
from .stats import curve_band, iqm_ci, survival_at, wilson  # noqa: E402

FIG_SIZES: dict[str, tuple[float, float]] = {
    "reward_vs_step": (10, 6),
    "kl_vs_step": (10, 5),
    "survival": (10, 5),
    "collapse_onset": (10, 5),
    "n_sweep": (12, 5),
    "tis_sensitivity": (12, 5),
}
FORMATS = ("png", "pdf")


class MissingInput(Exception):
    """The figure cannot be drawn from this experiment; the message says why."""


@dataclass
class FigureContext:
    exp: Experiment
    measures: pd.DataFrame
    cfg: AnalysisConfig
    palette: Palette
    out_dir: Path


def pixel_size(name: str, dpi: int) -> tuple[int, int]:
    """(width, height) in pixels of the PNG of figure ``name``."""
    w, h = FIG_SIZES[name]
    return int(round(w * dpi)), int(round(h * dpi))


def _new(name: str, cfg: AnalysisConfig, ncols: int = 1) -> tuple[Figure, list]:
    fig = Figure(figsize=FIG_SIZES[name], dpi=cfg.dpi, layout="constrained")
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


LEGEND_INSIDE_MAX = 6  # more entries than this: the legend goes outside the axes, right of the data


def _legend(ax, n: int) -> None:
    if not n:
        return
    if n <= LEGEND_INSIDE_MAX:
        ax.legend(loc="upper left", fontsize=9, framealpha=0.85)
    else:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, framealpha=0.85)


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


def _curves(ctx: FigureContext, name: str, metric: str, smoothed: bool, title: str, ylabel: str, log: bool) -> Figure:
    if not ctx.exp.has_metric(metric):
        raise MissingInput(f"no run logged `{metric}`")
    fig, (ax,) = _new(name, ctx.cfg)
    drawn, positives = 0, []
    for label in ctx.exp.labels:
        m = _group_matrix(ctx, metric, label, smoothed)
        if m.empty:
            continue
        center, lo, hi = curve_band(m.to_numpy().T, ctx.cfg.curve_reps, ctx.cfg.ci, ctx.cfg.seed)
        steps = m.index.to_numpy()
        st = ctx.palette[label]
        n_runs = m.shape[1]
        ax.plot(steps, center, color=st.colour, linestyle=st.linestyle, linewidth=2,
                label=f"{label} ({n_runs} seeds)" if n_runs > 1 else label)
        if np.isfinite(lo).any():
            ax.fill_between(steps, lo, hi, color=st.colour, alpha=0.18 if len(ctx.exp.labels) <= 4 else 0.1, linewidth=0)
        vals = np.concatenate([center, lo, hi])
        positives.append(vals[np.isfinite(vals) & (vals > 0)])
        drawn += 1
    if not drawn:
        raise MissingInput(f"no run logged `{metric}`")
    if log:
        pos = np.concatenate(positives) if positives else np.array([])
        lo_pos, hi_pos = (float(pos.min()), float(pos.max())) if len(pos) else (1e-8, 1e-8)
        if hi_pos >= 10 * lo_pos:  # a decade or more: symlog, linear below the decade under the smallest value
            ax.set_yscale("symlog", linthresh=10.0 ** np.floor(np.log10(max(lo_pos, 1e-12))))
            ylabel += ", symlog)"
        else:  # less than a decade: a log axis would show no labelled decade; linear keeps exact zeros too
            ylabel += ", linear)"
    ax.set_title(title)
    ax.set_xlabel("Step")
    _step_axis(ax)
    ax.set_ylabel(ylabel)
    _legend(ax, drawn)
    return fig


def reward_vs_step(ctx: FigureContext) -> Figure:
    band = f"IQM across seeds, {ctx.cfg.ci:.0%} CI" if ctx.exp.runs.groupby("label").size().max() > 1 else "one seed"
    return _curves(ctx, "reward_vs_step", ctx.cfg.reward_metric, True,
                   f"Reward vs Step (smoothed W={ctx.cfg.smooth_window}; {band})", "Reward", log=False)


def kl_vs_step(ctx: FigureContext) -> Figure:
    return _curves(ctx, "kl_vs_step", ctx.cfg.kl_metric, False,
                   "Train-inference KL (k3) vs Step", f"KL div (`{ctx.cfg.kl_metric}`", log=True)


def survival(ctx: FigureContext) -> Figure:
    m = ctx.measures.dropna(subset=["collapse_time"])
    if m.empty:
        raise MissingInput(f"no run logged `{ctx.cfg.reward_metric}`")
    fig, (ax,) = _new("survival", ctx.cfg)
    t_max = float(m["collapse_time"].max())
    drawn = 0
    for label in ctx.exp.labels:
        g = m[m["label"] == label]
        if g.empty:
            continue
        st = ctx.palette[label]
        grid = np.unique(np.concatenate([[0.0], g["collapse_time"].to_numpy(float), [float(g["collapse_time"].max())]]))
        s = survival_at(grid, g["collapse_time"].to_numpy(float), g["collapsed"].to_numpy(bool))
        ax.step(grid, s, where="post", color=st.colour, linestyle=st.linestyle, linewidth=2,
                label=f"{label} ({int(g['collapsed'].sum())}/{len(g)} collapsed)")
        cens = g[~g["collapsed"]]["collapse_time"].to_numpy(float)
        if len(cens):
            ax.plot(cens, survival_at(cens, g["collapse_time"].to_numpy(float), g["collapsed"].to_numpy(bool)),
                    linestyle="none", marker="+", markersize=10, color=st.colour)
        drawn += 1
    ax.set_ylim(-0.03, 1.05)
    ax.set_xlim(0, max(t_max, 1.0) * 1.02)
    ax.set_title("Share of runs not yet collapsed (Kaplan-Meier; + = censored)")
    ax.set_xlabel("Step")
    _step_axis(ax)
    ax.set_ylabel("Not yet collapsed")
    ax.legend(loc="lower left", fontsize=9 if drawn <= 8 else 7, framealpha=0.85)
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
    for k, g in enumerate(fams.values()):
        row = g.iloc[0]
        colour = BASE_COLOUR.get(row["estimator"], UNKNOWN_COLOUR)
        ls = LEVEL_STYLE.get(row["level"], BASE_STYLE.get(row["estimator"], "-"))
        xs, rate, rlo, rhi, fin, flo, fhi = [], [], [], [], [], [], []
        for xv, gg in g.groupby(x):
            mm = m.loc[gg["run_id"]]
            most = max(most, len(mm))
            w = wilson(int(mm["collapsed"].sum()), len(mm), ctx.cfg.ci)
            f = iqm_ci(mm["final"].to_numpy(float), ctx.cfg.bootstrap_reps, ctx.cfg.ci, ctx.cfg.seed)
            xs.append(xv)
            rate.append(w.point), rlo.append(w.lo), rhi.append(w.hi)
            fin.append(f.point), flo.append(f.lo), fhi.append(f.hi)
        xs = np.array(xs, float)
        fam = family_name(g, x)
        for ax, c, lo, hi in ((ax_rate, rate, rlo, rhi), (ax_final, fin, flo, fhi)):
            c, lo, hi = (np.array(v, float) for v in (c, lo, hi))
            ax.plot(xs, c, color=colour, linestyle=ls, marker="o", linewidth=2, label=fam)
            ok = np.isfinite(lo) & np.isfinite(hi)
            if ok.any() and most > 1:
                ax.fill_between(xs[ok], lo[ok], hi[ok], color=colour, alpha=0.15, linewidth=0)
    allx = sorted({float(v) for g in fams.values() for v in g[x]})
    ticks, tick_labels = _ticks(allx)
    for ax in (ax_rate, ax_final):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.set_xticklabels(tick_labels)
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.minorticks_off()
        _legend(ax, len(fams))
    ci = f"{ctx.cfg.ci:.0%} Wilson CI" if most > 1 else "one run per point: no CI"
    ax_rate.set_ylim(-0.03, 1.05)
    ax_rate.set_ylabel(f"Collapse rate ({ci})")
    ax_rate.set_title("Collapse rate")
    ax_final.set_ylabel(f"Final reward (IQM, {ctx.cfg.ci:.0%} CI)" if most > 1 else "Final reward (one run per point: no CI)")
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


FIGURES = {
    "reward_vs_step": (reward_vs_step, "Reward vs step: IQM across seeds of the smoothed reward, with the bootstrap CI band."),
    "kl_vs_step": (kl_vs_step, "Train-inference mismatch `mismatch/k3` vs step (IQM across seeds, symlog y)."),
    "survival": (survival, "Share of runs not yet collapsed by step s (Kaplan-Meier; + marks censored runs)."),
    "collapse_onset": (collapse_onset, "Collapse onset per run: drop-from-peak rule (filled), non-finite loss (X), "
                                       "change-point estimate (|), censored runs (open >) at their last step."),
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

"""Sweeps: collapse rate and final reward against an axis (n, C, any key: ``--x``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullFormatter

from ..labels import family_name, sweep_families
from ..palette import BASE_COLOUR, BASE_STYLE, LEVEL_STYLE, UNKNOWN_COLOUR
from ..stats import iqm_ci, wilson
from .base import (FigureContext, MissingInput, _new, _save)


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

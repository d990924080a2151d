"""Reward and KL against step, survival, collapse onset."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..stats import curve_band, survival_at
from .base import (FigureContext, MissingInput, SMALL_MULTIPLES_ABOVE, _grid, _group_matrix, _legend, _new,
                   _panel_legend, _reference_handles, _reference_style, _step_axis, _suptitle, camp_panels, grid_shape)


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
                   f"KL div ({ctx.cfg.kl_metric}", log=True)


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

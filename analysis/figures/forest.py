"""The forest plot of the pair comparisons."""
from __future__ import annotations

from typing import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D


from .base import (FOREST_MAX_ROWS, FOREST_REST, FigureContext, MissingInput, figure_size)


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
        from ..verdict_tables import run_verdicts

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

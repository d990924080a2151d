"""Figures, checked through matplotlib's objects (ticks, labels, legend boxes) on small synthetic
experiments in a tmp MLflow store: the reliability review's figure findings, each a test."""
from __future__ import annotations

import itertools
import math
import shutil

import numpy as np
import pytest
from matplotlib import image as mpimg
from matplotlib.backends.backend_agg import FigureCanvasAgg

from analysis.figures import (FOREST_REST, FigureContext, MissingInput, camp_panels, draw, figure, forest_rows,
                              pixel_size)
from analysis.load import load_experiment
from analysis.measures import measure_experiment
from analysis.palette import Palette
from analysis.synthetic import SyntheticRun, curve, log_runs
from analysis.verdict_tables import run_verdicts
from analysis.verdicts import Comparison

MINUS = "\u2212"


def context(uri: str, name: str, cfg, tmp_path) -> FigureContext:
    exp = load_experiment(name, uri)
    return FigureContext(exp, measure_experiment(exp, cfg), cfg, Palette.from_runs(exp.runs), tmp_path)


def render(fig) -> None:
    FigureCanvasAgg(fig).draw()


def visible_labels(fig, ax, axis: str = "y") -> list:
    render(fig)
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    ticks = ax.yaxis.get_major_ticks() if axis == "y" else ax.xaxis.get_major_ticks()
    return [t.label1 for t in ticks if t.label1.get_visible() and t.label1.get_text() and lo <= t.get_loc() <= hi]


def test_kl_axis_has_labelled_ticks_when_the_data_span_less_than_a_decade(fresh_store, fast_cfg, tmp_path):
    T = 40
    log_runs(fresh_store.uri, "kl", [SyntheticRun("recompute", s, curve(T, seed=s), k3=np.linspace(0.04, 0.2, T))
                                     for s in range(2)])
    fig = figure("kl_vs_step", context(fresh_store.uri, "kl", fast_cfg, tmp_path))
    ax = fig.axes[0]
    assert len(visible_labels(fig, ax)) >= 3, [t.get_text() for t in ax.get_yticklabels()]
    # a span of several decades (and rollout's exact zeros) keeps the symlog axis, with labelled decades
    log_runs(fresh_store.uri, "kl_wide", [SyntheticRun("recompute", s, curve(T, seed=s), k3=np.geomspace(1e-4, 1e-1, T))
                                          for s in range(2)] + [SyntheticRun("rollout", 0, curve(T, seed=5))])
    fig = figure("kl_vs_step", context(fresh_store.uri, "kl_wide", fast_cfg, tmp_path))
    assert fig.axes[0].get_yscale() == "symlog" and len(visible_labels(fig, fig.axes[0])) >= 3


def test_tis_sensitivity_ticks_title_and_ci_claim(fresh_store, fast_cfg, tmp_path):
    """C values as a tuner leaves them (6 significant figures, two close together), token level only,
    one seed per C: labels at 3 significant figures that do not overlap, a title naming the token
    level alone, and no 95% CI claimed."""
    cs = (1.23456, 1.26111, 2.0, 7.98765)
    log_runs(fresh_store.uri, "tis_c", [SyntheticRun("tis", 0, curve(60, seed=k), clip_c=c, level="token")
                                        for k, c in enumerate(cs)])
    fig = figure("tis_sensitivity", context(fresh_store.uri, "tis_c", fast_cfg, tmp_path))
    assert "sequence" not in fig._suptitle.get_text() and "token" in fig._suptitle.get_text()
    for ax in fig.axes:
        labels = visible_labels(fig, ax, "x")
        texts = [t.get_text() for t in labels]
        assert texts and all(len(t.replace(".", "")) <= 3 for t in texts), texts
        boxes = [t.get_window_extent() for t in labels]
        assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2)), texts
        assert "95%" not in ax.get_ylabel() and "no CI" in ax.get_ylabel()


def title(fig) -> str:
    return fig._suptitle.get_text().replace("\n", " ")


def legend_outside(fig, ax) -> bool:
    """The axes' legend (or, without one, the figure's) does not overlap the axes' data area."""
    render(fig)
    legend = ax.get_legend() or fig.legends[0]
    return not legend.get_window_extent().overlaps(ax.get_window_extent())


def test_many_curves_get_small_multiples_with_legends_outside_and_integer_step_ticks(fresh_store, fast_cfg, tmp_path):
    runs = [SyntheticRun(e, s, curve(4, seed=s), n=n) for s in range(2)
            for e, n in [("mean_n", n) for n in (1, 2, 4, 8, 16)] + [("rollout", None), ("recompute", None), ("r3", None)]]
    log_runs(fresh_store.uri, "many", runs)
    fig = figure("reward_vs_step", context(fresh_store.uri, "many", fast_cfg, tmp_path))
    assert [ax.get_title() for ax in fig.axes] == ["routing replay", "sampling noise"]
    for ax in fig.axes:
        assert legend_outside(fig, ax)
        steps = [t.get_loc() for t in ax.xaxis.get_major_ticks() if ax.get_xlim()[0] <= t.get_loc() <= ax.get_xlim()[1]]
        assert steps and all(float(s).is_integer() for s in steps), steps


# ---- small multiples, bands, survival, forest (issue 28 item 8) -------------------------------------------------

MANY_SEEDS = 8


@pytest.fixture(scope="module")
def verdict_uri(empty_db, tmp_path_factory) -> str:
    """8 seeds of rollout (collapses in every seed), recompute, tis and mean_n(n=4) (stable), 3 seeds of icepop."""
    root = tmp_path_factory.mktemp("verdicts")
    shutil.copy(empty_db, root / "m.db")
    uri = f"sqlite:///{root / 'm.db'}"
    T = 60
    runs = []
    for s in range(MANY_SEEDS):
        runs += [SyntheticRun("rollout", s, curve(T, ramp=15, drop_at=35, seed=500 + s)),
                 SyntheticRun("recompute", s, curve(T, ramp=15, plateau=0.75, seed=600 + s)),
                 SyntheticRun("tis", s, curve(T, ramp=15, seed=700 + s), clip_c=2.0, level="token"),
                 SyntheticRun("mean_n", s, curve(T, ramp=15, plateau=0.78, seed=800 + s), n=4)]
    runs += [SyntheticRun("icepop", s, curve(T, ramp=15, seed=900 + s)) for s in range(3)]
    log_runs(uri, "verdicts", runs)
    return uri


def with_verdicts(uri, name, cfg, tmp_path, primary=()) -> FigureContext:
    ctx = context(uri, name, cfg, tmp_path)
    ctx.comparisons = run_verdicts(ctx.exp, ctx.measures, cfg, primary)
    return ctx


def test_small_multiples_one_panel_per_camp_shared_y_references_and_no_band_under_min_seeds(store, fast_cfg, tmp_path):
    """demo: 9 groups of 3 seeds: one panel per camp (recompute and rollout are the references, in every panel,
    not a baseline panel of their own), legends below the panels, and no band (3 < min_seeds)."""
    ctx = context(store.uri, "demo", fast_cfg, tmp_path)
    refs, panels = camp_panels(ctx.exp)
    assert refs == ["recompute", "rollout"] and [p.title for p in panels] == ["re-weighting", "sampling noise"]
    for name in ("reward_vs_step", "survival", "kl_vs_step"):
        fig = figure(name, ctx)
        assert [ax.get_title() for ax in fig.axes] == [p.title for p in panels], name
        a, b = fig.axes
        assert a.get_shared_y_axes().joined(a, b), name
        for ax, panel in zip(fig.axes, panels):
            assert legend_outside(fig, ax), (name, ax.get_title())
            shown = [t.get_text().split(":")[0] for t in ax.get_legend().get_texts()]
            assert shown == list(panel.labels), (name, shown)
            assert len(ax.lines) >= len(panel.labels) + len(refs)  # the references drawn in every panel
            if name != "survival":
                assert not ax.collections, f"{name}: a band with 3 seeds per group"
        if name != "survival":
            assert "no band: < 5 seeds per group" in title(fig)
    png = draw("reward_vs_step", ctx)[0]
    w, h = pixel_size("reward_vs_step", fast_cfg.dpi, panels=len(panels))
    assert mpimg.imread(png).shape[:2] == (h, w)


def test_band_only_for_groups_with_min_seeds(verdict_uri, fast_cfg, tmp_path):
    ctx = context(verdict_uri, "verdicts", fast_cfg, tmp_path)
    fig = figure("reward_vs_step", ctx)
    (ax,) = fig.axes
    assert len(ax.collections) == 4  # the four groups of 8 seeds; icepop (3) has none
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert [t for t in texts if "no band" in t] == ["icepop (3 seeds, no band)"], texts
    assert "groups with >= 5 seeds" in title(fig) and legend_outside(fig, ax)


def test_survival_curves_at_one_stay_visible_and_the_legend_is_outside(verdict_uri, fast_cfg, tmp_path):
    """Groups that never collapse share the line at 1.0: each drawn at its own small offset, the legend (with
    collapsed/runs) outside the data."""
    ctx = context(verdict_uri, "verdicts", fast_cfg, tmp_path)
    fig = figure("survival", ctx)
    (ax,) = fig.axes
    starts = [float(line.get_ydata()[0]) for line in ax.lines if not line.get_label().startswith("_")]
    assert len(starts) == 5 and len(set(np.round(starts, 6))) == 5, starts
    assert max(starts) - min(starts) <= 0.03
    assert "rollout: 8/8" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend_outside(fig, ax)
    for name in ("kl_vs_step", "collapse_onset"):
        fig = figure(name, ctx)
        assert legend_outside(fig, fig.axes[0]), name


def test_forest_has_one_row_per_shown_pair_primary_first_filled_when_it_separates(verdict_uri, fast_cfg, tmp_path):
    ctx = with_verdicts(verdict_uri, "verdicts", fast_cfg, tmp_path, primary=[("rollout", "recompute")])
    rows, counts = forest_rows(ctx.comparisons, fast_cfg.alpha)
    # 4 groups of 8 seeds: 6 pairs tested; the 4 pairs with icepop (3 seeds) are too few seeds
    assert counts["shown"] == counts["tested"] == 6 and counts["too_few"] == 4
    fig = figure("forest", ctx)
    render(fig)
    ax_collapse, ax_final = fig.axes[:2]
    assert ax_collapse.get_title().startswith("Collapse rate") and ax_final.get_title().startswith("Final reward")
    labels = [t.get_text() for t in ax_collapse.get_yticklabels()]
    pair_rows = [lab for lab in labels if MINUS in lab]
    assert len(pair_rows) == 6 and len(labels) == 8  # two family headers
    assert labels[0].startswith("primary") and pair_rows[0] == f"rollout {MINUS} recompute"
    assert labels[2].startswith("exploratory")
    assert "6 of 6 tested pairs shown" in title(fig) and "4 pairs with too few seeds" in title(fig)
    by_row = {(r[1][0], r[1][1]): r[2] for r in rows if r[0] == "pair"}
    for ax, ep in ((ax_collapse, "collapse"), (ax_final, "final")):
        points = [line for line in ax.lines if line.get_marker() == "o"]
        assert len(points) == 6, ep
        for line in points:
            y = int(round(line.get_ydata()[0]))
            a, b = labels[y].split(f" {MINUS} ")
            c = by_row[(a, b)][ep]
            assert line.get_xdata()[0] == pytest.approx(c.effect)
            assert (line.get_markerfacecolor() != "white") == (c.verdict == "separates"), (a, b, ep)
    # the planted effect separates: rollout collapses in every seed, recompute in none
    prim = by_row[("rollout", "recompute")]
    assert prim["collapse"].verdict == "separates" and prim["collapse"].effect == 1.0
    png = draw("forest", ctx)[0]
    w, h = pixel_size("forest", fast_cfg.dpi, rows=len(rows))
    assert mpimg.imread(png).shape[:2] == (h, w)


def test_forest_computes_the_verdicts_when_the_context_has_none(verdict_uri, fast_cfg, tmp_path):
    fig = figure("forest", context(verdict_uri, "verdicts", fast_cfg, tmp_path))
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0].startswith("exploratory") and sum(MINUS in lab for lab in labels) == 6


def test_forest_is_missing_at_three_seeds(store, fast_cfg, tmp_path):
    with pytest.raises(MissingInput, match="too few seeds"):
        figure("forest", with_verdicts(store.uri, "demo", fast_cfg, tmp_path))


def _pair(a, b, endpoint, p, family="exploratory", verdict="not shown"):
    return Comparison("pair", a, b, endpoint, "Wilcoxon signed-rank", True, 10, 10, 10, 0.1, p, family=family,
                      p_holm=min(1.0, 40 * p), lo=0.0, hi=0.2, verdict=verdict)


def test_forest_rows_show_primary_then_what_separates_then_the_smallest_p():
    groups = [f"g{i}" for i in range(10)]
    pairs = list(itertools.combinations(groups, 2))  # 45 pairs
    cs = []
    for k, (a, b) in enumerate(pairs):
        fam = "primary" if k == 44 else "exploratory"
        verdict = "separates" if k in (30, 31, 32) else "not shown"
        for ep in ("collapse", "final"):
            cs.append(_pair(a, b, ep, p=0.001 * (k + 1) if ep == "final" else 0.9, family=fam, verdict=verdict))
    rows, counts = forest_rows(cs, 0.05)
    shown = [r[1] for r in rows if r[0] == "pair"]
    assert counts["tested"] == 45 and counts["shown"] == len(shown) == 1 + 3 + FOREST_REST
    assert shown[0] == pairs[44] and shown[1:4] == pairs[30:33]
    assert shown[4:] == [pr for pr in pairs[:30]][:FOREST_REST]  # the rest by smallest p
    assert [r[1] for r in rows if r[0] == "header"] == ["primary: 0 of 1 separate", "exploratory: 3 of 44 separate"]
    assert math.isclose(counts["levels"]["exploratory"], 1 - 0.05 / 88)

"""Figures, checked through matplotlib's objects (ticks, labels, legend boxes) on small synthetic
experiments in a tmp MLflow store: the reliability review's figure findings, each a test."""
from __future__ import annotations

import itertools

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg

from analysis.figures import FigureContext, figure
from analysis.load import load_experiment
from analysis.measures import measure_experiment
from analysis.palette import Palette
from analysis.synthetic import SyntheticRun, curve, log_runs


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


def test_many_curves_put_the_legend_outside_the_data_with_integer_step_ticks(fresh_store, fast_cfg, tmp_path):
    runs = [SyntheticRun(e, s, curve(4, seed=s), n=n) for s in range(2)
            for e, n in [("mean_n", n) for n in (1, 2, 4, 8, 16)] + [("rollout", None), ("recompute", None), ("r3", None)]]
    log_runs(fresh_store.uri, "many", runs)
    fig = figure("reward_vs_step", context(fresh_store.uri, "many", fast_cfg, tmp_path))
    ax = fig.axes[0]
    render(fig)
    legend, frame = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.x0 >= frame.x1 - 1, (legend, frame)  # right of the axes, not over the curves
    steps = [t.get_loc() for t in ax.xaxis.get_major_ticks() if ax.get_xlim()[0] <= t.get_loc() <= ax.get_xlim()[1]]
    assert steps and all(float(s).is_integer() for s in steps), steps

"""The collapse detector against the labelled synthetic benchmark (the numbers docs/analysis.md records)
and the hand-labelled sets shipped in analysis/labelled. The full synthetic set is checked (detection only,
< 1 s); `python -m analysis validate` adds the change-point estimate."""
from __future__ import annotations

import pytest

from analysis.benchmark import synthetic_set
from analysis.config import AnalysisConfig
from analysis.load import AnalysisError
from analysis.validate import evaluate, labelled_sets, load_labelled

CFG = AnalysisConfig()


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_set()


def test_the_set_covers_what_it_claims(synthetic):
    assert len(synthetic) >= 1000
    assert synthetic_set(50, 3)[7].values.tolist() == synthetic_set(50, 3)[7].values.tolist()  # seeded
    noise = [c.noise for c in synthetic]
    assert min(noise) < 0.015 and max(noise) > 0.075
    drops = [c.drop_frac for c in synthetic if c.kind in ("collapse", "truncated", "small_drop", "grey")]
    assert min(drops) < 0.06 and max(drops) > 0.55
    tails = [len(c.values) - c.onset for c in synthetic if c.kind == "truncated"]
    assert min(tails) == 5 and max(tails) == 50
    assert {c.shape for c in synthetic} == {"linear", "exponential", "logistic"}
    assert {c.kind for c in synthetic} >= {"collapse", "truncated", "recovery", "small_drop", "rise", "flat", "wander"}


def test_detector_meets_the_benchmark_bars(synthetic):
    r = evaluate("synthetic", synthetic, CFG, with_cp=False)
    assert r.precision >= 0.95 and r.recall >= 0.90 and r.onset_err_median <= 10, (r.precision, r.recall, r.onset_err_median)
    for kind in ("flat", "wander", "rise"):
        n, flagged, _ = r.by_kind[kind]
        assert n >= 40 and flagged == 0, (kind, flagged)
    n, flagged, transient = r.by_kind["recovery"]
    assert flagged == 0 and transient >= 0.9 * n  # recoveries are transient dips, not collapses


def test_a_rule_needing_20_steps_fails_on_truncated_curves(synthetic):
    """Needing 20 steps below the line before the end (as the rule of 56d12ff did) misses the truncated
    collapses: the benchmark tells that rule from this one."""
    r = evaluate("synthetic", [c for c in synthetic if c.kind == "truncated"], CFG, with_cp=False)
    assert r.recall >= 0.9
    old = AnalysisConfig(collapse_persist=20, collapse_gain_frac=0.3)
    assert evaluate("truncated", [c for c in synthetic if c.kind == "truncated"], old, with_cp=False).recall < 0.9


def test_labelled_sets_load_and_are_scored():
    sets = labelled_sets()
    for name, curves in sets.items():
        assert curves, name
        r = evaluate(name, curves, CFG, with_cp=False)
        assert r.curves == len(curves)


def test_malformed_labelled_set_is_one_clear_error(tmp_path):
    (tmp_path / "x_labels.csv").write_text("curve,label,onset\na,collapsed,3\n")
    (tmp_path / "x_curves.csv").write_text("curve,step,reward\na,0,0.1\na,1,0.2\n")
    with pytest.raises(AnalysisError, match="unknown label"):
        load_labelled(tmp_path / "x_labels.csv")
    (tmp_path / "x_labels.csv").write_text("curve,label,onset\nb,stable,\n")
    with pytest.raises(AnalysisError, match="no points for curve 'b'"):
        load_labelled(tmp_path / "x_labels.csv")


def test_published_collapses_are_found():
    """KwaiKAT's Figure 1 (digitized, analysis/labelled/kwaikat_fig1_*.csv): recompute_logprob and rollout_logprob
    collapse and the figure stops soon after; the three stable curves are not flagged."""
    r = evaluate("kwaikat_fig1", labelled_sets()["kwaikat_fig1"], CFG, with_cp=False)
    assert (r.positives, r.tp, r.flagged) == (2, 2, 2) and r.onset_err_median <= 10


def test_exported_curves_round_trip_into_a_labelled_set(store, tmp_path):
    from analysis.validate import export_curves

    assert export_curves("single", store.uri, tmp_path / "own_curves.csv") == 2
    (tmp_path / "own_labels.csv").write_text("curve,label,onset,source,reason\n"
                                             "rollout/seed0,collapse,70,synthetic,drop at 70\n"
                                             "mean_n(n=8)/seed0,stable,,synthetic,no drop\n")
    r = evaluate("own", load_labelled(tmp_path / "own_labels.csv"), CFG, with_cp=False)
    assert (r.positives, r.tp, r.flagged) == (1, 1, 1) and r.onset_err_median <= 5
    with pytest.raises(AnalysisError, match="_curves.csv"):
        export_curves("single", store.uri, tmp_path / "own.csv")

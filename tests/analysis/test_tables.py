"""Tables: markdown, CSV and LaTeX (booktabs) renderings, parameters under every table."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.config import AnalysisConfig
from analysis.load import load_experiment
from analysis.measures import measure_experiment
from analysis.tables import KWAIKAT_PROBE, Table, latex_escape, marginal_table, noise_probe_table, summary_table


def test_rendering(tmp_path):
    cfg = AnalysisConfig()
    t = Table("x", "A | title", pd.DataFrame({"group": ["tis(C=2,token)", "a|b"], "P(A > B)": ["0.50", "1.00"]}),
              pd.DataFrame({"group": ["tis(C=2,token)", "a|b"], "poi": [0.5, 1.0]}), cfg.describe(),
              notes=["100% sure_"], short_footer=cfg.describe_short())
    md = t.markdown()
    assert md.splitlines()[0] == "| group | P(A > B) |" and "a\\|b" in md and "max(7*sigma/sqrt" in md
    tex = t.latex()
    for needle in ("\\toprule", "\\midrule", "\\bottomrule", "P(A \\textgreater{} B)", "100\\% sure\\_",
                   "a\\textbar{}b", "\\begin{tabular}{lr}"):
        assert needle in tex, needle
    paths = t.write(tmp_path)
    assert [p.suffix for p in paths] == [".md", ".csv", ".tex"]
    assert pd.read_csv(tmp_path / "x.csv")["poi"].tolist() == [0.5, 1.0]
    assert "max(7*sigma/sqrt" in t.terminal() and "<sub>" not in t.terminal()
    assert latex_escape("a_b&c") == "a\\_b\\&c"


def test_summary_and_probe_tables(store, fast_cfg):
    exp = load_experiment("demo", store.uri)
    m = measure_experiment(exp, fast_cfg)
    s = summary_table(exp, m, fast_cfg)
    row = s.data.set_index("group").loc["rollout"]
    assert row["collapsed"] == 3 and row["runs"] == 3 and row["final_iqm_lo"] <= row["final_iqm"] <= row["final_iqm_hi"]
    assert s.data.set_index("group").loc["mean_n(n=16)", "collapsed"] == 0
    assert s.data.set_index("group").loc["recompute", "collapsed"] == 1  # the NaN loss of seed 0
    p = noise_probe_table(exp, fast_cfg)
    d = p.data.set_index("model_kind")
    assert d.loc["moe", "kwaikat_probe/diff"] == KWAIKAT_PROBE["moe"]["probe/diff"] == 0.008
    assert d.loc["dense", "probe/var_rollout"] == 1e-5 and d.loc["moe", "probe_runs"] == 1


def test_probe_table_splits_perturbations_and_depths(store, fast_cfg):
    """Probe runs of the same model under other perturbations or depths are rows of their own, each MoE row
    divided by the dense twin of its own perturbation and depth."""
    d = noise_probe_table(load_experiment("probe_arms", store.uri), fast_cfg).data
    assert len(d) == 6 and (d["probe_runs"] == 1).all()
    moe = d[d["model_kind"] == "moe"].set_index(["perturbation", "model_shape"])["var_rollout_over_dense"]
    assert moe.loc[("none", "L2-E8-k4-d64")] == pytest.approx(2.0)
    assert moe.loc[("router=1", "L2-E8-k4-d64")] == pytest.approx(1e3)
    assert moe.loc[("none", "L8-E8-k4-d64")] == pytest.approx(40.0)
    assert list(d["perturbation"])[:2] == ["none", "none"]  # the unperturbed rows first
    assert d[d["model_kind"] == "dense"]["var_rollout_over_dense"].isna().all()


def test_group_by_perturbation_splits_groups_and_pools_arms(store, fast_cfg):
    """--group-by perturbation: one group per estimator and arm, the arm printed in the summary, and a
    table pooled over the estimators per arm (control first) with Wilson and stratified-bootstrap CIs."""
    exp = load_experiment("arms", store.uri, group_by=["perturbation"])
    m = measure_experiment(exp, fast_cfg)
    s = summary_table(exp, m, fast_cfg).data.set_index("group")
    assert len(s) == 4 and (s["runs"] == 3).all()
    assert sorted(s["perturbation"]) == ["bias=0.3", "bias=0.3", "none", "none"]
    # the control arm is labelled by its tag, "none", not as a missing value ("na")
    assert sorted(s.index) == ["recompute[bias=0.3]", "recompute[none]", "rollout[bias=0.3]", "rollout[none]"]
    by = marginal_table(exp, m, fast_cfg, "perturbation")
    d = by.data.set_index("perturbation")
    assert list(d.index) == ["none", "bias=0.3"] and (d["runs"] == 6).all() and (d["groups"] == 2).all()
    assert d.loc["bias=0.3", "collapsed"] == 6 and d.loc["none", "collapsed"] == 0
    assert d.loc["none", "collapse_rate_hi"] < d.loc["bias=0.3", "collapse_rate_lo"]  # the CIs separate
    assert d.loc["bias=0.3", "final_iqm_hi"] < d.loc["none", "final_iqm_lo"]
    assert marginal_table(load_experiment("demo", store.uri), m, fast_cfg, "perturbation") is None  # no such tag


def test_probability_of_improvement_needs_two_seeds(store, fast_cfg):
    """One seed against one: P(A > B) can only be 0, 1/2 or 1, so it is printed n/a, never 1.00."""
    from analysis.tables import poi_table

    exp = load_experiment("single", store.uri)
    t = poi_table(exp, measure_experiment(exp, fast_cfg), fast_cfg)
    cells = t.frame.drop(columns="P(row > column)").to_numpy().ravel()
    assert set(cells) == {"-", "n/a"} and t.data["poi"].isna().all()
    exp = load_experiment("demo", store.uri)  # 3 seeds per group: numbers
    t = poi_table(exp, measure_experiment(exp, fast_cfg), fast_cfg)
    assert "n/a" not in set(t.frame.drop(columns="P(row > column)").to_numpy().ravel())


def test_separation_at_three_seeds_says_too_few_seeds(store, fast_cfg):
    """demo: 3 seeds per group (rollout collapses 3/3, mean_n(n=16) 0/3). Below min_seeds (5) no pair is tested:
    every comparison is 'too few seeds', none separates; at min_seeds=3 the paired McNemar test of 3 discordant
    seeds has p = 2 / 2^3 = 0.25, so still nothing separates (where the old unpaired 95% intervals listed it)."""
    import dataclasses

    from analysis.verdict_tables import run_verdicts, separation_table

    exp = load_experiment("demo", store.uri)
    m = measure_experiment(exp, fast_cfg)
    cs = run_verdicts(exp, m, fast_cfg)
    assert cs and all(c.verdict == "too few seeds" for c in cs)
    t = separation_table(cs, fast_cfg)
    assert t.frame.empty and any("too few seeds" in n for n in t.notes)
    cs3 = run_verdicts(exp, m, dataclasses.replace(fast_cfg, min_seeds=3))
    pair = next(c for c in cs3 if {c.a, c.b} == {"rollout", "mean_n(n=16)"} and c.endpoint == "collapse")
    assert pair.test == "McNemar exact" and pair.n_pairs == 3 and pair.p == pytest.approx(0.25)
    assert not any(c.verdict == "separates" for c in cs3)

"""The along-training table (analysis/along.py): per run the mean of each metric over its logged steps, per group the
median over seeds and the interquartile range, checked by hand on the committed demo histories."""
from pathlib import Path

import numpy as np

from analysis.along import ALONG, along_table, run_means
from analysis.config import AnalysisConfig
from analysis.histories import load
from harness import metrics as M

DEMO = Path(__file__).resolve().parents[2] / "docs" / "results" / "demo" / "histories.json.gz"


def test_each_cell_is_the_median_over_seeds_of_the_run_means():
    exp = load(DEMO, metrics=ALONG + (M.REWARD_MEAN,))
    t = along_table(exp, AnalysisConfig())
    assert t is not None and list(t.data["group"]) == exp.labels
    label = exp.labels[1]
    ids = exp.group_runs(label)
    by_hand = [np.nanmean(exp.series(M.POLICY_CLIPFRAC, r).to_numpy()) for r in ids]
    row = t.data.set_index("group").loc[label]
    assert np.isclose(row[M.POLICY_CLIPFRAC], np.median(by_hand))
    assert np.isclose(row[f"{M.POLICY_CLIPFRAC} q1"], np.percentile(by_hand, 25))
    assert np.allclose(run_means(exp, M.POLICY_CLIPFRAC, ids), by_hand)
    assert M.POLICY_UPDATE_NORM not in t.data  # the demo's runs predate it: a metric nobody logged is left out


def test_no_table_without_the_metrics():
    exp = load(DEMO, metrics=(M.REWARD_MEAN,))
    assert along_table(exp, AnalysisConfig()) is None

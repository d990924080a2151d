"""Group labels, their canonical order and sweep families."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.labels import base_label, context_suffix, family_name, sort_key, sweep_families


def test_labels_from_tags():
    assert base_label({"estimator": "mean_n", "n": "8", "clip_c": "na", "level": "na"}) == "mean_n(n=8)"
    assert base_label({"estimator": "tis", "n": "na", "clip_c": "2.0", "level": "token"}) == "tis(C=2,token)"
    assert base_label({"estimator": "mis", "clip_c": "2"}) == "mis(C=2)"
    assert base_label({"estimator": "rollout", "n": "na", "clip_c": "na"}) == "rollout"
    assert context_suffix({"model": "dense_tiny"}, ["model"]) == "[dense_tiny]"
    assert context_suffix({"model": "m", "task": "t"}, ["model", "task"]) == "[model=m,task=t]"


def test_canonical_order():
    keys = [
        sort_key("mean_n", 16.0, np.nan, "", ""), sort_key("rollout", np.nan, np.nan, "", ""),
        sort_key("mean_n", 2.0, np.nan, "", ""), sort_key("tis", np.nan, 2.0, "token", ""),
        sort_key("zzz_custom", np.nan, np.nan, "", ""),
    ]
    order = sorted(range(len(keys)), key=lambda i: keys[i])
    assert order == [1, 3, 2, 0, 4]


def test_sweep_families():
    runs = pd.DataFrame({
        "estimator": ["mean_n"] * 3 + ["tis"] * 4 + ["rollout"],
        "n": [1.0, 4.0, 16.0] + [np.nan] * 5,
        "clip_c": [np.nan] * 3 + [2.0, 8.0, 2.0, 8.0, np.nan],
        "level": [""] * 3 + ["token", "token", "sequence", "sequence", ""],
        "label": ["mean_n(n=1)", "mean_n(n=4)", "mean_n(n=16)", "tis(C=2,token)", "tis(C=8,token)",
                  "tis(C=2,sequence)", "tis(C=8,sequence)", "rollout"],
    })
    fams = sweep_families(runs, "n", None)
    assert [family_name(g, "n") for g in fams.values()] == ["mean_n"]
    fams = sweep_families(runs, "clip_c", ("tis",))
    assert sorted(family_name(g, "clip_c") for g in fams.values()) == ["tis(sequence)", "tis(token)"]
    assert not sweep_families(runs[runs["estimator"] == "rollout"], "n", None)


def test_a_param_logged_null_by_one_group_and_absent_from_another_does_not_split_labels():
    """A key added to the schema later (a new estimator's parameter, null for every other estimator) is logged by
    runs made after it and absent from runs made before: the same spec either way, so it never enters a label."""
    from analysis.load import identity_labels

    base = {"g1": "recompute", "g2": "recompute"}
    params = {"g1": {"trainer.lr": "0.0003", "estimator.geo_lower": "None"}, "g2": {"trainer.lr": "0.00015"}}
    assert identity_labels(base, params) == {"g1": "recompute[trainer.lr=0.0003]", "g2": "recompute[trainer.lr=0.00015]"}
    params["g2"]["estimator.geo_lower"] = "0.9"  # a value, not null: it tells them apart
    assert identity_labels(base, params)["g2"] == "recompute[estimator.geo_lower=0.9,trainer.lr=0.00015]"


def test_a_label_reads_the_knobs_the_tags_lack_from_the_params(logged_store):
    """gmpo_rs's gamma_min never reached the run tags (harness.tags): the label takes it from the logged param, so
    plain GMPO (gamma_min 1) is `gmpo(eps=0.4)` and GMPO+RS `gmpo_rs(gmin=0.8,eps=0.4)`, in stores written before."""
    from analysis.load import load_experiment
    from analysis.synthetic import SyntheticRun, curve

    runs = [SyntheticRun("gmpo_rs", s, curve(30, seed=s), extra_tags={"log_clip": "0.4"},
                         params={"estimator.gamma_min": g, "estimator.log_clip": "0.4"})
            for g in ("1.0", "0.8") for s in range(2)]
    runs = [SyntheticRun(r.estimator, r.seed, r.reward, extra_tags={**r.extra_tags, "g": r.params["estimator.gamma_min"]},
                         params=r.params) for r in runs]  # two groups: the tag g splits their signatures
    uri = logged_store({"gmpo": runs})
    exp = load_experiment("gmpo", uri, metrics=("reward/mean",))
    assert sorted(exp.labels) == ["gmpo(eps=0.4)", "gmpo_rs(gmin=0.8,eps=0.4)"]

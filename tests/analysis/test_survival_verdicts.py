"""`python -m analysis survival`: time-to-collapse verdicts for declared pairs, on synthetic runs with known collapses
logged into a real temporary MLflow store, and from the exported histories file (the same tables)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.config import AnalysisConfig
from analysis.histories import export
from analysis.survival_verdicts import build_survival
from analysis.synthetic import SyntheticRun, curve

H, T = 100, 130  # horizon and steps logged: an unscored tail of 30
CFG = AnalysisConfig(bootstrap_reps=200, curve_reps=50)
SEEDS = range(8)


def _run(estimator, n, seed, kind, shift=0):
    """``event``: collapses at 40 + 5 seed + shift (before H); ``tail``: collapses at 110 (after H); ``stable``."""
    drop = 40 + 5 * seed + shift if kind == "event" else (110 if kind == "tail" else None)
    return SyntheticRun(estimator, 300 + seed, curve(T, ramp=25, noise=0.01, drop_at=drop, seed=500 + seed), n=n)


# recompute: 7 of 8 collapse before H (seed 7 collapses in the tail: censored); mean_8: none; tis: the same 7 seeds,
# first in odd seeds and second in even ones (a null); rollout: none; r3: recompute's curves exactly (ties)
RUNS = ([_run("recompute", None, s, "event" if s < 7 else "tail") for s in SEEDS]
        + [_run("mean_n", 8, s, "stable") for s in SEEDS]
        + [_run("tis", None, s, "event" if s < 7 else "stable", shift=-8 if s % 2 else 8) for s in SEEDS]
        + [_run("rollout", None, s, "stable") for s in SEEDS]
        + [_run("r3", None, s, "event" if s < 7 else "tail") for s in SEEDS])


# stopped before H: recompute seed 0 on a NaN loss from step 85 (its run ends at 89: an event), mean_8 seed 0 planned
# to end at 89 (censored there)
STOPPED = ([replace(_run("recompute", None, 0, "stable"), reward=_run("recompute", None, 0, "stable").reward[:90],
                    loss_nan_at=85),
            replace(_run("mean_n", 8, 0, "stable"), reward=_run("mean_n", 8, 0, "stable").reward[:90])]
           + [_run(e, n, s, "stable") for e, n in (("recompute", None), ("mean_n", 8)) for s in range(1, 4)])


@pytest.fixture(scope="module")
def store(logged_store):
    return logged_store({"positive": RUNS, "stopped": STOPPED})


def test_a_real_difference_is_shown_a_null_is_not_and_no_events_is_said(store, tmp_path):
    pairs = ["recompute|mean_n(n=8)", "recompute|tis", "mean_n(n=8)|rollout", "recompute|r3"]
    res = build_survival("positive", store, tmp_path / "out", CFG, H, pairs, echo=None)
    arms = res.arms.set_index("arm")
    assert arms.loc["recompute", "events"] == 7 and arms.loc["mean_n(n=8)", "events"] == 0  # the tail one censored
    p = res.pairs.set_index("B")
    assert p.loc["mean_n(n=8)", "verdict"] == "**shown**" and p.loc["mean_n(n=8)", "logrank_p"] < 0.01
    assert p.loc["mean_n(n=8)", "hr_method"] == "profile" and p.loc["mean_n(n=8)", "hr"] == 0  # no events in B
    assert np.isfinite(p.loc["mean_n(n=8)", "hr_hi"]) and p.loc["mean_n(n=8)", "hr_hi"] < 1  # an interval, not a point
    assert p.loc["tis", "verdict"] == "not shown"  # the same seeds collapse, each arm first in half of them
    assert p.loc["r3", "logrank_p"] == 1.0 and p.loc["r3", "verdict"] == "not shown"  # tied in every seed: no error
    assert p.loc["rollout", "verdict"] == "no events" and not np.isfinite(p.loc["rollout", "holm_p"])
    # Holm over the two tested pairs (statsmodels'), the untested one outside the family
    from statsmodels.stats.multitest import multipletests
    tested = res.pairs.dropna(subset=["logrank_p"])
    assert np.allclose(tested["holm_p"], multipletests(tested["logrank_p"], method="holm")[1])
    assert p.loc["mean_n(n=8)", "rmst_diff"] > 0  # B survives longer
    files = {f.name for f in res.files}
    assert {"arms.md", "pairs.md", "survival_runs.csv", "km.png"} <= files


def test_a_run_stopped_on_a_non_finite_loss_is_an_event_and_one_planned_short_is_censored(store, tmp_path):
    res = build_survival("stopped", store, tmp_path / "out", CFG, H, ["recompute|mean_n(n=8)"], echo=None)
    first = res.runs[res.runs["seed"] == 300].set_index("arm")
    assert first.loc["recompute", "event"] and first.loc["recompute", "time"] == 85
    assert not first.loc["mean_n(n=8)", "event"] and first.loc["mean_n(n=8)", "time"] == 89
    text = (tmp_path / "out" / "arms.md").read_text()
    assert "1 run(s) stopped before H without an event (censored at their last step)" in text
    assert "1 run(s) stopped before H after their event (events)" in text


def test_the_histories_file_gives_the_same_verdicts(store, tmp_path):
    path = tmp_path / "h.json.gz"
    export("positive", store, path, metrics=("reward/mean", "policy/loss"))
    a = build_survival("positive", store, tmp_path / "a", CFG, H, ["recompute|mean_n(n=8)"], echo=None)
    b = build_survival(None, None, tmp_path / "b", CFG, H, ["recompute|mean_n(n=8)"], source=path, echo=None)
    pd.testing.assert_frame_equal(a.pairs, b.pairs)
    assert (tmp_path / "a" / "pairs.md").read_text() == (tmp_path / "b" / "pairs.md").read_text()


@pytest.mark.parametrize("pair, says", [("recompute", "two different group labels"),
                                        ("recompute|nope", "no group 'nope'; the groups are")])
def test_a_bad_pair_is_one_line_exit_2_and_no_folder(store, tmp_path, capsys, pair, says):
    out = tmp_path / "out"
    assert main(["survival", "-e", "positive", "--tracking-uri", store, "--horizon", str(H), "--pair", pair,
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0]
    assert not out.exists()


# ---- the dose x estimator interaction (stage B's B6) and the critical doses
DOSES = ("0.001", "0.003", "0.01")


def _dosed(estimator, n, seed, dose, collapses):
    run = _run(estimator, n, seed, "event" if collapses else "stable")
    run.params = {"inference.kl_target": dose}
    run.extra_tags = {"group_sig": f"{estimator}-{dose}"}
    return run


def _collapses(arm, dose, seed):
    """recompute: 2, 5, 8 of 8 seeds collapse as the dose rises; mean_8: 1, 2, 3 (a flatter dose-response)."""
    k = {"recompute": (2, 5, 8), "mean_n": (1, 2, 3)}[arm][DOSES.index(dose)]
    return seed < k


DOSED = [_dosed(est, n, s, d, _collapses(est, d, s)) for est, n in (("recompute", None), ("mean_n", 8))
         for d in DOSES for s in SEEDS]


@pytest.fixture(scope="module")
def dosed_store(logged_store):
    return logged_store({"stage_b": DOSED})


def test_the_interaction_joins_the_family_and_the_critical_doses_are_the_glms(dosed_store, tmp_path):
    from analysis.survival import critical_dose

    res = build_survival("stage_b", dosed_store, tmp_path / "out", CFG, H, [], interaction="recompute|mean_n(n=8)",
                         echo=None)
    runs = res.runs
    assert set(runs["arm"]) == {"recompute", "mean_n(n=8)"} and sorted(set(runs["dose"])) == [0.001, 0.003, 0.01]
    rec = runs[runs["arm"] == "recompute"]
    want = critical_dose(rec["dose"], rec["event"])
    assert res.dose.ed50_a.point == pytest.approx(want.point) and 0.001 < want.point < 0.01
    assert res.dose.ed50_b.point > res.dose.ed50_a.point  # mean_8's dose-response is flatter and lower
    assert len(res.pairs) == 1 and res.pairs.loc[0, "hr_method"].startswith("interaction")
    assert res.pairs.loc[0, "holm_p"] == pytest.approx(res.dose.interaction.p)  # a family of one
    text = (tmp_path / "out" / "dose.md").read_text()
    assert "critical dose of recompute" in text and "F = critical dose of mean_n(n=8) / of recompute" in text


def test_an_interaction_of_an_arm_the_experiment_lacks_is_one_line_exit_2(dosed_store, tmp_path, capsys):
    assert main(["survival", "-e", "stage_b", "--tracking-uri", dosed_store, "--horizon", str(H),
                 "--interaction", "recompute|tis", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no arm 'tis'" in err[0] and not (tmp_path / "o").exists()


# ---- stage B's committed command, rehearsed on synthetic runs with stage B's arms (no stage B outcome is read)
def _stage_b_command() -> list[str]:
    """The `python -m analysis survival ...` line of sweeps/v4_stage_b.yaml's header, as argv after the module."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "sweeps" / "v4_stage_b.yaml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("#   python -m analysis survival"))
    return shlex.split(line[1:])[3:]


def _stage_b_run(arm: str, seed: int, collapses: bool) -> SyntheticRun:
    """One run tagged and logged as stage B's real runs are: estimator, n, C and level, the perturbation tag and the
    logged dose (``inference.kl_target``; the control logs none)."""
    est, n, c, level, dose = {
        "recompute": ("recompute", None, None, None, "0.01"), "rollout": ("rollout", None, None, None, "0.01"),
        "tis": ("tis", None, 2.0, "token", "0.01"), "r3": ("r3", None, None, None, "0.01"),
        "mean_8": ("mean_n", 8, None, None, "0.01"), "control": ("recompute", None, None, None, None),
        "recompute_half": ("recompute", None, None, None, "0.005"),
        "recompute_twice": ("recompute", None, None, None, "0.02"),
        "mean_8_half": ("mean_n", 8, None, None, "0.005"), "mean_8_twice": ("mean_n", 8, None, None, "0.02")}[arm]
    run = _run(est, n, seed, "event" if collapses else "stable")
    run.clip_c, run.level = c, level
    run.extra_tags = {"perturbation": "none" if dose is None else f"router@k3={float(dose):g}", "group_sig": arm}
    run.params = {} if dose is None else {"inference.kl_target": dose}
    return run


def test_stage_b_committed_command_runs_end_to_end_on_runs_shaped_like_stage_bs(logged_store, tmp_path):
    """The header command of sweeps/v4_stage_b.yaml (its pairs and interaction verbatim; only --from, --horizon and
    --out point elsewhere) finds every declared label among runs tagged as stage B's arms are, and writes the family
    of 5 pairs + the interaction and the critical doses. recompute collapses more as the dose rises, mean_8 less."""
    k = {"recompute": 4, "rollout": 3, "tis": 3, "r3": 4, "mean_8": 1, "control": 0, "recompute_half": 2,
         "recompute_twice": 6, "mean_8_half": 0, "mean_8_twice": 2}
    runs = [_stage_b_run(arm, s, s < n) for arm, n in k.items() for s in SEEDS]
    uri = logged_store({"v4_stage_b": runs})
    path = tmp_path / "h.json.gz"
    export("v4_stage_b", uri, path, metrics=("reward/mean", "policy/loss"))
    argv = _stage_b_command()
    for flag, value in (("--from", str(path)), ("--horizon", str(H)), ("--out", str(tmp_path / "out"))):
        argv[argv.index(flag) + 1] = value
    assert main(argv) == 0
    pairs = pd.read_csv(tmp_path / "out" / "pairs.csv")
    assert len(pairs) == 6 and pairs["hr_method"].iloc[-1].startswith("interaction")
    assert pairs.loc[0, ["A", "B"]].tolist() == ["recompute[router@k3=0.01]", "mean_n(n=8)[router@k3=0.01]"]
    arms = pd.read_csv(tmp_path / "out" / "arms.csv")
    assert len(arms) == 10 and "recompute[none]" in set(arms["arm"])
    text = (tmp_path / "out" / "dose.md").read_text()
    assert "Doses (`inference.kl_target` > 0): 0.005, 0.01, 0.02" in text  # the control (no dose) is not a dose

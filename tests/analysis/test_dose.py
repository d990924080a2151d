"""`python -m analysis dose`: perturbation tags -> arms, the dose table's numbers against hand computations, missing
metrics shown as '-', equal-KL matching, the CLI's files, on synthetic runs logged into a real temporary MLflow
sqlite store."""
from __future__ import annotations

import math
import shutil

import numpy as np
import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.config import AnalysisConfig
from analysis.dose import Arm, build_dose, parse_perturbation
from analysis.load import AnalysisError
from analysis.readme import refresh
from analysis.synthetic import SyntheticRun, curve, log_runs
from harness import metrics as M

T = 120
SEEDS = range(4)
NEAR_1E3 = (0.9e-3, 1.0e-3, 1.0e-3, 1.1e-3)  # per-run k3 of the three arms that sit at equal KL


def k3_steps(first: float, rest: float) -> np.ndarray:
    """k3 = ``first`` over the first 50 steps, ``rest`` after: mean (50 first + 70 rest) / 120."""
    return np.where(np.arange(T) < 50, first, rest)


def dose_runs() -> list[SyntheticRun]:
    """Five arms x 4 seeds with known answers.

    - none: stable, k3 1e-4 (bias_sq 1e-4, var 0);
    - router=0.1: stable, k3 ~1e-3, bias_sq 2e-4 + var 8e-4 (share 0.2);
    - router=0.3: every run collapses (drop at 60, 65, 70, 75), k3 2e-3 then 5.0..5.3e-3; bias_sq in 3 of 4 runs;
    - logit=0.05: stable, k3 ~1e-3, neither bias_sq nor var_rollout logged;
    - bias=0.9: seeds 0, 1 collapse, k3 ~1e-3, bias_sq 1e-3 + var 0 (share 1);
    - bias=0.7: seeds 0..2 collapse, k3 1e-2, starts at reward 0.5 (the others at 0.2).
    """
    runs = []

    def add(arm: str, s: int, k3: np.ndarray, drop: int | None, terms: tuple | None, r0: float = 0.2) -> None:
        extra = {M.MISMATCH_BIAS_SQ: np.full(T, terms[0]), M.NOISE_VAR_ROLLOUT: np.full(T, terms[1])} if terms else {}
        if arm == "router=0.3" and s == 3:
            extra.pop(M.MISMATCH_BIAS_SQ)
        runs.append(SyntheticRun("recompute", s, curve(T, r0=r0, ramp=30, drop_at=drop, noise=1e-3, seed=500 + s),
                                 k3=k3, extra_tags={"perturbation": arm}, extra_metrics=extra))

    for s in SEEDS:
        add("none", s, np.full(T, 1e-4), None, (1e-4, 0.0))
        add("router=0.1", s, np.full(T, NEAR_1E3[s]), None, (2e-4, 8e-4))
        add("router=0.3", s, k3_steps(2e-3, 5.0e-3 + 1e-4 * s), 60 + 5 * s, (1e-3, 3e-3))
        add("logit=0.05", s, np.full(T, NEAR_1E3[s]), None, None)
        add("bias=0.9", s, np.full(T, NEAR_1E3[s]), 70 if s < 2 else None, (1e-3, 0.0))
        add("bias=0.7", s, np.full(T, 1e-2 * (1 + 0.01 * s)), 70 if s < 3 else None, (1e-2, 0.0), r0=0.5)
    return runs


@pytest.fixture(scope="module")
def dose_store(empty_db, tmp_path_factory):
    root = tmp_path_factory.mktemp("dose")
    shutil.copy(empty_db, root / "m.db")
    uri = f"sqlite:///{root / 'm.db'}"
    log_runs(uri, "dose", dose_runs())
    log_runs(uri, "two_at_once", [SyntheticRun("recompute", 0, curve(60, seed=1),
                                                extra_tags={"perturbation": "router=1,bias=0.5"})])
    log_runs(uri, "two_estimators", [SyntheticRun(e, 0, curve(60, seed=2), extra_tags={"perturbation": "router=1"})
                                     for e in ("recompute", "rollout")])
    log_runs(uri, "two_specs", [SyntheticRun("recompute", 0, curve(60, seed=3 + k), extra_tags={"perturbation": "router=1",
                                                                                            "lr": lr})
                                for k, lr in enumerate(("1e-4", "1e-3"))])
    # a control and a router arm that also differ in the learning rate (each arm one spec): not a dose-response
    log_runs(uri, "two_lrs", [SyntheticRun("recompute", s, curve(60, seed=7 + s), extra_tags={"perturbation": arm},
                                           params={"trainer.lr": lr, "inference.router_noise_sigma": sigma})
                              for s in range(2) for arm, sigma, lr in (("none", "0.0", "1e-4"), ("router=1", "1.0", "1e-3"))])
    log_runs(uri, "one_lr", [SyntheticRun("recompute", s, curve(60, seed=7 + s), extra_tags={"perturbation": arm},
                                          params={"trainer.lr": "1e-4", "inference.router_noise_sigma": sigma})
                             for s in range(2) for arm, sigma in (("none", "0.0"), ("router=1", "1.0"))])
    return uri


@pytest.fixture(scope="module")
def result(dose_store, tmp_path_factory):
    cfg = AnalysisConfig(bootstrap_reps=1000, curve_reps=100)
    return build_dose("dose", dose_store, tmp_path_factory.mktemp("out"), cfg, echo=None)


# ---- tags -----------------------------------------------------------------------------------------------------

def test_parse_perturbation_tags():
    assert parse_perturbation("none").kind == "none"
    assert parse_perturbation("router=0.3") == Arm("router", 0.3)
    assert parse_perturbation("logit=0.05") == Arm("logit", 0.05)
    assert parse_perturbation("bias=0.8") == Arm("bias", 0.8)
    assert parse_perturbation("router=1").name == "router=1"
    # bias: a smaller delta is a larger dose
    order = sorted([Arm("bias", 0.7), Arm("none", math.nan), Arm("bias", 0.9), Arm("router", 1.0), Arm("logit", 0.1),
                    Arm("router", 0.1)], key=lambda a: a.order)
    assert [a.name for a in order] == ["none", "router=0.1", "router=1", "logit=0.1", "bias=0.9", "bias=0.7"]


@pytest.mark.parametrize("tag, msg", [
    ("router=1,bias=0.5", "2 perturbations at once"),
    ("temperature=0.7", "is not one of"),
    ("router=abc", "is not a number"),
    ("router=nan", "must be finite"),
    ("", "no `perturbation` tag"),
    (None, "no `perturbation` tag"),
])
def test_parse_perturbation_refuses(tag, msg):
    with pytest.raises(AnalysisError, match=msg):
        parse_perturbation(tag, "run x")


def test_cli_refuses_several_perturbations_and_several_estimators(dose_store, tmp_path, capsys):
    assert main(["dose", "-e", "two_at_once", "--tracking-uri", dose_store, "--out", str(tmp_path / "a")]) == 2
    assert "2 perturbations at once" in capsys.readouterr().err
    assert main(["dose", "-e", "two_estimators", "--tracking-uri", dose_store, "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "2 estimator configurations" in err and "--filter" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing written on refusal
    assert main(["dose", "-e", "two_specs", "--tracking-uri", dose_store, "--out", str(tmp_path / "c")]) == 2
    assert "router=1 hold runs of several specs" in capsys.readouterr().err and not (tmp_path / "c").exists()
    # the filter the message names makes it work
    assert main(["dose", "-e", "two_estimators", "--tracking-uri", dose_store, "--out", str(tmp_path / "b"),
                 "--filter", "tags.estimator = 'recompute'", "--set", "bootstrap_reps=200"]) == 0


def test_arms_that_differ_in_more_than_the_perturbation_are_refused(dose_store, tmp_path, capsys):
    """Each arm one spec, but the control at lr 1e-4 and the router arm at 1e-3: refused, naming the param;
    the same arms at one lr (only the perturbation's param differs) are a dose table."""
    assert main(["dose", "-e", "two_lrs", "--tracking-uri", dose_store, "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "differ in more than the perturbation (trainer.lr)" in err and "--filter" in err
    assert not (tmp_path / "a").exists()
    assert main(["dose", "-e", "one_lr", "--tracking-uri", dose_store, "--out", str(tmp_path / "b"),
                 "--set", "bootstrap_reps=200"]) == 0


def test_the_params_an_arm_may_differ_in_are_the_configs_perturbations():
    from analysis.dose import PERTURBATION_PARAMS
    from harness.spec import PERTURBATIONS

    assert PERTURBATION_PARAMS == {f"inference.{key}" for _, key, _ in PERTURBATIONS} | {"inference.kl_target"}


# ---- the table ------------------------------------------------------------------------------------------------

def row(result, arm: str) -> dict:
    data = result.tables["dose"].data
    return data[data["arm"] == arm].iloc[0].to_dict()


def cell(result, arm: str, col: str) -> str:
    frame = result.tables["dose"].frame
    return str(frame.loc[frame["arm"] == arm, col].iloc[0])


def test_rows_in_dose_order(result):
    assert list(result.tables["dose"].frame["arm"]) == ["none", "router=0.1", "router=0.3", "logit=0.05", "bias=0.9",
                                                       "bias=0.7"]


def test_collapse_counts_and_wilson_intervals(result):
    assert [cell(result, a, "collapsed") for a in ("none", "router=0.3", "bias=0.9", "bias=0.7")] == \
        ["0/4", "4/4", "2/4", "3/4"]
    # Wilson 95 %, by hand: 2/4 -> 0.5 -/+ 1.96 sqrt(1/16 + 1.96^2/64) / (1 + 1.96^2/4) = [0.150, 0.850]
    assert cell(result, "bias=0.9", "collapse rate") == "0.50 [0.15, 0.85]"
    # 4/4: lower bound (1 + z^2/8 - z sqrt(z^2/64)) / (1 + z^2/4) = 0.510
    assert cell(result, "router=0.3", "collapse rate") == "1.00 [0.51, 1.00]"
    assert cell(result, "none", "onset (KM median)") == "-"
    # every router=0.3 run collapses (drops at 60, 65, 70, 75): the KM median is the second onset, just before 65
    assert 55 <= row(result, "router=0.3")["onset_km_median"] <= 65


def test_final_reward_iqm(result):
    # bias=0.9: finals ~0.3, 0.3, 0.8, 0.8 -> IQM = mean of the middle two = 0.55
    assert row(result, "bias=0.9")["final_iqm"] == pytest.approx(0.55, abs=2e-3)
    assert row(result, "router=0.1")["final_iqm"] == pytest.approx(0.8, abs=2e-3)


def test_starting_reward(result):
    # the bias=0.7 curves start at 0.5, the others at 0.2: R0 (the smoothed first reward) is 0.3 higher, less the
    # share of the ramp the centred window sees, (0.8 - r0) x the same fraction
    lift = row(result, "bias=0.7")["r0_iqm"] - row(result, "router=0.1")["r0_iqm"]
    assert 0.2 < lift <= 0.3
    assert cell(result, "none", "R0 (IQM)").startswith("0.2")


def test_kl_along_training_first_last_and_terms(result):
    r = row(result, "router=0.3")
    # per run mean = (50 * 2e-3 + 70 * b) / 120 with b = 5.0, 5.1, 5.2, 5.3e-3; IQM = middle two -> b = 5.15e-3
    assert r["k3_iqm"] == pytest.approx((50 * 2e-3 + 70 * 5.15e-3) / 120, rel=1e-9)
    assert r["k3_first_iqm"] == pytest.approx(2e-3, rel=1e-9)
    assert r["k3_last_iqm"] == pytest.approx(5.15e-3, rel=1e-9)
    assert r["k3_iqm_lo"] <= r["k3_iqm"] <= r["k3_iqm_hi"]
    assert row(result, "router=0.1")["k3_iqm"] == pytest.approx(1e-3, rel=1e-9)  # IQM of 0.9, 1.0, 1.0, 1.1
    # bias share per run = bias_sq / (bias_sq + var)
    assert row(result, "router=0.1")["bias_share_iqm"] == pytest.approx(0.2, rel=1e-9)
    assert row(result, "bias=0.9")["bias_share_iqm"] == pytest.approx(1.0)
    assert row(result, "router=0.3")["bias_share_iqm"] == pytest.approx(0.25, rel=1e-9)
    assert cell(result, "router=0.1", "k3 along training (IQM)").startswith("0.001 [")
    assert cell(result, "router=0.1", "bias share") == "0.20 [0.20, 0.20]"


def test_missing_metrics_are_dashes_and_notes_never_zero(result):
    r = row(result, "logit=0.05")
    assert math.isnan(r["bias_sq_iqm"]) and math.isnan(r["var_rollout_iqm"]) and math.isnan(r["bias_share_iqm"])
    for col in ("bias_sq (IQM)", "var_rollout (IQM)", "bias share"):
        assert cell(result, "logit=0.05", col) == "-"
    notes = " ".join(result.tables["dose"].notes)
    assert "bias_sq: no value in any run of logit=0.05" in notes
    assert "router=0.3 (3/4 runs)" in notes  # bias_sq logged by 3 of its 4 runs: IQM over those
    assert row(result, "router=0.3")["bias_sq_runs"] == 3
    assert "0.0" not in cell(result, "logit=0.05", "bias_sq (IQM)")


# ---- equal KL -------------------------------------------------------------------------------------------------

def test_equal_kl_matches_only_overlapping_arms(result):
    data = result.tables["dose_equal_kl"].data
    pairs = {(r.arm_a, r.arm_b) for r in data.itertuples() if r.arm_a}
    assert pairs == {("router=0.1", "logit=0.05"), ("router=0.1", "bias=0.9"), ("logit=0.05", "bias=0.9")}
    frame = result.tables["dose_equal_kl"].frame
    unmatched = frame[frame["rate A - B [Newcombe CI]"].str.startswith("no arms at equal KL")]
    assert unmatched["kinds"].tolist() == ["none vs router", "none vs logit", "none vs bias"]
    # the nearest pair is named, not matched: none's 1e-4 against router=0.1's 1e-3
    assert unmatched.iloc[0]["rate A - B [Newcombe CI]"] == "no arms at equal KL (nearest: none / router=0.1, k3 ratio 0.1)"


def test_equal_kl_newcombe_interval_by_hand(result):
    data = result.tables["dose_equal_kl"].data
    r = data[(data["arm_a"] == "router=0.1") & (data["arm_b"] == "bias=0.9")].iloc[0]
    # 0/4 vs 2/4: Wilson [0, 0.490] and [0.150, 0.850]; d = -0.5;
    # lo = d - sqrt(0^2 + (0.850 - 0.5)^2) = -0.850, hi = d + sqrt(0.490^2 + (0.5 - 0.150)^2) = 0.102
    assert r["rate_diff"] == pytest.approx(-0.5)
    assert r["rate_diff_lo"] == pytest.approx(-0.8500, abs=1e-3)
    assert r["rate_diff_hi"] == pytest.approx(0.1021, abs=1e-3)
    assert r["k3_ratio"] == pytest.approx(1.0, rel=1e-9)


# ---- files ----------------------------------------------------------------------------------------------------

def test_cli_writes_every_file_and_readme_fills_the_block(dose_store, tmp_path, capsys):
    out = tmp_path / "results" / "dose"
    assert main(["dose", "-e", "dose", "--tracking-uri", dose_store, "--out", str(out), "--set",
                 "bootstrap_reps=200"]) == 0
    for name in ("dose.md", "dose.csv", "dose.tex", "dose.png", "dose.pdf", "dose_equal_kl.md", "dose_equal_kl.csv"):
        assert (out / name).stat().st_size > 0, name
    assert "Dose-response" in capsys.readouterr().out
    csv = pd.read_csv(out / "dose.csv")
    assert list(csv["arm"]) == ["none", "router=0.1", "router=0.3", "logit=0.05", "bias=0.9", "bias=0.7"]
    assert csv.loc[csv["arm"] == "logit=0.05", "bias_sq_iqm"].isna().all()
    doc = "x\n<!-- generated: results/dose/dose.md -->\nold\n<!-- /generated -->\n"
    new, changed = refresh(doc, tmp_path)
    assert changed == ["results/dose/dose.md"]
    assert "| bias=0.7 | 4 | 3/4 |" in new and "old" not in new


def test_figure_leaves_out_what_a_log_axis_cannot_show(result, tmp_path):
    from analysis.dose_figure import draw_dose

    arms = result.tables["dose"].data.copy()
    arms.loc[arms["arm"] == "none", "k3_iqm"] = 0.0  # e.g. a control whose k3 is exactly 0
    per_step = {"router=0.1": pd.Series([1e-3, 2e-3], index=[0, 1]), "none": pd.Series([0.0, 0.0], index=[0, 1])}
    paths, notes = draw_dose(arms, per_step, AnalysisConfig(), tmp_path)
    assert [p.name for p in paths] == ["dose.png", "dose.pdf"] and all(p.stat().st_size for p in paths)
    assert any("none: left out of the left panel" in n for n in notes)
    assert any("for none: not in the right panel" in n for n in notes)


# ---- KL-held arms (inference.kl_target: tag kind@k3=K) -----------------------------------------------------------

def test_parse_held_arms_sort_by_target_after_the_fixed_arms_of_their_kind():
    assert parse_perturbation("router@k3=0.003") == Arm("router", 0.003, held=True)
    assert parse_perturbation("bias@k3=0.01").name == "bias@k3=0.01"
    assert parse_perturbation("bias@k3=0.01").dose == 0.01  # a held bias's dose is its target, not 1 - delta
    order = sorted([Arm("bias", 0.01, True), Arm("bias", 0.001, True), Arm("router", 1.0), Arm("router", 0.003, True),
                    Arm("none", math.nan)], key=lambda a: a.order)
    assert [a.name for a in order] == ["none", "router=1", "router@k3=0.003", "bias@k3=0.001", "bias@k3=0.01"]
    with pytest.raises(AnalysisError, match="is not one of"):
        parse_perturbation("router@kl=0.1")


def test_held_arms_report_the_level_they_ran_at_count_the_runs_that_held_and_match_within_10_percent(empty_db, tmp_path):
    """router and bias held at 3e-3 (levels 0.2-0.5 logged per step), logit at 3e-3 with k3 7 % higher and a CI that
    misses the others' (matched by the 1.1x tolerance); bias seed 3 cannot hold its target late in the run."""
    shutil.copy(empty_db, tmp_path / "m.db")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    runs = []
    for s in SEEDS:
        for arm, level in (("router@k3=0.003", 0.2 + 0.01 * s), ("logit@k3=0.003", 0.3), ("bias@k3=0.003", 0.5 + 0.01 * s)):
            lv = np.full(T, level)
            lv[:10] = level * 3  # a transient: the run's mean is (10 * 3 + 110) / 120 = 7/6 of the level
            k3 = np.full(T, 3.2e-3 * (1 + 1e-4 * s) if arm.startswith("logit") else 3e-3 * (1 + 0.01 * s))
            if arm.startswith("bias") and s == 3:
                k3[-60:] = 1e-3  # at its bound: the last 50 steps 3x under the target
            runs.append(SyntheticRun("recompute", s, curve(T, r0=0.2, ramp=30, noise=1e-3, seed=700 + s),
                                     k3=k3, extra_tags={"perturbation": arm},
                                     extra_metrics={M.PERTURB_LEVEL: lv, M.MISMATCH_REC_K3: k3}))
    log_runs(uri, "held", runs)
    res = build_dose("held", uri, tmp_path / "out", AnalysisConfig(bootstrap_reps=500, curve_reps=50), echo=None)
    data = res.tables["dose"].data
    assert list(data["arm"]) == ["router@k3=0.003", "logit@k3=0.003", "bias@k3=0.003"]
    r = data[data["arm"] == "router@k3=0.003"].iloc[0]
    means = [(0.2 + 0.01 * s) * 7 / 6 for s in SEEDS]
    assert r["held_level_iqm"] == pytest.approx(np.mean(sorted(means)[1:3]))  # IQM of 4 = mean of the middle 2
    assert r["held_level_iqm_lo"] <= r["held_level_iqm"] <= r["held_level_iqm_hi"]
    # how the level moved: the first 50 steps hold the transient, (10 * 3 + 40) / 50 = 1.4x; the last 50 are at it
    levels = sorted(0.2 + 0.01 * s for s in SEEDS)[1:3]
    assert r["held_level_first_iqm"] == pytest.approx(1.4 * np.mean(levels))
    assert r["held_level_last_iqm"] == pytest.approx(np.mean(levels))
    frame = res.tables["dose"].frame
    assert list(frame["held (last 50)"]) == ["4/4", "4/4", "3/4"]
    pairs = res.tables["dose_equal_kl"].data
    logit = data[data["arm"] == "logit@k3=0.003"].iloc[0]
    assert logit["k3_iqm_lo"] > r["k3_iqm_hi"]  # the intervals miss each other ...
    assert ("router@k3=0.003", "logit@k3=0.003") in list(zip(pairs["arm_a"], pairs["arm_b"]))  # ... 1.07x: matched
    assert ("router@k3=0.003", "bias@k3=0.003") in list(zip(pairs["arm_a"], pairs["arm_b"]))


def test_held_is_judged_on_the_k3_the_controller_holds(empty_db, tmp_path):
    """The controller holds mismatch/rec_k3. rollout's mismatch/k3 is 0 (its pi_old is the sampler's), so a rollout
    arm held at 3e-3 held it in every run by rec_k3, whatever its own k3 says."""
    shutil.copy(empty_db, tmp_path / "m.db")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    log_runs(uri, "held_rollout", [
        SyntheticRun("rollout", s, curve(T, r0=0.2, ramp=30, noise=1e-3, seed=800 + s), k3=np.zeros(T),
                     extra_tags={"perturbation": "router@k3=0.003"},
                     extra_metrics={M.PERTURB_LEVEL: np.full(T, 0.2), M.MISMATCH_REC_K3: np.full(T, 3e-3)})
        for s in SEEDS])
    res = build_dose("held_rollout", uri, tmp_path / "out", AnalysisConfig(bootstrap_reps=200, curve_reps=50), echo=None)
    assert list(res.tables["dose"].frame["held (last 50)"]) == ["4/4"]


def test_a_table_without_held_arms_has_no_level_column(result):
    assert "level held (IQM)" not in result.tables["dose"].frame.columns

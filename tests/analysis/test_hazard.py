"""`python -m analysis hazard`: stage A's map and the pre-registered selection rule, on small synthetic stage-A-like
sweeps logged into a real temporary MLflow sqlite store (params as the harness logs them: strings), and from an
exported histories file. The rule's three outcomes: a qualifying cell, a tie going to the smaller lr, no cell."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.config import AnalysisConfig
from analysis.hazard import RULE_TEXT, build_hazard, cell_table, select_cell
from analysis.histories import export
from analysis.synthetic import SyntheticRun, curve
from harness import metrics as M

H, T = 100, 140  # horizon and steps logged: a tail of 40 unscored steps
LRS = ("0.0003", "0.0006")
DOSES = ("0.0", "0.001", "0.003")
SEEDS = range(4)
CFG = AnalysisConfig(bootstrap_reps=200, curve_reps=50)
ROOT = Path(__file__).resolve().parents[2]


def reward(kind: str, seed: int) -> np.ndarray:
    """``event``: collapses at step 50 + seed; ``stable``; ``tail``: collapses at step 115 (after H);
    ``dip``: down at step 85, back at 115 (open at H, recovered in the tail)."""
    x = curve(T, ramp=30, noise=0.01, drop_at=50 + seed if kind == "event" else (115 if kind == "tail" else None),
              seed=1000 + seed)
    if kind == "dip":
        x[85:115] = 0.3
    return x


def sweep(events: dict[tuple[str, str], int], extra: dict[tuple[str, str, int], str] | None = None,
          doses: tuple[str, ...] = DOSES):
    """One run per (dose, lr, seed); the first ``events[(dose, lr)]`` seeds collapse before H, the rest are stable
    unless ``extra`` gives their kind. Each cell is one spec (its own ``group_sig``, as the harness's spec signature
    would be)."""
    extra = extra or {}
    runs = []
    for dose in doses:
        for lr in LRS:
            for s in SEEDS:
                kind = "event" if s < events.get((dose, lr), 0) else extra.get((dose, lr, s), "stable")
                k3 = np.full(T, 1e-4 if dose == "0.0" else 1.1 * float(dose))
                runs.append(SyntheticRun(
                    "recompute", 200 + s, reward(kind, s), k3=k3, extra_metrics={M.MISMATCH_REC_K3: k3},
                    extra_tags={"perturbation": "none" if dose == "0.0" else f"router@k3={float(dose):g}",
                                "group_sig": f"k3={dose},lr={lr}"},
                    params={"inference.kl_target": dose, "trainer.lr": lr, "trainer.steps": str(T)}))
    return runs


# qualifies: (0.003, 6e-4) at 2/4 with its control at 0/4; (0.001, 3e-4) at 2/4 is out because its control is 2/4;
# the control at 6e-4 has a dip open at H that recovers in the tail and a collapse starting in the tail: neither
# is an event (counted, the control would be 2/4 and nothing would qualify)
QUALIFIES = sweep({("0.0", "0.0003"): 2, ("0.001", "0.0003"): 2, ("0.001", "0.0006"): 1, ("0.003", "0.0003"): 4,
                   ("0.003", "0.0006"): 2},
                  extra={("0.0", "0.0006", 2): "dip", ("0.0", "0.0006", 3): "tail"})
# tie: at dose 0.001 both lrs at 2/4 (equally near 0.5), both controls 0/4: the smaller lr wins
TIE = sweep({("0.001", "0.0003"): 2, ("0.001", "0.0006"): 2}, doses=("0.0", "0.001"))
# none: nothing in [0.3, 0.7] with a quiet control; 0.001 only equals the control, 0.003 exceeds it at 3e-4 (1/4 vs 0/4)
NONE = sweep({("0.0", "0.0006"): 2, ("0.001", "0.0006"): 2, ("0.003", "0.0003"): 1, ("0.003", "0.0006"): 2})
# short: seed 200 of the first cell diverges (a NaN loss from step 89 on, the run stopped at 89), seed 201 was planned
# to end at step 89 (no unscored tail); the notes tell the two apart
SHORT = sweep({}, doses=("0.0",))
SHORT[0] = replace(SHORT[0], reward=SHORT[0].reward[:90], loss_nan_at=89,
                   k3=SHORT[0].k3[:90], extra_metrics={M.MISMATCH_REC_K3: SHORT[0].k3[:90]})
SHORT[1] = replace(SHORT[1], reward=SHORT[1].reward[:90],
                   k3=SHORT[1].k3[:90], extra_metrics={M.MISMATCH_REC_K3: SHORT[1].k3[:90]})


@pytest.fixture(scope="module")
def hazard_store(logged_store):
    return logged_store({
        "map_qualifies": QUALIFIES, "map_tie": TIE, "map_none": NONE, "map_short": SHORT,
        "map_no_lr": [SyntheticRun("recompute", 0, curve(60, seed=1), params={"inference.kl_target": "0.0"})],
        "map_two_estimators": [SyntheticRun(e, 0, curve(60, seed=2), params={"inference.kl_target": "0.0",
                                                                             "trainer.lr": "0.0003"})
                               for e in ("recompute", "rollout")]})


@pytest.fixture(scope="module")
def qualifies(hazard_store, tmp_path_factory):
    return build_hazard("map_qualifies", hazard_store, tmp_path_factory.mktemp("q"), CFG, H, echo=None)


def cell(result, dose: float, lr: float) -> pd.Series:
    c = result.cells
    return c[(c["dose"] == dose) & (c["lr"] == lr)].iloc[0]


def test_a_qualifying_cell_is_chosen(qualifies):
    assert qualifies.rule.chosen == (0.003, 0.0006)
    text = (qualifies.files[0].parent / "rule.md").read_text()
    assert "**Chosen cell: dose 0.003 at lr 0.0006**" in text and "recompute 2/4" in text
    v = qualifies.rule.verdicts.set_index(["dose", "lr"])
    assert v.loc[(0.001, 0.0003), "in_range"] and not v.loc[(0.001, 0.0003), "control_ok"]  # its control: 2/4


def test_the_tail_rule_decides_the_control(qualifies):
    ctrl = qualifies.runs[(qualifies.runs["dose"] == 0) & (qualifies.runs["lr"] == 0.0006)].set_index("seed")
    assert not ctrl.loc[[202, 203], "event"].any() and (ctrl.loc[[202, 203], "time"] == H).all()
    assert cell(qualifies, 0.0, 0.0006)["events"] == 0


def test_map_cells_counts_intervals_and_achieved_dose(qualifies):
    c = cell(qualifies, 0.003, 0.0003)
    assert (c["runs"], c["events"], c["share"], c["share_hi"]) == (4, 4, 1.0, 1.0)
    assert c["share_lo"] == pytest.approx(0.025 ** (1 / 4))  # Clopper-Pearson, k = n
    assert c["achieved"] == pytest.approx(3.3e-3)
    assert 44 <= c["km_median"] <= 56  # drops at 50 + seed (the onset walks back over the smoothing window)
    assert math.isnan(cell(qualifies, 0.0, 0.0006)["km_median"])
    assert len(qualifies.cells) == 6 and qualifies.cells["dose"].is_monotonic_increasing
    md = (qualifies.files[0].parent / "map.md").read_text()
    assert "0 (no noise)" in md and "4/4" not in md and "1.00 [0.40, 1.00]" in md


def test_files_written(qualifies):
    folder = qualifies.files[0].parent
    for name in ("map.md", "map.csv", "rule.md", "hazard_runs.csv", "map.png", "km.png"):
        assert (folder / name).stat().st_size > 0, name
    assert pd.read_csv(folder / "map.csv")["events"].sum() == qualifies.cells["events"].sum()


def test_a_tie_goes_to_the_smaller_lr(hazard_store, tmp_path):
    r = build_hazard("map_tie", hazard_store, tmp_path, CFG, H, echo=None)
    assert r.rule.chosen == (0.001, 0.0003) and r.rule.ties == [0.0003, 0.0006]
    assert "the tie goes to the smaller lr, 0.0003" in (tmp_path / "rule.md").read_text()


def test_no_cell_qualifies_and_the_onset_dose_is_named(hazard_store, tmp_path):
    r = build_hazard("map_none", hazard_store, tmp_path, CFG, H, echo=None)
    assert r.rule.chosen is None and r.rule.onset == (0.003, [0.0003])
    text = (tmp_path / "rule.md").read_text()
    assert "**No cell qualifies.**" in text and "**0.003** (lr 0.0003: 1/4 vs the control's 0/4)" in text


def test_notes_tell_a_diverged_run_from_one_planned_short(hazard_store, tmp_path):
    r = build_hazard("map_short", hazard_store, tmp_path, CFG, H, echo=None)
    first = r.runs[r.runs["lr"] == 0.0003].set_index("seed")  # SHORT[0] and SHORT[1]: the first cell's seeds 200, 201
    ids = first["run_id"].str[:8]
    diverged = next(n for n in r.notes if "non-finite" in n)
    assert diverged.startswith("1 run(s) stopped before H = 100 on a non-finite value")
    assert f"{ids[200]} (a non-finite loss at step 89)" in diverged and ids[201] not in diverged
    short = next(n for n in r.notes if "no unscored tail" in n)
    assert short.startswith("1 run(s) end at or before H = 100") and short.endswith(f": {ids[201]}.")
    assert first.loc[200, "event"] and not first.loc[201, "event"]
    assert "a non-finite loss at step 89" in (tmp_path / "rule.md").read_text()


def test_nearest_half_and_ties_on_eight_seeds():
    def cells(rows):
        return pd.DataFrame([{"dose": d, "lr": lr, "runs": 8, "events": k} for d, lr, k in rows])
    base = [(0.0, 1.0, 1), (0.0, 2.0, 0), (0.0, 3.0, 0)]
    assert select_cell(cells(base + [(1.0, 1.0, 3), (1.0, 2.0, 4), (1.0, 3.0, 5)])).chosen == (1.0, 2.0)
    tie = select_cell(cells(base + [(1.0, 1.0, 3), (1.0, 2.0, 5), (1.0, 3.0, 6)]))
    assert tie.chosen == (1.0, 1.0) and tie.ties == [1.0, 2.0]
    # 0.15 admits 1 of 8 in the control; 2 of 8 does not; 0.3 admits 3 of 10 exactly
    assert select_cell(cells([(0.0, 1.0, 2), (1.0, 1.0, 4)])).chosen is None
    exact = pd.DataFrame([{"dose": 0.0, "lr": 1.0, "runs": 20, "events": 3}, {"dose": 1.0, "lr": 1.0, "runs": 10,
                                                                               "events": 3}])
    assert select_cell(exact).chosen == (1.0, 1.0)
    assert select_cell(cells([(0.0, 1.0, 8), (1.0, 1.0, 8)])).onset is None  # never exceeds the control


def test_the_rule_text_is_the_preregistration_verbatim():
    prereg = (ROOT / "docs" / "preregistration_v4.md").read_text()
    assert RULE_TEXT in prereg


def test_cli_store_and_from_file_write_the_same_map(hazard_store, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["hazard", "-e", "map_qualifies", "--tracking-uri", hazard_store, "--horizon", str(H),
                 "--out", str(a)]) == 0
    assert "Chosen cell" in capsys.readouterr().out
    export("map_qualifies", hazard_store, tmp_path / "h.json.gz")
    assert main(["hazard", "--from", str(tmp_path / "h.json.gz"), "--horizon", str(H), "--out", str(b)]) == 0
    for name in ("map.csv", "map.md", "rule.md", "hazard_runs.csv"):
        assert (a / name).read_text() == (b / name).read_text(), name


@pytest.mark.parametrize("argv, msg", [
    (["-e", "map_qualifies", "--horizon", "0"], "--horizon must be a positive"),
    (["-e", "map_no_lr", "--horizon", "50"], "param `trainer.lr`"),
    (["-e", "map_two_estimators", "--horizon", "50"], "2 estimator configurations"),
])
def test_cli_refuses_bad_input_with_exit_2(hazard_store, tmp_path, capsys, argv, msg):
    assert main(["hazard", *argv, "--tracking-uri", hazard_store, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_cell_table_counts_a_run_censored_before_the_horizon():
    runs = pd.DataFrame({"dose": [0.0, 0.0], "lr": [1.0, 1.0], "seed": [0, 1], "time": [40.0, 100.0],
                         "event": [False, True], "final": [0.5, 0.2], "achieved": [1e-4, np.nan]})
    c = cell_table(runs, 100).iloc[0]
    assert (c["runs"], c["events"], c["censored_early"], c["achieved"]) == (2, 1, 1, 1e-4)

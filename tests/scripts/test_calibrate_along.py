"""scripts/calibrate_along.py (issue 42, item 4): probes along a run, and the per-phase table's reading."""
import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("calibrate_along", ROOT / "scripts" / "calibrate_along.py")
calibrate_along = importlib.util.module_from_spec(spec)
spec.loader.exec_module(calibrate_along)


def _row(step, diff, var):
    return {"step": step, "scale": 1.0, "diff": diff, "var_rollout": var, "ratio": var / diff ** 2, "p99": 0.1,
            "p999": 0.3, "flip_rate": 0.05, "rec_k3": 1e-3}


def test_the_phase_table_says_which_moments_hold_and_which_drift():
    # diff held at KwaiKAT's 0.008; var_rollout drifts 10x down in the last phase, so the ratio leaves 2x too
    rows = [_row(s, 0.008, 1e-3 if s < 200 else 1e-4) for s in range(0, 301, 50)]
    table = calibrate_along.phase_table(rows, 300, 3)
    assert "- diff: within 2x of KwaiKAT's in every phase (yes, yes, yes)" in table
    assert "- var_rollout: leaves 2x of KwaiKAT's in some phase (yes, yes, no)" in table
    assert [line.split(" (")[0] for line in table.splitlines() if line[:3] in ("| 1", "| 2", "| 3")] == ["| 1", "| 2", "| 3"]


def test_a_short_run_is_probed_at_its_steps_and_written(tmp_path, monkeypatch):
    from harness.backends.local import warmstart
    monkeypatch.setattr(warmstart, "CACHE", tmp_path / "cache")
    assert calibrate_along.main(["--steps", "4", "--every", "2", "--passes", "2", "--sequences", "8",
                                 "--out", str(tmp_path / "out"), "trainer.prompts_per_step=4",
                                 "trainer.group_size=4", "task.warmstart.max_steps=0"]) == 0
    lines = (tmp_path / "out" / "along.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in lines] == ["step", "0", "2", "4"]
    scales = [float(line.split(",")[1]) for line in lines[1:]]
    assert scales[0] == 1.0 and scales[1] != 1.0  # the controller moved c_t, and the probe ran at it
    assert all(math.isfinite(float(x)) for x in lines[2].split(",")[2:])

"""``benchmarks/gpu_study.sh`` (issue 41, item 1) with ``SMOKE=1``: the same script a bare GPU machine runs, here on
the CPU with this environment's packages (so no carried wheel is missing and none is installed): a named sweep run as
seed packs, its store under MOE_RL_HOME, and the histories, report, status and timings in OUT."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _study(tmp_path, out: str, home: str, *overrides: str, **extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "wheels").mkdir(exist_ok=True)
    env = {**os.environ, "SMOKE": "1", "PY": sys.executable, "OUT": str(tmp_path / out),
           "MOE_RL_HOME": str(tmp_path / home), "SITE": str(tmp_path / "site"), "WHEELS": str(tmp_path / "wheels"),
           **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    try:
        return subprocess.run(["bash", "benchmarks/gpu_study.sh", "sweeps/tiny.yaml", *overrides], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=600)
    finally:  # whatever happened, no job of this scratch outlives the test
        subprocess.run(["pkill", "-9", "-f", f"submitit.core._submit {tmp_path / home}/"], check=False)


@pytest.fixture(scope="module")
def first_call(tmp_path_factory):
    """One call of the script, as a bare GPU machine would make it (with PARTS: its finished runs archived)."""
    root = tmp_path_factory.mktemp("gpu_study")
    return root, _study(root, "out", "home", "trainer.steps=4", PARTS=str(root / "parts"))


def test_the_gpu_study_script_runs_a_sweep_and_brings_back_histories_and_report(first_call):
    tmp_path, done = first_call
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert "carry_install: 0 of 0 carried wheels missing" in done.stdout
    with gzip.open(out / "tiny" / "histories.json.gz", "rt") as f:
        runs = json.load(f)["runs"]
    assert len(runs) == 4 and {r["tags"]["numerics.key"].split(" | ")[0] for r in runs} == {"torch " + __import__(
        "torch").__version__}
    assert (out / "tiny" / "report.md").exists() and (out / "status.txt").read_text().count("finished") >= 4
    assert (tmp_path / "home" / "mlruns.db").exists()  # the store under MOE_RL_HOME, not in the checkout
    assert [line.split()[0] for line in (out / "timing.txt").read_text().splitlines()] == [
        "install", "sweep", "export+report", "total"]


def test_without_wheels_it_says_what_to_run_and_exits_2(tmp_path):
    env = {**os.environ, "PY": sys.executable, "OUT": str(tmp_path / "out"), "WHEELS": str(tmp_path / "none")}
    done = subprocess.run(["bash", "benchmarks/gpu_study.sh", "sweeps/tiny.yaml"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "make gpu-wheels" in done.stderr


def test_a_study_longer_than_a_call_goes_on_from_its_parts_in_the_next_call(first_call, tmp_path):
    """PARTS: the first call archives its finished runs as a part in OUT/parts; the next call, in a fresh scratch
    (a new device machine), restores them and trains nothing; BUDGET_S stops a sweep and still archives."""
    root, first = first_call
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    (part,) = sorted((root / "out" / "parts").glob("part-*.json.gz"))
    with gzip.open(part, "rt") as f:
        assert len(json.load(f)["runs"]) == 4

    second = _study(tmp_path, "out2", "home2", "trainer.steps=4", PARTS=str(root / "out" / "parts"))
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
    assert "4 runs restored from 1 parts" in second.stdout and "0 to submit, 4 finished (skipped)" in second.stdout
    assert "nothing new to archive" in second.stdout
    assert [p.name for p in (tmp_path / "out2" / "parts").glob("part-*")] == [part.name]

    stopped = _study(tmp_path, "out3", "home3", "trainer.steps=4000", "experiment=tiny_b", PARTS=str(tmp_path / "none"),
                     BUDGET_S="20")
    assert stopped.returncode == 0, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    assert "the sweep stopped after BUDGET_S=20 s (its jobs ended)" in stopped.stdout
    assert "hold 0 runs of 'tiny_b'" in stopped.stdout  # the override's experiment; no 4000-step run finished
    alive = subprocess.run(["pgrep", "-f", f"submitit.core._submit {tmp_path / 'home3'}/"], capture_output=True)
    assert alive.returncode == 1, alive.stdout  # the stopped sweep's jobs are gone


def test_parts_of_another_experiment_are_refused_before_anything_trains(first_call, tmp_path):
    root, _ = first_call
    done = _study(tmp_path, "out", "home", "trainer.steps=4", "experiment=other", PARTS=str(root / "out" / "parts"))
    assert done.returncode == 2 and "holds experiment 'tiny', not 'other'" in done.stderr
    assert not (tmp_path / "home" / "mlruns.db").exists() or "to submit" not in done.stdout

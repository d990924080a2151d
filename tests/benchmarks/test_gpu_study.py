"""``benchmarks/gpu_study.sh`` (issue 41, item 1) with ``SMOKE=1``: the same script a bare GPU machine runs, here on
the CPU with this environment's packages (so no carried wheel is missing and none is installed): a named sweep run as
seed packs, its store under MOE_RL_HOME, and the histories, report, status and timings in OUT."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_study_script_runs_a_sweep_and_brings_back_histories_and_report(tmp_path):
    (tmp_path / "wheels").mkdir()
    env = {**os.environ, "SMOKE": "1", "PY": sys.executable, "OUT": str(tmp_path / "out"),
           "MOE_RL_HOME": str(tmp_path / "home"), "SITE": str(tmp_path / "site"), "WHEELS": str(tmp_path / "wheels")}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(["bash", "benchmarks/gpu_study.sh", "sweeps/tiny.yaml", "trainer.steps=4"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    assert "0 of 0 carried wheels missing" in done.stdout
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

"""``benchmarks/gpu_session.sh`` with ``SMOKE=1``: the one call a lent GPU gets, here tiny on the CPU with this
environment's packages: every part writes its table, within its limit, and the study part brings back its report and
its finished runs as a part."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_session_writes_every_table(tmp_path):
    (tmp_path / "wheels").mkdir()
    env = {**os.environ, "SMOKE": "1", "PY": sys.executable, "OUT": str(tmp_path / "out"),
           "MOE_RL_HOME": str(tmp_path / "home"), "SITE": str(tmp_path / "site"), "WHEELS": str(tmp_path / "wheels")}
    env.pop("MLFLOW_TRACKING_URI", None)
    try:
        done = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
    finally:
        subprocess.run(["pkill", "-9", "-f", f"submitit.core._submit {tmp_path}/"], check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = tmp_path / "out"
    timing = (out / "timing.txt").read_text().splitlines()
    assert [line.split()[0] for line in timing] == ["setup", "throughput", "deterministic", "identity", "resume", "study"]
    assert all(line.endswith("(exit 0)") for line in timing), timing
    setup = (out / "setup.md").read_text()
    assert "| set-up s |" in setup and "| estimator=recompute | 2 |" in setup
    assert "estimator=mean_n,estimator.n=8 | 2 |" in (out / "throughput.md").read_text()
    assert (out / "identity.txt").read_text().count("bitwise the same") == 2  # on a CPU; measured on a GPU
    assert "bitwise: yes" in (out / "resume.txt").read_text()
    assert (out / "study" / "tiny" / "report.md").exists() and list((out / "study" / "parts").glob("part-*.json.gz"))

"""slurm/ray_multinode.sbatch on the real single-node cluster: Ray head up, the driver joins it."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.uri import ROOT


def test_ray_template_runs_a_driver_on_its_cluster(slurm_cluster, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (it comes with verl: scripts/install.sh test)")
    venv_bin = Path(sys.executable).parent
    driver = "import ray; ray.init(); r = ray.cluster_resources(); print('RAY_CPUS', int(r['CPU']))"
    t0 = time.time()
    jid = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--mem=2G", "--time=10",
         f"--chdir={tmp_path}", f"--export=ALL,PATH={venv_bin}:/usr/bin:/bin:/usr/sbin:/sbin",
         str(ROOT / "slurm" / "ray_multinode.sbatch"), "python", "-c", driver],
        capture_output=True, text=True, check=True).stdout.strip().split(";")[0]
    while subprocess.run(["squeue", "-h", "-j", jid, "-t", "PD,R,CG"], capture_output=True, text=True).stdout.strip():
        if time.time() - t0 > 150:
            pytest.fail("the Ray job did not finish in 150 s")
        time.sleep(1)
    out = (tmp_path / f"slurm-ray-multinode-{jid}.out").read_text()
    assert "1 node(s) up" in out and "RAY_CPUS 1" in out, out
    show = subprocess.run(["scontrol", "show", "job", jid], capture_output=True, text=True).stdout
    assert "ExitCode=0:0" in show, out
    print(f"\n[slurm] Ray template job: {time.time() - t0:.0f} s")

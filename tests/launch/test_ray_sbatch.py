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


# ------------------------------------------------------------------------ worker retries, with a fake Ray and Slurm
SBATCH = ROOT / "slurm" / "ray_multinode.sbatch"
FAKES = {
    # srun: drop its options (-w NODE, --flags), run the command here
    "srun": 'while [ $# -gt 0 ]; do case "$1" in -w) shift 2;; --*) shift;; *) break;; esac; done\nexec "$@"\n',
    "scontrol": 'case "$1 $2" in "show hostnames") printf "h0\\nh1\\n";; esac\n',
    # ray: the head starts at once; a worker's `ray start --address` fails while FAILS holds a count > 0
    "ray": ('echo "$*" >> "$STATE/calls"\n'
            'case "$1 $2" in\n'
            '  "start --address="*) n=$(cat "$STATE/fails"); if [ "$n" -gt 0 ]; then echo $((n - 1)) > "$STATE/fails";'
            ' echo "ConnectionError: GCS at $RAY_ADDRESS not reachable" >&2; exit 1; fi; echo up >> "$STATE/joined";;\n'
            'esac\nexit 0\n'),
    # the head's node count (`python - <<EOF ... ray.nodes()`): itself + the joined workers
    "python": ('if [ "$1" = "-" ]; then cat >/dev/null; echo $(( 1 + $(cat "$STATE/joined" 2>/dev/null | wc -l) ));'
               ' else exec "$REAL_PYTHON" "$@"; fi\n'),
    "sleep": 'echo "$1" >> "$STATE/sleeps"\n',  # no real waiting: the waits are recorded
}


def _fakes(tmp_path: Path, fails: int) -> dict[str, str]:
    """A folder of fake srun/scontrol/ray/python/sleep first on PATH; the environment that runs the template."""
    import os

    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir()
    state.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    (state / "fails").write_text(f"{fails}\n")
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state),
            "REAL_PYTHON": sys.executable, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[0-1]",
            "SLURM_CPUS_PER_TASK": "2", "RAY_START_TIMEOUT_S": "300"}


def test_a_worker_that_starts_before_the_head_retries_until_it_joins(tmp_path):
    env = _fakes(tmp_path, fails=3)
    proc = subprocess.run(["bash", str(SBATCH), "echo", "DRIVER-RAN"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "2 node(s) up" in proc.stdout and "DRIVER-RAN" in proc.stdout, proc
    log = (tmp_path / "ray-7-h1.log").read_text()
    assert "joined the head" in log and "(try 4)" in log, log
    calls = (tmp_path / "state" / "calls").read_text().splitlines()
    joins = [c for c in calls if c.startswith("start --address=")]
    assert len(joins) == 4 and all("--num-cpus=2" in c and "--block" not in c for c in joins), calls
    assert calls.count("stop --force") >= 3  # a half-started raylet stopped after each failed try
    sleeps = [s for s in (tmp_path / "state" / "sleeps").read_text().split() if s != "3"]  # 3: the head's poll
    assert sleeps == ["2", "4", "8", "infinity"], sleeps  # doubling waits, then the worker's step is held


def test_a_worker_gives_up_after_the_start_timeout(tmp_path):
    """join_head on its own (extracted from the template): every try fails; the next wait would pass the deadline."""
    env = {**_fakes(tmp_path, fails=100), "RAY_START_TIMEOUT_S": "5", "RAY_JOIN_BACKOFF_S": "4",
           "RAY_ADDRESS": "10.0.0.1:6379", "CPUS": "1", "GPUS": "0"}
    script = f'eval "$(sed -n \'/^join_head() {{/,/^}}/p\' {SBATCH})"; join_head'
    proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "could not join the head at 10.0.0.1:6379 (2 tries)" in proc.stderr, proc
    assert (tmp_path / "state" / "sleeps").read_text().split() == ["4"]
    assert not (tmp_path / "state" / "joined").exists()

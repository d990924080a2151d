"""Jobs inside the container image (issue 44): ``launcher.container`` on the submitit and the sbatch paths.

No container runtime here: the runtime is a FAKE stand-in (``fake_apptainer`` below, named so) that records its
arguments and execs the command it wraps on this machine, given as ``launcher.container.exe``. Slurm is the real
single-node cluster (tests/launch/conftest.py; skipped with the reason where it cannot start). pyxis needs Slurm's
plugin, which this cluster lacks: its srun flags are checked in the generated commands.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import container
from harness.launch.jobs import JobsDB
from harness.launch.progress import mlflow_progress
from harness.launch.spec import SweepError, load_spec
from harness.launch.submit import slurm_parameters, slurm_python
from harness.launch.sweep import submit_sweep
from harness.launch.expand import validate
from launch_helpers import job_state, wait_for, wait_sweep, where

#: FAKE apptainer: logs "<argv>" per call to $1's sibling log, checks the `exec [--nv] [--bind X] IMAGE CMD...` form
#: and that the image exists, then runs CMD on this machine (no container: the stand-in named in the module doc)
FAKE_APPTAINER = """#!/usr/bin/env bash
printf '%s\\n' "$*" >> {log}
[ "$1" = exec ] || {{ echo "fake apptainer: only exec" >&2; exit 64; }}
shift
while [ "${{1#--}}" != "$1" ]; do case "$1" in --bind|-B|--env|--pwd) shift 2;; *) shift;; esac; done
[ -f "$1" ] || {{ echo "fake apptainer: no image $1" >&2; exit 65; }}
shift
exec "$@"
"""


def _fake_apptainer(tmp: Path) -> tuple[Path, Path, Path]:
    exe, log, image = tmp / "fake_apptainer", tmp / "apptainer_calls.log", tmp / "harness.sif"
    exe.write_text(FAKE_APPTAINER.format(log=shlex.quote(str(log))))
    exe.chmod(0o755)
    image.write_text("a FAKE image file: the stand-in only checks that it exists\n")
    return exe, log, image


@pytest.mark.parametrize("raw, key", [
    ({"runtime": "docker", "image": "x"}, "launcher.container.runtime"),
    ({"runtime": "apptainer"}, "launcher.container.image"),
    ({"runtime": "pyxis", "image": "x", "mounts": ["/a,/b"]}, "launcher.container.mounts"),
    ({"runtime": "apptainer", "image": "x", "workdir": "/opt"}, "launcher.container.workdir"),
    ({"runtime": "pyxis", "image": "x", "gpus": 8}, "launcher.container.gpus"),
])
def test_a_bad_container_is_one_error_naming_the_key(tmp_path, raw, key):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "c", "base": ["trainer.steps=2"], "launcher": {"name": "slurm",
                                                                                          "container": raw}}))
    with pytest.raises(SweepError) as exc:
        load_spec(p, [])
    assert exc.value.key == key and str(exc.value).startswith(key)


def test_the_local_launcher_refuses_a_container(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "c", "base": ["trainer.steps=2"], "launcher": {"name": "local",
                                                          "container": {"runtime": "apptainer", "image": "x"}}}))
    with pytest.raises(SweepError, match="launcher=slurm"):
        load_spec(p, [])


def test_pyxis_and_apptainer_commands_on_the_submitit_path(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({"name": "c", "base": ["trainer.steps=2"], "launcher": {"name": "slurm"}}))
    spec = load_spec(p, ["launcher.container={runtime: pyxis, image: /sh/h.sqsh, mounts: [/sh, /d:/data], "
                         "workdir: /opt/moe-rl-harness}"])
    assert slurm_parameters(spec)["srun_args"] == ["--container-image=/sh/h.sqsh", "--container-mounts=/sh,/d:/data",
                                                   "--container-workdir=/opt/moe-rl-harness"]
    assert slurm_python(spec) == "python"  # the image's, inside the pyxis step
    spec = load_spec(p, ["launcher.container={runtime: apptainer, image: /sh/h.sif, mounts: [/sh]}"])
    assert "srun_args" not in slurm_parameters(spec)
    assert slurm_python(spec) == "apptainer exec --nv --bind /sh /sh/h.sif python"
    assert slurm_python(load_spec(p, [])) == shlex.quote(sys.executable)  # no container: this interpreter


def test_the_sbatch_script_runs_its_steps_and_the_requeue_in_the_image(tmp_path):
    pytest.importorskip("verl", reason="the verl backend's spec validation imports verl's config")
    from harness.backends.verl import launch
    from harness.spec import load
    from harness.backends.verl.config import validate as verl_validate

    cfg = verl_validate(load(["backend=verl", "estimator=tis", "model=qwen3_4b", f"out_dir={tmp_path}/run"]))
    pyxis = {"runtime": "pyxis", "image": "/sh/h.sqsh", "mounts": ["/sh"]}
    script = launch.sbatch_script(cfg, launch.SlurmResources(container=pyxis), python="/opt/venv/bin/python")
    srun = next(x for x in script.splitlines() if x.startswith("srun "))
    assert srun.startswith("srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1 --container-image=/sh/h.sqsh "
                           "--container-mounts=/sh python -m harness.backends.verl.launch node --spec ")
    assert "srun --overlap --nodes=1 --ntasks=1 --container-image=/sh/h.sqsh --container-mounts=/sh python -m " \
           "harness.backends.verl.launch requeue" in script
    assert "/opt/venv/bin/python" not in script and "\ncd " not in script  # nothing of the generating machine
    apptainer = {"runtime": "apptainer", "image": "/sh/h.sif"}
    script = launch.sbatch_script(cfg, launch.SlurmResources(container=apptainer))
    assert "srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1 apptainer exec --nv /sh/h.sif python -m " \
           "harness.backends.verl.launch node" in script
    assert "on_usr1() { apptainer exec --nv /sh/h.sif python -m harness.backends.verl.launch requeue" in script
    plain = launch.sbatch_script(cfg, launch.SlurmResources())
    assert f"srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1 {sys.executable} -m" in plain  # as before


CONTAINED = {
    "name": "contained",
    "base": ["trainer.steps=40", "trainer.prompts_per_step=8", "trainer.group_size=8", "trainer.num_minibatches=2",
             "task.warmstart.max_steps=20"],
    "seeds": [5],
    "launcher": {"name": "slurm", "time_min": 30, "cpus_per_task": 1, "mem_gb": 2, "checkpoint_every": 4},
}


def test_a_sweep_runs_in_the_container_requeues_once_and_resumes(slurm_cluster, store, tmp_path):
    """submitit's step runs through the (stand-in) apptainer; a forced USR2 checkpoints and requeues the job, whose
    second start goes through the container again and resumes the run to its last step in one MLflow run."""
    root, uri = store
    exe, log, image = _fake_apptainer(tmp_path)
    p = tmp_path / "contained.yaml"
    data = dict(CONTAINED)
    data["launcher"] = {**CONTAINED["launcher"], "container": {
        "runtime": "apptainer", "image": str(image), "exe": str(exe), "python": sys.executable,
        "mounts": [str(root), str(tmp_path)]}}
    p.write_text(yaml.safe_dump(data))
    spec = load_spec(p, where(root, uri, "contained"))
    submit_sweep(spec)
    run = validate(spec)[0]
    sig, run_dir = run.signature, run.cfg.run_dir
    job = JobsDB(spec.sweep_dir).runs[sig]["job_id"]

    def logged() -> int:
        prog = mlflow_progress(uri, "contained", [sig]).get(sig)
        return len(prog["steps"]) if prog else 0

    wait_for(lambda: logged() >= 6, 150, "6 logged steps", spec)
    subprocess.run(["scancel", "--signal=USR2", job], check=True, capture_output=True)
    wait_for(lambda: job_state(job) == "PENDING", 60, "the job to requeue itself after USR2", spec)
    n1 = logged()
    assert not (run_dir / "summary.json").exists() and n1 < 40, "the run finished before it was interrupted"
    wait_sweep(spec, timeout=240, cluster=slurm_cluster)

    calls = log.read_text().splitlines()
    want = shlex.join(["exec", "--nv", "--bind", f"{root},{tmp_path}", str(image), sys.executable, "-u", "-m",
                       "submitit.core._submit"])
    assert len(calls) == 2 and all(c.startswith(want) for c in calls), calls  # first start, and after the requeue
    show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "Restarts=1" in show, show
    joblog = "\n".join(q.read_text() for q in (spec.sweep_dir / "submitit").glob("*_log.out"))
    assert joblog.count("Starting with JobEnvironment") == 2 and "Calling checkpoint method" in joblog
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    (m,) = client.search_runs([client.get_experiment_by_name("contained").experiment_id])  # one MLflow run
    steps = [h.step for h in client.get_metric_history(m.info.run_id, "reward/mean")]
    assert m.info.status == "FINISHED" and sorted(set(steps)) == list(range(40)) and len(steps) == 40
    assert os.path.exists(run_dir / "summary.json")

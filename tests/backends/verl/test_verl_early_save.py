"""Saving before the Slurm time limit (issue 30, item 3): the job's end time feeds verl's early-save hook, the USR1
handler requeues only once verl's save is complete, and ``verl.checkpoint_dir`` puts checkpoints outside the project.

No Slurm here: ``squeue``, ``scontrol`` and ``srun`` are FAKE scripts on PATH (named as such). verl's hook
(``should_save_ckpt_esi``) and the sbatch script (run by bash) are the real ones.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.backends.verl import launch, memory, translate
from harness.backends.verl.runner import CKPT_TRACKER, prune_checkpoints
from harness.uri import ROOT
from harness.spec import ConfigError

#: FAKE of ``squeue -h -j JOB -o %e``: prints $FAKE_END (an ISO local time), as Slurm does
FAKE_SQUEUE = "import os, sys; assert sys.argv[1:] == ['-h', '-j', os.environ['SLURM_JOB_ID'], '-o', '%e'], sys.argv; " \
              "print(os.environ.get('FAKE_END', 'N/A'))"
#: FAKE of ``scontrol requeue JOB``: appends "<time> <args>" to $FAKE_LOG
FAKE_SCONTROL = "import os, sys, time; open(os.environ['FAKE_LOG'], 'a').write(f'{time.time()} {\" \".join(sys.argv[1:])}\\n')"
#: FAKE of ``srun``: verl that starts a save (global_step_3) and completes it (the tracker) $FAKE_SAVE_S later
FAKE_SRUN = r'''
import os, time
from pathlib import Path
root = Path(os.environ["FAKE_CKPT"])
(root / "global_step_3").mkdir(parents=True)
time.sleep(float(os.environ["FAKE_SAVE_S"]))
(root / "latest_checkpointed_iteration.txt").write_text("3")
time.sleep(120)
'''


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, code in (("squeue", FAKE_SQUEUE), ("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{code}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "77",
           "FAKE_LOG": str(tmp_path / "scontrol.log")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_END_TIME", raising=False)
    monkeypatch.delenv(launch.SIGNAL_ENV, raising=False)
    return env


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def test_the_end_time_from_squeue_feeds_verls_early_save_hook(spec, tmp_path, fake_slurm, monkeypatch):
    from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi

    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", "trainer.checkpoint_every=20", f"out_dir={tmp_path}/run")
    budget = memory.save_budget_s(cfg)
    assert 300 < budget < 600  # megatron: ~430 GB of bf16 + fp32 weights + Adam at 1 GB/s
    end = float(round(time.time() + 300 + budget + 1000))
    monkeypatch.setenv("FAKE_END", _iso(end))
    assert launch.slurm_end_time() == end
    env = launch.esi_environment(cfg, signal_before_s=300)
    assert env == {launch.ESI_ENV: f"{end - 300 - budget:.0f}"}
    monkeypatch.setenv(launch.ESI_ENV, env[launch.ESI_ENV])  # verl's real hook, as its trainer calls it
    assert not should_save_ckpt_esi(max_steps_duration=600, redundant_time=0)  # 1000 s left > 60 + 600
    assert should_save_ckpt_esi(max_steps_duration=950, redundant_time=0)  # 1000 s left <= 60 + 950: save now
    # SLURM_JOB_END_TIME wins over squeue; no limit, no job or no checkpoints: nothing exported
    monkeypatch.setenv("SLURM_JOB_END_TIME", str(int(end) + 60))
    assert launch.slurm_end_time() == end + 60
    monkeypatch.delenv("SLURM_JOB_END_TIME")
    monkeypatch.setenv("FAKE_END", "N/A")
    assert launch.slurm_end_time() is None and launch.esi_environment(cfg) == {}
    monkeypatch.delenv("SLURM_JOB_ID")
    assert launch.slurm_end_time() is None
    no_ckpt = spec("estimator=tis", "model=qwen3_30b_a3b", "trainer.checkpoint_every=0", f"out_dir={tmp_path}/r2")
    assert launch.esi_environment(no_ckpt, end=end) == {}


def test_the_save_budget_follows_the_checkpoint_size_and_is_in_the_plan(spec, tmp_path, monkeypatch):
    big = spec("estimator=tis", "model=qwen3_30b_a3b", f"out_dir={tmp_path}/a")
    small = spec("estimator=tis", "model=qwen3_4b", f"out_dir={tmp_path}/b")
    assert memory.checkpoint_gb(big) > 5 * memory.checkpoint_gb(small)
    assert 300 < memory.checkpoint_gb(big) < 450  # docs/verl.md: ~430 GB for Qwen3-30B-A3B (megatron) with Adam states
    monkeypatch.setenv("HARNESS_CKPT_WRITE_GBPS", "4")
    assert memory.save_budget_s(big) == pytest.approx(memory.checkpoint_gb(big) / 4)
    assert "early save before the Slurm time limit gets" in memory.plan(big).text()
    monkeypatch.setenv("HARNESS_CKPT_WRITE_GBPS", "fast")
    with pytest.raises(ConfigError, match="HARNESS_CKPT_WRITE_GBPS"):
        memory.save_budget_s(big)


def test_wait_for_save_waits_for_the_tracker_and_gives_up_at_the_deadline(tmp_path):
    root = tmp_path / "ckpt"
    assert launch.wait_for_save(root, deadline=0)  # nothing there: nothing to wait for
    (root / "global_step_2").mkdir(parents=True)
    (root / CKPT_TRACKER).write_text("2")
    assert launch.save_in_progress(root) is None
    (root / "global_step_4").mkdir()
    assert launch.save_in_progress(root) == "global_step_4"
    now, slept = [0.0], []

    def sleep(s):  # verl completes the save during the third wait
        slept.append(s)
        now[0] += s
        if len(slept) == 3:
            (root / CKPT_TRACKER).write_text("4")

    assert launch.wait_for_save(root, deadline=100, poll_s=5, sleep=sleep, clock=lambda: now[0])
    assert slept == [5, 5, 5]
    (root / "global_step_6").mkdir()
    now[0] = 0.0
    assert not launch.wait_for_save(root, deadline=12, poll_s=5, sleep=lambda s: now.__setitem__(0, now[0] + s),
                                    clock=lambda: now[0])


def test_the_sbatch_usr1_handler_requeues_only_after_verls_save(spec, tmp_path, fake_slurm):
    cfg = spec("estimator=tis", "model=qwen3_4b", "verl.nnodes=1", f"out_dir={tmp_path}/run")
    script = tmp_path / "job.sbatch"
    script.write_text(launch.sbatch_script(cfg, launch.SlurmResources(signal_before_s=120), python=sys.executable))
    assert "export HARNESS_SIGNAL_BEFORE_S=120" in script.read_text()
    root = translate.checkpoint_root(cfg)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAKE_CKPT": str(root), "FAKE_SAVE_S": "3",
           "FAKE_END": _iso(time.time() + 600)}
    out_file = (tmp_path / "job.out").open("w")  # not a pipe: the fake srun keeps its end open
    proc = subprocess.Popen(["bash", str(script)], env=env, start_new_session=True, stdout=out_file,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while not (root / "global_step_3").exists():
            assert time.time() < deadline and proc.poll() is None, "the fake srun did not start its save"
            time.sleep(0.05)
        time.sleep(0.5)  # bash has entered `wait`
        proc.send_signal(signal.SIGUSR1)  # Slurm's --signal=B:USR1
        proc.wait(timeout=90)  # the handler requeued, bash leaves (set -e: `wait` was interrupted)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        out_file.close()
    out = (tmp_path / "job.out").read_text()
    log = Path(fake_slurm["FAKE_LOG"]).read_text().splitlines()
    assert len(log) == 1 and log[0].split()[1:] == ["requeue", "77"], (log, out)
    saved = (root / CKPT_TRACKER).stat().st_mtime
    assert float(log[0].split()[0]) >= saved, out  # requeued after the tracker named the new checkpoint
    assert "waiting for verl's save of global_step_3" in out


def test_checkpoint_dir_outside_the_project(spec, tmp_path):
    base = spec("estimator=tis", "model=qwen3_4b", f"out_dir={tmp_path}/run")
    assert translate.checkpoint_root(base) == base.run_dir / translate.CHECKPOINT_DIR
    cfg = spec("estimator=tis", "model=qwen3_4b", f"out_dir={tmp_path}/run", f"verl.checkpoint_dir={tmp_path}/scratch")
    root = tmp_path / "scratch" / cfg.tracking.experiment / cfg.signature
    assert translate.checkpoint_root(cfg) == root
    assert f"trainer.default_local_dir={root}" in translate.overrides(cfg)
    # a later key: the signatures of specs without it stay, set it is part of the run's identity
    assert base.signature == spec("estimator=tis", "model=qwen3_4b", f"out_dir={tmp_path}/run",
                                  "verl.checkpoint_dir=null").signature
    assert cfg.signature != base.signature
    for step in (1, 2):
        (root / f"global_step_{step}").mkdir(parents=True)
    (root / CKPT_TRACKER).write_text("2")
    assert [p.name for p in prune_checkpoints(cfg.run_dir, root)] == ["global_step_1"]
    with pytest.raises(ConfigError, match="verl.checkpoint_dir"):
        spec("estimator=tis", "model=qwen3_4b", "verl.checkpoint_dir=scratch/ckpt")


def test_a_bad_checkpoint_dir_exits_2_naming_the_key(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "harness.run", "backend=verl", "estimator=tis", "model=qwen3_4b",
                           "verl.checkpoint_dir=relative/ckpt", f"out_dir={tmp_path}/run", "--plan"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert "verl.checkpoint_dir" in proc.stderr and "absolute" in proc.stderr


def test_a_run_set_aside_takes_its_checkpoints_outside_the_project_with_it(spec, tmp_path):
    from harness.backends.verl.runner import RUN_FILES, VerlRecord

    cfg = spec("estimator=tis", "model=qwen3_4b", f"out_dir={tmp_path}/run", f"verl.checkpoint_dir={tmp_path}/scratch")
    root = translate.checkpoint_root(cfg)
    (root / "global_step_2").mkdir(parents=True)
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    VerlRecord(cfg, rerun=True)._archive(*RUN_FILES)  # what --rerun does
    assert not root.exists()  # a new run cannot resume from them
    assert [p.name.split(".prev-")[0] for p in root.parent.iterdir()] == [cfg.signature]

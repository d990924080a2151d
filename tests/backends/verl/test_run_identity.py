"""A verl run's identity (harness.record's rules): the folder's ``summary.json``, ``mlflow_run_id``,
``git_commit`` and ``verl_checkpoints/`` answer or resume only this spec in this store; ``--rerun`` sets
them aside; a crashed verl run ends FAILED; a sweep counts a verl run finished only by its FINISHED run
in the sweep's store.

verl cannot run here (no GPU, no vLLM): its entry point is replaced by ``FAKE_VERL`` (records the MLflow
run it was handed, logs its step metric, exits with ``$FAKE_EXIT``), or by ``fake_main_ppo.py`` where verl's own MLflow
``Tracking`` must end the run as verl does.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness import backends
from harness.backends.verl import runner, train, translate
from harness.uri import ROOT
from harness.record import IdentityError

#: FAKE of verl's entry point (``python -c`` in place of ``-m verl.trainer.main_ppo``): appends the MLflow
#: run id it was given to $FAKE_VERL_LOG, logs verl's step metric ``training/global_step`` for steps
#: $FAKE_FIRST (default 1) .. ``trainer.total_training_steps`` of its argv ($FAKE_LAST if set: a run whose
#: logging stopped) into that run, and exits with $FAKE_EXIT; trains nothing, ends no MLflow run
FAKE_VERL = ("-c", """
import os, sys, time
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
run_id = os.environ['MLFLOW_RUN_ID']
open(os.environ['FAKE_VERL_LOG'], 'a').write(run_id + '\\n')
total = int([a for a in sys.argv if a.startswith('trainer.total_training_steps=')][0].split('=')[1])
last = int(os.environ.get('FAKE_LAST', total))
now = int(time.time() * 1000)
steps = range(int(os.environ.get('FAKE_FIRST', '1')), last + 1)
MlflowClient(os.environ['MLFLOW_TRACKING_URI']).log_batch(
    run_id, metrics=[Metric('training/global_step', float(k), now, k) for k in steps])
sys.exit(int(os.environ.get('FAKE_EXIT', '0')))
""")


@pytest.fixture
def fake_verl(monkeypatch, tmp_path):
    """verl replaced by FAKE_VERL; returns ``launched()``: the MLflow run ids verl was started with, in order."""
    log = tmp_path / "fake_verl.log"
    monkeypatch.setattr(runner, "preflight", lambda cfg: None)  # no GPU/vLLM/data here
    monkeypatch.setattr(translate, "ENTRYPOINT", FAKE_VERL)
    monkeypatch.setenv("FAKE_VERL_LOG", str(log))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    for key in ("FAKE_EXIT", "FAKE_LAST", "FAKE_FIRST"):
        monkeypatch.delenv(key, raising=False)
    return lambda: log.read_text().split() if log.exists() else []


def _client(cfg):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=cfg.tracking_uri)


def _runs(cfg) -> list:
    client = _client(cfg)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    return [] if exp is None else list(client.search_runs([exp.experiment_id]))


def _summary(cfg) -> dict:
    import json

    return json.loads((cfg.run_dir / runner.SUMMARY_FILE).read_text())


def _set_aside(run_dir: Path, name: str) -> list[Path]:
    return list(run_dir.glob(f"{name}.prev-*"))


def test_a_folder_of_another_spec_is_refused_not_answered(spec, tmp_path, fake_verl):
    """Two specs sharing out_dir: the second is refused (IdentityError, exit 2), not answered with the
    first's result; --rerun sets the first's files aside and runs the second in a new MLflow run."""
    a = spec("estimator=tis", "model=qwen3_30b_a3b", tmp=tmp_path)
    b = spec("estimator=tis", "model=qwen3_30b_a3b", "seed=1", tmp=tmp_path)
    assert a.run_dir == b.run_dir and a.signature != b.signature
    train(a)
    (first,) = fake_verl()
    train(a)  # finished: nothing to do
    assert fake_verl() == [first]
    with pytest.raises(IdentityError, match="belongs to another run.*--rerun"):
        backends.get("verl").run(b)
    assert fake_verl() == [first] and len(_runs(a)) == 1 and _summary(a)["run_id"] == first

    backends.get("verl").run(b, rerun=True)
    launched = fake_verl()
    assert len(launched) == 2 and launched[1] != first
    s = _summary(b)
    assert s["run_id"] == launched[1] and s["signature"] == b.signature
    assert s["identity"]["signature"] == b.signature and s["identity"]["tracking_uri"] == b.tracking_uri
    for name in (runner.SUMMARY_FILE, runner.RUN_ID_FILE, runner.COMMIT_FILE):
        assert _set_aside(b.run_dir, name), name
    run = _client(b).get_run(launched[1])
    assert run.data.tags["spec_sig"] == b.signature and run.info.status == "FINISHED"


def test_a_result_of_another_store_is_no_answer(spec, tmp_path, fake_verl):
    """An old runs/ folder, a new tracking store: the run trains into the new store from scratch (the old
    store's summary, MLflow run id and verl checkpoints set aside)."""
    old = spec("estimator=tis", "model=qwen3_30b_a3b", tmp=tmp_path)
    train(old)
    (first,) = fake_verl()
    (old.run_dir / translate.CHECKPOINT_DIR / "global_step_2").mkdir(parents=True)  # what verl leaves
    new = spec("estimator=tis", "model=qwen3_30b_a3b", f"tracking.uri=sqlite:///{tmp_path}/new.db", tmp=tmp_path)
    assert new.signature == old.signature and new.tracking_uri != old.tracking_uri
    train(new)
    launched = fake_verl()
    assert len(launched) == 2 and launched[1] != first
    s = _summary(new)
    assert s["run_id"] == launched[1] and s["identity"]["tracking_uri"] == new.tracking_uri
    run = _client(new).get_run(launched[1])
    assert run.info.status == "FINISHED" and run.data.tags["spec_sig"] == new.signature
    assert (new.run_dir / runner.RUN_ID_FILE).read_text().strip() == launched[1]
    assert not (new.run_dir / translate.CHECKPOINT_DIR).exists()  # verl starts from scratch
    for name in (runner.SUMMARY_FILE, runner.RUN_ID_FILE, translate.CHECKPOINT_DIR):
        assert _set_aside(new.run_dir, name), name


def test_an_unfinished_run_of_another_store_is_refused(spec, tmp_path, fake_verl, monkeypatch):
    """A folder whose MLflow run (no result yet) is in another store: refused, as the local backend refuses
    a checkpoint of another store (resuming it would log half a run into this one)."""
    old = spec("estimator=tis", "model=qwen3_30b_a3b", tmp=tmp_path)
    monkeypatch.setenv("FAKE_EXIT", "1")
    with pytest.raises(RuntimeError, match="verl exited with status 1"):
        train(old)
    monkeypatch.setenv("FAKE_EXIT", "0")
    new = spec("estimator=tis", "model=qwen3_30b_a3b", f"tracking.uri=sqlite:///{tmp_path}/new.db", tmp=tmp_path)
    with pytest.raises(IdentityError, match="not in the store.*--rerun"):
        train(new)
    assert len(fake_verl()) == 1 and _runs(new) == []
    train(new, rerun=True)
    assert len(fake_verl()) == 2 and _summary(new)["identity"]["tracking_uri"] == new.tracking_uri


def test_a_crashed_verl_run_ends_failed_although_verl_ended_it_finished(spec, tmp_path, monkeypatch):
    """verl's own MLflow adapter ends the run FINISHED in its teardown (FAKE main_ppo does, then exits 1):
    the harness ends it FAILED after verl has exited, so analysis (FINISHED runs only) never keeps it."""
    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", tmp=tmp_path)
    monkeypatch.setattr(runner, "preflight", lambda cfg: None)  # no GPU/vLLM/data here
    monkeypatch.setattr(translate, "ENTRYPOINT", (str(Path(__file__).with_name("fake_main_ppo.py")),))
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("FAKE_EXIT", "1")
    with pytest.raises(RuntimeError, match="verl exited with status 1"):
        train(cfg)
    run_id = (cfg.run_dir / runner.RUN_ID_FILE).read_text().strip()
    run = _client(cfg).get_run(run_id)
    assert run.data.metrics  # verl logged its steps, then ended the run ...
    assert run.info.status == "FAILED" and run.data.tags["status"] == "failed"  # ... and the harness failed it
    assert not (cfg.run_dir / runner.SUMMARY_FILE).exists()


def test_rerun_starts_a_new_mlflow_run_from_scratch(spec, tmp_path, fake_verl):
    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", tmp=tmp_path)
    train(cfg)
    (first,) = fake_verl()
    (cfg.run_dir / translate.CHECKPOINT_DIR / "global_step_2").mkdir(parents=True)
    backends.get("verl").run(cfg, rerun=True)
    launched = fake_verl()
    assert len(launched) == 2 and launched[1] != first
    assert _summary(cfg)["run_id"] == launched[1]
    assert (cfg.run_dir / runner.RUN_ID_FILE).read_text().strip() == launched[1]
    assert not (cfg.run_dir / translate.CHECKPOINT_DIR).exists()
    for name in (runner.SUMMARY_FILE, runner.RUN_ID_FILE, runner.COMMIT_FILE, translate.CHECKPOINT_DIR):
        assert _set_aside(cfg.run_dir, name), name
    client = _client(cfg)
    assert {client.get_run(r).info.status for r in launched} == {"FINISHED"}  # the old run stays, superseded


def test_sweep_rerun_sets_verl_files_aside(tmp_path):
    from harness import backends
    from harness.launch.sweep import archive_finished
    from harness.record import CHECKPOINT_FILE, SUMMARY_FILE

    assert runner.SUMMARY_FILE is SUMMARY_FILE  # one name, defined once
    names = (SUMMARY_FILE, CHECKPOINT_FILE, runner.RUN_ID_FILE, runner.COMMIT_FILE)
    for name in names:
        (tmp_path / name).write_text("x\n")
    (tmp_path / translate.CHECKPOINT_DIR / "global_step_1").mkdir(parents=True)
    archive_finished(tmp_path, backends.get("verl").run_files)  # what submit_sweep passes for a verl run
    for name in (*names, translate.CHECKPOINT_DIR):
        assert not (tmp_path / name).exists() and _set_aside(tmp_path, name), name


def test_sweep_counts_a_verl_run_finished_by_its_run_in_the_sweeps_store(tmp_path, fake_verl):
    """``finished_in_store``: a verl run is finished when its folder's summary.json names a run FINISHED in the
    sweep's store with its spec_sig (started after a --rerun's submission); a summary.json alone is not."""
    import json

    from harness.launch.expand import validate
    from harness.launch.progress import finished_in_store
    from harness.launch.spec import load_spec

    spec = load_spec(ROOT / "sweeps" / "ablation_verl.yaml",
                     ["grid.estimator=[tis]", "seeds=[0]", f"runs_dir={tmp_path / 'runs'}",
                      f"tracking_uri=sqlite:///{tmp_path}/mlruns.db", "experiment=identity"])
    (run,) = validate(spec)
    cfg = run.cfg
    assert finished_in_store(spec, [run]) == set()
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / runner.SUMMARY_FILE).write_text(json.dumps(  # another store's result
        {"run_id": "0123456789abcdef0123456789abcdef", "signature": cfg.signature, "status": "finished"}))
    assert finished_in_store(spec, [run]) == set()

    train(cfg, rerun=True)
    (run_id,) = fake_verl()
    assert finished_in_store(spec, [run]) == {run.signature}
    started = _client(cfg).get_run(run_id).info.start_time
    assert finished_in_store(spec, [run], after_ms=started + 1) == set()  # a --rerun's run is a later one
    _client(cfg).set_terminated(run_id, "FAILED")
    assert finished_in_store(spec, [run]) == set()


def test_verl_exiting_0_with_steps_missing_ends_failed_loudly(spec, tmp_path, fake_verl, monkeypatch):
    """verl carries on without MLflow (three failed inits) or drops a step's metrics (three failed log calls) and
    still exits 0: the harness compares the run's logged steps with trainer.steps, ends it FAILED, writes no
    summary, and says so."""
    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", "trainer.steps=3", tmp=tmp_path)
    monkeypatch.setenv("FAKE_LAST", "0")  # no MLflow at all
    with pytest.raises(RuntimeError, match=r"verl exited 0 but MLflow run \w+ has no training step of the 3 "
                                           r"planned .*ends FAILED.*--rerun"):
        train(cfg)
    (run_id,) = fake_verl()
    run = _client(cfg).get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["status"] == "failed"
    assert not (cfg.run_dir / runner.SUMMARY_FILE).exists()

    monkeypatch.setenv("FAKE_LAST", "2")  # the last step's metrics dropped
    with pytest.raises(RuntimeError, match=r"has steps up to 2, 1 missing \(3\) of the 3 planned"):
        train(cfg)
    assert fake_verl() == [run_id, run_id] and _client(cfg).get_run(run_id).info.status == "FAILED"
    assert not (cfg.run_dir / runner.SUMMARY_FILE).exists()

    monkeypatch.delenv("FAKE_LAST")
    train(cfg, rerun=True)  # the way out: a new MLflow run from scratch
    launched = fake_verl()
    assert len(launched) == 3 and launched[2] != run_id and _summary(cfg)["run_id"] == launched[2]
    assert runner.logged_steps(_client(cfg), launched[2]) == [1, 2, 3]


def test_a_finished_run_with_fewer_logged_steps_than_planned_is_not_finished(spec, tmp_path, fake_verl, monkeypatch):
    """A summary.json naming a FINISHED run of this spec whose MLflow run stops short of trainer.steps (what the
    harness accepted before issue 30): not finished, for train() and for a sweep; train() resumes that run and
    verl logs the rest."""
    from harness.launch.expand import validate
    from harness.launch.progress import finished_in_store
    from harness.launch.spec import load_spec

    spec_ = load_spec(ROOT / "sweeps" / "ablation_verl.yaml",
                      ["grid.estimator=[tis]", "seeds=[0]", f"runs_dir={tmp_path / 'runs'}", "trainer.steps=3",
                       f"tracking_uri=sqlite:///{tmp_path}/mlruns.db", "experiment=steps"])
    (run,) = validate(spec_)
    cfg = run.cfg
    assert cfg.trainer.steps == 3
    monkeypatch.setenv("FAKE_LAST", "1")
    with monkeypatch.context() as m:
        m.setattr(runner, "steps_problem", lambda *a: None)  # the harness before issue 30: no step check
        train(cfg)
    (run_id,) = fake_verl()
    client = _client(cfg)
    assert client.get_run(run_id).info.status == "FINISHED" and _summary(cfg)["run_id"] == run_id
    assert runner.logged_steps(client, run_id) == [1]

    assert runner.finished(client, cfg) is None and finished_in_store(spec_, [run]) == set()
    monkeypatch.delenv("FAKE_LAST")
    monkeypatch.setenv("FAKE_FIRST", "2")  # verl resumes from its checkpoint and logs the remaining steps
    train(cfg)
    assert fake_verl() == [run_id, run_id]  # the same MLflow run, resumed
    assert runner.logged_steps(client, run_id) == [1, 2, 3] and client.get_run(run_id).info.status == "FINISHED"
    assert runner.finished(client, cfg) is not None and finished_in_store(spec_, [run]) == {run.signature}


def test_superseded_checkpoints_are_deleted_across_requeues(spec, tmp_path, fake_verl, monkeypatch):
    """verl keeps max_actor_ckpt_to_keep=1 only among its own process's saves: a requeued job leaves the checkpoint
    it resumed from. train() deletes every global_step_* folder but the one verl's tracker names, before verl
    starts (what earlier attempts left) and after it exits (the one it resumed from); without a tracker, nothing.
    (verl.keep_checkpoint=last: the finished run keeps its last one, test_verl_retention.py has the others.)"""
    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", "verl.keep_checkpoint=last", tmp=tmp_path)
    ckpt = cfg.run_dir / translate.CHECKPOINT_DIR
    for step in (20, 40, 60):
        (ckpt / f"global_step_{step}" / "actor").mkdir(parents=True)
        (ckpt / f"global_step_{step}" / "actor" / "model.pt").write_text("weights")
    (ckpt / "other_folder").mkdir()
    assert runner.prune_checkpoints(cfg.run_dir) == []  # no tracker: verl would start over, nothing is ours to judge
    (ckpt / runner.CKPT_TRACKER).write_text("40\n")  # global_step_60: a save cut short by the preemption
    monkeypatch.setenv("FAKE_EXIT", "1")  # this attempt is preempted too
    with pytest.raises(RuntimeError, match="verl exited with status 1"):
        train(cfg)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(["global_step_40", "other_folder", runner.CKPT_TRACKER])
    assert (ckpt / "global_step_40" / "actor" / "model.pt").read_text() == "weights"

    # the next attempt resumes from 40 and saves 60 (FAKE: made here, as verl would): 40 goes after verl exits
    monkeypatch.setenv("FAKE_EXIT", "0")
    real_run = subprocess.run

    def verl_saves_60(argv, **kw):
        if any(str(a).startswith("trainer.total_training_steps=") for a in argv):  # the verl command only
            (ckpt / "global_step_60").mkdir(exist_ok=True)
            (ckpt / runner.CKPT_TRACKER).write_text("60")
        return real_run(argv, **kw)

    monkeypatch.setattr(runner.subprocess, "run", verl_saves_60)
    train(cfg)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(["global_step_60", "other_folder", runner.CKPT_TRACKER])
    (ckpt / runner.CKPT_TRACKER).write_text("80")  # names a folder that is not there: nothing deleted
    assert runner.prune_checkpoints(cfg.run_dir) == [] and (ckpt / "global_step_60").is_dir()

"""The store failing under a run (issue 27 items 6 and 8): a locked sqlite store is waited for, a full one and a
deleted experiment are one line. Real tiny runs into real sqlite stores under tmp_path.

sqlite answers "database is locked" only after its busy timeout, which MLflow sets to 20 s per session; these tests
shorten it to 0.2 s (``short_busy_wait``, rewriting MLflow's ``PRAGMA busy_timeout``) so that a lock of a few
seconds reaches the harness's own retry (``harness.tracking.call_store``) as it would after 20 s.
"""
from __future__ import annotations

import os
import sqlite3
import sys
import threading

import pytest
from mlflow.tracking import MlflowClient

from harness import metrics as M
from harness import tracking
from harness.uri import ROOT
from harness.spec import load
from harness.run import execute, main


@pytest.fixture
def short_busy_wait():
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    def rewrite(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.startswith("PRAGMA busy_timeout"):
            statement = "PRAGMA busy_timeout = 200;"
        return statement, parameters

    event.listen(Engine, "before_cursor_execute", rewrite, retval=True)
    yield
    event.remove(Engine, "before_cursor_execute", rewrite)


class Holder:
    """Another process's write lock on the store: ``BEGIN EXCLUSIVE`` on its own connection (readers and writers
    wait), let go after ``seconds`` (None: when :meth:`release` is called)."""

    def __init__(self, db, seconds: float | None = None):
        self.con = sqlite3.connect(str(db), isolation_level=None, check_same_thread=False)
        self.con.execute("BEGIN EXCLUSIVE")
        self.timer = threading.Timer(seconds, self.release) if seconds is not None else None
        if self.timer is not None:
            self.timer.start()

    def release(self) -> None:
        if self.con is not None:
            self.con.execute("ROLLBACK")
            self.con.close()
            self.con = None

    def join(self) -> None:
        if self.timer is not None:
            self.timer.join()
        self.release()


def only_run(uri: str, experiment: str = "test"):
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return run


def steps_logged(uri: str, run_id: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, M.REWARD_MEAN))


def error_lines(err: str) -> list[str]:
    return [line for line in err.replace("\r", "\n").splitlines() if line.strip()]  # after the progress bar


def test_a_store_locked_for_seconds_mid_run_is_waited_for_and_every_step_logged_once(tiny_overrides, tmp_path,
                                                                                       short_busy_wait, capfd):
    cfg = load(tiny_overrides("trainer.checkpoint_every=1", steps=4, name="locked"))
    held: list[Holder] = []

    def lock_at_step_1(step, values):  # between two store writes: the next one is the checkpoint's flush
        if step == 1:
            held.append(Holder(tmp_path / "mlruns.db", seconds=3.0))
        return False

    summary = execute(cfg, on_step=lock_at_step_1, progress=False)
    held[0].join()
    err = capfd.readouterr().err
    assert "is locked by another process; retrying up to 120 s" in err  # the lock reached the harness's retry
    assert "Traceback" not in err and "database is locked" not in err  # MLflow's logged tracebacks: silenced
    run = only_run(cfg.tracking_uri)
    assert summary.status == "finished" and run.info.status == "FINISHED" and run.info.run_id == summary.run_id
    assert steps_logged(cfg.tracking_uri, run.info.run_id) == [0, 1, 2, 3]  # each step once


def test_a_store_locked_past_the_deadline_is_one_line_exit_1_and_the_same_command_resumes(
        tiny_overrides, tmp_path, short_busy_wait, monkeypatch, capsys):
    monkeypatch.setattr(tracking, "LOCK_DEADLINE_S", 1.0)
    over = tiny_overrides("trainer.checkpoint_every=1", steps=4, name="stuck")
    cfg, db = load(over), tmp_path / "mlruns.db"
    real_flush, held = tracking.StepBuffer.flush, []

    def locked_before_the_second_flush(self):
        if self.rows and not held and steps_logged(cfg.tracking_uri, self.tracker.run_id):
            held.append(Holder(db))  # another process takes the store mid-run and keeps it
        return real_flush(self)

    monkeypatch.setattr(tracking.StepBuffer, "flush", locked_before_the_second_flush)
    assert main(over) == 1
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert lines[-1].startswith(f"error: the MLflow store {db} stayed locked for ") and f"fuser {db}" in lines[-1]
    assert "same command again" in lines[-1]
    assert "Traceback" not in err and err.count("error:") == 1
    held[0].release()
    run = only_run(cfg.tracking_uri)
    assert run.info.status == "RUNNING"  # the locked store could not be told; the checkpoint resumes it
    assert main(over) == 0  # the way out the line names
    run = only_run(cfg.tracking_uri)
    assert run.info.status == "FINISHED" and steps_logged(cfg.tracking_uri, run.info.run_id) == [0, 1, 2, 3]


def test_a_full_store_is_one_line_naming_its_path_exit_1_and_the_same_command_resumes(tiny_overrides, tmp_path,
                                                                                    monkeypatch, capsys):
    """sqlite's own error for a full disk ("database or disk is full", SQLITE_FULL), raised by the driver on the
    store's metric inserts once the run has logged its first steps."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    over = tiny_overrides("trainer.checkpoint_every=1", steps=4, name="full")
    cfg, db = load(over), tmp_path / "mlruns.db"
    full = {"on": False, "flushes": 0}
    real_flush = tracking.StepBuffer.flush

    def count_flushes(self):
        full["flushes"] += 1
        full["on"] = full["on"] or full["flushes"] == 2
        return real_flush(self)

    def disk_full(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if full["on"] and statement.startswith("INSERT INTO metrics"):
            raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(tracking.StepBuffer, "flush", count_flushes)
    event.listen(Engine, "before_cursor_execute", disk_full)
    try:
        assert main(over) == 1
    finally:
        event.remove(Engine, "before_cursor_execute", disk_full)
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert lines[-1].startswith(f"error: the MLflow store {db} cannot be written: database or disk is full; "
                                f"free space on its disk"), lines[-1]
    assert "Traceback" not in err and err.count("error:") == 1
    run = only_run(cfg.tracking_uri)
    assert run.info.status == "FAILED"  # the run's end is no insert: it could be written
    assert main(over) == 0
    run = only_run(cfg.tracking_uri)
    assert run.info.status == "FINISHED" and steps_logged(cfg.tracking_uri, run.info.run_id) == [0, 1, 2, 3]


def test_a_deleted_experiment_is_named_with_the_fix_exit_2_and_nothing_written(tiny_overrides, tmp_path, capsys):
    over = tiny_overrides(steps=2, name="first")
    assert main(over) == 0
    cfg = load(over)
    client = MlflowClient(cfg.tracking_uri)
    exp_id = client.get_experiment_by_name("test").experiment_id
    client.delete_experiment(exp_id)
    capsys.readouterr()
    again = tiny_overrides(steps=2, name="second")
    assert main(again) == 2
    err = capsys.readouterr().err
    assert err == (f"error: tracking.experiment: MLflow experiment 'test' was deleted in {cfg.tracking_uri}: restore "
                   f"it (`MLFLOW_TRACKING_URI={cfg.tracking_uri} mlflow experiments restore --experiment-id {exp_id}`) "
                   f"or choose another tracking.experiment\n")
    assert not (tmp_path / "second").exists()  # before the folder: nothing written
    client.restore_experiment(exp_id)  # the fix it names
    assert main(again) == 0


def test_a_sweep_into_a_deleted_experiment_is_refused_naming_it(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "launch"))
    from launch_helpers import SWEEPS, where

    from harness.launch.expand import validate
    from harness.launch.progress import prepare_tracking
    from harness.launch.spec import SweepError, load_spec

    uri = f"sqlite:///{tmp_path}/sweep.db"
    spec = load_spec(str(SWEEPS / "tiny.yaml"), ["launcher=local", *where(tmp_path, uri, "gone")])
    runs = validate(spec)
    client = MlflowClient(uri)
    client.delete_experiment(client.create_experiment("gone"))
    with pytest.raises(SweepError) as exc:
        prepare_tracking(spec, runs[0].cfg)
    assert exc.value.key == "experiment" and "MLflow experiment 'gone' was deleted in" in str(exc.value)
    assert "mlflow experiments restore --experiment-id" in str(exc.value)


def test_a_run_file_not_written_is_one_line_naming_it_exit_1(tiny_overrides, monkeypatch, capsys):
    """A full disk under the run folder at the end (``summary.json``): one line naming the file, its tmp file gone."""
    import errno
    from pathlib import Path

    over = tiny_overrides(steps=2, name="nospace")
    cfg = load(over)
    real = Path.write_text

    def full_for_the_summary(self, *args, **kwargs):
        if self.name == "summary.tmp":
            real(self, "half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_for_the_summary)
    assert main(over) == 1
    err = capsys.readouterr().err
    lines = error_lines(err)
    assert lines[-1].startswith(f"error: cannot write {cfg.run_dir / 'summary.json'}: No space left on device; "
                                f"free space there")
    assert "Traceback" not in err and err.count("error:") == 1
    assert not list(cfg.run_dir.glob("*.tmp"))
    assert only_run(cfg.tracking_uri).info.status == "FAILED"


def test_a_dead_http_store_is_one_line_exit_1_in_seconds(tiny_overrides, tmp_path):
    """Issue 45: on d747b32 a killed ``mlflow server`` kept a run in urllib3's retries for 12.5 min (134 lines, 5
    tracebacks). MLflow's own retry settings are bounded now (``harness.http_store.HTTP_LIMITS``): a server that answers
    ``/health`` and then goes away (its port closed, as a killed server's) ends the run in one line, exit 1.
    The server is a fake (``Health``, standard library): it stands for an ``mlflow server`` killed between the
    harness's store check and MLflow's first call, which a real one cannot be timed to do reliably."""
    import http.server
    import subprocess
    import time

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")
            threading.Thread(target=lambda: (server.shutdown(), server.server_close())).start()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    over = [o for o in tiny_overrides(steps=2, name="dead_http") if not o.startswith("tracking.uri=")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness.run", *over,
                           f"tracking.uri=http://127.0.0.1:{server.server_address[1]}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert error_lines(proc.stderr) == [proc.stderr.strip()] and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: the MLflow store http://127.0.0.1:{server.server_address[1]} did not answer")
    assert took < 60, took

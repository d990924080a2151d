"""One writer per run folder (harness/runlock.py; the runs themselves: tests/test_faults.py, issue 27 item 2)."""
import json
import multiprocessing as mp
import os
import socket

import pytest

from harness.runlock import LOCK_FILE, NotALockFile, RunInProgress, RunLock
from harness.uri import ROOT


def test_a_held_lock_names_its_holder_and_is_free_once_released(tmp_path):
    held = RunLock(tmp_path)
    held.acquire()
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    with pytest.raises(RunInProgress, match=rf"^run in progress \(pid {os.getpid()}, host {socket.gethostname()}\)"):
        RunLock(tmp_path).acquire()
    held.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""
    again = RunLock(tmp_path)
    again.acquire()
    again.release()


def _child(ready, stop):
    ready.set()
    stop.wait(120)


def test_a_forked_child_does_not_keep_the_lock(tmp_path):
    """The overlap rollout worker is forked while the run holds its lock: the lock must end with the run."""
    held = RunLock(tmp_path)
    held.acquire()
    ctx = mp.get_context("fork")
    ready, stop = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_child, args=(ready, stop), daemon=True)
    child.start()
    try:
        assert ready.wait(120)  # the child runs (past the fork's handlers), holding whatever it kept
        held.release()
        other = RunLock(tmp_path)
        other.acquire()  # RunInProgress while the child held a copy of the descriptor
        other.release()
    finally:
        stop.set()
        child.join()


# ------------------------------------------------ issue 45: what is at the lock's path is taken only if a lock file
VICTIM = "secret content\n"


def _planted(tmp_path, how):
    """``run.lock`` in ``tmp_path/run`` as ``how``; returns (folder, the file that must stay as it was)."""
    folder, victim = tmp_path / "run", tmp_path / "victim"
    folder.mkdir()
    victim.write_text(VICTIM)
    lock = folder / LOCK_FILE
    if how == "symlink":
        lock.symlink_to(victim)
    elif how == "hardlink":
        os.link(victim, lock)
    elif how == "fifo":
        os.mkfifo(lock)
    elif how == "folder":
        lock.mkdir()
    elif how == "other content":
        lock.write_text(VICTIM)
        victim = lock
    elif how == "another user's":
        lock.write_text("")
        os.chown(lock, 65534, 65534)
        victim = lock
    return folder, victim


@pytest.mark.parametrize("how", ["symlink", "hardlink", "fifo", "folder", "other content", "another user's"])
def test_a_lock_path_that_is_not_a_lock_file_is_refused_and_left_as_it_was(tmp_path, how):
    """On d747b32 ``run.lock`` symlinked (or hard-linked) to any writable file emptied it (O_CREAT follows the link,
    then ftruncate), even when the run then exited 2."""
    if how == "another user's" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    folder, victim = _planted(tmp_path, how)
    with pytest.raises(NotALockFile, match=rf"^the lock file {folder / LOCK_FILE} is .*: it is not taken as a lock"):
        RunLock(folder).acquire()
    if victim.is_file():
        assert victim.read_text() == (VICTIM if how != "another user's" else "")


def test_a_run_and_a_sweep_refuse_a_symlinked_lock_with_one_line_and_the_target_kept(tiny_overrides, tmp_path,
                                                                                     capsys):
    from harness.launch import sweep
    from harness.run import main
    from harness.spec import load

    over = tiny_overrides(steps=2, name="symlinked")
    folder, victim = load(over).run_dir, tmp_path / "victim"
    folder.mkdir(parents=True)
    victim.write_text(VICTIM)
    (folder / LOCK_FILE).symlink_to(victim)
    assert main(over) == 2
    err = capsys.readouterr().err
    assert "is a symlink or not a regular file" in err and len(err.strip().splitlines()) == 1
    assert victim.read_text() == VICTIM
    spec_args = [str(ROOT / "sweeps" / "tiny.yaml"), f"runs_dir={tmp_path / 'runs'}",
                 f"tracking_uri=sqlite:///{tmp_path}/s.db", "experiment=symlinked", "--dry-run"]
    from harness.launch.spec import load_spec

    sweep_dir = load_spec(spec_args[0], spec_args[1:-1]).sweep_dir
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "submit.lock").symlink_to(victim)
    assert sweep.main(spec_args[:-1]) == 2
    err = capsys.readouterr().err
    assert "submit.lock is a symlink or not a regular file" in err and len(err.strip().splitlines()) == 1
    assert victim.read_text() == VICTIM


def test_a_symlinked_store_lock_is_one_line_and_its_target_kept(tmp_path):
    from harness import store
    from harness.tracking import TrackingError

    victim = tmp_path / "victim"
    victim.write_text(VICTIM)
    (tmp_path / "s.db.lock").symlink_to(victim)
    with pytest.raises(TrackingError, match=r"its lock file .*s\.db\.lock cannot be used .*rm "):
        store.check(f"sqlite:///{tmp_path}/s.db")
    assert victim.read_text() == VICTIM

"""One writer per run folder (harness/runlock.py; the runs themselves: tests/test_faults.py, issue 27 item 2)."""
import json
import multiprocessing as mp
import os
import socket

import pytest

from harness.runlock import LOCK_FILE, RunInProgress, RunLock


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

"""A local job's liveness from /proc (harness.launch.jobs): a worker inside execve is alive."""
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.launch.jobs import PF_KTHREAD, _pid_alive, alive_from_proc


def own_stat() -> str:
    return Path(f"/proc/{os.getpid()}/stat").read_text()


def with_flag(stat: str, flag: int) -> str:
    """``stat`` with ``flag`` set in its flags field (the 9th; the 7th after the command name)."""
    head, tail = stat.rsplit(")", 1)
    fields = tail.split()
    fields[6] = str(int(fields[6]) | flag)
    return head + ") " + " ".join(fields)


def test_a_submitit_worker_is_alive_and_another_program_is_not():
    stat = own_stat()
    assert alive_from_proc(stat, b"/usr/bin/python3\0-u\0-m\0submitit.local._local\0/tmp/x\0")
    assert not alive_from_proc(stat, b"/usr/bin/sleep\0100\0")  # a reused PID


def test_an_empty_cmdline_is_a_worker_inside_execve_unless_a_kernel_thread():
    """Popen (vfork) returns before the kernel writes the child's arguments: for that instant the
    worker's cmdline is empty. Taking it for gone made `sweep --wait` return early (a flaky test)."""
    stat = own_stat()
    assert alive_from_proc(stat, b"")
    assert not alive_from_proc(with_flag(stat, PF_KTHREAD), b"")


def test_a_zombie_is_not_alive():
    proc = subprocess.Popen([sys.executable, "-c", "pass", "submitit"])  # exits; not reaped until wait()
    try:
        for _ in range(200):
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                break
            time.sleep(0.05)
        assert state == "Z"
        assert not _pid_alive(str(proc.pid))
    finally:
        proc.wait()
    assert not _pid_alive(str(proc.pid))  # reaped: no such process


def test_a_live_process_with_submitit_in_its_arguments_is_alive():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "submitit"])
    try:
        for _ in range(200):  # until its cmdline is written (the execve window)
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                break
            time.sleep(0.01)
        assert _pid_alive(str(proc.pid))
    finally:
        proc.kill()
        proc.wait()

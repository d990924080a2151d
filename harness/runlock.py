"""One writer per run folder: an exclusive lock on ``<run folder>/run.lock``, held by
:class:`harness.record.RunRecord` from ``prepare`` to the run's end.

Why (issue 27, item 2): two identical runs started together both trained into one MLflow run (the second
resumed the first's live checkpoint). Now the second stops at once: :class:`RunInProgress`, "run in progress
(pid, host)", exit 2, before it reads the checkpoint or touches the store's run.

- The lock is the kernel's (``flock(2)``), not the file: it ends with its process however that ends
  (``kill -9`` included), so a lock file left by a dead process blocks nothing. The file only says who holds
  the lock (pid and host, written once it is taken, emptied on release), for the message.
- The file is never deleted: a process still holding the old file and one creating a new one would both
  "hold" the lock.
- A child forked while a lock is held (the overlap rollout worker) closes its copy of the descriptor, so the
  lock ends with the run, not with the child; a child that execs never has it (close-on-exec).
- What is opened is a lock file only (issue 45): ``O_NOFOLLOW``, then ``fstat`` must show a regular file of this
  user with one link, holding nothing but a lock record (:func:`open_lock_file`); anything else is refused with
  one line (:class:`NotALockFile`, exit 2) and left as it was.
- On NFS, Linux runs ``flock`` as a POSIX lock through the server's lock manager: processes on different
  hosts exclude each other too.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

LOCK_FILE = "run.lock"
_HELD: dict[int, "RunLock"] = {}  # descriptor -> lock, of this process


class RunInProgress(RuntimeError):
    """Another live process holds the run folder's lock (exit 2)."""


class NotALockFile(RunInProgress):
    """The lock's path holds something this process will not take as its lock file (a symlink, not a regular
    file, another user's file, a file with other links or other content): exit 2, nothing written to it."""


def open_lock_file(path: Path) -> int:
    """A descriptor of the lock file ``path``, created (mode 0644) if absent; :class:`NotALockFile` when ``path``
    is a symlink (``O_NOFOLLOW``), not a regular file, not owned by this user, hard-linked elsewhere, or holds
    anything but a lock record (a file this process did not create is only ever written when it is a lock file:
    on d747b32 a ``run.lock`` symlinked to any writable file, the MLflow store included, was emptied)."""
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
        return fd  # created here: ours
    except FileExistsError:
        pass
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EACCES, errno.EPERM):
            raise NotALockFile(_refusal(path, "a symlink or not a regular file" if exc.errno != errno.EACCES
                                        else "not writable by this user")) from None
        raise
    try:
        st = os.fstat(fd)
        why = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
               "owned by another user" if st.st_uid != os.geteuid() else
               "a hard link to another file" if st.st_nlink != 1 else
               "not a lock file (it holds other content)" if not _is_lock_record(os.pread(fd, 4097, 0)) else "")
    except BaseException:
        os.close(fd)
        raise
    if why:
        os.close(fd)
        raise NotALockFile(_refusal(path, why))
    return fd


def _refusal(path: Path, why: str) -> str:
    return f"the lock file {path} is {why}: it is not taken as a lock; remove it (`rm {path}`) if it is not needed"


def _is_lock_record(data: bytes) -> bool:
    """Empty (released), or ``{"pid": ..., "host": ...}`` as :meth:`RunLock.acquire` writes it."""
    if not data.strip():
        return True
    try:
        record = json.loads(data)
    except ValueError:
        return False
    return isinstance(record, dict) and set(record) <= {"pid", "host"}


class RunLock:
    """The exclusive lock of one run folder (module docstring); :meth:`acquire` never waits."""

    def __init__(self, folder: Path, file: str = LOCK_FILE, doing: str = "is training the run of"):
        self.folder = Path(folder)
        self.path = self.folder / file
        self.doing = doing  # what the holder is doing, for the message
        self.fd: int | None = None

    @property
    def held(self) -> bool:
        return self.fd is not None

    def acquire(self) -> None:
        """Take the lock and write this process's pid and host into the file; :class:`RunInProgress` naming
        the holder when another process has it; OSError when the folder cannot be written."""
        if self.fd is not None:
            return
        fd = open_lock_file(self.path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise RunInProgress(
                f"run in progress (pid {holder.get('pid', '?')}, host {holder.get('host', '?')}): another process "
                f"{self.doing} {self.folder}; wait for it to end, or stop it (the same command then "
                f"resumes its checkpoint)") from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        _HELD[fd] = self
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n").encode(), 0)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Empty the file and let the lock go (a no-op when not held)."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        _HELD.pop(fd, None)
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)


def _holder(fd: int, tries: int = 20) -> dict:
    """The holder's {pid, host} from the file; it writes them just after taking the lock, so an empty file
    is read again a few times (50 ms apart) before the holder is given as unknown."""
    for _ in range(tries):
        try:
            data = json.loads(os.pread(fd, 4096, 0) or b"null")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            return data
        time.sleep(0.05)
    return {}


def _forget_in_child() -> None:
    """After a fork: close the child's copies of the held descriptors (the parent's locks stay held)."""
    for fd, lock in list(_HELD.items()):
        lock.fd = None
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)

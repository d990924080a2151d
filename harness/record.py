"""One run's bookkeeping, separate from its training loop: any loop (``harness.backends.local.run.execute``, a
seed-pack runner) drives one :class:`RunRecord` per run.

A run's **identity** is (signature, seed, experiment, tracking URI) plus, once it exists, its MLflow
run id. The run folder (``run.json``), the checkpoint (``checkpoint.pt``) and ``summary.json`` all carry
it. The order of a run's bookkeeping, each step before anything heavier:

1. :meth:`RunRecord.prepare` — the store is reachable (``harness.store.check``, seconds) and the experiment not
   deleted there (``harness.tracking.ExperimentDeleted``, exit 2, before anything is written); the folder is
   looked up in the store first (a FINISHED run of this signature and seed is answered from there, below, without
   writing or locking the folder: a read-only folder works); else the folder is
   writable (:class:`RunFolderError`, exit 2, naming the path) and this process's alone (``run.lock``,
   :mod:`harness.runlock`, held until the run ends: another live process training this run is
   :class:`RunInProgress`, exit 2); the folder holds nothing of another run (signature, seed or experiment
   differ: :class:`IdentityError`, exit 2, with the way out: ``--rerun`` or another ``out_dir``); the run is
   looked up **in the store** (a FINISHED run of this signature and seed: its summary is returned with
   ``found_in`` set, so its line says "already finished in <store> (run <id>), not retrained"; the lock let go
   and nothing runs); a checkpoint is read, tensors and plain values only
   (:mod:`harness.torchfile`: a file naming code is refused unrun), and must be this run's (a truncated,
   crafted or foreign one: :class:`CheckpointError` / :class:`IdentityError`, exit 2).
2. :meth:`RunRecord.start` — creates the MLflow run, named for what it trains (``harness.tracking.run_name``:
   ``mean_n(n=8) s3``), or re-attaches to the checkpoint's.
3. :meth:`RunRecord.save_checkpoint` every ``trainer.checkpoint_every`` steps (atomic: tmp + rename; a failed
   write removes the tmp file and is :class:`CheckpointWriteError`, one line naming the path, exit 1; so is any
   run file, :class:`RunWriteError`). The store's own failures (locked past the deadline, full) are
   ``harness.tracking.StoreError``: one line, exit 1.
4. :meth:`RunRecord.finish` (summary, FINISHED) or :meth:`RunRecord.end` — an interrupt (SIGINT,
   SIGTERM: :class:`Interrupted`; submitit's preemption exit) ends the MLflow run KILLED, any other failure FAILED: no run is left
   RUNNING by a process that is gone (only a SIGKILL can, and its checkpoint resumes it). Under submitit a
   ``scancel`` ends that way: submitit's job ignores SIGTERM (its preemption signal is USR2), so Slurm's SIGKILL
   follows and the MLflow run stays RUNNING until a rerun resumes it; analysis leaves RUNNING runs out.
   Either way the folder's lock is let go (:meth:`RunRecord.release`; the loops call it once more, finally).

Signals (:func:`signals_as_interrupts`, installed by the CLI): the first SIGINT/SIGTERM during the
training loop lets the current step end, writes a checkpoint (if enabled) and raises
:class:`Interrupted`; outside the loop, or a second signal, raises at once.
"""
from __future__ import annotations

import json
import signal
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from harness import store, torchfile
from harness.runlock import RunInProgress, RunLock  # noqa: F401 - RunInProgress: the entry points' exit 2
from harness.tracking import StoreError
from harness.uri import redact

IDENTITY_FILE = "run.json"
SUMMARY_FILE = "summary.json"
CHECKPOINT_FILE = "checkpoint.pt"
IDENTITY_KEYS = ("signature", "seed", "experiment")  # what a run *is*; the store is where it is logged


class IdentityError(ValueError):
    """The folder or checkpoint belongs to another run (exit 2)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read (exit 2)."""


class RunFolderError(ValueError):
    """The run folder cannot be created or written (exit 2)."""


class RunWriteError(RuntimeError):
    """A file of the run (``spec.yaml``, ``run.json``, ``summary.json``) could not be written (disk full, a write
    error): one line naming it; the run ends FAILED (exit 1)."""


class CheckpointWriteError(RunWriteError):
    """A checkpoint could not be written (disk full, a write error): the run ends FAILED (exit 1)."""


class Interrupted(BaseException):
    """SIGINT/SIGTERM: the run was ended KILLED (a BaseException, like KeyboardInterrupt)."""

    def __init__(self, signum: int, detail: str = ""):
        self.signum, self.detail = signum, detail
        super().__init__(f"{signal.Signals(signum).name}{': ' + detail if detail else ''}")


@dataclass(frozen=True)
class Identity:
    signature: str
    seed: int
    experiment: str
    tracking_uri: str
    run_id: str | None = None

    @classmethod
    def of(cls, cfg) -> "Identity":
        return cls(cfg.signature, cfg.seed, cfg.tracking.experiment, redact(cfg.tracking_uri))  # no password

    def differences(self, other: dict[str, Any]) -> list[str]:
        """The identity keys ``other`` records with another value (keys it lacks are not compared)."""
        return [f"{k}={other[k]!r} (this run: {getattr(self, k)!r})" for k in IDENTITY_KEYS
                if k in other and other[k] != getattr(self, k)]


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


class RunRecord:
    def __init__(self, cfg, rerun: bool = False, finished_after_ms: int = 0, tags: dict[str, str] | None = None):
        self.cfg, self.rerun, self.tags = cfg, rerun, dict(tags or {})
        # --rerun: a FINISHED run started before now does not count
        self.finished_after_ms = int(time.time() * 1000) if rerun else finished_after_ms
        self.dir = Path(cfg.run_dir)
        self.identity = Identity.of(cfg)
        self.state: dict[str, Any] | None = None  # the checkpoint being resumed
        self.tracker = None
        self.in_loop = False
        self.stop_signal: int | None = None
        self.stop_time: float | None = None  # time.monotonic() when the signal came
        self.lock = RunLock(self.dir)

    # ------------------------------------------------------------------------- paths
    @property
    def summary_path(self) -> Path:
        return self.dir / SUMMARY_FILE

    @property
    def checkpoint_path(self) -> Path:
        return self.dir / CHECKPOINT_FILE

    @property
    def identity_path(self) -> Path:
        return self.dir / IDENTITY_FILE

    # ---------------------------------------------------------------- 1. before anything heavy
    def prepare(self):
        """Store, folder, store lookup, checkpoint (module docstring). Returns the finished run's
        ``RunSummary`` (nothing to do) or None (train: from ``self.state`` if it is set)."""
        from harness.tracking import client_for, live_experiment

        uri = self.cfg.tracking_uri  # the identity's is redacted
        store.check(uri)
        client = client_for(uri)
        live_experiment(client, self.identity.experiment, uri)  # deleted there: exit 2, before anything is written
        done = store.finished_run(client, self.identity.experiment, self.identity.signature, self.identity.seed,
                                  after_ms=self.finished_after_ms)
        if done is not None:  # the store's answer needs no folder: none written, none locked (a read-only one works)
            return self._summary_of(client, done)
        self._lock()
        try:
            self._check_folder()
            done = store.finished_run(client, self.identity.experiment, self.identity.signature,
                                      self.identity.seed, after_ms=self.finished_after_ms)
            if done is not None:
                self.release()  # finished: nothing will be written
                return self._summary_of(client, done)
            if self.state is not None:
                self._check_checkpoint_run(client)
        except BaseException:
            self.release()
            raise
        return None

    def _lock(self) -> None:
        """Create the folder and take its lock (:mod:`harness.runlock`): before anything is read or set aside."""
        d = self.dir
        if d.exists() and not d.is_dir():
            raise RunFolderError(f"run folder {d}: exists and is not a folder; choose another out_dir")
        try:
            d.mkdir(parents=True, exist_ok=True)
            self.lock.acquire()
        except OSError as exc:
            raise RunFolderError(f"cannot write the run folder {d}: {exc.strerror or exc}; "
                                 f"choose a writable out_dir") from None

    def release(self) -> None:
        """Let the folder's lock go (idempotent): the run has ended, or will not run in this process."""
        self.lock.release()

    def _check_folder(self) -> None:
        d = self.dir
        if d.exists() and not d.is_dir():
            raise RunFolderError(f"run folder {d}: exists and is not a folder; choose another out_dir")
        if self.rerun:
            self._archive(IDENTITY_FILE, SUMMARY_FILE, CHECKPOINT_FILE)
        found = [(IDENTITY_FILE, read_json(self.identity_path))]
        summary = read_json(self.summary_path)
        if summary is not None:
            found.append((SUMMARY_FILE, summary.get("identity") or {"signature": summary.get("signature")}))
        if self.checkpoint_path.exists():
            self.state = self._read_checkpoint()
            found.append((CHECKPOINT_FILE, self.state.get("identity") or {}))
        for name, ident in found:
            if ident is None:
                continue
            diff = self.identity.differences(ident)
            if diff:
                raise IdentityError(
                    f"{d / name} belongs to another run ({', '.join(diff)}); use another out_dir for this one, "
                    f"or --rerun to set the old files aside (*.prev-<time>) and start this run there")
        if self.state is not None and self.state["identity"].get("tracking_uri") != self.identity.tracking_uri:
            raise IdentityError(
                f"{self.checkpoint_path} belongs to MLflow run {self.state['identity'].get('run_id')} of the store "
                f"{self.state['identity'].get('tracking_uri')!r}, not {self.identity.tracking_uri!r}: set tracking.uri "
                f"to that store to resume it, or --rerun to start over in this one")
        if summary is not None and (summary.get("identity") or {}).get("tracking_uri") != self.identity.tracking_uri:
            self._archive(SUMMARY_FILE)  # another store's result: not finished here
        try:
            d.mkdir(parents=True, exist_ok=True)
            self._write_identity()
        except (OSError, RunWriteError) as exc:  # before the run starts: the folder is the bad input (exit 2)
            why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
            raise RunFolderError(f"cannot write the run folder {d}: {why}; choose a writable out_dir") from None

    def _read_checkpoint(self) -> dict[str, Any]:
        p = self.checkpoint_path
        try:
            state = torchfile.load(p)  # tensors and plain values only: a crafted pickle is refused, not run
        except Exception as exc:  # noqa: BLE001 - truncated, empty, random bytes, crafted, unreadable
            raise CheckpointError(f"checkpoint {p} cannot be read ({torchfile.cause(exc)}): delete it to start "
                                  f"this run over, or --rerun") from None
        if not isinstance(state, dict) or not isinstance(state.get("identity"), dict) or "trainer" not in state:
            raise CheckpointError(f"checkpoint {p} carries no run identity (an older harness wrote it, or it is "
                                  f"not a checkpoint): delete it to start this run over, or --rerun")
        return state

    def _check_checkpoint_run(self, client) -> None:
        run_id = self.state["identity"].get("run_id")
        if active_run(client, run_id) is None:
            raise IdentityError(f"{self.checkpoint_path} resumes MLflow run {run_id}, which is not in the store "
                                f"{self.identity.tracking_uri!r} (a new store, or a deleted run): --rerun to start over")

    def _summary_of(self, client, run):
        """The finished run's summary (``found_in``: this store): the folder's if it is that run's, else the
        store's artifact."""
        return replace(self._stored_summary(run), found_in=self.identity.tracking_uri)

    def _stored_summary(self, run):
        from harness.summary import RunSummary

        names = RunSummary.stored_fields()
        local = read_json(self.summary_path)
        if local is not None and local.get("run_id") == run.info.run_id:
            return RunSummary(**{k: local[k] for k in names})
        try:
            import mlflow.artifacts

            text = mlflow.artifacts.load_text(f"runs:/{run.info.run_id}/{SUMMARY_FILE}")
            data = json.loads(text)
            return RunSummary(**{k: data[k] for k in names})
        except Exception:  # noqa: BLE001 - a run finished by another tool: rebuild it from its data
            m = run.data.metrics
            return RunSummary(run_id=run.info.run_id, signature=self.identity.signature,
                              status=run.data.tags.get("status", "finished"), steps_done=self.cfg.trainer.steps,
                              final_reward=m.get("summary/final_reward", float("nan")),
                              peak_reward=m.get("summary/peak_reward", float("nan")),
                              time_per_step_s=m.get("summary/time_per_step_s", float("nan")))

    # ---------------------------------------------------------------- 2. the MLflow run
    def start(self, tags: dict[str, str], params: dict[str, Any], spec_text: str):
        """Create the MLflow run (or re-attach to the checkpoint's); returns the Tracker."""
        from harness.tracking import Tracker, run_name

        i = self.identity
        if self.state is not None:
            self.tracker = Tracker(self.cfg.tracking_uri, i.experiment, run_id=self.state["identity"]["run_id"])
            if self.tags:
                self._guard(self.tracker.set_tags, self.tags)
        else:
            self.tracker = Tracker(self.cfg.tracking_uri, i.experiment, run_name=run_name(self.cfg),
                                   tags={**tags, **self.tags})
            self._guard(self._first_writes, params, spec_text)
        self.identity = replace(self.identity, run_id=self.tracker.run_id)
        self._guard(self._write_identity)
        return self.tracker

    def _first_writes(self, params: dict[str, Any], spec_text: str) -> None:
        self.tracker.log_params(params)
        self.tracker.log_text(spec_text, "spec.yaml")
        self._write(self.dir / "spec.yaml", spec_text)

    def _guard(self, fn, *args):
        try:
            return fn(*args)
        except BaseException as exc:
            self.end(exc)
            raise

    def _write_identity(self) -> None:
        self._write(self.identity_path, json.dumps(asdict(self.identity), indent=2) + "\n")

    @staticmethod
    def _write(path: Path, text: str) -> None:
        """Write a run file atomically (tmp + rename); a failed write (disk full) removes its tmp file and is
        :class:`RunWriteError`, one line naming the path."""
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(text)
            tmp.replace(path)
        except OSError as exc:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            err = RunWriteError(f"cannot write {path}: {exc.strerror or exc}; free space there (or choose another "
                                f"out_dir), then the same command resumes from the run's last checkpoint")
            err.reason = exc.strerror or str(exc)
            raise err from None

    # ---------------------------------------------------------------- 3. checkpoints, the loop
    def save_checkpoint(self, trainer_state: dict[str, Any], extra: dict[str, Any]) -> None:
        """Write ``checkpoint.pt`` atomically (tensors and plain values: :mod:`harness.torchfile`); a failed write
        leaves the previous checkpoint and no tmp file, and is :class:`CheckpointWriteError` naming the path."""
        state = {"identity": asdict(self.identity), "run_id": self.identity.run_id, "trainer": trainer_state, **extra}
        try:
            torchfile.save(state, self.checkpoint_path)
        except torchfile.WriteFailed as exc:
            raise CheckpointWriteError(f"{exc}; free space there (or choose another out_dir), then the same command "
                                       f"resumes from the last checkpoint written") from None

    @contextmanager
    def loop(self) -> Iterator["RunRecord"]:
        """While inside, a first SIGINT/SIGTERM only sets ``stop_signal`` (see signals_as_interrupts)."""
        self.in_loop = True
        _ACTIVE.append(self)
        try:
            yield self
        finally:
            self.in_loop = False
            _ACTIVE.remove(self)

    # ---------------------------------------------------------------- 4. the end
    def finish(self, summary, metrics: dict[str, float]) -> None:
        """Log the summary, write ``summary.json`` (with the identity), end FINISHED, drop the checkpoint."""
        t = self.tracker
        data = summary.stored()
        text = json.dumps({**data, "identity": asdict(self.identity)}, indent=2)
        try:
            t.set_tags({"status": summary.status})
            t.log_step(summary.steps_done, metrics)
            t.log_text(json.dumps(data, indent=2), SUMMARY_FILE)
            self._write(self.summary_path, text)
        except BaseException as exc:
            self.end(exc)
            raise
        t.finish("FINISHED")
        self.checkpoint_path.unlink(missing_ok=True)
        self.release()

    def end(self, exc: BaseException) -> None:
        """An interrupted run ends KILLED, a failed one FAILED (best effort: the store may be the failure); the
        folder's lock is let go."""
        try:
            if self.tracker is None:
                return
            # SystemExit: submitit's preemption (USR2 -> checkpoint, requeue, exit): the requeued job resumes the run
            status = "KILLED" if isinstance(exc, (Interrupted, KeyboardInterrupt, SystemExit)) else "FAILED"
            try:
                self.tracker.finish(status, once=isinstance(exc, StoreError))  # a locked store: no second deadline
            except Exception:  # noqa: BLE001 - report the original failure, not this one
                pass
        finally:
            self.release()

    def _archive(self, *names: str) -> None:
        stamp = _stamp()
        for name in names:
            p = self.dir / name
            if p.exists():
                try:
                    p.replace(self.dir / f"{name}.prev-{stamp}")
                except OSError as exc:
                    raise RunFolderError(f"cannot move {p} aside: {exc.strerror or exc}") from None


def active_run(client, run_id: str | None):
    """The active (not deleted) MLflow run ``run_id`` of ``client``'s store, else None."""
    try:
        run = client.get_run(run_id)
    except Exception:  # noqa: BLE001 - not in this store
        return None
    return run if run.info.lifecycle_stage == "active" else None


def read_json(path: Path) -> dict[str, Any] | None:
    """A run folder's JSON file (None when absent); unreadable: RunFolderError naming it."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{path} cannot be read ({exc}): delete it, or --rerun") from None
    return data if isinstance(data, dict) else None


# ------------------------------------------------------------------------------------ signals
_ACTIVE: list[RunRecord] = []


@contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """SIGTERM is handled as SIGINT: in a record's loop the first one stops the run after its step,
    otherwise (or the second time) :class:`Interrupted` is raised at once. Main thread only."""

    def handler(signum, frame):  # noqa: ARG001
        live = [r for r in _ACTIVE if r.in_loop]
        if live and all(r.stop_signal is None for r in live):  # a loop over several records (a seed pack) sees it on each
            for r in live:
                r.stop_signal, r.stop_time = signum, time.monotonic()
            return
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)

"""What a launcher submits for the local backend: submitit callables that resume when requeued.

On preemption or timeout Slurm sends USR2, submitit calls ``checkpoint()``, which returns a
``DelayedSubmission`` of the same callable; the requeued job calls it again and the run resumes
from ``<run_dir>/checkpoint.pt`` into the same MLflow run (``harness.record``).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission


class RunJob(Checkpointable):
    """One run: build the resolved spec into a RunConfig and ``execute`` it (resuming if it can)."""

    def __init__(self, spec: dict[str, Any], tags: dict[str, str] | None = None, finished_after_ms: int = 0):
        self.spec = spec
        self.tags = tags or {}
        self.finished_after_ms = finished_after_ms  # a sweep's --rerun: older FINISHED runs do not count

    @property
    def signature(self) -> str:
        from harness.spec import signature

        return signature(self.spec)

    def __call__(self) -> dict[str, Any]:
        from harness.backends.local.run import execute
        from harness.spec import build

        cfg = build(self.spec)
        summary = execute(cfg, tags=self.tags or None, finished_after_ms=getattr(self, "finished_after_ms", 0),
                          progress=False)  # job logs are files, not terminals
        return asdict(summary)

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        # The run's state is on disk (checkpoint.pt, every trainer.checkpoint_every steps):
        # resubmitting the same callable resumes from it.
        return DelayedSubmission(RunJob(self.spec, self.tags, self.finished_after_ms), *args, **kwargs)


class PackJob(Checkpointable):
    """A seed pack: several seeds of one spec trained together in one process
    (``harness.backends.local.run.execute_pack``), each seed its own MLflow run and checkpoint."""

    def __init__(self, specs: list[dict[str, Any]], finished_after_ms: int = 0):
        self.specs, self.finished_after_ms = specs, finished_after_ms

    def __call__(self) -> list[dict[str, Any]]:
        from harness.backends.local.run import execute_pack
        from harness.spec import build

        summaries = execute_pack([build(s) for s in self.specs], finished_after_ms=self.finished_after_ms)
        return [asdict(s) for s in summaries]

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return DelayedSubmission(PackJob(self.specs, self.finished_after_ms), *args, **kwargs)

"""Slurm's USR2 on the submitit path, and the checkpoint folder's measured write speed (issue 44).

**USR2.** submitit asks Slurm for ``--signal=USR2@<launcher.signal_delay_s>`` without ``B:``: Slurm sends it to
every process of the job step, not only to submitit's python (whose handler calls ``VerlJob.checkpoint`` and
requeues). verl's ``main_ppo``, the raylets and Ray's workers, vLLM, have no USR2 handler: the default action ends
them, so verl would die at the signal, in or before its early save. The harness starts every process of verl's
tree (``main_ppo``; ``ray start`` of the head and of the workers, whose raylets start the Ray workers) through
:func:`run_shielded`: USR2 is ignored in the child, and an ignored signal stays ignored across ``fork`` and
``exec``, so the whole tree inherits it. submitit's own python keeps its handler. The early save itself is verl's,
from the job's end time (``launch.esi_environment``), so USR2 has nothing else to ask of verl.

**Write speed.** The early save must finish before the signal: its budget is the checkpoint's size over the write
speed to the checkpoint folder (``memory.save_budget_s``). :func:`write_speed_env`, at the start of the job on the
head node, times a write of ``HARNESS_CKPT_PROBE_GB`` (default 2 GB, fsync'd, then deleted) into that folder and sets
``HARNESS_CKPT_WRITE_GBPS`` from it, unless the job's environment already sets it (a speed measured by the user
wins).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

PROBE_ENV, WRITE_ENV = "HARNESS_CKPT_PROBE_GB", "HARNESS_CKPT_WRITE_GBPS"
PROBE_GB = 2.0
CHUNK = 64 * 2 ** 20
GB = 1e9


def ignore_usr2() -> None:
    """The child's first act (``preexec_fn``): USR2 ignored, inherited by everything it starts."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def run_shielded(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of a process of verl's tree, with USR2 ignored in it (module docstring)."""
    return subprocess.run(argv, preexec_fn=ignore_usr2, **kwargs)


def measure_write_gbps(folder: Path, gb: float) -> float:
    """GB/s of a write of ``gb`` GB into ``folder`` (64 MB blocks, fsync'd before the clock stops), then deleted."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".harness_write_probe.{os.getpid()}"
    block = os.urandom(min(CHUNK, max(1, int(gb * GB))))
    left = int(gb * GB)
    t0 = time.perf_counter()
    try:
        with open(path, "wb", buffering=0) as f:
            while left > 0:
                left -= f.write(block[:left])
            os.fsync(f.fileno())
        seconds = time.perf_counter() - t0
    finally:
        path.unlink(missing_ok=True)
    return gb / max(seconds, 1e-6)


def write_speed_env(folder: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``{HARNESS_CKPT_WRITE_GBPS: measured}``, or ``{}`` where the environment sets it already."""
    from harness.errors import ConfigError

    env = os.environ if env is None else env
    if env.get(WRITE_ENV):
        return {}
    raw = env.get(PROBE_ENV, str(PROBE_GB))
    try:
        gb = float(raw)
    except ValueError:
        gb = -1.0
    if not gb > 0:
        raise ConfigError(PROBE_ENV, f"the size of the write-speed probe in GB, > 0 (e.g. 2), got {raw!r}")
    gbps = measure_write_gbps(folder, gb)
    print(f"[harness] checkpoint folder {folder}: {gb:g} GB written at {gbps:.3f} GB/s ({WRITE_ENV}; the early "
          "save's budget follows it)", flush=True)
    return {WRITE_ENV: f"{gbps:.4g}"}

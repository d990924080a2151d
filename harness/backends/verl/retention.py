"""What a finished verl run keeps of its checkpoints (``verl.keep_checkpoint``, issue 44).

A Qwen3-30B-A3B checkpoint with Adam states is ~430 GB (megatron): a sweep of 27 finished runs would keep ~11.5 TB.
Once a run is finished (verl exited 0 and every step's metrics are in the store: ``runner.train``), its checkpoint
folder (``translate.checkpoint_root``) is reduced to what the spec asks for:

* ``none`` (default): everything deleted (the run cannot be resumed or extended; its result is in the store);
* ``hf``: the last checkpoint's actor as Hugging Face weights in ``<root>/hf_model`` (verl's own
  ``python -m verl.model_merger merge``, run on the head node: it needs host RAM for the whole model), then the rest
  deleted; a failed conversion keeps everything and says so;
* ``last``: verl's last checkpoint, resumable (``runner.prune_checkpoints`` has already removed the others).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
HF_DIR = "hf_model"


def _last(root: Path) -> Path | None:
    try:
        step = root / f"global_step_{int((root / TRACKER).read_text().strip())}"
    except (OSError, ValueError):
        return None
    return step if step.is_dir() else None


def merge_command(step_dir: Path, target: Path, strategy: str) -> list[str]:
    """verl's model merger of the checkpoint's actor into Hugging Face weights."""
    backend = "megatron" if strategy == "megatron" else "fsdp"
    return [sys.executable, "-m", "verl.model_merger", "merge", "--backend", backend,
            "--local_dir", str(step_dir / "actor"), "--target_dir", str(target)]


def retain(root: Path, keep: str, strategy: str, run=subprocess.run) -> str:
    """Reduce ``root`` to ``keep`` (module docstring); one line saying what was kept."""
    if not root.is_dir():
        return f"no checkpoint folder {root}: nothing to keep"
    steps = sorted(p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"global_step_\d+", p.name))
    if keep == "last":
        last = _last(root)
        return f"kept the last checkpoint {last or root}"
    if keep == "hf":
        last = _last(root)
        if last is None:
            return f"no complete checkpoint in {root}: no Hugging Face weights written, nothing deleted"
        proc = run(merge_command(last, root / HF_DIR, strategy))
        if proc.returncode != 0:
            return (f"verl's model_merger exited {proc.returncode} on {last}: checkpoints kept (convert by hand: "
                    f"{' '.join(merge_command(last, root / HF_DIR, strategy))})")
    for path in steps:
        shutil.rmtree(path)
    (root / TRACKER).unlink(missing_ok=True)
    if keep == "hf":
        return f"kept {root / HF_DIR} (Hugging Face weights of {steps[-1].name if steps else '?'}); deleted " \
               f"{len(steps)} checkpoint(s)"
    if not any(root.iterdir()):
        root.rmdir()
    return f"deleted {len(steps)} checkpoint(s) in {root} (verl.keep_checkpoint=none)"

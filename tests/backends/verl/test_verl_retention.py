"""What a finished verl run keeps (``verl.keep_checkpoint``, retention.py) and where checkpoints go by default
(``$SCRATCH``, translate.checkpoint_root) (issue 44). The checkpoint folders are stand-ins (named so: empty
``global_step_N`` folders and verl's tracker file); verl's model merger is replaced by a recorder where named."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.backends.verl import translate
from harness.backends.verl.retention import HF_DIR, TRACKER, merge_command, retain


def _checkpoints(root: Path, steps=(2, 4), tracked: int = 4) -> None:
    for s in steps:
        (root / f"global_step_{s}" / "actor").mkdir(parents=True)
        (root / f"global_step_{s}" / "actor" / "model_world_size_8_rank_0.pt").write_text("stand-in")
    (root / TRACKER).write_text(str(tracked))


def test_none_deletes_every_checkpoint_and_the_empty_folder(tmp_path):
    root = tmp_path / "ckpt"
    _checkpoints(root)
    assert retain(root, "none", "megatron") == f"deleted 2 checkpoint(s) in {root} (verl.keep_checkpoint=none)"
    assert not root.exists()


def test_last_keeps_verls_last_checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    _checkpoints(root, steps=(4,))
    assert "global_step_4" in retain(root, "last", "fsdp2")
    assert (root / "global_step_4" / "actor").is_dir() and (root / TRACKER).exists()


def test_hf_converts_the_last_checkpoint_with_verls_merger_then_deletes(tmp_path):
    root = tmp_path / "ckpt"
    _checkpoints(root)
    calls = []

    def merger(argv):  # a recorder in place of verl's model_merger (which needs the real checkpoint)
        calls.append(argv)
        Path(argv[argv.index("--target_dir") + 1]).mkdir()
        return subprocess.CompletedProcess(argv, 0)

    out = retain(root, "hf", "megatron", run=merger)
    assert calls == [merge_command(root / "global_step_4", root / HF_DIR, "megatron")]
    assert calls[0][2:7] == ["verl.model_merger", "merge", "--backend", "megatron", "--local_dir"]
    assert sorted(p.name for p in root.iterdir()) == [HF_DIR] and "kept" in out
    _checkpoints(root)
    out = retain(root, "hf", "fsdp", run=lambda argv: subprocess.CompletedProcess(argv, 1))  # a failed conversion
    assert "checkpoints kept" in out and (root / "global_step_4").is_dir()


def test_the_default_checkpoint_folder_is_scratch_and_never_enters_the_signature(spec, tmp_path):
    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", tmp=tmp_path)
    scratch = tmp_path / "scratch"
    assert translate.checkpoint_root(cfg, env={}) == cfg.run_dir / translate.CHECKPOINT_DIR
    assert translate.checkpoint_root(cfg, env={"SCRATCH": str(scratch)}) == \
        scratch / "moe-rl-harness" / "verl_checkpoints" / cfg.tracking.experiment / cfg.signature
    assert translate.checkpoint_root(cfg, env={"SCRATCH": "relative"}) == cfg.run_dir / translate.CHECKPOINT_DIR
    set_ = spec("estimator=tis", "model=qwen3_30b_a3b", f"verl.checkpoint_dir={tmp_path}/c", tmp=tmp_path)
    assert translate.checkpoint_root(set_, env={"SCRATCH": str(scratch)}) == \
        tmp_path / "c" / cfg.tracking.experiment / set_.signature  # the key wins
    kept = spec("estimator=tis", "model=qwen3_30b_a3b", "verl.keep_checkpoint=last", tmp=tmp_path)
    assert kept.signature == cfg.signature  # what a finished run keeps is not what it computes


def test_a_bad_keep_checkpoint_names_the_key(spec):
    from harness.spec import ConfigError

    with pytest.raises(ConfigError, match="verl.keep_checkpoint"):
        spec("estimator=tis", "model=qwen3_30b_a3b", "verl.keep_checkpoint=all")

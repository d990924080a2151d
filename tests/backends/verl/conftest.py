"""Fixtures of the verl backend tests: verl's own config tree, a tiny offline HF checkpoint, specs.

All of it runs on CPU: verl 0.9.1 is installed (tests extra), vLLM and GPUs are not. The only
fakes are for what cannot run here, and they say so: ``FakeVLLMServer`` (verl's vLLM server) and
``fake_main_ppo.py`` (verl's entry point without Ray, vLLM and GPU workers).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.spec import load

try:
    import verl
except ImportError as exc:  # every test here is then skipped, with this reason
    verl = None
    VERL_MISSING = f"verl is not importable ({exc}); `bash scripts/install.sh test` installs verl==0.9.1"
else:
    VERL_MISSING = None

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    if VERL_MISSING:
        for item in items:
            if HERE in Path(str(item.fspath)).resolve().parents:
                item.add_marker(pytest.mark.skip(reason=VERL_MISSING))

LLM = ["trainer.lr=1e-6", "trainer.prompts_per_step=16", "trainer.group_size=8", "trainer.num_minibatches=4"]


def verl_spec(*overrides: str, tmp: Path | None = None):
    """A validated backend=verl RunConfig (harness.spec.load + the verl backend's validate)."""
    from harness.backends.verl.config import validate

    extra = [f"out_dir={tmp}/run", f"tracking.uri=sqlite:///{tmp}/mlruns.db"] if tmp is not None else []
    return validate(load(["backend=verl", *LLM, *extra, *overrides]))


@pytest.fixture
def spec():
    """``spec("estimator=tis", "model=qwen3_30b_a3b", ...)`` -> a validated backend=verl RunConfig."""
    return verl_spec


@pytest.fixture(scope="session")
def tiny_hf_model(tmp_path_factory) -> Path:
    """A Qwen3-MoE config + word-level tokenizer with a chat template, written offline (no weights):
    enough for verl's HFModelConfig and RLHFDataset."""
    from transformers import Qwen3MoeConfig

    from harness.backends.verl.tokenizer import write_word_tokenizer

    out = tmp_path_factory.mktemp("tiny_qwen3_moe")
    words = [str(d) for d in range(10)] + "sort these digits in ascending order add and write the sum of".split()
    n_vocab = write_word_tokenizer(out, words)
    Qwen3MoeConfig(vocab_size=n_vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                   num_experts=8, num_experts_per_tok=4, architectures=["Qwen3MoeForCausalLM"]).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3_moe"
    return out


@pytest.fixture
def process_group(tmp_path):
    """A one-process gloo group: verl's engine all-reduces token counts over its data-parallel group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture
def cpu_fsdp_engine(monkeypatch):
    """``cpu_fsdp_engine(model)`` -> verl's ``FSDPEngineWithLMHead`` around an HF model, on CPU, with our RAIS
    patch installed (active only with HARNESS_RAIS=1). What cannot run here is replaced, named: the object is
    made without ``__init__`` (no FSDP wrapping; use with ``process_group``), and verl's device lookups answer
    "cpu" (verl has no CPU platform). Its ``forward_step``, ``forward_backward_batch``, ``infer_batch`` are verl's."""
    import sys

    import torch
    import verl.workers.engine.fsdp.transformer_impl as ti

    from harness.backends.verl.plugins import rais_fsdp

    rais_fsdp.install()
    for name, mod in list(sys.modules.items()):
        if name.startswith("verl.") and mod is not None:
            for fn in ("get_device_id", "get_device_name"):
                if callable(getattr(mod, fn, None)):
                    monkeypatch.setattr(mod, fn, lambda: "cpu")

    def make(model):
        eng = object.__new__(ti.FSDPEngineWithLMHead)
        eng.module, eng.pad_to_length, eng.use_ulysses_sp, eng.ulysses_sequence_parallel_size = model, False, False, 1
        eng._autocast_dtype, eng.pass_packed_cu_seqlens, eng.ulysses_device_mesh = torch.float32, False, None
        eng.engine_config = type("EngineCfg", (), {"entropy_checkpointing": False, "entropy_from_logits_with_chunking": False,
                                                   "forward_only": False, "fsdp_size": 1})
        eng.optimizer, eng.ulysses_parallel_group, eng._is_offload_param, eng._is_offload_optimizer = None, None, False, False
        return eng

    return make


@pytest.fixture
def no_hf_network(monkeypatch):
    """Hugging Face offline for one test. ``datasets``' ``Dataset.map(num_proc=...)`` (verl's RLHFDataset filter)
    rebinds ``os.environ`` to a snapshot (``os.environ = prev_env``, datasets/arrow_dataset.py), out of
    monkeypatch's reach: the original mapping is put back first, so the variables do not leak into later tests."""
    import os

    env = os.environ
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    yield
    os.environ = env  # then monkeypatch's undo removes the variables from it



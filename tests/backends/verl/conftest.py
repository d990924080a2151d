"""Fixtures of the verl backend tests: verl's own config tree, a tiny offline HF checkpoint, specs.

All of it runs on CPU: verl 0.9.1 is installed (tests extra), vLLM and GPUs are not. The only
fakes are for what cannot run here, and they say so: ``FakeVLLMServer`` (verl's vLLM server) and
``fake_main_ppo.py`` (verl's entry point without Ray, vLLM and GPU workers).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config import load

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
    """A validated backend=verl RunConfig (harness.config.load + the verl backend's validate)."""
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
def no_hf_network(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")



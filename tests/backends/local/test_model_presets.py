"""The local model presets (experiments/model/): each MoE preset composes, builds, builds, and has a dense twin of equal
active parameters (one SwiGLU of hidden top_k * d_expert) and otherwise the same shape."""
import pytest
import torch

from harness.backends.local.model import Policy
from harness.spec import group_options, load

PAIRS = [(m, m.replace("moe_", "dense_")) for m in group_options("model") if m.startswith("moe_")]


def test_every_local_moe_preset_has_its_dense_twin():
    assert ("moe_tiny", "dense_tiny") in PAIRS and len(PAIRS) >= 3
    assert all(d in group_options("model") for _, d in PAIRS)


@pytest.mark.parametrize("moe, dense", PAIRS)
def test_the_twins_share_their_shape_and_active_parameters(moe, dense):
    m, d = load([f"model={moe}"]).model, load([f"model={dense}"]).model
    assert (m.kind, d.kind) == ("moe", "dense")
    assert d.ffn_hidden == m.top_k * m.d_expert
    for key in ("d_model", "n_layers", "n_heads", "rope_theta", "norm_eps", "init_std"):
        assert getattr(m, key) == getattr(d, key), key


def test_the_small_presets_build():
    for name in ("moe_small", "dense_small"):
        cfg = load([f"model={name}"])
        torch.manual_seed(0)
        policy = Policy(cfg.model, 32)
        n = sum(p.numel() for p in policy.parameters())
        assert n > 1e6, (name, n)

"""Our Policy <-> Hugging Face Qwen3-MoE / Qwen3: same float32 logits, exact round trips."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e .[test])")

from harness.backends.local import hf  # noqa: E402
from harness.backends.local import train_engine as TE  # noqa: E402
from harness.backends.local.model import EOS, VOCAB_SIZE, build_policy  # noqa: E402
from harness.spec import ModelConfig  # noqa: E402

KINDS = ("moe", "dense")


def _policy(kind: str, seed: int = 0):
    """A policy with weights far from init (std 0.2, norms != 1) so every mapping mistake shows."""
    cfg = ModelConfig(name=f"{kind}_test", kind=kind, init_std=0.2, rope_theta=500.0)
    policy = build_policy(cfg, seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for p in policy.parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
    return policy


@pytest.fixture(scope="module", params=KINDS)
def pair(request):
    torch.set_num_threads(1)
    policy = _policy(request.param)
    return policy, hf.to_hf(policy)


def _tokens(b: int = 4, t: int = 24, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB_SIZE, (b, t), generator=torch.Generator().manual_seed(seed))


def _same_params(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].shape == sb[k].shape, k
        assert torch.equal(sa[k], sb[k]), k


def test_config_describes_our_architecture(pair):
    policy, model = pair
    c, cfg = model.config, policy.cfg
    assert c.model_type == ("qwen3_moe" if policy.is_moe else "qwen3")
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (
        cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_heads, cfg.d_model // cfg.n_heads)
    assert c.vocab_size == VOCAB_SIZE and not c.tie_word_embeddings and c.eos_token_id == EOS
    assert c.rope_parameters["rope_theta"] == cfg.rope_theta and c.rms_norm_eps == cfg.norm_eps
    if policy.is_moe:
        assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (cfg.n_experts, cfg.top_k, cfg.d_expert)
        assert c.norm_topk_prob and not c.output_router_logits  # output_router_logits=True breaks generate()
    else:
        assert c.intermediate_size == cfg.top_k * cfg.d_expert  # equal active parameters
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in policy.parameters())


def test_float32_logits_match_train_engine(pair):
    policy, model = pair
    tokens = _tokens()
    with torch.no_grad():
        ours = TE.forward(policy, tokens)
        theirs = model(tokens, output_router_logits=policy.is_moe)
    assert theirs.logits.dtype == torch.float32
    torch.testing.assert_close(theirs.logits, ours.logits, atol=1e-5, rtol=0)
    if policy.is_moe:  # router logits per layer: HF gives a tuple of [B*T, E]
        b, t = tokens.shape
        router = torch.stack(theirs.router_logits, 1).view(b, t, policy.cfg.n_layers, -1)
        torch.testing.assert_close(router, ours.router_logits, atol=1e-5, rtol=0)


def test_greedy_generate_with_kv_cache_matches_full_forward(pair):
    policy, model = pair
    prompts, new = _tokens(3, 6, seed=1), 5
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                             max_new_tokens=new, min_new_tokens=new, pad_token_id=0)
        seq = prompts
        for _ in range(new):
            seq = torch.cat([seq, TE.forward(policy, seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)


def test_round_trip_gives_identical_parameters(pair):
    policy, model = pair
    back = hf.from_hf(model)
    assert back.cfg == policy.cfg and back.vocab_size == policy.vocab_size
    _same_params(policy, back)
    _same_params(model, hf.to_hf(back))


def test_save_pretrained_round_trip(pair, tmp_path):
    policy, _ = pair
    hf.save_pretrained(policy, tmp_path)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in tmp_path.iterdir()}
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    if policy.is_moe:  # written in the per-expert layout of the original checkpoints (vLLM reads this)
        assert "model.layers.0.mlp.experts.0.gate_proj.weight" in keys
        assert "model.layers.0.mlp.gate.weight" in keys
    back = hf.load_pretrained(tmp_path)
    assert back.cfg == policy.cfg
    _same_params(policy, back)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok("<bos>90215=")["input_ids"]
    assert ids == [12, 9, 0, 2, 1, 5, 11] and tok.decode(ids) == "<bos>90215=" and tok.eos_token_id == EOS


def test_from_hf_without_stored_config_derives_it():
    policy = build_policy(ModelConfig(name="dense_ff96", kind="dense", d_ff=96), 0)
    model = hf.to_hf(policy)
    delattr(model.config, hf.CONFIG_KEY)
    back = hf.from_hf(model)
    assert back.cfg.kind == "dense" and back.cfg.d_ff == 96 and back.cfg.d_model == policy.cfg.d_model
    _same_params(policy, back)


def test_unsupported_hf_configs_are_refused():
    import transformers

    base = dict(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, head_dim=8,
                moe_intermediate_size=8, num_experts=4, num_experts_per_tok=2)
    for bad, msg in ((dict(num_key_value_heads=2, norm_topk_prob=True), "num_key_value_heads"),
                     (dict(num_key_value_heads=4, norm_topk_prob=False), "norm_topk_prob")):
        with pytest.raises(ValueError, match=msg):
            hf.model_config_from_hf(transformers.Qwen3MoeConfig(**base, **bad))

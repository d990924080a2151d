"""Our Policy <-> the Hugging Face Qwen3-MoE layout (and Qwen3 for the dense twin).

The local policy is a Qwen3-MoE decoder with ``num_key_value_heads == num_attention_heads``,
``norm_topk_prob=True``, no biases, an untied LM head and every layer sparse; the dense twin is a
``Qwen3ForCausalLM`` with ``intermediate_size = d_ff or top_k * d_expert``. The conversion is exact
(a transpose per matrix), so the same weights give the same float32 logits in both
(``tests/backends/local/test_hf.py``), and ``save_pretrained`` writes a checkpoint directory
(config, safetensors in the per-expert layout vLLM reads, a 16-token tokenizer) that verl can
start from.

Parameter map (ours, stored ``[in, out]`` and used as ``x @ W`` -> HF ``nn.Linear`` ``[out, in]``)::

    embed [V, d]                          model.embed_tokens.weight [V, d]
    blocks.i.attn_norm                    model.layers.i.input_layernorm.weight
    blocks.i.attn.{q,k,v,o}_proj [d, d]   model.layers.i.self_attn.{q,k,v,o}_proj.weight (transposed)
    blocks.i.attn.{q,k}_norm [hd]         model.layers.i.self_attn.{q,k}_norm.weight
    blocks.i.ffn_norm                     model.layers.i.post_attention_layernorm.weight
    MoE:   blocks.i.ffn.router [d, E]     model.layers.i.mlp.gate.weight [E, d]
           blocks.i.ffn.w_gate/w_up [E, d, f]
                                          model.layers.i.mlp.experts.gate_up_proj [E, 2f, d]
                                          (gate rows first, then up; transformers 5.x fused experts)
           blocks.i.ffn.w_down [E, f, d]  model.layers.i.mlp.experts.down_proj [E, d, f]
    dense: blocks.i.ffn.w_{gate,up} [d, F], w_down [F, d]
                                          model.layers.i.mlp.{gate,up,down}_proj.weight (transposed)
    final_norm                            model.norm.weight
    lm_head [d, V]                        lm_head.weight [V, d]

transformers is imported lazily: it is a test/benchmark dependency, not a runtime one.
``output_router_logits`` is left off in the config: in transformers 5.10 it breaks ``generate()``;
pass ``output_router_logits=True`` to a training forward call instead.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harness.backends.local.model import BOS, EOS, PAD, VOCAB_SIZE, Policy
from harness.spec import ModelConfig

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PretrainedConfig, PreTrainedModel

#: our ModelConfig travels in the HF config under this key, so ``from_hf`` restores it exactly
CONFIG_KEY = "harness_model"
#: token strings of the task vocabulary (ids as in ``harness.backends.local.model``)
TOKENS = tuple(str(d) for d in range(10)) + ("+", "=", "<bos>", "<eos>", "<pad>", "<unk>")
MAX_POSITIONS = 512


def to_hf_config(model_cfg: ModelConfig, vocab_size: int = VOCAB_SIZE) -> "PretrainedConfig":
    """``Qwen3MoeConfig`` (moe) or ``Qwen3Config`` (dense twin) describing our architecture."""
    import transformers

    c = model_cfg
    if c.d_model % c.n_heads:
        raise ValueError(f"d_model={c.d_model} is not divisible by n_heads={c.n_heads}")
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_heads,
        head_dim=c.d_model // c.n_heads,
        hidden_act="silu",
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=c.init_std,
        rms_norm_eps=c.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(c.rope_theta)},
        attention_bias=False,
        tie_word_embeddings=False,
        use_sliding_window=False,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        dtype="float32",
        architectures=["Qwen3MoeForCausalLM" if c.kind == "moe" else "Qwen3ForCausalLM"],
        **{CONFIG_KEY: dataclasses.asdict(c)},
    )
    if c.kind == "moe":
        return transformers.Qwen3MoeConfig(
            **common,
            intermediate_size=c.ffn_hidden,  # unused (no mlp_only_layers); the dense twin's size
            moe_intermediate_size=c.d_expert,
            num_experts=c.n_experts,
            num_experts_per_tok=c.top_k,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            output_router_logits=False,
            router_aux_loss_coef=0.0,
        )
    if c.kind == "dense":
        return transformers.Qwen3Config(**common, intermediate_size=c.ffn_hidden)
    raise ValueError(f"model.kind must be moe or dense, got {c.kind!r}")


def hf_state_dict(policy: Policy) -> dict[str, torch.Tensor]:
    """Our parameters renamed and transposed into the HF (transformers 5.x) module layout."""
    p = {k: v.detach() for k, v in policy.state_dict().items()}
    out = {"model.embed_tokens.weight": p["embed"], "model.norm.weight": p["final_norm"], "lm_head.weight": p["lm_head"].T}
    for i in range(policy.cfg.n_layers):
        s, h = f"blocks.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = p[s + "attn_norm"]
        out[h + "post_attention_layernorm.weight"] = p[s + "ffn_norm"]
        for n in ("q", "k", "v", "o"):
            out[h + f"self_attn.{n}_proj.weight"] = p[s + f"attn.{n}_proj"].T
        for n in ("q", "k"):
            out[h + f"self_attn.{n}_norm.weight"] = p[s + f"attn.{n}_norm"]
        if policy.is_moe:
            out[h + "mlp.gate.weight"] = p[s + "ffn.router"].T
            out[h + "mlp.experts.gate_up_proj"] = torch.cat(
                [p[s + "ffn.w_gate"].transpose(1, 2), p[s + "ffn.w_up"].transpose(1, 2)], dim=1)
            out[h + "mlp.experts.down_proj"] = p[s + "ffn.w_down"].transpose(1, 2)
        else:
            for n in ("gate", "up", "down"):
                out[h + f"mlp.{n}_proj.weight"] = p[s + f"ffn.w_{n}"].T
    return {k: v.contiguous().clone() for k, v in out.items()}


def to_hf(policy: Policy) -> "PreTrainedModel":
    """A float32 ``Qwen3MoeForCausalLM`` / ``Qwen3ForCausalLM`` (eval mode) holding our weights."""
    import transformers

    config = to_hf_config(policy.cfg, policy.vocab_size)
    cls = transformers.Qwen3MoeForCausalLM if policy.is_moe else transformers.Qwen3ForCausalLM
    device = policy.embed.device
    model = cls(config)  # tiny: a throw-away random init is cheaper than meta-device bookkeeping
    model.load_state_dict(hf_state_dict(policy), strict=True)
    model.to(device=device, dtype=torch.float32)
    return model.eval()


def model_config_from_hf(config: "PretrainedConfig") -> ModelConfig:
    """Our ModelConfig: the stored one when the checkpoint came from ``save_pretrained``, else derived."""
    mt = getattr(config, "model_type", None)
    if mt not in ("qwen3_moe", "qwen3"):
        raise ValueError(f"expected a qwen3_moe or qwen3 config, got model_type={mt!r}")
    heads, d = config.num_attention_heads, config.hidden_size
    problems = []
    if config.num_key_value_heads != heads:
        problems.append(f"num_key_value_heads={config.num_key_value_heads} != num_attention_heads={heads}")
    if (getattr(config, "head_dim", None) or d // heads) * heads != d:
        problems.append(f"head_dim={config.head_dim} * heads != hidden_size={d}")
    if getattr(config, "attention_bias", False):
        problems.append("attention_bias=True")
    if getattr(config, "tie_word_embeddings", False):
        problems.append("tie_word_embeddings=True")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        problems.append(f"rope_type={rope.get('rope_type')!r}")
    if mt == "qwen3_moe":
        if not config.norm_topk_prob:
            problems.append("norm_topk_prob=False")
        if config.mlp_only_layers or config.decoder_sparse_step != 1:
            problems.append("not every layer is sparse (mlp_only_layers / decoder_sparse_step)")
    if problems:
        raise ValueError("not convertible to the local policy: " + "; ".join(problems))

    stored = getattr(config, CONFIG_KEY, None)
    if isinstance(stored, dict):
        names = {f.name for f in dataclasses.fields(ModelConfig)}
        cfg = ModelConfig(**{k: v for k, v in stored.items() if k in names})
    else:
        cfg = ModelConfig(name=f"hf_{mt}", kind="moe" if mt == "qwen3_moe" else "dense")
    cfg.d_model, cfg.n_layers, cfg.n_heads = d, config.num_hidden_layers, heads
    cfg.rope_theta = float(rope.get("rope_theta", cfg.rope_theta))
    cfg.norm_eps = float(config.rms_norm_eps)
    if mt == "qwen3_moe":
        cfg.kind, cfg.n_experts, cfg.top_k = "moe", config.num_experts, config.num_experts_per_tok
        cfg.d_expert = config.moe_intermediate_size
    else:
        cfg.kind = "dense"
        if config.intermediate_size != cfg.top_k * cfg.d_expert:
            cfg.d_ff = config.intermediate_size
    return cfg


def from_hf(hf_model: "PreTrainedModel") -> Policy:
    """Our float32 Policy from a Qwen3-MoE / Qwen3 causal LM (exact inverse of ``to_hf``)."""
    cfg = model_config_from_hf(hf_model.config)
    policy = Policy(cfg, hf_model.config.vocab_size)
    sd = {k: v.detach().float() for k, v in hf_model.state_dict().items()}
    if "lm_head.weight" not in sd:  # a tied checkpoint (rejected above) or a bare base model
        raise ValueError("the HF model has no lm_head.weight: pass a *ForCausalLM model")
    ours = {"embed": sd["model.embed_tokens.weight"], "final_norm": sd["model.norm.weight"], "lm_head": sd["lm_head.weight"].T}
    for i in range(cfg.n_layers):
        s, h = f"blocks.{i}.", f"model.layers.{i}."
        ours[s + "attn_norm"] = sd[h + "input_layernorm.weight"]
        ours[s + "ffn_norm"] = sd[h + "post_attention_layernorm.weight"]
        for n in ("q", "k", "v", "o"):
            ours[s + f"attn.{n}_proj"] = sd[h + f"self_attn.{n}_proj.weight"].T
        for n in ("q", "k"):
            ours[s + f"attn.{n}_norm"] = sd[h + f"self_attn.{n}_norm.weight"]
        if cfg.kind == "moe":
            f = cfg.d_expert
            gate_up = sd[h + "mlp.experts.gate_up_proj"]  # [E, 2f, d]
            ours[s + "ffn.router"] = sd[h + "mlp.gate.weight"].T
            ours[s + "ffn.w_gate"] = gate_up[:, :f].transpose(1, 2)
            ours[s + "ffn.w_up"] = gate_up[:, f:].transpose(1, 2)
            ours[s + "ffn.w_down"] = sd[h + "mlp.experts.down_proj"].transpose(1, 2)
        else:
            for n in ("gate", "up", "down"):
                ours[s + f"ffn.w_{n}"] = sd[h + f"mlp.{n}_proj.weight"].T
    policy.load_state_dict({k: v.contiguous().clone() for k, v in ours.items()}, strict=True)
    return policy


def build_tokenizer():
    """A ``PreTrainedTokenizerFast`` over the 16-token task vocabulary (one character per digit)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    assert len(TOKENS) == VOCAB_SIZE
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TOKENS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<[a-z]+>|\S"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")


def save_pretrained(policy: Policy, path: str | Path, tokenizer: bool = True) -> Path:
    """Write a HF checkpoint directory (config.json, model.safetensors, tokenizer) verl/vLLM can load."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    to_hf(policy).save_pretrained(path)
    if tokenizer and policy.vocab_size == VOCAB_SIZE:
        build_tokenizer().save_pretrained(path)
    return path


def load_pretrained(path: str | Path) -> Policy:
    """Inverse of ``save_pretrained``."""
    import transformers

    return from_hf(transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32))

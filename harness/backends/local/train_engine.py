"""TrainEngine: the training side (as Megatron/FSDP): float32, full-sequence, deterministic.

One causal forward over whole sequences. The MoE computes every expert densely and combines the
top-k outputs in a fixed order, so the same input gives bitwise the same output. It returns the
router logits of every layer and accepts a routing replay (R3): with ``replay`` the selected
experts are the given ones (``-1`` = use the own top-k at that position) and the gates are the
softmax of the *training* router's logits over that set, so the gradient still reaches the router.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.backends.local.model import Attention, Block, DenseMLP, MoE, Policy, apply_rope, rms_norm, rope_tables
from harness.estimators.base import PolicyForward


@dataclass
class TrainOutput:
    logits: Tensor  # [B, T, V] float32
    router_logits: Tensor | None  # [B, T, L, E]
    selected: Tensor | None  # [B, T, L, k]


def _attention(attn: Attention, x: Tensor, cos: Tensor, sin: Tensor, eps: float) -> Tensor:
    b, t, d = x.shape
    h, hd = attn.n_heads, attn.head_dim
    q = (x @ attn.q_proj).view(b, t, h, hd).transpose(1, 2)
    k = (x @ attn.k_proj).view(b, t, h, hd).transpose(1, 2)
    v = (x @ attn.v_proj).view(b, t, h, hd).transpose(1, 2)
    q = apply_rope(rms_norm(q, attn.q_norm, eps), cos, sin)
    k = apply_rope(rms_norm(k, attn.k_norm, eps), cos, sin)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(b, t, d) @ attn.o_proj


def route(router_logits: Tensor, top_k: int, replay: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Top-k experts and renormalised gates g_e = exp(s_e) / sum_{j in S} exp(s_j), e in S."""
    selected = router_logits.topk(top_k, dim=-1).indices
    if replay is not None:
        selected = torch.where(replay >= 0, replay, selected)
    gates = torch.softmax(router_logits.gather(-1, selected), dim=-1)
    return selected, gates


def _moe(moe: MoE, x: Tensor, replay: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    n = x.shape[0]
    logits = x @ moe.router  # [N, E]
    selected, gates = route(logits, moe.top_k, replay)
    h = F.silu(torch.einsum("nd,edf->enf", x, moe.w_gate)) * torch.einsum("nd,edf->enf", x, moe.w_up)
    y = torch.einsum("enf,efd->end", h, moe.w_down)  # every expert, every token: [E, N, d]
    picked = y[selected, torch.arange(n, device=x.device)[:, None]]  # [N, k, d]
    return (picked * gates[..., None]).sum(1), logits, selected


def _dense(mlp: DenseMLP, x: Tensor) -> Tensor:
    return (F.silu(x @ mlp.w_gate) * (x @ mlp.w_up)) @ mlp.w_down


def forward(policy: Policy, tokens: Tensor, replay: Tensor | None = None) -> TrainOutput:
    """Full-sequence float32 forward. tokens [B, T]; replay [B, T, L, k] or None."""
    cfg = policy.cfg
    b, t = tokens.shape
    cos, sin = rope_tables(torch.arange(t, device=tokens.device), cfg.d_model // cfg.n_heads, cfg.rope_theta)
    x = policy.embed[tokens]
    router_logits, selected = [], []
    for li, block in enumerate(policy.blocks):
        block: Block
        x = x + _attention(block.attn, rms_norm(x, block.attn_norm, cfg.norm_eps), cos, sin, cfg.norm_eps)
        hn = rms_norm(x, block.ffn_norm, cfg.norm_eps).reshape(b * t, -1)
        if policy.is_moe:
            rep = None if replay is None else replay[:, :, li].reshape(b * t, -1)
            out, logits, sel = _moe(block.ffn, hn, rep)
            router_logits.append(logits.view(b, t, -1))
            selected.append(sel.view(b, t, -1))
        else:
            out = _dense(block.ffn, hn)
        x = x + out.view(b, t, -1)
    logits = rms_norm(x, policy.final_norm, cfg.norm_eps) @ policy.lm_head
    if not policy.is_moe:
        return TrainOutput(logits, None, None)
    return TrainOutput(logits, torch.stack(router_logits, 2), torch.stack(selected, 2))


def response_view(out: TrainOutput, tokens: Tensor, prompt_len: int, with_entropy: bool = False) -> PolicyForward:
    """Log-probs (and router stats) of the response tokens, read at their predicting positions."""
    pred = slice(prompt_len - 1, tokens.shape[1] - 1)
    logp_all = torch.log_softmax(out.logits[:, pred], dim=-1)
    logp = logp_all.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    if out.router_logits is None:
        return PolicyForward(logp=logp, entropy=entropy)
    return PolicyForward(
        logp=logp,
        router_logp=torch.log_softmax(out.router_logits[:, pred], dim=-1),
        selected=out.selected[:, pred],
        entropy=entropy,
    )


class TrainEngine:
    """Owns the float32 policy; ``logprobs`` is the recompute path, ``forward`` the update path."""

    def __init__(self, policy: Policy):
        self.policy = policy

    def forward(self, tokens: Tensor, prompt_len: int, replay: Tensor | None = None,
                with_entropy: bool = False) -> PolicyForward:
        return response_view(forward(self.policy, tokens, replay), tokens, prompt_len, with_entropy)

    @torch.no_grad()
    def logprobs(self, tokens: Tensor, prompt_len: int, replay: Tensor | None = None) -> PolicyForward:
        return self.forward(tokens, prompt_len, replay)

"""TrainEngine: the training side (as Megatron/FSDP): float32, full-sequence, deterministic.

One causal forward over whole sequences. The MoE computes only the selected experts (grouped GEMMs) and
combines the top-k outputs in a fixed order, so the same input gives bitwise the same output. It returns the
router logits of every layer and accepts a routing replay (R3): with ``replay`` the selected
experts are the given ones (``-1`` = use the own top-k at that position) and the gates are the
softmax of the *training* router's logits over that set, so the gradient still reaches the router.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.backends.local.grouped import GroupedMM, Layout, positions
from harness.backends.local.model import Policy, PolicyPack, apply_rope, rope_range, stacked_weights
from harness.estimators.base import PolicyForward


@dataclass
class TrainOutput:
    logits: Tensor  # [B, T, V] float32 ([S, B, T, V] for a pack)
    router_logits: Tensor | None  # [B, T, L, E]
    selected: Tensor | None  # [B, T, L, k]


def _bmm(x: Tensor, w: Tensor) -> Tensor:
    """Per-seed matmul: x [S, ..., K] @ w [S, K, F] (one batched GEMM; slice s = x[s] @ w[s])."""
    s_, k = x.shape[0], x.shape[-1]
    return torch.bmm(x.reshape(s_, -1, k), w).view(*x.shape[:-1], w.shape[-1])


def _seed_vec(w: Tensor, ndim: int) -> Tensor:
    """A per-seed vector [S, d] shaped to broadcast against [S, ..., d] (ndim dims)."""
    return w.view(w.shape[0], *([1] * (ndim - 2)), w.shape[-1])


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * _seed_vec(weight, x.dim())


def _attention(w: dict, p: str, x: Tensor, cos: Tensor, sin: Tensor, cfg) -> Tensor:
    s_, b, t, d = x.shape
    h = cfg.n_heads
    hd = d // h
    q = _bmm(x, w[p + "q_proj"]).view(s_, b, t, h, hd).transpose(2, 3)
    k = _bmm(x, w[p + "k_proj"]).view(s_, b, t, h, hd).transpose(2, 3)
    v = _bmm(x, w[p + "v_proj"]).view(s_, b, t, h, hd).transpose(2, 3)
    q = apply_rope(_rms(q, w[p + "q_norm"], cfg.norm_eps), cos, sin)
    k = apply_rope(_rms(k, w[p + "k_norm"], cfg.norm_eps), cos, sin)
    o = F.scaled_dot_product_attention(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), is_causal=True)
    return _bmm(o.view(s_, b, h, t, hd).transpose(2, 3).reshape(s_, b, t, d), w[p + "o_proj"])


def route(router_logits: Tensor, top_k: int, replay: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Top-k experts and renormalised gates g_e = exp(s_e) / sum_{j in S} exp(s_j), e in S."""
    selected = router_logits.topk(top_k, dim=-1).indices
    if replay is not None:
        selected = torch.where(replay >= 0, replay, selected)
    gates = torch.softmax(router_logits.gather(-1, selected), dim=-1)
    return selected, gates


def _moe(w: dict, p: str, x: Tensor, top_k: int, replay: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """x [S, N, d] -> (y [S, N, d], router logits [S, N, E], selected [S, N, k]):
    y = sum_{e in top-k} g_e SwiGLU_e(x), only the selected experts computed."""
    logits = _bmm(x, w[p + "router"])  # [S, N, E]
    selected, gates = route(logits, top_k, replay)
    y = _experts(x.reshape(-1, x.shape[-1]), selected, gates, w[p + "w_gate"], w[p + "w_up"], w[p + "w_down"])
    return y.view(x.shape), logits, selected


def _experts(x: Tensor, selected: Tensor, gates: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    """The selected experts of every seed as grouped GEMMs: x [S N, d] (seed-major), selected / gates [S, N, k],
    weights [S, E, ...]. The (token, slot) pairs sorted by (seed, expert), each group's rows multiplied by its
    weights (``grouped.GroupedMM``: the arithmetic of a zero-padded [E, cap_s, d] batch per seed, cap_s from that
    seed's routing only, so a seed's arithmetic, gradients included, does not depend on its pack); outputs scaled
    by their gates and summed per token in ascending expert order (fixed: deterministic)."""
    s_, n, k = selected.shape
    e, d, f = w_gate.shape[1], w_gate.shape[2], w_gate.shape[3]
    key = (selected + (torch.arange(s_, device=x.device) * e)[:, None, None]).reshape(-1)  # seed * E + expert
    order = key.argsort(stable=True)
    counts = torch.bincount(key, minlength=s_ * e)
    caps = counts.view(s_, e).amax(1)  # [S]
    layout = Layout(counts, caps.repeat_interleave(e))
    row = seeds = None  # the per-seed padded rows of the weight gradient: the CPU's form (a GPU's is one bmm)
    if not layout.dense:
        base = torch.cumsum(e * caps, 0) - e * caps  # each seed's first row in the padded layout
        group, pos = positions(counts)  # each sorted row's group (= key[order]) and place within it
        seed = group // e
        row = base[seed] + (group % e) * caps[seed] + pos
        seeds = tuple(zip(base.tolist(), caps.tolist()))
    token = order // k
    w_gu = torch.cat([w_gate, w_up], -1).view(s_ * e, d, 2 * f)
    gu = GroupedMM.apply(x.index_select(0, token), w_gu, layout, row, seeds)  # [S N k, 2f]
    g, u = gu.split(f, dim=1)  # one split: its backward is one cat (two slices' would zero-fill [S N k, 2f] twice)
    h = F.silu(g) * u
    y = GroupedMM.apply(h, w_down.reshape(s_ * e, f, d), layout, row, seeds) * gates.reshape(-1)[order][:, None]
    return x.new_zeros(s_ * n, d).index_add(0, token, y)


def forward(model: Policy | PolicyPack, tokens: Tensor, replay: Tensor | None = None) -> TrainOutput:
    """Full-sequence float32 forward. A policy: tokens [B, T], replay [B, T, L, k] or None; a
    pack: tokens [S, B, T], replay [S, B, T, L, k] (outputs with the leading S axis)."""
    single = not isinstance(model, PolicyPack)
    if single:
        tokens = tokens[None]
        replay = None if replay is None else replay[None]
    cfg, w = model.cfg, stacked_weights(model)
    s_, b, t = tokens.shape
    cos, sin = rope_range(0, t, cfg.d_model // cfg.n_heads, cfg.rope_theta, tokens.device)
    seeds = torch.arange(s_, device=tokens.device)[:, None, None]
    x = w["embed"][seeds, tokens]  # [S, B, T, d]
    router_logits, selected = [], []
    for li in range(cfg.n_layers):
        p = f"blocks.{li}."
        x = x + _attention(w, p + "attn.", _rms(x, w[p + "attn_norm"], cfg.norm_eps), cos, sin, cfg)
        hn = _rms(x, w[p + "ffn_norm"], cfg.norm_eps).reshape(s_, b * t, -1)
        if model.is_moe:
            rep = None if replay is None else replay[:, :, :, li].reshape(s_, b * t, -1)
            out, logits, sel = _moe(w, p + "ffn.", hn, cfg.top_k, rep)
            router_logits.append(logits.view(s_, b, t, -1))
            selected.append(sel.view(s_, b, t, -1))
        else:
            out = _bmm(F.silu(_bmm(hn, w[p + "ffn.w_gate"])) * _bmm(hn, w[p + "ffn.w_up"]), w[p + "ffn.w_down"])
        x = x + out.view(s_, b, t, -1)
    logits = _bmm(_rms(x, w["final_norm"], cfg.norm_eps), w["lm_head"])
    rl = sel = None
    if model.is_moe:
        rl, sel = torch.stack(router_logits, -2), torch.stack(selected, -2)
    if single:
        return TrainOutput(logits[0], None if rl is None else rl[0], None if sel is None else sel[0])
    return TrainOutput(logits, rl, sel)


def response_view(out: TrainOutput, tokens: Tensor, prompt_len: int, with_entropy: bool = False,
                  temperature: float = 1.0) -> PolicyForward:
    """Log-probs (and router stats) of the response tokens, read at their predicting positions, of the
    sampler's temperature T: ``log_softmax(logits / T)``, as verl's actor (``_scale_logits_by_temperature``
    in ``verl/workers/engine/fsdp/transformer_impl.py``; no division at T = 1). Like verl, no top-k / top-p:
    their truncation's renormalisation stays a train-inference difference (docs/engines.md, "Sampler")."""
    pred = slice(prompt_len - 1, tokens.shape[1] - 1)
    logits = out.logits[:, pred]
    logp_all = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
    logp = logp_all.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    if out.router_logits is None:
        return PolicyForward(logp=logp, entropy=entropy)
    return PolicyForward(
        logp=logp,
        router_logp=torch.log_softmax(out.router_logits[:, pred], dim=-1),
        selected=out.selected[:, pred],
        entropy=entropy,
        routes=out.selected,
    )


class TrainEngine:
    """Owns the float32 policy (or seed pack); ``logprobs`` is the recompute path, ``forward`` the
    update path. For a pack of S seeds, tokens/replay are [S B, ...] with seed-major rows. Its log-probs
    are those of the sampler's ``temperature`` (``inference.temperature``: one source for both engines)."""

    def __init__(self, policy: Policy | PolicyPack, temperature: float = 1.0):
        self.policy = policy
        self.temperature = temperature

    def forward(self, tokens: Tensor, prompt_len: int, replay: Tensor | None = None,
                with_entropy: bool = False) -> PolicyForward:
        if not isinstance(self.policy, PolicyPack):
            return response_view(forward(self.policy, tokens, replay), tokens, prompt_len, with_entropy,
                                 self.temperature)
        s_ = self.policy.size
        seeds = lambda x: None if x is None else x.reshape(s_, -1, *x.shape[1:])  # noqa: E731
        out = forward(self.policy, seeds(tokens), seeds(replay))
        flat = lambda x: None if x is None else x.flatten(0, 1)  # noqa: E731
        return response_view(TrainOutput(flat(out.logits), flat(out.router_logits), flat(out.selected)), tokens,
                             prompt_len, with_entropy, self.temperature)

    @torch.no_grad()
    def logprobs(self, tokens: Tensor, prompt_len: int, replay: Tensor | None = None) -> PolicyForward:
        return self.forward(tokens, prompt_len, replay)

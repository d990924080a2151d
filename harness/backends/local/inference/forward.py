"""The engine's forward pass (``Forward``, a part of ``InferenceEngine``): weights and activations in ``dtype``
(bf16 by default), attention softmax in float32. Every op rounds its output to ``dtype`` exactly where a bf16
kernel would: a matmul rounds its float32 accumulator once (``round(sum_k x_k w_k)``, ``kernels._Call.mm``), an
elementwise op its result.

MoE: only the top-k experts of each token, as two grouped GEMMs (no Python loop over experts); their outputs are
combined, summed in a *random order per token and per call* with accumulation in ``dtype`` (what GPU atomics /
scatter_add do): the order is the ranks of keyed uniforms (stream ``combine``, ``kernels._Call.uniform``), drawn for
every seed of a pack in one call; the dense twin has no such term. ``deterministic``: a fixed combine order (and no
split-K).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.backends.local.grouped import Layout, grouped
from harness.backends.local.inference.kernels import _Call
from harness.backends.local.inference.kv_cache import KVCache
from harness.backends.local.model import rope_range


class Forward:
    """The forward pass of ``InferenceEngine`` over its weights ``w`` (``load_weights``), in its ``act`` dtype;
    the noise knobs through ``Noise`` (``_sigma``, ``_noise``)."""

    def _rms(self, call: _Call, x: Tensor, weight: Tensor) -> Tensor:
        """RMSNorm in float32, the result rounded to the activation dtype."""
        wg = call.per_group(weight)
        wg = wg.view(wg.shape[0], *([1] * (x.dim() - 2)), wg.shape[-1])
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.mcfg.norm_eps) * wg).to(self.act)

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(self.act)

    def _attention(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Causal attention of the queries q [G, B, H, tq, hd] (the last tq positions) over k, v [G, B, H, T, hd]:
        scores and softmax in float32, the weights and the output rounded to the activation dtype."""
        act, hd, tq = self.act, q.shape[-1], q.shape[-2]
        if tq == 1:  # decode: one query per row; products and sums instead of tiny batched GEMMs
            scores = (q.float() * k.float()).sum(-1, keepdim=True).transpose(-1, -2) / hd ** 0.5
            attn = torch.softmax(scores, -1).to(act)
            return (attn.float().transpose(-1, -2) * v.float()).sum(-2, keepdim=True).to(act)
        scores = (q.float() @ k.float().transpose(-1, -2)) / hd ** 0.5  # float32
        total = k.shape[-2]
        causal = torch.ones(tq, total, dtype=torch.bool, device=q.device).tril(total - tq)
        attn = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1).to(act)
        return (attn.float() @ v.float()).to(act)

    def _layer_moe(self, call: _Call, p: str, x: Tensor, layer: int):
        """x [G, N, d] -> (out [G, N, d], router log-probs [G, N, E], selected [G, N, k])."""
        cfg, mc = self.cfg, self.mcfg
        g_, n, d = x.shape
        k = mc.top_k
        logits = call.mm(x, self.w[p + "router"]).float()
        if cfg.router_noise_sigma > 0:
            z = self._noise(call, x, "router")
            if cfg.router_noise_rate < 1:  # sparse: a keyed Bernoulli(rate) per (token, layer) row
                z = z * (call.uniform("noise", (n, 1)) < cfg.router_noise_rate)
            logits = logits + self._sigma(cfg.router_noise_sigma, logits.shape[0], 3) * z
        probs = torch.softmax(logits, -1)
        gates, selected = probs.topk(k, dim=-1)
        gates = (gates / gates.sum(-1, keepdim=True)).to(self.act)
        m = g_ * n
        dest = torch.arange(m * k, device=x.device)  # where the (token, slot) pair goes in the sum order
        if not cfg.deterministic:  # random summation order per token: atomics
            rank = call.uniform("combine", (n, k)).argsort(dim=-1, stable=True).argsort(-1)
            dest = (dest.view(m, k) - torch.arange(k, device=x.device) + rank.view(m, k)).view(-1)
        key = selected + (call.seed_of(x.device) * mc.n_experts)[:, None, None]  # (seed, expert)
        y = self._experts(p, x.reshape(m, d), key.reshape(-1), gates.reshape(-1), dest).view(g_, n, k, d)
        out = y[:, :, 0]
        for j in range(1, k):
            out = out + y[:, :, j]  # accumulation in dtype: order matters
        return out, torch.log_softmax(logits, -1), selected

    def _experts(self, p: str, x: Tensor, key: Tensor, gates: Tensor, dest: Tensor) -> Tensor:
        """Gated outputs ``round(gate * expert(x))`` [M k, d] of the selected experts of tokens x
        [M, d] (``key`` = seed * E + expert, ``gates``: [M k]), written to rows ``dest``. The (token, slot)
        pairs sorted by (seed, expert), each group's rows multiplied by its weights in one grouped GEMM
        (``grouped.grouped``: each row bitwise as in a zero-padded [S E, capacity, d] batched GEMM)."""
        act, w_gu, w_down = self.act, self.w[p + "w_gate_up"], self.w[p + "w_down_flat"]
        m, d = x.shape
        groups, f, k = w_gu.shape[0], w_down.shape[1], key.numel() // m
        order = key.argsort(stable=True)
        counts = torch.bincount(key, minlength=groups)
        layout = Layout(counts, int(counts.max()))
        gu = grouped(x.index_select(0, order // k).float(), w_gu, layout).to(act)  # [M k, 2f]
        h = F.silu(gu[:, :f]) * gu[:, f:]  # dtype ops: each rounded
        ye = grouped(h.float(), w_down, layout).to(act) * gates.index_select(0, order)[:, None]
        return torch.empty_like(ye).index_copy_(0, dest.index_select(0, order), ye)

    def _draw_plan(self, b: int, t: int, keep_from: int, sample: bool = False) -> list[tuple[str, str, tuple]]:
        """The draws a forward of ``b`` rows of ``t`` positions makes, in order (``_Call.prefetch``): per MoE layer
        the router noise [b t, E] (and its rows' Bernoulli uniforms [b t, 1] when ``router_noise_rate`` < 1) and the
        combine order's uniforms [b t, k] (the last layer over the t - keep_from
        kept positions), then the logit noise [b, t', V] (none that ``deterministic`` or a knob at 0 leaves out);
        then, with ``sample``, the Gumbel draws [b, V] of the token sampled from its last position."""
        cfg, mc = self.cfg, self.mcfg
        sampled = [("gumbel", "sample", (b, self.w["lm_head"].shape[-1]))] if sample else []
        if cfg.deterministic:
            return sampled
        plan = []
        for li in range(mc.n_layers if mc.kind == "moe" else 0):
            n = b * (t - keep_from if li == mc.n_layers - 1 and keep_from else t)
            if cfg.router_noise_sigma > 0:
                plan.append(("normal", "noise", (n, mc.n_experts)))
                if cfg.router_noise_rate < 1:
                    plan.append(("uniform", "noise", (n, 1)))
            plan.append(("uniform", "combine", (n, mc.top_k)))
        if cfg.logit_noise_sigma > 0:
            plan.append(("normal", "noise", (b, t - keep_from, self.w["lm_head"].shape[-1])))
        return plan + sampled

    def _forward(self, call: _Call, tokens: Tensor, start: int, cache: KVCache | None, capacity: int = 0,
                 keep_from: int = 0):
        """Run new ``tokens`` [G, B, t] (or [B, t]: one call) at positions start..start+t-1,
        appending to the KV cache. Returns logits [G, B, t', V] and router log-probs / selected
        experts [G, B, t', L, *] (without the G axis for 2-D ``tokens``) of the positions from
        ``keep_from`` on (t' = t - keep_from): the last layer computes only those (scoring)."""
        squeeze = tokens.dim() == 2
        if squeeze:
            tokens = tokens[None]
        mc, w, act = self.mcfg, self.w, self.act
        g_, b, t = tokens.shape
        if not call.planned:
            call.prefetch(self._draw_plan(b, t, keep_from))  # the call's draws in one Philox evaluation
        h_, hd = mc.n_heads, mc.d_model // mc.n_heads
        cos, sin = rope_range(start, t, hd, mc.rope_theta, tokens.device)
        x = w["embed"][call.seed_of(tokens.device)[:, None, None], tokens].to(act)  # [G, B, t, d]
        router_logp, selected = [], []
        for li in range(mc.n_layers):
            p = f"blocks.{li}."
            last = li == mc.n_layers - 1
            hn = self._rms(call, x, w[p + "attn_norm"])
            q = call.mm(hn, w[p + "attn.q_proj"]).view(g_, b, t, h_, hd).transpose(2, 3)
            k = call.mm(hn, w[p + "attn.k_proj"]).view(g_, b, t, h_, hd).transpose(2, 3)
            v = call.mm(hn, w[p + "attn.v_proj"]).view(g_, b, t, h_, hd).transpose(2, 3)
            q = self._rope(self._rms(call, q, w[p + "attn.q_norm"]), cos, sin)
            k = self._rope(self._rms(call, k, w[p + "attn.k_norm"]), cos, sin)
            if cache is not None:
                k, v = cache.append(li, k, v, start, max(capacity, start + t))
            if last and keep_from:  # the earlier positions only feed K and V
                q, x, router_logp, selected = q[..., keep_from:, :], x[:, :, keep_from:], [], []
            tq = q.shape[-2]
            o = self._attention(q, k, v).transpose(2, 3).reshape(g_, b, tq, -1)
            x = x + call.mm(o, w[p + "attn.o_proj"])
            hn = self._rms(call, x, w[p + "ffn_norm"]).reshape(g_, b * tq, -1)
            if mc.kind == "moe":
                out, rl, sel = self._layer_moe(call, p + "ffn.", hn, li)
                router_logp.append(rl.view(g_, b, tq, -1))
                selected.append(sel.view(g_, b, tq, -1))
            else:
                gate = F.silu(call.mm(hn, w[p + "ffn.w_gate"]))
                out = call.mm(gate * call.mm(hn, w[p + "ffn.w_up"]), w[p + "ffn.w_down"])
            x = x + out.view(g_, b, tq, -1)
        if cache is not None:
            cache.length = start + t
        hidden = self._rms(call, x, w["final_norm"])
        logits = call.mm(hidden, w["lm_head"]).float()
        if self.cfg.logit_noise_sigma > 0:
            logits = logits + self._sigma(self.cfg.logit_noise_sigma, logits.shape[0], 4) * self._noise(call, hidden,
                                                                                                      "logits")
        rl = sel = None
        if mc.kind == "moe" and not keep_from:
            rl, sel = torch.stack(router_logp, -2), torch.stack(selected, -2)
        if squeeze:
            return logits[0], None if rl is None else rl[0], None if sel is None else sel[0]
        return logits, rl, sel

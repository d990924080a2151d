"""InferenceEngine: the rollout side (as vLLM): a separate code path with its own numerics.

- KV-cached incremental decoding (a preallocated cache); prefill for scoring (``score``, like vLLM
  ``prompt_logprobs``);
- weights and activations in ``dtype`` (bf16 by default), attention softmax in float32. Every op
  rounds its output to ``dtype`` exactly where a bf16 kernel would: a matmul rounds its float32
  accumulator once (``round(sum_k x_k w_k)``), an elementwise op its result. Sub-float32 dtypes are
  *stored* as float32 tensors holding ``dtype`` values and computed in float32 (emulated): the
  product of two bf16 numbers is exact in float32, so this is the arithmetic of a bf16 GEMM with
  float32 accumulation, at float32 speed (native bf16 matmuls are ~40x slower on CPUs without
  AVX512-BF16);
- MoE: every expert on every token as two flat matmuls (no Python loop over experts), then only the
  top-k experts' outputs are combined, summed in a *random order per token and per call* with
  accumulation in ``dtype`` (what GPU atomics / scatter_add do); the dense twin has no such term;
- ``batch_variance``: every call picks a split-K factor s in {1, 2, 4} for its matmuls (as kernels
  pick tiles by batch shape): ``y = round(...round(round(P_1) + round(P_2))... + round(P_s))``
  with ``P_i`` the partial product over the i-th K-chunk - noise for dense models too;
- ``deterministic``: fixed combine order and no split-K (batch invariant): zero scoring variance;
- explicit perturbations, off by default (DESIGN.md section 3): router-logit noise before top-k,
  output-logit noise, and a biased down-weighting of low-probability tokens. The two noise knobs
  draw fresh N(0, sigma^2) per call; in ``deterministic`` mode they become *frozen*: the same
  scale, but a fixed function of the hidden state (a fixed random projection), so a deterministic
  engine still differs from the training engine but no longer from itself (deterministic inference
  removes run-to-run variance, not the train-inference mismatch).

Independent calls can share one batched forward: every activation carries a leading *call* axis
G, and each call keeps its own split-K factor, combine orders and noise draws (``_Call``). That is
how ``score(tokens, n)`` runs its n passes as one forward over n x B rows.

``generate`` returns tokens, the sampling log-probs (``logprobs_mode``: ``processed`` = the exact
distribution sampled from; ``raw`` = before temperature/top-k) and the routed experts per token and
layer. ``score(tokens, n)`` returns n independent scorings.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.backends.local.model import Policy, rope_tables
from harness.config import InferenceConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPLITS = (1, 2, 4)


@dataclass
class Rollout:
    tokens: Tensor  # [B, T] prompt + response
    logp: Tensor  # [B, R] sampling log-probs
    routed_experts: Tensor | None  # [B, T, L, k], -1 at the last position (never processed)
    router_logp: Tensor | None  # [B, R, L, E] router log-probs at the predicting positions


def rounder(dtype: torch.dtype):
    """x -> x rounded to ``dtype`` and held in float32 (identity for float32)."""
    if dtype == torch.float32:
        return lambda x: x
    return lambda x: x.to(dtype).float()


class _Call:
    """Per-call randomness of ``groups`` independent calls batched along a leading axis: the
    split-K factor of each call, and the generator for combine orders and noise."""

    def __init__(self, cfg: InferenceConfig, gen: torch.Generator, groups: int = 1, rnd=None):
        self.cfg, self.gen, self.groups = cfg, gen, groups
        self.r = rnd or rounder(DTYPES[cfg.dtype])
        splits = [1] * groups
        if cfg.batch_variance and not cfg.deterministic:
            idx = torch.randint(len(SPLITS), (groups,), generator=gen, device=gen.device).tolist()
            splits = [SPLITS[i] for i in idx]
        self.splits = splits
        self.by_split = {s: [g for g in range(groups) if splits[g] == s] for s in sorted(set(splits))}

    def mm(self, x: Tensor, w: Tensor) -> Tensor:
        """x [G, ..., K] @ w [K, F], each call g with its own split-K factor."""
        if len(self.by_split) == 1:
            return self._mm(x, w, self.splits[0])
        out = x.new_empty(*x.shape[:-1], w.shape[1])
        for s, groups in self.by_split.items():
            idx = torch.tensor(groups, device=x.device)
            out[idx] = self._mm(x[idx], w, s)
        return out

    def _mm(self, x: Tensor, w: Tensor, split: int) -> Tensor:
        r, k = self.r, x.shape[-1]
        if split == 1 or k % split:
            return r(x @ w)
        c = k // split
        out = r(x[..., :c] @ w[:c])
        for i in range(1, split):
            out = r(out + r(x[..., i * c:(i + 1) * c] @ w[i * c:(i + 1) * c]))  # rounded to dtype each time
        return out


class _Cache:
    """Preallocated KV cache: per layer K and V of shape [G, B, H, T_max, hd]."""

    def __init__(self):
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.length = 0

    def append(self, layer: int, k: Tensor, v: Tensor, start: int, capacity: int) -> tuple[Tensor, Tensor]:
        t = k.shape[-2]
        if layer == len(self.k):
            shape = (*k.shape[:-2], capacity, k.shape[-1])
            self.k.append(k.new_empty(shape))
            self.v.append(v.new_empty(shape))
        self.k[layer][..., start:start + t, :] = k
        self.v[layer][..., start:start + t, :] = v
        return self.k[layer][..., :start + t, :], self.v[layer][..., :start + t, :]


class InferenceEngine:
    def __init__(self, policy: Policy, cfg: InferenceConfig, seed: int, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.mcfg = policy.cfg
        self.dtype = DTYPES[cfg.dtype]
        self.r = rounder(self.dtype)
        self.device = torch.device(device)
        self.sample_gen = torch.Generator(self.device).manual_seed(seed * 1000 + 1)
        self.noise_gen = torch.Generator(self.device).manual_seed(seed * 1000 + 2)
        g = torch.Generator().manual_seed(seed * 1000 + 6)
        d = self.mcfg.d_model
        self.frozen = {  # fixed projections: the deterministic mode's stand-in for fresh noise
            "router": torch.randn(d, self.mcfg.n_experts, generator=g).to(self.device),
            "logits": torch.randn(d, policy.vocab_size, generator=g).to(self.device),
        }
        self.load_weights(policy)

    # ------------------------------------------------------------------ weights (as weight sync)
    def load_weights(self, policy: Policy) -> None:
        """Weights rounded to ``dtype`` (held in float32); the experts laid out as flat matrices."""
        w = {k: self.r(v.detach().to(self.device, torch.float32)).clone() for k, v in policy.state_dict().items()}
        mc = self.mcfg
        if mc.kind == "moe":
            for li in range(mc.n_layers):
                p = f"blocks.{li}.ffn."
                w[p + "w_gate_up"] = torch.cat([w[p + "w_gate"], w[p + "w_up"]], -1).contiguous()  # [E, d, 2f]
        self.w = w

    def state(self) -> dict:
        return {"sample_gen": self.sample_gen.get_state(), "noise_gen": self.noise_gen.get_state()}

    def load_state(self, state: dict) -> None:
        self.sample_gen.set_state(state["sample_gen"])
        self.noise_gen.set_state(state["noise_gen"])

    # ------------------------------------------------------------------------------- forward
    def _rms(self, x: Tensor, weight: Tensor) -> Tensor:
        return self.r(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.mcfg.norm_eps) * weight)

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x1, x2 = x.chunk(2, dim=-1)
        return self.r(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))

    def _layer_moe(self, call: _Call, p: str, x: Tensor, layer: int):
        """x [G, N, d] -> (out [G, N, d], router log-probs [G, N, E], selected [G, N, k])."""
        cfg, mc, r = self.cfg, self.mcfg, self.r
        g_, n, d = x.shape
        k = mc.top_k
        logits = call.mm(x, self.w[p + "router"])
        if cfg.router_noise_sigma > 0:
            logits = logits + cfg.router_noise_sigma * self._noise(call, x, "router")
        probs = torch.softmax(logits, -1)
        gates, selected = probs.topk(k, dim=-1)
        gates = r(gates / gates.sum(-1, keepdim=True))
        m = g_ * n
        dest = torch.arange(m * k, device=x.device)  # where the (token, slot) pair goes in the sum order
        if not cfg.deterministic:  # random summation order per token: atomics
            rank = torch.rand(g_, n, k, generator=call.gen, device=x.device).argsort(-1).argsort(-1)
            dest = (dest.view(m, k) - torch.arange(k, device=x.device) + rank.view(m, k)).view(-1)
        y = self._experts(p, x.reshape(m, d), selected.reshape(-1), gates.reshape(-1), dest).view(g_, n, k, d)
        out = y[:, :, 0]
        for j in range(1, k):
            out = r(out + y[:, :, j])  # accumulation in dtype: order matters
        return out, torch.log_softmax(logits, -1), selected

    def _experts(self, p: str, x: Tensor, selected: Tensor, gates: Tensor, dest: Tensor) -> Tensor:
        """Gated outputs ``round(gate * expert(x))`` [M k, d] of the selected experts of tokens x
        [M, d] (``selected``, ``gates``: [M k]), written to rows ``dest``. One grouped matmul: the
        (token, slot) pairs sorted by expert into a zero-padded [E, capacity, d] batch."""
        mc, r = self.mcfg, self.r
        m, d = x.shape
        e, f, k = mc.n_experts, mc.d_expert, mc.top_k
        order = selected.argsort(stable=True)
        expert = selected[order]
        counts = torch.bincount(selected, minlength=e)
        cap = int(counts.max())
        row = expert * cap + torch.arange(m * k, device=x.device) - (counts.cumsum(0) - counts)[expert]
        xe = x.new_zeros(e * cap, d).index_copy_(0, row, x.index_select(0, order // k)).view(e, cap, d)
        gu = r(torch.bmm(xe, self.w[p + "w_gate_up"]))  # [E, C, 2f]
        h = r(r(F.silu(gu[..., :f])) * gu[..., f:])
        ye = r(torch.bmm(h, self.w[p + "w_down"])).view(e * cap, d).index_select(0, row)
        ye = r(ye * gates.index_select(0, order)[:, None])
        return torch.empty_like(ye).index_copy_(0, dest.index_select(0, order), ye)

    def _forward(self, call: _Call, tokens: Tensor, start: int, cache: _Cache | list | None, capacity: int = 0,
                 keep_from: int = 0):
        """Run new ``tokens`` [G, B, t] (or [B, t]: one call) at positions start..start+t-1,
        appending to the KV cache. Returns logits [G, B, t', V] and router log-probs / selected
        experts [G, B, t', L, *] (without the G axis for 2-D ``tokens``) of the positions from
        ``keep_from`` on (t' = t - keep_from): the last layer computes only those (scoring)."""
        squeeze = tokens.dim() == 2
        if squeeze:
            tokens = tokens[None]
        if isinstance(cache, list):  # the old list-of-(k, v) API: a fresh cache
            cache = _Cache() if not cache else cache
        mc, w, r = self.mcfg, self.w, self.r
        g_, b, t = tokens.shape
        h_, hd = mc.n_heads, mc.d_model // mc.n_heads
        cos, sin = rope_tables(torch.arange(start, start + t, device=tokens.device), hd, mc.rope_theta)
        x = w["embed"][tokens]  # [G, B, t, d]
        router_logp, selected = [], []
        for li in range(mc.n_layers):
            p = f"blocks.{li}."
            last = li == mc.n_layers - 1
            hn = self._rms(x, w[p + "attn_norm"])
            q = call.mm(hn, w[p + "attn.q_proj"]).view(g_, b, t, h_, hd).transpose(2, 3)
            k = call.mm(hn, w[p + "attn.k_proj"]).view(g_, b, t, h_, hd).transpose(2, 3)
            v = call.mm(hn, w[p + "attn.v_proj"]).view(g_, b, t, h_, hd).transpose(2, 3)
            q = self._rope(self._rms(q, w[p + "attn.q_norm"]), cos, sin)
            k = self._rope(self._rms(k, w[p + "attn.k_norm"]), cos, sin)
            if cache is not None:
                k, v = cache.append(li, k, v, start, max(capacity, start + t))
            if last and keep_from:  # the earlier positions only feed K and V
                q, x, router_logp, selected = q[..., keep_from:, :], x[:, :, keep_from:], [], []
            tq = q.shape[-2]
            scores = (q @ k.transpose(-1, -2)) / hd ** 0.5  # float32
            if tq > 1:
                total = k.shape[-2]
                causal = torch.ones(tq, total, dtype=torch.bool, device=x.device).tril(total - tq)
                scores = scores.masked_fill(~causal, float("-inf"))
            attn = r(torch.softmax(scores, -1))
            o = r(attn @ v).transpose(2, 3).reshape(g_, b, tq, -1)
            x = r(x + call.mm(o, w[p + "attn.o_proj"]))
            hn = self._rms(x, w[p + "ffn_norm"]).reshape(g_, b * tq, -1)
            if mc.kind == "moe":
                out, rl, sel = self._layer_moe(call, p + "ffn.", hn, li)
                router_logp.append(rl.view(g_, b, tq, -1))
                selected.append(sel.view(g_, b, tq, -1))
            else:
                gate = r(F.silu(call.mm(hn, w[p + "ffn.w_gate"])))
                out = call.mm(r(gate * call.mm(hn, w[p + "ffn.w_up"])), w[p + "ffn.w_down"])
            x = r(x + out.view(g_, b, tq, -1))
        if cache is not None:
            cache.length = start + t
        hidden = self._rms(x, w["final_norm"])
        logits = call.mm(hidden, w["lm_head"])
        if self.cfg.logit_noise_sigma > 0:
            logits = logits + self.cfg.logit_noise_sigma * self._noise(call, hidden, "logits")
        rl = sel = None
        if mc.kind == "moe" and not keep_from:
            rl, sel = torch.stack(router_logp, -2), torch.stack(selected, -2)
        if squeeze:
            return logits[0], None if rl is None else rl[0], None if sel is None else sel[0]
        return logits, rl, sel

    def _noise(self, call: _Call, x: Tensor, which: str) -> Tensor:
        """Standard-normal noise per entry: fresh per call, or frozen (a function of x) when deterministic."""
        proj = self.frozen[which]
        if not self.cfg.deterministic:
            shape = (*x.shape[:-1], proj.shape[1])
            return torch.randn(shape, generator=call.gen, device=x.device)
        z = x.float()
        z = z / z.norm(dim=-1, keepdim=True).clamp(min=1e-6)  # unit rows: z @ proj ~ N(0, 1) per entry
        return z @ proj

    # ----------------------------------------------------------------------- distributions
    def _model_logp(self, logits: Tensor) -> Tensor:
        """The engine's model distribution (with the biased perturbation when it is on)."""
        logp = torch.log_softmax(logits, -1)
        if self.cfg.bias_delta != 1.0:
            low = logp.exp() < self.cfg.bias_threshold
            logp = torch.log_softmax(logp + low * torch.log(torch.tensor(self.cfg.bias_delta)), -1)
        return logp

    def _sampler_logp(self, logp: Tensor) -> Tensor:
        """The processed distribution the sampler draws from (temperature, top-k)."""
        if self.cfg.temperature != 1.0:
            logp = torch.log_softmax(logp / self.cfg.temperature, -1)
        if self.cfg.top_k > 0:
            kth = logp.topk(self.cfg.top_k, -1).values[..., -1:]
            logp = torch.log_softmax(logp.masked_fill(logp < kth, float("-inf")), -1)
        return logp

    def _reported(self, model_logp: Tensor, sampler_logp: Tensor) -> Tensor:
        return sampler_logp if self.cfg.logprobs_mode == "processed" else model_logp

    # --------------------------------------------------------------------------------- API
    @torch.no_grad()
    def generate(self, prompts: Tensor, max_new_tokens: int) -> Rollout:
        b, p = prompts.shape
        capacity = p + max_new_tokens
        cache = _Cache()
        tokens = torch.empty(b, capacity, dtype=prompts.dtype, device=prompts.device)
        tokens[:, :p] = prompts
        logps, routed, routers = [], [], []
        call = _Call(self.cfg, self.noise_gen, 1, self.r)  # one engine step = one batch shape
        logits, rl, sel = self._forward(call, prompts[None], 0, cache, capacity)
        if sel is not None:
            routed.append(sel[0])
            routers.append(rl[0, :, -1:])
        for i in range(max_new_tokens):
            model_logp = self._model_logp(logits[0, :, -1])
            sampler_logp = self._sampler_logp(model_logp)
            nxt = torch.multinomial(sampler_logp.exp(), 1, generator=self.sample_gen)
            logps.append(self._reported(model_logp, sampler_logp).gather(-1, nxt))
            tokens[:, p + i:p + i + 1] = nxt
            if i + 1 < max_new_tokens:
                call = _Call(self.cfg, self.noise_gen, 1, self.r)
                logits, rl, sel = self._forward(call, nxt[None], p + i, cache, capacity)
                if sel is not None:
                    routed.append(sel[0])
                    routers.append(rl[0])
        routed_experts = router_logp = None
        if routed:
            last = torch.full_like(routed[0][:, :1], -1)
            routed_experts = torch.cat(routed + [last], 1)
            router_logp = torch.cat(routers, 1)
        return Rollout(tokens, torch.cat(logps, 1), routed_experts, router_logp)

    @torch.no_grad()
    def score(self, tokens: Tensor, prompt_len: int, n: int, generator: torch.Generator | None = None) -> Tensor:
        """n independent scorings [n, B, R] in one batched prefill over n x B rows; each pass has
        its own split-K factor, combine orders and noise draws."""
        call = _Call(self.cfg, generator or self.noise_gen, n, self.r)
        inputs = tokens[None, :, :-1].expand(n, -1, -1)  # the last token predicts nothing
        logits, _, _ = self._forward(call, inputs, 0, None, keep_from=prompt_len - 1)
        model_logp = self._model_logp(logits)
        logp = self._reported(model_logp, self._sampler_logp(model_logp))
        return logp.gather(-1, tokens[None, :, prompt_len:, None].expand(n, -1, -1, 1)).squeeze(-1)

    def score_once(self, tokens: Tensor, prompt_len: int, generator: torch.Generator | None = None) -> Tensor:
        """One prefill pass over prompt+response: log-probs of the response tokens [B, R]."""
        return self.score(tokens, prompt_len, 1, generator)[0]

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
- MoE: only the top-k experts of each token, as two grouped GEMMs (no Python loop over experts); their
  outputs are combined, summed in a *random order per token and per call* with
  accumulation in ``dtype`` (what GPU atomics / scatter_add do); the dense twin has no such term;
- ``batch_variance``: every call picks a split-K factor s in {1, 2, 4} for its matmuls (as kernels
  pick tiles by batch shape): ``y = round(...round(round(P_1) + round(P_2))... + round(P_s))``
  with ``P_i`` the partial product over the i-th K-chunk - noise for dense models too;
- ``deterministic``: fixed combine order and no split-K (batch invariant): zero scoring variance;
- explicit perturbations, off by default (docs/design.md section 3): router-logit noise before top-k,
  output-logit noise, and a biased down-weighting of low-probability tokens. The two noise knobs
  draw fresh N(0, sigma^2) per call; in ``deterministic`` mode they become *frozen*: the same
  scale, but a fixed function of the hidden state (a fixed random projection), so the engine no
  longer differs from itself but carries a large fixed bias (the ``deterministic(frozen)`` arm).
  Deterministic inference proper (the ``deterministic`` estimator, ``noise: removed``) runs this
  mode with both noise knobs at 0 (``Estimator.inference``): precision is the only difference left.
  ``scale`` (None, or a per-seed [S] tensor set by ``kl_control.KLController`` in a KL-held run) multiplies the
  noise sigmas, or the bias's log delta, per seed.

Independent calls can share one batched forward: every activation carries a leading *call* axis
G, and each call keeps its own split-K factor, combine orders and noise draws (``_Call``). That is
how ``score(tokens, n)`` runs its n passes as one forward over n x B rows.

``generate`` returns tokens, the sampling log-probs (``logprobs_mode``, as vLLM's: ``processed`` = the
exact distribution sampled from, after temperature, top-k and top-p (``sampler_logp``); ``raw`` = the
model's log-softmax before them) and the routed experts per token and layer. ``score(tokens, n)``
returns n independent scorings in the same mode. vLLM's ``prompt_logprobs`` (what verl's mean_n loop
re-scores with) are always the raw distribution whatever ``logprobs_mode`` (docs/engines.md, "Sampler"):
here ``processed`` scoring applies the sampler, so that mean_n estimates the distribution actually sampled
from; verl runs mean_n only where the two agree (T = 1, no top-k / top-p).

``generate_turns`` is the multi-turn rollout of a tool task (``harness.tasks.base.Tool``, a fixed slot layout
``call | observation | answer``): decode the call (each row stops at CALL_END and then emits PAD, not
sampled), ask the environment for the observation, prefill it into the SAME KV cache (the prefix-cache hit:
the prompt and the call are not recomputed), decode the answer until EOS (then PAD). Routing is recorded for
every position (prompt, call, observation, answer), and ``Rollout.mask`` marks the tokens the policy sampled
(1) against observation, padding and forced PAD (0, with sampling log-prob 0: finite, never used).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.backends.local import prefix_cache
from harness.backends.local.grouped import Layout, grouped
from harness.backends.local.model import Policy, PolicyPack, rope_tables, stacked_weights
from harness.spec import InferenceConfig
from harness.tasks.vocab import CALL_END, EOS, PAD

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPLITS = (1, 2, 4)


@dataclass
class Rollout:
    tokens: Tensor  # [B, T] prompt + response
    logp: Tensor  # [B, R] sampling log-probs
    routed_experts: Tensor | None  # [B, T, L, k], -1 at the last position (never processed)
    router_logp: Tensor | None  # [B, R, L, E] router log-probs at the predicting positions
    mask: Tensor | None = None  # [B, R] 1 = a token the policy sampled (multi-turn only; None = all)
    # [B, T] int8, multi-turn MoE only: where each position's recorded routing comes from (prefix_cache.SAMPLED,
    # RECOMPUTED_SAME, RECOMPUTED_OTHER after a prefix-cache miss, MISSING with replay_on_miss=missing)
    routing_origin: Tensor | None = None

    def map(self, fn) -> "Rollout":
        """The rollout with ``fn`` applied to every tensor field (None stays None)."""
        return Rollout(*(None if v is None else fn(v) for v in (self.tokens, self.logp, self.routed_experts,
                                                                 self.router_logp, self.mask, self.routing_origin)))


def rounder(dtype: torch.dtype):
    """x -> x rounded to ``dtype`` and held in float32 (identity for float32)."""
    if dtype == torch.float32:
        return lambda x: x
    return lambda x: x.to(dtype).float()


def sampler_logp(logp: Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The processed distribution over the last axis, in vLLM's order (``vllm/v1/sample/sampler.py``:
    temperature, then ``apply_top_k_top_p``), as log-probs (-inf outside the support):

        l    = log_softmax(logp / T)                                  (T = 1: unchanged)
        top-k: l_v = -inf where l_v < (k-th largest l)                  (ties kept), renormalised
        top-p: sort ascending, c_j = cumsum_j exp(l_(j)); drop the tokens with c_j <= 1 - p
               (the largest always kept), renormalised

    so top-p keeps the smallest head of the (top-k-truncated) distribution whose mass reaches p."""
    if temperature != 1.0:
        logp = torch.log_softmax(logp / temperature, -1)
    if top_k > 0:
        kth = logp.topk(top_k, -1).values[..., -1:]
        logp = torch.log_softmax(logp.masked_fill(logp < kth, float("-inf")), -1)
    if top_p < 1.0:
        sorted_, idx = logp.sort(-1)  # ascending, as vLLM
        drop = sorted_.exp().cumsum(-1) <= 1 - top_p
        drop[..., -1] = False
        logp = torch.log_softmax(logp.masked_fill(drop.scatter(-1, idx, drop), float("-inf")), -1)
    return logp


class _Call:
    """Per-call randomness of independent calls batched along a leading axis G: ``per`` calls for
    each generator (one generator per seed of a pack), group g = seed (g // per), pass (g % per).
    Every draw is made per generator in seed order, each seed exactly as if it ran alone: the
    split-K factor of each call, then combine orders and noise as the forward asks for them."""

    def __init__(self, cfg: InferenceConfig, gen: "torch.Generator | list[torch.Generator]", groups: int = 1,
                 rnd=None):
        gens = gen if isinstance(gen, (list, tuple)) else [gen]
        self.cfg, self.gens, self.per = cfg, list(gens), groups
        self.groups = groups * len(self.gens)
        self.act = DTYPES[cfg.dtype]
        self.r = rnd or rounder(self.act)
        splits = [1] * self.groups
        if cfg.batch_variance and not cfg.deterministic:
            idx = [i for g in self.gens for i in torch.randint(len(SPLITS), (groups,), generator=g, device=g.device).tolist()]
            splits = [SPLITS[i] for i in idx]
        self.splits = splits
        self.by_split = {s: [g for g in range(self.groups) if splits[g] == s] for s in sorted(set(splits))}
        self._seed_of: Tensor | None = None

    @property
    def gen(self) -> torch.Generator:
        return self.gens[0]

    def seed_of(self, device) -> Tensor:
        """The seed index of every group [G]."""
        if self._seed_of is None:
            self._seed_of = torch.arange(self.groups, device=device) // self.per
        return self._seed_of

    def per_group(self, w: Tensor, groups: list[int] | None = None) -> Tensor:
        """Per-seed weights [S, ...] -> one row per group [G, ...] (or per listed group)."""
        if groups is None:
            return w if self.per == 1 else w.index_select(0, self.seed_of(w.device))
        if self.per == 1 and len(groups) == w.shape[0]:
            return w
        return w.index_select(0, self.seed_of(w.device)[torch.tensor(groups, device=w.device)])

    def draw(self, kind: str, shape: tuple[int, ...], device) -> Tensor:
        """rand/randn of shape [G, *shape]: ``per`` rows from each seed's generator, in seed order."""
        fn = torch.rand if kind == "rand" else torch.randn
        parts = [fn((self.per, *shape), generator=g, device=device) for g in self.gens]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def mm(self, x: Tensor, w: Tensor) -> Tensor:
        """x [G, ..., K] @ w [S, K, F] (the weights of group g's seed; or [K, F]), each call g with its own
        split-K factor."""
        shared = w.dim() == 2  # [K, F]: the same weights for every group
        if len(self.by_split) == 1:
            return self._mm(x, w if shared else self.per_group(w), self.splits[0])
        out = x.new_empty(*x.shape[:-1], w.shape[-1], dtype=self.act)
        for s, groups in self.by_split.items():
            idx = torch.tensor(groups, device=x.device)
            out[idx] = self._mm(x[idx], w if shared else self.per_group(w, groups), s)
        return out

    def _mm(self, x: Tensor, w: Tensor, split: int) -> Tensor:
        """x [G, ..., K] @ w [G, K, F] (w [K, F]: shared), split-K partial products rounded to dtype."""
        act, k = self.act, x.shape[-1]
        if w.dim() == 2:
            w = w[None].expand(x.shape[0], -1, -1)
        x32 = x.float()

        def part(a: int, b: int) -> Tensor:  # float32 accumulation, rounded once to the activation dtype
            xs = x32[..., a:b].reshape(x.shape[0], -1, b - a)
            return torch.bmm(xs, w[:, a:b]).view(*x.shape[:-1], w.shape[-1]).to(act)

        if split == 1 or k % split:
            return part(0, k)
        c = k // split
        out = part(0, c)
        for i in range(1, split):
            out = out + part(i * c, (i + 1) * c)  # a dtype add: rounded each time
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
    """The engine of one policy (``seed`` an int) or of a seed pack (a ``PolicyPack`` and one seed
    per slice): the pack's tensors carry a leading seed axis, every seed its own generators."""

    def __init__(self, policy: "Policy | PolicyPack", cfg: InferenceConfig, seed: "int | list[int]",
                 device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.mcfg = policy.cfg
        self.packed = isinstance(policy, PolicyPack)
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed]
        self.dtype = DTYPES[cfg.dtype]
        self.r = rounder(self.dtype)
        self.act = self.dtype  # activations are held in dtype; matmuls accumulate in float32
        self.device = torch.device(device)
        self.sample_gens = [torch.Generator(self.device).manual_seed(s * 1000 + 1) for s in seeds]
        self.noise_gens = [torch.Generator(self.device).manual_seed(s * 1000 + 2) for s in seeds]
        # the prefix cache's refills between turns (prefix_cache.refill): their own draws, so that the rows that hit
        # are bitwise those of a full cache
        self.cache_gens = [torch.Generator(self.device).manual_seed(s * 1000 + 7) for s in seeds]
        d, frozen = self.mcfg.d_model, {"router": [], "logits": []}
        for s in seeds:
            g = torch.Generator().manual_seed(s * 1000 + 6)
            frozen["router"].append(torch.randn(d, self.mcfg.n_experts, generator=g))
            frozen["logits"].append(torch.randn(d, policy.vocab_size, generator=g))
        # fixed projections [S, d, *]: the deterministic mode's stand-in for fresh noise
        self.frozen = {k: torch.stack(v).to(self.device) for k, v in frozen.items()}
        self.scale: Tensor | None = None  # per-seed [S] scale of the perturbation (KL-held runs), None = 1
        self.load_weights(policy)

    @property
    def sample_gen(self) -> torch.Generator:
        return self.sample_gens[0]

    @property
    def noise_gen(self) -> torch.Generator:
        return self.noise_gens[0]

    # ------------------------------------------------------------------ weights (as weight sync)
    def load_weights(self, policy: "Policy | PolicyPack") -> None:
        """Weights [S, ...] rounded to ``dtype`` (held in float32); experts as [S E, d, *]."""
        w = {k: self.r(v.detach().to(self.device, torch.float32)).clone() for k, v in stacked_weights(policy).items()}
        mc = self.mcfg
        if mc.kind == "moe":
            for li in range(mc.n_layers):
                p = f"blocks.{li}.ffn."
                s_, e, d, f = w[p + "w_gate"].shape
                w[p + "w_gate_up"] = torch.cat([w[p + "w_gate"], w[p + "w_up"]], -1).reshape(s_ * e, d, 2 * f)
                w[p + "w_down_flat"] = w[p + "w_down"].reshape(s_ * e, f, d)
        self.w = w

    def seed_view(self, s: int) -> "InferenceEngine":
        """The engine of seed ``s`` of a pack alone: its weights, projections, scale and generators (views, no
        copies). What it computes for seed s is bitwise what the pack computes for it."""
        view = copy.copy(self)
        e = self.mcfg.n_experts
        view.w = {k: v[s * e:(s + 1) * e] if k.endswith(("w_gate_up", "w_down_flat")) else v[s:s + 1]
                  for k, v in self.w.items()}
        view.frozen = {k: v[s:s + 1] for k, v in self.frozen.items()}
        view.scale = None if self.scale is None else self.scale[s:s + 1]
        view.sample_gens, view.noise_gens = [self.sample_gens[s]], [self.noise_gens[s]]
        view.cache_gens = [self.cache_gens[s]]
        return view

    def state(self, s: int = 0) -> dict:
        return {"sample_gen": self.sample_gens[s].get_state(), "noise_gen": self.noise_gens[s].get_state(),
                "cache_gen": self.cache_gens[s].get_state()}

    def load_state(self, state: dict, s: int = 0) -> None:
        self.sample_gens[s].set_state(state["sample_gen"])
        self.noise_gens[s].set_state(state["noise_gen"])
        if "cache_gen" in state:  # checkpoints written before the prefix cache have none (and never drew from it)
            self.cache_gens[s].set_state(state["cache_gen"])

    # ------------------------------------------------------------------------------- forward
    def _rms(self, call: _Call, x: Tensor, weight: Tensor) -> Tensor:
        """RMSNorm in float32, the result rounded to the activation dtype."""
        wg = call.per_group(weight)
        wg = wg.view(wg.shape[0], *([1] * (x.dim() - 2)), wg.shape[-1])
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.mcfg.norm_eps) * wg).to(self.act)

    def _rope(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(self.act)

    def _layer_moe(self, call: _Call, p: str, x: Tensor, layer: int):
        """x [G, N, d] -> (out [G, N, d], router log-probs [G, N, E], selected [G, N, k])."""
        cfg, mc = self.cfg, self.mcfg
        g_, n, d = x.shape
        k = mc.top_k
        logits = call.mm(x, self.w[p + "router"]).float()
        if cfg.router_noise_sigma > 0:
            logits = logits + self._sigma(cfg.router_noise_sigma, logits.shape[0], 3) * self._noise(call, x, "router")
        probs = torch.softmax(logits, -1)
        gates, selected = probs.topk(k, dim=-1)
        gates = (gates / gates.sum(-1, keepdim=True)).to(self.act)
        m = g_ * n
        dest = torch.arange(m * k, device=x.device)  # where the (token, slot) pair goes in the sum order
        if not cfg.deterministic:  # random summation order per token: atomics
            rank = call.draw("rand", (n, k), x.device).argsort(-1).argsort(-1)
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
        mc, w, act = self.mcfg, self.w, self.act
        g_, b, t = tokens.shape
        h_, hd = mc.n_heads, mc.d_model // mc.n_heads
        cos, sin = rope_tables(torch.arange(start, start + t, device=tokens.device), hd, mc.rope_theta)
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
            if tq == 1:  # decode: one query per row; products and sums instead of tiny batched GEMMs
                scores = (q.float() * k.float()).sum(-1, keepdim=True).transpose(-1, -2) / hd ** 0.5
                attn = torch.softmax(scores, -1).to(act)
                o = (attn.float().transpose(-1, -2) * v.float()).sum(-2, keepdim=True).to(act)
            else:
                scores = (q.float() @ k.float().transpose(-1, -2)) / hd ** 0.5  # float32
                total = k.shape[-2]
                causal = torch.ones(tq, total, dtype=torch.bool, device=x.device).tril(total - tq)
                attn = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1).to(act)
                o = (attn.float() @ v.float()).to(act)
            o = o.transpose(2, 3).reshape(g_, b, tq, -1)
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

    def _sigma(self, sigma: float, rows: int, ndim: int) -> "float | Tensor":
        """A perturbation's size for ``rows`` seed-major leading rows (S x calls) of an ndim tensor: the configured
        value, or times each row's seed ``scale`` in a KL-held run."""
        if self.scale is None:
            return sigma
        return (sigma * self.scale).repeat_interleave(rows // self.scale.numel()).view(-1, *([1] * (ndim - 1)))

    def _noise(self, call: _Call, x: Tensor, which: str) -> Tensor:
        """Standard-normal noise per entry: fresh per call, or frozen (a function of x) when deterministic."""
        proj = self.frozen[which]  # [S, d, P]
        if not self.cfg.deterministic:
            return call.draw("randn", (*x.shape[1:-1], proj.shape[-1]), x.device)
        z = x.float()
        z = z / z.norm(dim=-1, keepdim=True).clamp(min=1e-6)  # unit rows: z @ proj ~ N(0, 1) per entry
        pg = call.per_group(proj)
        return torch.bmm(z.reshape(z.shape[0], -1, z.shape[-1]), pg).view(*z.shape[:-1], pg.shape[-1])

    # ----------------------------------------------------------------------- distributions
    def _model_logp(self, logits: Tensor) -> Tensor:
        """The engine's model distribution (with the biased perturbation when it is on)."""
        logp = torch.log_softmax(logits, -1)
        if self.cfg.bias_delta != 1.0:
            low = logp.exp() < self.cfg.bias_threshold
            log_delta = torch.log(torch.tensor(self.cfg.bias_delta))
            if self.scale is not None:  # delta ** c per seed
                log_delta = self._sigma(float(log_delta), logp.shape[0], logp.dim())
            logp = torch.log_softmax(logp + low * log_delta, -1)
        return logp

    def _sampler_logp(self, logp: Tensor) -> Tensor:
        """The processed distribution the sampler draws from (temperature, top-k, top-p: ``sampler_logp``)."""
        return sampler_logp(logp, self.cfg.temperature, self.cfg.top_k, self.cfg.top_p)

    def _reported(self, model_logp: Tensor, sampler_logp: Tensor) -> Tensor:
        return sampler_logp if self.cfg.logprobs_mode == "processed" else model_logp

    # --------------------------------------------------------------------------------- API
    @torch.no_grad()
    def generate(self, prompts: Tensor, max_new_tokens: int) -> Rollout:
        """prompts [B, P] (one policy) or [S, B, P] (a pack: every Rollout field gets the S axis)."""
        single = prompts.dim() == 2
        if single:
            prompts = prompts[None]
        s_, b, p = prompts.shape
        capacity = p + max_new_tokens
        cache = _Cache()
        tokens = torch.empty(s_, b, capacity, dtype=prompts.dtype, device=prompts.device)
        tokens[:, :, :p] = prompts
        logps, routed, routers = [], [], []
        logits = self._advance(prompts, 0, cache, capacity, routed, routers, 1)  # one engine step = one batch shape
        for i in range(max_new_tokens):
            nxt, lp = self._sample(logits)
            logps.append(lp)
            tokens[:, :, p + i:p + i + 1] = nxt
            if i + 1 < max_new_tokens:
                logits = self._advance(nxt, p + i, cache, capacity, routed, routers, 1)
        roll = Rollout(tokens, torch.cat(logps, 2), *self._routing(routed, routers))
        return roll.map(lambda v: v[0]) if single else roll

    @staticmethod
    def _routing(routed: list[Tensor], routers: list[Tensor]) -> tuple[Tensor | None, Tensor | None]:
        """(routed experts [S, B, T, L, k] with -1 at the last position, router log-probs [S, B, R, L, E]) of
        the recorded forwards, or (None, None) for a dense model."""
        if not routed:
            return None, None
        last = torch.full_like(routed[0][:, :, :1], -1)
        return torch.cat(routed + [last], 2), torch.cat(routers, 2)

    def _sample(self, logits: Tensor) -> tuple[Tensor, Tensor]:
        """One token per row from the last position's logits [S, B, t, V]: (token [S, B, 1], its reported
        log-prob [S, B, 1]), each seed from its own sampling generator."""
        model_logp = self._model_logp(logits[:, :, -1])
        sampler_logp = self._sampler_logp(model_logp)
        probs = sampler_logp.exp()
        nxt = torch.stack([torch.multinomial(probs[s], 1, generator=g) for s, g in enumerate(self.sample_gens)])
        return nxt, self._reported(model_logp, sampler_logp).gather(-1, nxt)

    def _advance(self, tokens: Tensor, start: int, cache: _Cache, capacity: int, routed: list, routers: list,
                 predicting: int) -> Tensor:
        """Forward ``tokens`` [S, B, t] at positions start.. into ``cache`` (one engine step), record the routing
        of every position and the router log-probs of the last ``predicting`` ones; the logits [S, B, t, V]."""
        call = _Call(self.cfg, self.noise_gens, 1, self.r)
        logits, rl, sel = self._forward(call, tokens, start, cache, capacity)
        if sel is not None:
            routed.append(sel)
            routers.append(rl[:, :, rl.shape[2] - predicting:])
        return logits

    def prefill(self, tokens: Tensor, gens: list[torch.Generator]) -> tuple[_Cache, Tensor | None, Tensor | None]:
        """One fresh engine call over ``tokens`` [S, B, t] at positions 0..t-1 into a new cache, its random draws
        from ``gens``: (the cache, router log-probs [S, B, t, L, E], selected experts [S, B, t, L, k])."""
        cache = _Cache()
        _, rl, sel = self._forward(_Call(self.cfg, gens, 1, self.r), tokens, 0, cache, tokens.shape[-1])
        return cache, rl, sel

    @torch.no_grad()
    def generate_turns(self, prompts: Tensor, tool, length: int, answer_len: int) -> Rollout:
        """The multi-turn rollout of a tool task (module docstring): prompts [B, P] or [S, B, P] ->
        Rollout over the response slots ``call (C) | observation (O) | answer (A)`` with its mask."""
        single = prompts.dim() == 2
        if single:
            prompts = prompts[None]
        s_, b, p = prompts.shape
        c, o = tool.call_len(length), tool.obs_len(length)
        r = c + o + answer_len
        capacity = p + r
        tokens = torch.full((s_, b, capacity), PAD, dtype=prompts.dtype, device=prompts.device)
        tokens[:, :, :p] = prompts
        logp = torch.zeros(s_, b, r, device=prompts.device)
        mask = torch.zeros(s_, b, r, device=prompts.device)
        cache, routed, routers = _Cache(), [], []
        step = lambda x, at, keep: self._advance(x, at, cache, capacity, routed, routers, keep)  # noqa: E731

        def turn(first: int, slot: int, stop: int, logits: Tensor) -> None:
            """Decode the policy slot [first, first + slot) of the response; a row that wrote ``stop`` emits PAD."""
            done = torch.zeros(s_, b, 1, dtype=torch.bool, device=prompts.device)
            for i in range(slot):
                nxt, lp = self._sample(logits)
                nxt = nxt.masked_fill(done, PAD)
                at = first + i
                tokens[:, :, p + at:p + at + 1] = nxt
                logp[:, :, at:at + 1] = lp.masked_fill(done, 0.0)
                mask[:, :, at:at + 1] = (~done).float()
                done = done | (nxt == stop)
                if i + 1 < slot:
                    logits = step(nxt, p + at, 1)

        turn(0, c, CALL_END, step(prompts, 0, 1))
        calls = tokens[:, :, p:p + c].flatten(0, 1)
        tokens[:, :, p + c:p + c + o] = tool.observe(prompts.flatten(0, 1), calls).view(s_, b, o).to(tokens.dtype)
        refill = None
        if self.cfg.prefix_cache_capacity < 1:  # while the tool runs, the contexts wait in a cache that may evict
            refill = prefix_cache.between_turns(self, cache, tokens[:, :, :p + c - 1], tokens[:, :, p:p + c],
                                                CALL_END, PAD)
        # the call's last token and the observation, appended to the same cache: a hit does not recompute the
        # prompt and the call (a miss has them re-prefilled by the refill above)
        turn(c + o, answer_len, EOS, step(tokens[:, :, p + c - 1:p + c + o], p + c - 1, o + 1))
        routed_experts, router_logp = self._routing(routed, routers)
        origin = None
        if routed_experts is not None:
            routed_experts, router_logp, origin = prefix_cache.replay_routing(routed_experts, router_logp, refill, p,
                                                                              self.cfg.replay_on_miss)
        roll = Rollout(tokens, logp, routed_experts, router_logp, mask, origin)
        return roll.map(lambda v: v[0]) if single else roll

    @torch.no_grad()
    def score(self, tokens: Tensor, prompt_len: int, n: int,
              generator: "torch.Generator | list[torch.Generator] | None" = None) -> Tensor:
        """n independent scorings [n, B, R] ([S, n, B, R] for pack tokens [S, B, T]) in one
        batched prefill over (S x) n x B rows; each pass has its own split-K factor, combine
        orders and noise draws (from its seed's generator)."""
        single = tokens.dim() == 2
        if single:
            tokens = tokens[None]
        s_, b, t = tokens.shape
        gens = generator or self.noise_gens
        if s_ > 1:  # a pack: seed by seed (each seed's rows and draws are its own: bitwise the same; n x B rows
            gens = gens if isinstance(gens, (list, tuple)) else [gens]  # of one seed stay cache-sized, S x n x B not)
            return torch.stack([self.seed_view(i).score(tokens[i], prompt_len, n, gens[i]) for i in range(s_)])
        call = _Call(self.cfg, gens, n, self.r)
        inputs = tokens[:, None, :, :-1].expand(s_, n, b, t - 1).reshape(s_ * n, b, t - 1)  # last: predicts nothing
        logits, _, _ = self._forward(call, inputs, 0, None, keep_from=prompt_len - 1)
        model_logp = self._model_logp(logits)
        logp = self._reported(model_logp, self._sampler_logp(model_logp))
        target = tokens[:, None, :, prompt_len:, None].expand(s_, n, b, t - prompt_len, 1).reshape(s_ * n, b, -1, 1)
        out = logp.gather(-1, target).squeeze(-1).view(s_, n, b, -1)
        return out[0] if single else out

    def score_once(self, tokens: Tensor, prompt_len: int, generator: torch.Generator | None = None) -> Tensor:
        """One prefill pass over prompt+response: log-probs of the response tokens [B, R]."""
        return self.score(tokens, prompt_len, 1, generator)[0]

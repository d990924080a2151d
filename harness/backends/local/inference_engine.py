"""InferenceEngine: the rollout side (as vLLM): a separate code path with its own numerics.

- KV-cached incremental decoding; prefill for scoring (``score``, like vLLM ``prompt_logprobs``);
- weights and activations in ``dtype`` (bf16 by default), attention softmax in float32;
- MoE: only the top-k experts' outputs are combined, summed in a *random order per token and per
  call* with accumulation in ``dtype`` (what GPU atomics / scatter_add do); the dense twin has no
  such term;
- ``batch_variance``: every call picks a split-K factor for its matmuls (as kernels pick tiles by
  batch shape), partial products rounded to ``dtype`` - noise for dense models too;
- ``deterministic``: fixed combine order and no split-K (batch invariant): zero scoring variance;
- explicit perturbations, off by default (DESIGN.md section 3): router-logit noise before top-k,
  output-logit noise, and a biased down-weighting of low-probability tokens. The two noise knobs
  draw fresh N(0, sigma^2) per call; in ``deterministic`` mode they become *frozen*: the same
  scale, but a fixed function of the hidden state (a fixed random projection), so a deterministic
  engine still differs from the training engine but no longer from itself (deterministic inference
  removes run-to-run variance, not the train-inference mismatch).

``generate`` returns tokens, the sampling log-probs (``logprobs_mode``: ``processed`` = the exact
distribution sampled from; ``raw`` = before temperature/top-k) and the routed experts per token and
layer. ``score(tokens, n)`` returns n independent scorings.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from harness.backends.local.model import Policy, apply_rope, rms_norm, rope_tables
from harness.config import InferenceConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPLITS = (1, 2, 4)


@dataclass
class Rollout:
    tokens: Tensor  # [B, T] prompt + response
    logp: Tensor  # [B, R] sampling log-probs
    routed_experts: Tensor | None  # [B, T, L, k], -1 at the last position (never processed)
    router_logp: Tensor | None  # [B, R, L, E] router log-probs at the predicting positions


class _Call:
    """Per-call randomness: the split-K factor and the generator for combine order and noise."""

    def __init__(self, cfg: InferenceConfig, gen: torch.Generator):
        self.cfg, self.gen = cfg, gen
        self.split = 1
        if cfg.batch_variance and not cfg.deterministic:
            self.split = SPLITS[int(torch.randint(len(SPLITS), (1,), generator=gen, device=gen.device))]

    def mm(self, x: Tensor, w: Tensor) -> Tensor:
        k = x.shape[-1]
        if self.split == 1 or k % self.split:
            return x @ w
        c = k // self.split
        out = x[..., :c] @ w[:c]
        for i in range(1, self.split):
            out = out + x[..., i * c:(i + 1) * c] @ w[i * c:(i + 1) * c]  # rounded to dtype each time
        return out


class InferenceEngine:
    def __init__(self, policy: Policy, cfg: InferenceConfig, seed: int, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.mcfg = policy.cfg
        self.dtype = DTYPES[cfg.dtype]
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
        self.w = {k: v.detach().to(self.device, self.dtype).clone() for k, v in policy.state_dict().items()}

    def state(self) -> dict:
        return {"sample_gen": self.sample_gen.get_state(), "noise_gen": self.noise_gen.get_state()}

    def load_state(self, state: dict) -> None:
        self.sample_gen.set_state(state["sample_gen"])
        self.noise_gen.set_state(state["noise_gen"])

    # ------------------------------------------------------------------------------- forward
    def _layer_moe(self, call: _Call, p: str, x: Tensor, layer: int):
        cfg, mc = self.cfg, self.mcfg
        n = x.shape[0]
        logits = call.mm(x, self.w[p + "router"]).float()
        if cfg.router_noise_sigma > 0:
            logits = logits + cfg.router_noise_sigma * self._noise(call, x, "router")
        probs = torch.softmax(logits, -1)
        gates, selected = probs.topk(mc.top_k, dim=-1)
        gates = (gates / gates.sum(-1, keepdim=True)).to(self.dtype)
        # every expert on every token (cheap at this size, no weight gathers), then pick the top-k
        h = F.silu(torch.einsum("nd,edf->enf", x, self.w[p + "w_gate"])) * torch.einsum("nd,edf->enf", x, self.w[p + "w_up"])
        y_all = torch.einsum("enf,efd->end", h, self.w[p + "w_down"])  # [E, N, d] in dtype
        y = y_all[selected, torch.arange(n, device=x.device)[:, None]] * gates[..., None]  # [N, k, d]
        if not cfg.deterministic:  # random summation order per token: atomics
            order = torch.rand(n, mc.top_k, generator=call.gen, device=x.device).argsort(-1)
            y = y.gather(1, order[..., None].expand_as(y))
        out = y[:, 0]
        for j in range(1, mc.top_k):
            out = out + y[:, j]  # accumulation in dtype: order matters
        return out, torch.log_softmax(logits, -1), selected

    def _forward(self, call: _Call, tokens: Tensor, start: int, cache: list | None):
        """Run new ``tokens`` [B, t] at positions start..start+t-1, appending to the KV cache."""
        mc, w = self.mcfg, self.w
        b, t = tokens.shape
        h_, hd = mc.n_heads, mc.d_model // mc.n_heads
        cos, sin = rope_tables(torch.arange(start, start + t, device=tokens.device), hd, mc.rope_theta)
        x = w["embed"][tokens]
        router_logp, selected = [], []
        for li in range(mc.n_layers):
            p = f"blocks.{li}."
            hn = rms_norm(x, w[p + "attn_norm"], mc.norm_eps)
            q = call.mm(hn, w[p + "attn.q_proj"]).view(b, t, h_, hd).transpose(1, 2)
            k = call.mm(hn, w[p + "attn.k_proj"]).view(b, t, h_, hd).transpose(1, 2)
            v = call.mm(hn, w[p + "attn.v_proj"]).view(b, t, h_, hd).transpose(1, 2)
            q = apply_rope(rms_norm(q, w[p + "attn.q_norm"], mc.norm_eps), cos, sin)
            k = apply_rope(rms_norm(k, w[p + "attn.k_norm"], mc.norm_eps), cos, sin)
            if cache is not None:
                if len(cache) > li:
                    k = torch.cat([cache[li][0], k], 2)
                    v = torch.cat([cache[li][1], v], 2)
                    cache[li] = (k, v)
                else:
                    cache.append((k, v))
            scores = (q.float() @ k.float().transpose(-1, -2)) / hd ** 0.5
            total = k.shape[2]
            causal = torch.ones(t, total, dtype=torch.bool, device=x.device).tril(total - t)
            attn = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1).to(self.dtype)
            o = (attn @ v).transpose(1, 2).reshape(b, t, -1)
            x = x + call.mm(o, w[p + "attn.o_proj"])
            hn = rms_norm(x, w[p + "ffn_norm"], mc.norm_eps).reshape(b * t, -1)
            if mc.kind == "moe":
                out, rl, sel = self._layer_moe(call, p + "ffn.", hn, li)
                router_logp.append(rl.view(b, t, -1))
                selected.append(sel.view(b, t, -1))
            else:
                out = call.mm(F.silu(call.mm(hn, w[p + "ffn.w_gate"])) * call.mm(hn, w[p + "ffn.w_up"]), w[p + "ffn.w_down"])
            x = x + out.view(b, t, -1)
        hidden = rms_norm(x, w["final_norm"], mc.norm_eps)
        logits = call.mm(hidden, w["lm_head"]).float()
        if self.cfg.logit_noise_sigma > 0:
            logits = logits + self.cfg.logit_noise_sigma * self._noise(call, hidden, "logits")
        if mc.kind != "moe":
            return logits, None, None
        return logits, torch.stack(router_logp, 2), torch.stack(selected, 2)

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
        cache: list = []
        tokens, logps, routed, routers = prompts, [], [], []
        call = _Call(self.cfg, self.noise_gen)  # one engine step = one batch shape
        logits, rl, sel = self._forward(call, prompts, 0, cache)
        if sel is not None:
            routed.append(sel)
            routers.append(rl[:, -1:])
        for i in range(max_new_tokens):
            model_logp = self._model_logp(logits[:, -1])
            sampler_logp = self._sampler_logp(model_logp)
            nxt = torch.multinomial(sampler_logp.exp(), 1, generator=self.sample_gen)
            logps.append(self._reported(model_logp, sampler_logp).gather(-1, nxt))
            tokens = torch.cat([tokens, nxt], 1)
            if i + 1 < max_new_tokens:
                call = _Call(self.cfg, self.noise_gen)
                logits, rl, sel = self._forward(call, nxt, p + i, cache)
                if sel is not None:
                    routed.append(sel)
                    routers.append(rl)
        routed_experts = router_logp = None
        if routed:
            last = torch.full_like(routed[0][:, :1], -1)
            routed_experts = torch.cat(routed + [last], 1)
            router_logp = torch.cat(routers, 1)
        return Rollout(tokens, torch.cat(logps, 1), routed_experts, router_logp)

    @torch.no_grad()
    def score_once(self, tokens: Tensor, prompt_len: int, generator: torch.Generator | None = None) -> Tensor:
        """One prefill pass over prompt+response: log-probs of the response tokens [B, R]."""
        call = _Call(self.cfg, generator or self.noise_gen)
        logits, _, _ = self._forward(call, tokens, 0, None)
        model_logp = self._model_logp(logits[:, prompt_len - 1:-1])
        logp = self._reported(model_logp, self._sampler_logp(model_logp))
        return logp.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)

    def score(self, tokens: Tensor, prompt_len: int, n: int, generator: torch.Generator | None = None) -> Tensor:
        """n independent scorings [n, B, R] (each its own combine order, split-K and noise)."""
        return torch.stack([self.score_once(tokens, prompt_len, generator) for _ in range(n)])

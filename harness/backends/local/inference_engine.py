"""InferenceEngine: the rollout side (as vLLM): a separate code path with its own numerics.

- KV-cached incremental decoding (a preallocated cache, ``inference.kv_cache``; ``generate``, ``inference.decoding``);
  prefill for scoring (``score``, like vLLM ``prompt_logprobs``, ``inference.scoring``);
- weights and activations in ``dtype`` (bf16 by default), attention softmax in float32 (``inference.forward``).
  Every op rounds its output to ``dtype`` exactly where a bf16 kernel would: a matmul rounds its float32
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
  with ``P_i`` the partial product over the i-th K-chunk - noise for dense models too (``inference.kernels``);
- ``deterministic``: fixed combine order and no split-K (batch invariant): zero scoring variance;
- explicit perturbations, off by default (docs/design.md section 3; ``inference.noise``): router-logit noise
  before top-k, output-logit noise, and a biased down-weighting of low-probability tokens;
- the sampler (temperature, top-k, top-p) and the reported log-probs (``logprobs_mode``): ``inference.sampling``;
- the multi-turn rollout of a tool task (``generate_turns``, the prefix cache between turns):
  ``inference.multi_turn``.

Independent calls can share one batched forward: every activation carries a leading *call* axis
G, and each call keeps its own split-K factor, combine orders and noise draws (``_Call``). That is
how ``score(tokens, n)`` runs its n passes as one forward over n x B rows.

This module holds what the parts share: the engine's configuration, weights, generators and seed views.
"""
from __future__ import annotations

import copy

import torch
from torch import Tensor

from harness.backends.local.inference.decoding import Decoding
from harness.backends.local.inference.forward import Forward
from harness.backends.local.inference.kernels import DTYPES, rounder
from harness.backends.local.inference.multi_turn import MultiTurn
from harness.backends.local.inference.noise import Noise, frozen_projections
from harness.backends.local.inference.rollout import Rollout
from harness.backends.local.inference.sampling import Sampling, sampler_logp
from harness.backends.local.inference.scoring import Scoring
from harness.backends.local.model import Policy, PolicyPack, stacked_weights
from harness.spec import InferenceConfig

__all__ = ["InferenceEngine", "Rollout", "sampler_logp"]


class InferenceEngine(Decoding, MultiTurn, Scoring, Sampling, Noise, Forward):
    """The engine of one policy (``seed`` an int) or of a seed pack (a ``PolicyPack`` and one seed
    per slice): the pack's tensors carry a leading seed axis, every seed its own generators. Its methods come
    from its parts (``harness.backends.local.inference``): generate, generate_turns and prefill, score, the
    sampler, the perturbations and the forward pass."""

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
        # fixed projections [S, d, *]: the deterministic mode's stand-in for fresh noise
        self.frozen = frozen_projections(seeds, self.mcfg.d_model, self.mcfg.n_experts, policy.vocab_size, self.device)
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

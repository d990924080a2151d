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
- ``batch_variance``: every call draws a split-K factor s in {1, 2, 4} for its matmuls (as kernels
  pick tiles by batch shape): ``y = round(...round(round(P_1) + round(P_2))... + round(P_s))``
  with ``P_i`` the partial product over the i-th K-chunk - noise for dense models too; the partials of the
  four K-chunks come from one batched matmul and each row (call) takes its factor's sum (``inference.kernels``);
- ``deterministic``: fixed combine order and no split-K (batch invariant): zero scoring variance;
- explicit perturbations, off by default (docs/design.md section 3; ``inference.noise``): router-logit noise
  before top-k, output-logit noise, and a biased down-weighting of low-probability tokens;
- the sampler (temperature, top-k, top-p) and the reported log-probs (``logprobs_mode``): ``inference.sampling``;
- the multi-turn rollout of a tool task (``generate_turns``, the prefix cache between turns):
  ``inference.multi_turn``.

Independent calls can share one batched forward: every activation carries a leading *call* axis
G, and each call keeps its own split-K factor, combine orders and noise draws (``_Call``). That is
how ``score(tokens, n)`` runs the n passes of every seed of a pack as one forward over S x n x B rows.

Keyed random numbers (``harness.backends.local.philox``): every draw is a pure function of the key (seed, stream)
and the counter (step, call, draw, block), computed for all the seeds of a pack in one call, so a seed's draws are
the same alone or in any pack and nothing but the step is needed to resume. The trainer starts each step with
``begin_step(step)``; the engine numbers its calls within the step (each ``_Call`` and each sampled token takes the
next number; the calls of a stream of their own, the prefix cache's ``refill`` and the diagnostics' ``score``,
are numbered apart, so that they move no other call's numbers) and each call its draws.

This module holds what the parts share: the engine's configuration, weights, keys and seed views.
"""
from __future__ import annotations

import copy

from typing import Callable

import torch
from torch import Tensor

from harness.backends.local.inference.decoding import Decoding
from harness.backends.local.inference.forward import Forward
from harness.backends.local.inference.kernels import DTYPES, _Call, rounder
from harness.backends.local.inference.multi_turn import MultiTurn
from harness.backends.local.inference.noise import Noise, frozen_projections
from harness.backends.local.inference.rollout import Rollout
from harness.backends.local.inference.sampling import Sampling, sampler_logp
from harness.backends.local.inference.scoring import Scoring
from harness.backends.local.model import Policy, PolicyPack, stacked_weights
from harness.spec import InferenceConfig

__all__ = ["InferenceEngine", "Rollout", "sampler_logp"]

#: on a CPU, a pack's scorings of more rows than this (S x n x B) run seed by seed: one seed of mean_n(8) over 128
#: sequences is 1024 rows; 8 seeds in one forward (8192 rows) were 1.8x slower than seed by seed on 2 cores
CPU_SCORE_ROWS = 2048


class InferenceEngine(Decoding, MultiTurn, Scoring, Sampling, Noise, Forward):
    """The engine of one policy (``seed`` an int) or of a seed pack (a ``PolicyPack`` and one seed
    per slice): the pack's tensors carry a leading seed axis, every seed its own keys. Its methods come
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
        self.seeds = torch.tensor(seeds, dtype=torch.int64, device=self.device)  # the keys' first word
        # a CPU scores a pack of more than this many rows seed by seed (cache-sized, the same numbers:
        # inference.scoring); a GPU always in one forward (None)
        self.score_rows: int | None = CPU_SCORE_ROWS if self.device.type == "cpu" else None
        # a CPU reads each call's split-K factors back and computes only the sums in use (the same numbers:
        # kernels._Call.in_use); a GPU selects among all three per row, without waiting for the device
        self.host_splits = self.device.type == "cpu"
        self.step = 0  # the counter's first word (begin_step)
        self._calls: dict[str, int] = {}  # calls made in this step, per stream of their own ("" the others)
        # fixed projections [S, d, *]: the deterministic mode's stand-in for fresh noise
        self.frozen = frozen_projections(seeds, self.mcfg.d_model, self.mcfg.n_experts, policy.vocab_size, self.device)
        self.scale: Tensor | None = None  # per-seed [S] scale of the perturbation (KL-held runs), None = 1
        # asked between two decode steps of a rollout (the trainer's phase boundary: it raises to abandon the step, so
        # a signal waits one decode step, not a whole rollout); reads a flag, computes nothing
        self.boundary: Callable[[], None] | None = None
        self.load_weights(policy)

    # ------------------------------------------------------------------ keys
    def begin_step(self, step: int) -> None:
        """Start engine step ``step``: the counter's step word, and the call numbers from 0 again."""
        self.step = int(step)
        self._calls = {}

    def _next_call(self, stream: str | None = None) -> int:
        """The next call number of this step (the calls of a ``stream`` of their own are numbered apart)."""
        lane = stream or ""
        n = self._calls.get(lane, 0)
        self._calls[lane] = n + 1
        return n

    def _call(self, groups: int = 1, stream: str | None = None) -> _Call:
        """A fresh engine call of ``groups`` passes per seed: the next call number, its draws keyed by this
        engine's seeds and step (from ``stream`` only, when given)."""
        return _Call(self.cfg, self.seeds, self.step, self._next_call(stream), groups, self.r, stream,
                     self.host_splits)

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
        """The engine of seed ``s`` of a pack alone: its weights, projections, scale and key (views, no copies),
        at the pack's step and call numbers. What it computes for seed s is bitwise what the pack computes for it."""
        view = copy.copy(self)
        e = self.mcfg.n_experts
        view.w = {k: v[s * e:(s + 1) * e] if k.endswith(("w_gate_up", "w_down_flat")) else v[s:s + 1]
                  for k, v in self.w.items()}
        view.frozen = {k: v[s:s + 1] for k, v in self.frozen.items()}
        view.scale = None if self.scale is None else self.scale[s:s + 1]
        view.seeds = self.seeds[s:s + 1]
        view._calls = dict(self._calls)
        return view

    def state(self, s: int = 0) -> dict:
        """What the engine needs to resume (the same for every seed ``s``): its step and the calls made in it (the
        draws are keyed; at a step's boundary the trainer's ``begin_step`` sets both anyway)."""
        return {"step": self.step, "calls": dict(self._calls)}

    def load_state(self, state: dict, s: int = 0) -> None:
        """Restore ``state()``; the generator states of checkpoints of local numerics version < 4 are ignored."""
        if "step" in state:
            self.step, self._calls = int(state["step"]), dict(state["calls"])

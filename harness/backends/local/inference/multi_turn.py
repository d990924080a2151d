"""The engine's multi-turn rollout of a tool task (``MultiTurn``, a part of ``InferenceEngine``).

``generate_turns`` follows the task's fixed slot layout ``call | observation | answer``
(``harness.tasks.base.Tool``): decode the call (each row stops at CALL_END and then emits PAD, not sampled), ask
the environment for the observation, prefill it into the SAME KV cache (the prefix-cache hit: the prompt and the
call are not recomputed), decode the answer until EOS (then PAD). Routing is recorded for every position (prompt,
call, observation, answer), and ``Rollout.mask`` marks the tokens the policy sampled (1) against observation,
padding and forced PAD (0, with sampling log-prob 0: finite, never used). With a prefix cache smaller than the
contexts (``inference.prefix_cache_capacity`` < 1), the rows that miss between the turns are re-prefilled
(``prefill``, through ``harness.backends.local.prefix_cache``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.backends.local import prefix_cache
from harness.backends.local.inference.kv_cache import KVCache
from harness.backends.local.inference.rollout import Rollout, routing
from harness.tasks.vocab import CALL_END, EOS, PAD


class MultiTurn:
    """``generate_turns`` and ``prefill``, over ``InferenceEngine``'s engine step (``Decoding._advance``) and
    sampler."""

    def prefill(self, tokens: Tensor, stream: str | None = None) -> tuple[KVCache, Tensor | None, Tensor | None]:
        """One fresh engine call over ``tokens`` [S, B, t] at positions 0..t-1 into a new cache, its random draws
        from ``stream`` (None: the engine's own streams; ``_call``): (the cache, router log-probs [S, B, t, L, E],
        selected experts [S, B, t, L, k])."""
        cache = KVCache()
        _, rl, sel = self._forward(self._call(stream=stream), tokens, 0, cache, tokens.shape[-1])
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
        cache, routed, routers = KVCache(), [], []
        step = lambda x, at, keep: self._advance(x, at, cache, capacity, routed, routers, keep)  # noqa: E731

        def turn(first: int, slot: int, stop: int, out: tuple) -> None:
            """Decode the policy slot [first, first + slot) of the response; a row that wrote ``stop`` emits PAD."""
            done = torch.zeros(s_, b, 1, dtype=torch.bool, device=prompts.device)
            for i in range(slot):
                nxt, lp = self._sample(*out)
                nxt = nxt.masked_fill(done, PAD)
                at = first + i
                tokens[:, :, p + at:p + at + 1] = nxt
                logp[:, :, at:at + 1] = lp.masked_fill(done, 0.0)
                mask[:, :, at:at + 1] = (~done).float()
                done = done | (nxt == stop)
                if i + 1 < slot:
                    if self.boundary is not None:  # a stop asked for: the step is abandoned here
                        self.boundary()
                    out = step(nxt, p + at, 1)

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
        routed_experts, router_logp = routing(routed, routers)
        origin = None
        if routed_experts is not None:
            routed_experts, router_logp, origin = prefix_cache.replay_routing(routed_experts, router_logp, refill, p,
                                                                              self.cfg.replay_on_miss)
        roll = Rollout(tokens, logp, routed_experts, router_logp, mask, origin)
        return roll.map(lambda v: v[0]) if single else roll

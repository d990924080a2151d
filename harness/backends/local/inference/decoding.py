"""The engine's single-turn rollout (``Decoding``, a part of ``InferenceEngine``): ``generate`` prefills the prompts
and decodes ``max_new_tokens`` tokens into a preallocated KV cache (``KVCache``), one fresh engine call per forward
(``_Call``, the next call number of the engine step: its own split-K factors, combine orders and noise draws, and
the Gumbel draws of the token sampled from its logits), recording the routing of every position (``_advance``). The
shapes of a rollout's calls are known before it starts, so the draws of all of them are made in one Philox
evaluation (``kernels.prefetch``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.backends.local.inference.kernels import _Call, prefetch
from harness.backends.local.inference.kv_cache import KVCache
from harness.backends.local.inference.rollout import Rollout, routing


class Decoding:
    """``generate`` and its engine step ``_advance``, over ``InferenceEngine``'s forward and sampler."""

    @torch.no_grad()
    def generate(self, prompts: Tensor, max_new_tokens: int) -> Rollout:
        """prompts [B, P] (one policy) or [S, B, P] (a pack: every Rollout field gets the S axis)."""
        single = prompts.dim() == 2
        if single:
            prompts = prompts[None]
        s_, b, p = prompts.shape
        capacity = p + max_new_tokens
        cache = KVCache()
        tokens = torch.empty(s_, b, capacity, dtype=prompts.dtype, device=prompts.device)
        tokens[:, :, :p] = prompts
        logps, routed, routers = [], [], []
        calls = [self._call() for _ in range(max(max_new_tokens, 1))]  # the prefill's, then each decode step's
        prefetch(calls, [self._draw_plan(b, t, 0, sample=True) for t in [p] + [1] * (len(calls) - 1)])
        out = self._advance(prompts, 0, cache, capacity, routed, routers, 1, calls[0])  # one call = one batch shape
        for i in range(max_new_tokens):
            nxt, lp = self._sample(*out)
            logps.append(lp)
            tokens[:, :, p + i:p + i + 1] = nxt
            if i + 1 < max_new_tokens:
                if self.boundary is not None:  # a stop asked for: the step is abandoned here (its memory discarded)
                    self.boundary()
                out = self._advance(nxt, p + i, cache, capacity, routed, routers, 1, calls[i + 1])
        roll = Rollout(tokens, torch.cat(logps, 2), *routing(routed, routers))
        return roll.map(lambda v: v[0]) if single else roll

    def _advance(self, tokens: Tensor, start: int, cache: KVCache, capacity: int, routed: list, routers: list,
                 predicting: int, call: _Call | None = None) -> tuple[Tensor, _Call]:
        """Forward ``tokens`` [S, B, t] at positions start.. into ``cache`` (one engine call: ``call``, prefetched,
        or the next one), record the routing of every position and the router log-probs of the last ``predicting``
        ones: (the logits [S, B, t, V], the call, whose draws include those of the token ``_sample`` draws from the
        last position's logits)."""
        if call is None:
            call = self._call()
            call.prefetch(self._draw_plan(*tokens.shape[1:], 0, sample=True))
        logits, rl, sel = self._forward(call, tokens, start, cache, capacity)
        if sel is not None:
            routed.append(sel)
            routers.append(rl[:, :, rl.shape[2] - predicting:])
        return logits, call

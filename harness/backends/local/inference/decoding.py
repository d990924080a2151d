"""The engine's single-turn rollout (``Decoding``, a part of ``InferenceEngine``): ``generate`` prefills the prompts
and decodes ``max_new_tokens`` tokens into a preallocated KV cache (``KVCache``), one fresh engine call per forward
(``_Call``, the next call number of the engine step: its own split-K factors, combine orders and noise draws) and
one per sampled token, recording the routing of every position (``_advance``).
"""
from __future__ import annotations

import torch
from torch import Tensor

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
        logits = self._advance(prompts, 0, cache, capacity, routed, routers, 1)  # one engine step = one batch shape
        for i in range(max_new_tokens):
            nxt, lp = self._sample(logits)
            logps.append(lp)
            tokens[:, :, p + i:p + i + 1] = nxt
            if i + 1 < max_new_tokens:
                logits = self._advance(nxt, p + i, cache, capacity, routed, routers, 1)
        roll = Rollout(tokens, torch.cat(logps, 2), *routing(routed, routers))
        return roll.map(lambda v: v[0]) if single else roll

    def _advance(self, tokens: Tensor, start: int, cache: KVCache, capacity: int, routed: list, routers: list,
                 predicting: int) -> Tensor:
        """Forward ``tokens`` [S, B, t] at positions start.. into ``cache`` (one engine step), record the routing
        of every position and the router log-probs of the last ``predicting`` ones; the logits [S, B, t, V]."""
        call = self._call()
        logits, rl, sel = self._forward(call, tokens, start, cache, capacity)
        if sel is not None:
            routed.append(sel)
            routers.append(rl[:, :, rl.shape[2] - predicting:])
        return logits

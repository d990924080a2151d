"""``KVCache``: the engine's preallocated KV cache, appended to by every forward of one rollout (a decode step,
a turn's prefill) and, between the turns of a multi-turn rollout, subject to the prefix cache's evictions
(``harness.backends.local.prefix_cache``).
"""
from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """Preallocated KV cache: per layer K and V of shape [G, B, H, T_max, hd], held in float32 (the activation
    dtype's values, exactly: the attention reads them in float32, so a decode step converts only its new position)."""

    def __init__(self):
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        self.length = 0

    def append(self, layer: int, k: Tensor, v: Tensor, start: int, capacity: int) -> tuple[Tensor, Tensor]:
        t = k.shape[-2]
        if layer == len(self.k):
            shape = (*k.shape[:-2], capacity, k.shape[-1])
            self.k.append(k.new_empty(shape, dtype=torch.float32))
            self.v.append(v.new_empty(shape, dtype=torch.float32))
        self.k[layer][..., start:start + t, :] = k
        self.v[layer][..., start:start + t, :] = v
        return self.k[layer][..., :start + t, :], self.v[layer][..., :start + t, :]

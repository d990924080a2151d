"""The inference engine's prefix cache between the turns of a multi-turn rollout: a capacity, LRU
eviction, and what a miss costs (docs/engines.md, "prefix cache and replay coverage").

While the tool runs, each row's context (prompt + turn 1) waits in the cache as one entry: its KV and
the routing recorded when that KV was computed. The cache of one seed holds

    capacity = floor(share * sum_b size_b)   tokens,   size_b = the row's context tokens (not padding)

``share`` = ``inference.prefix_cache_capacity`` (1.0: every row hits, the cache is off). A share and
not a token count, so that a setting means the same pressure whatever the policy's current turn-1
lengths are (a token count would give a coverage that drifts as the answers lengthen or shorten).

**LRU, in a synchronous batch.** A row's entry is *used* last when its turn 1 finishes (the decode
step that wrote its stop token; a row that never stops finishes at the end of the slot), and it is
inserted then; nothing reads an entry before turn 2, so the least recently used entry is the one
whose turn 1 finished first (ties: the lower row index first, the order a scheduler frees a step's
finished requests). Inserting an entry evicts least recently used ones until it fits; an entry larger
than the whole capacity is not kept. What is left when the tool returns is the latest-finishing rows
that fit: short turn-1 answers, finished early, are the first to go.

At turn 2 a **hit** resumes from the cached KV (the plain multi-turn path, bitwise). A **miss**
re-prefills the whole context in a fresh engine call (its own split-K, combine orders and noise):
its KV and, with ``replay_on_miss=recompute``, its routing replace the sampling-time ones, as in
production; with ``missing`` the routing of those positions is -1 (the training engine then routes
them with its own top-k, ``train_engine.route``). ``refill`` runs that call over *every* row and
keeps the missed rows' results: the shapes, and so the random draws, never depend on which rows
missed, so a seed's rollout is the same alone or in a seed pack.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from typing import Hashable

import torch
from torch import Tensor

REPLAY_ON_MISS = ("recompute", "missing")


class LRUCache:
    """Entries of a size (in tokens) under a token capacity, evicted least recently used first."""

    def __init__(self, capacity: int):
        self.capacity, self.used = capacity, 0
        self.entries: OrderedDict[Hashable, int] = OrderedDict()  # least recently used first
        self.evicted: list[Hashable] = []  # in eviction order

    def put(self, key: Hashable, size: int) -> list[Hashable]:
        """Insert (or refresh) ``key`` as the most recently used entry; the keys evicted to make room."""
        if key in self.entries:
            self.used -= self.entries.pop(key)
        out = []
        while self.entries and self.used + size > self.capacity:
            old, n = self.entries.popitem(last=False)
            self.used -= n
            out.append(old)
        if size <= self.capacity:
            self.entries[key] = size
            self.used += size
        else:
            out.append(key)  # larger than the whole cache: never kept
        self.evicted += out
        return out

    def get(self, key: Hashable) -> bool:
        """A hit (the entry becomes the most recently used) or a miss."""
        if key not in self.entries:
            return False
        self.entries.move_to_end(key)
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self.entries


def turn_hits(sizes: Tensor, finish: Tensor, share: float) -> Tensor:
    """Which rows' contexts are still cached when the tool returns: [S, B] bool, per seed its own cache
    of ``floor(share * sum_b sizes[s, b])`` tokens, entries inserted in (finish step, row) order."""
    if share >= 1.0:
        return torch.ones(sizes.shape, dtype=torch.bool, device=sizes.device)
    hits = torch.zeros(sizes.shape, dtype=torch.bool)
    for s, (size, done) in enumerate(zip(sizes.tolist(), finish.tolist())):
        cache = LRUCache(math.floor(share * sum(size)))
        for b in sorted(range(len(size)), key=lambda b: (done[b], b)):
            cache.put(b, size[b])
        hits[s] = torch.tensor([b in cache for b in range(len(size))])
    return hits.to(sizes.device)


def refill(engine, cache, tokens: Tensor, miss: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Re-prefill the contexts ``tokens`` [S, B, c] (positions 0..c-1, what ``cache`` holds) of the rows
    that missed (``miss`` [S, B]) in one fresh engine call, and write their K and V into ``cache`` (an
    ``inference_engine._Cache``). Returns the fresh call's selected experts [S, B, c, L, k] and router
    log-probs [S, B, c, L, E] (None for a dense model); only the missed rows' are meant to be used."""
    from harness.backends.local.inference_engine import _Cache, _Call

    c = tokens.shape[-1]
    fresh = _Cache()
    call = _Call(engine.cfg, engine.noise_gens, 1, engine.r)  # a new engine step: its own split-K, orders, noise
    _, rl, sel = engine._forward(call, tokens, 0, fresh, c)
    m = miss.view(*miss.shape, 1, 1, 1)  # [S, B, H, c, hd]
    for li in range(len(cache.k)):
        for old, new in ((cache.k[li], fresh.k[li]), (cache.v[li], fresh.v[li])):
            old[..., :c, :] = torch.where(m, new, old[..., :c, :])
    return sel, rl


def replace_routing(routed: Tensor, router_logp: Tensor | None, miss: Tensor, sel: Tensor, rl: Tensor | None,
                    mode: str) -> tuple[Tensor, Tensor | None]:
    """The routing a missed row's context positions carry after the refill: the recomputation's
    (``recompute``) or none, -1 (``missing``). ``routed`` [S, B, T, L, k] covers positions 0..T-1,
    ``sel`` [S, B, c, L, k] the refilled ones 0..c-1. ``router_logp`` (diagnostics only) takes the
    recomputation's in both modes: it is what the engine computed."""
    c = sel.shape[2]
    m = miss.view(*miss.shape, 1, 1, 1)
    new = sel if mode == "recompute" else torch.full_like(sel, -1)
    routed = routed.clone()
    routed[:, :, :c] = torch.where(m, new, routed[:, :, :c])
    if router_logp is not None and rl is not None:
        router_logp = router_logp.clone()
        router_logp[:, :, :c] = torch.where(m, rl, router_logp[:, :, :c])
    return routed, router_logp

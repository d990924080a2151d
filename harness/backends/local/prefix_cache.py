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
them with its own top-k, ``train_engine.route``). The observation is then prefilled for every row in
the one turn-2 step, hit or miss (a production engine would batch a miss's context and observation into
one prefill; here the context's recomputation is its own call, the observation's is shared). ``refill``
runs over *every* row and keeps the missed rows' results, its draws from a keyed stream of its own (``refill``,
its calls numbered apart from the engine step's other calls): the shapes and draws never depend on which rows
missed, and a refill moves no other call's numbers, so a row that hits is bitwise the full cache's row and a
seed's rollout is the same alone or in a seed pack.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Hashable

import torch
from torch import Tensor

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


@dataclass
class Refill:
    """What the cache did between the turns of one rollout: the rows that missed [S, B], and the fresh
    call's routing of the refilled positions 0..c-1 (None for a dense model)."""

    miss: Tensor
    selected: Tensor | None  # [S, B, c, L, k]
    router_logp: Tensor | None  # [S, B, c, L, E]


def between_turns(engine, cache, context: Tensor, turn1: Tensor, stop: int, pad: int) -> Refill:
    """The tool runs: every row's ``context`` [S, B, c] (positions 0..c-1: what ``cache`` holds) waits in a
    cache of ``engine.cfg.prefix_cache_capacity``; entries are sized by their tokens that are not ``pad``,
    used last at the decode step of their turn-1 stop token (``turn1`` [S, B, C], no stop: the slot's end).
    The rows that missed have their context re-prefilled (``refill``)."""
    sizes = (context != pad).sum(-1)
    stopped = turn1 == stop
    finish = torch.where(stopped.any(-1), stopped.int().argmax(-1), turn1.shape[-1] - 1)
    miss = ~turn_hits(sizes, finish, engine.cfg.prefix_cache_capacity)
    return Refill(miss, *refill(engine, cache, context, miss))


def refill(engine, cache, tokens: Tensor, miss: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """Re-prefill the contexts ``tokens`` [S, B, c] (positions 0..c-1, what ``cache`` holds) of the rows
    that missed (``miss`` [S, B]) in one fresh engine call, and write their K and V into ``cache`` (an
    ``inference.kv_cache.KVCache``). The call draws from its own stream (``refill``), so the rows that hit
    are bitwise those of a full cache. Returns the call's selected experts [S, B, c, L, k] and router
    log-probs [S, B, c, L, E] (None for a dense model); only the missed rows' are meant to be used."""
    c = tokens.shape[-1]
    fresh, rl, sel = engine.prefill(tokens, "refill")  # a new engine call: its own split-K, orders, noise
    m = miss.view(*miss.shape, 1, 1, 1)  # [S, B, H, c, hd]
    for li in range(len(cache.k)):
        for old, new in ((cache.k[li], fresh.k[li]), (cache.v[li], fresh.v[li])):
            old[..., :c, :] = torch.where(m, new, old[..., :c, :])
    return sel, rl


#: where a position's recorded (replayed) routing comes from: ``Rollout.routing_origin`` [B, T]
SAMPLED, RECOMPUTED_SAME, RECOMPUTED_OTHER, MISSING = 0, 1, 2, 3


def replay_routing(routed: Tensor, router_logp: Tensor | None, refill: "Refill | None", prompt_len: int,
                   mode: str) -> tuple[Tensor, Tensor | None, Tensor]:
    """The routing a rollout records after the cache: (routed experts [S, B, T, L, k], router log-probs
    [S, B, R, L, E], origin [S, B, T] int8). A missed row's refilled positions 0..c-1 carry the
    recomputation's experts (``recompute``: RECOMPUTED_SAME where every layer's set equals the sampling-time
    one, else RECOMPUTED_OTHER) or -1 (``missing``: MISSING); every other position is SAMPLED. The router
    log-probs (diagnostics only; positions prompt_len-1..T-2) take the recomputation's in both modes: they
    are what the engine computed."""
    origin = torch.full(routed.shape[:3], SAMPLED, dtype=torch.int8, device=routed.device)
    if refill is None or refill.selected is None or not refill.miss.any():
        return routed, router_logp, origin
    sel, c = refill.selected, refill.selected.shape[2]
    m = refill.miss[:, :, None]  # [S, B, 1]
    same = (sel.sort(-1).values == routed[:, :, :c].sort(-1).values).all(-1).all(-1)  # [S, B, c]
    if mode == "recompute":
        origin[:, :, :c] = torch.where(m, torch.where(same, RECOMPUTED_SAME, RECOMPUTED_OTHER), SAMPLED).to(origin)
    else:
        origin[:, :, :c] = torch.where(m, MISSING, SAMPLED).to(origin)
    new = sel if mode == "recompute" else torch.full_like(sel, -1)
    routed = routed.clone()
    routed[:, :, :c] = torch.where(m[..., None, None], new, routed[:, :, :c])
    if router_logp is not None and refill.router_logp is not None:
        first = prompt_len - 1  # router_logp[:, :, j] is position first + j
        router_logp = router_logp.clone()
        router_logp[:, :, :c - first] = torch.where(m[..., None, None], refill.router_logp[:, :, first:c],
                                                    router_logp[:, :, :c - first])
    return routed, router_logp, origin


def replay_coverage(tokens: Tensor, origin: Tensor, pad: int) -> tuple[Tensor, Tensor]:
    """Per seed [S]: (coverage, drift) over the positions whose routing R3 replays (every processed position,
    0..T-2, that is not ``pad``): coverage = the share replayed with their sampling-time routing (SAMPLED),
    drift = the share replayed with a recomputed routing that chose other experts in some layer."""
    counted = (tokens[..., :-1] != pad).float()
    o = origin[..., :-1]
    total = counted.flatten(1).sum(1).clamp(min=1.0)
    share = lambda k: ((o == k).float() * counted).flatten(1).sum(1) / total  # noqa: E731
    return share(SAMPLED), share(RECOMPUTED_OTHER)

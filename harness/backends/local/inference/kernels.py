"""What the engine's kernels do to the numbers: the dtypes, ``rounder`` (a value rounded to a dtype, held in
float32) and ``_Call``, independent engine calls batched along a leading axis G (the seeds of a pack times the
passes of each seed), each with its own split-K factor and its own random draws (combine orders, noise). That is
how ``score(tokens, n)`` runs the n passes of every seed of a pack as one forward over S x n x B rows.

Split-K (``batch_variance``): the float32 partial products ``q_1..q_4`` of the four K-chunks come from one batched
matmul, and every row (call) gets one of

    split 1 = round(((q_1 + q_2) + q_3) + q_4)
    split 2 = round(round(q_1 + q_2) + round(q_3 + q_4))
    split 4 = round(round(round(round(q_1) + round(q_2)) + round(q_3)) + round(q_4))

(``round``: to the activation dtype; float32 sums left to right; a sum of rounded values is a dtype add, rounded
again), selected per row by ``torch.where`` on the call's keyed split factor: no read-back to the host, no
grouping of calls. ``deterministic`` and ``batch_variance=false`` calls draw no split factor and take split 1 for
every row. A K that is not a multiple of 4 is one float32 matmul rounded once, for
every row and mode.

Keyed draws (``harness.backends.local.philox``): a call is numbered within its engine step (``call``, given by the
engine) and numbers its draws (``draw``: 0, 1, ... in the order the forward asks for them); a draw of seed s is the
Philox function of key (s, stream) and counter (step, call, draw, block), so a seed's draws are the same alone or
in any pack, and computed for all the pack's seeds in one call. Streams: ``split`` (the split-K factor), ``combine``
(the expert-combine orders), ``noise`` (router and logit noise), ``sample`` (the Gumbel draws of the token
sampled from a decoding call's logits); a call made with a ``stream`` of its own (the
prefix cache's refills: ``refill``; the diagnostics' scorings: ``score``) takes every draw from that stream.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

import torch
from torch import Tensor

from harness.backends.local import philox
from harness.spec import InferenceConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPLITS = (1, 2, 4)
CHUNKS = 4  # K-chunks of the partial products: the largest split
#: with ``host`` split-K factors, a product of at least this many rows (all groups) is computed factor by factor
#: (``_Call._mm_by_split``: its groups gathered); a smaller one selects per row (fewer operators)
GATHER_ROWS = 2048


def rounder(dtype: torch.dtype):
    """x -> x rounded to ``dtype`` and held in float32 (identity for float32)."""
    if dtype == torch.float32:
        return lambda x: x
    return lambda x: x.to(dtype).float()


class _Call:
    """Independent calls batched along a leading axis G: ``per`` calls (passes) for each of the seeds ``seeds``
    [S] (int64), group g = seed (g // per), pass (g % per). ``step`` and ``call`` are the counter words the engine
    gives this call; ``stream``: None (each kind of draw from its own stream) or one stream for every draw."""

    def __init__(self, cfg: InferenceConfig, seeds: Tensor, step: int, call: int, groups: int = 1, rnd=None,
                 stream: str | None = None, host: bool = False):
        self.cfg, self.seeds, self.step, self.call, self.stream = cfg, seeds, step, call, stream
        self.host = host  # read the split-K factors back to compute only the sums in use (a CPU: nothing to wait for)
        self._in_use: tuple[int, ...] | None = None
        self._by_split: dict[int, Tensor] | None = None
        self.per = groups
        self.groups = groups * seeds.shape[0]
        self.act = DTYPES[cfg.dtype]
        self.r = rnd or rounder(self.act)
        self.varies = cfg.batch_variance and not cfg.deterministic  # a split-K factor per group (draw 0)
        self.draws = 1 if self.varies else 0  # the next draw's number
        self.unplanned = 0  # draws made outside a ``prefetch`` (each its own Philox evaluation)
        self._ready: deque = deque()  # prefetched draws: ((kind, stream, shape, draw), [G, *shape])
        self.planned = False  # prefetched
        self._seed_of: Tensor | None = None
        self._splits: Tensor | None = None
        self._masks: dict[int, Tensor] = {}  # split -> [G, 1, 1] which groups have it

    @property
    def splits(self) -> Tensor | None:
        """[G] int64 split-K factor of each group (keyed uniforms of stream ``split``, draw 0); None: split 1 for
        every group (``deterministic`` or no ``batch_variance``)."""
        if self.varies and self._splits is None:
            u = self._take("uniform", "split", (), 0)
            idx = (u * len(SPLITS)).long().clamp(max=len(SPLITS) - 1)
            self._splits = torch.tensor(SPLITS, device=self.seeds.device)[idx]
        return self._splits

    def seed_of(self, device) -> Tensor:
        """The seed index of every group [G]."""
        if self._seed_of is None:
            self._seed_of = torch.arange(self.groups, device=device) // self.per
        return self._seed_of

    def per_group(self, w: Tensor) -> Tensor:
        """Per-seed weights [S, ...] -> one row per group [G, ...]."""
        return w if self.per == 1 else w.index_select(0, self.seed_of(w.device))

    def _spec(self, kind: str, stream: str, shape: Sequence[int], draw: int) -> tuple:
        return kind, self.stream or stream, (self.per, *shape), draw

    def prefetch(self, plan: Sequence[tuple[str, str, Sequence[int]]]) -> None:
        """Make the split-K draw (when not made yet) and the next draws ``plan`` [(kind, stream, shape)], in the
        order the forward will ask for them, in one Philox evaluation (``philox.draws``); ``uniform`` and
        ``normal`` then take them. The numbers are those of separate draws: a plan only saves operators."""
        prefetch([self], [plan])

    def _plan(self, plan: Sequence[tuple[str, str, Sequence[int]]]) -> list[tuple]:
        """The draw specs of ``prefetch(plan)`` (the split-K draw first, when not made yet); marks the call planned."""
        self.planned = True
        specs = [] if not self.varies or self._splits is not None else [self._spec("uniform", "split", (), 0)]
        return specs + [self._spec(kind, stream, shape, self.draws + i) for i, (kind, stream, shape) in enumerate(plan)]

    def _take(self, kind: str, stream: str, shape: Sequence[int], draw: int) -> Tensor:
        """Draw ``draw`` of this call, [G, *shape]: prefetched, or made now."""
        spec = self._spec(kind, stream, shape, draw)
        if self._ready and self._ready[0][0] == spec:
            out = self._ready.popleft()[1]
        else:
            self.unplanned += 1
            out = philox.draws(self.seeds, self.step, self.call, [spec])[0]
        return out.reshape(self.groups, *shape)

    def _next(self, kind: str, stream: str, shape: Sequence[int]) -> Tensor:
        """This call's next draw, [G, *shape] (the split-K draw, number 0, taken first: a plan has it first)."""
        _ = self.splits
        d, self.draws = self.draws, self.draws + 1
        return self._take(kind, stream, tuple(shape), d)

    def uniform(self, stream: str, shape: Sequence[int]) -> Tensor:
        """Keyed uniforms in (0, 1), [G, *shape] float32: this call's next draw, ``per`` rows per seed."""
        return self._next("uniform", stream, shape)

    def gumbel(self, stream: str, shape: Sequence[int]) -> Tensor:
        """Keyed Gumbel(0, 1) draws, [G, *shape] float32: this call's next draw, ``per`` rows per seed."""
        return self._next("gumbel", stream, shape)

    def normal(self, stream: str, shape: Sequence[int]) -> Tensor:
        """Keyed standard normals, [G, *shape] float32: this call's next draw, ``per`` rows per seed."""
        return self._next("normal", stream, shape)

    def mm(self, x: Tensor, w: Tensor) -> Tensor:
        """x [G, ..., K] @ w [S, K, F] (the weights of group g's seed; or [K, F], shared), in the activation
        dtype, each group with its own split-K factor (module docstring)."""
        w = w[None].expand(x.shape[0], -1, -1) if w.dim() == 2 else self.per_group(w)
        if x.shape[-1] % CHUNKS:
            return self._product(x, w)
        in_use = self.in_use()
        if len(in_use) > 1 and self.host and x.numel() // x.shape[-1] >= GATHER_ROWS:
            return self._mm_by_split(x, w)
        sums = self._split_sums(self._partials(x, w), in_use)
        out = sums[in_use[-1]]
        for split in in_use[-2::-1]:  # every split: where(split 1, s1, where(split 2, s2, s4))
            out = torch.where(self._is(split), sums[split], out)
        return out.view(*x.shape[:-1], w.shape[-1])

    def _mm_by_split(self, x: Tensor, w: Tensor) -> Tensor:
        """``mm`` grouped on the host: the groups of each split-K factor gathered, multiplied and summed under that
        factor only, and written to their rows (a group's product does not depend on the other groups': bitwise
        the per-row selection, without the sums of the factors a row does not have)."""
        x3 = x.reshape(x.shape[0], -1, x.shape[-1])
        out = x3.new_empty(x3.shape[0], x3.shape[1], w.shape[-1], dtype=self.act)
        for split, idx in self._groups().items():
            q = self._partials(x3.index_select(0, idx), w.index_select(0, idx))
            out.index_copy_(0, idx, self._split_sums(q, (split,))[split])
        return out.view(*x.shape[:-1], w.shape[-1])

    def _groups(self) -> dict[int, Tensor]:
        """{split-K factor: the groups [n] that have it}, read back on the host."""
        if self._by_split is None:
            splits = self.splits.tolist()
            self._by_split = {s: torch.tensor([g for g, f in enumerate(splits) if f == s], device=self.seeds.device)
                              for s in self.in_use()}
        return self._by_split

    def in_use(self) -> tuple[int, ...]:
        """The split-K factors whose sums ``mm`` computes: (1,) without a split draw; every one of ``SPLITS`` (the
        rows select theirs on the device, no read-back); with ``host``, only those some group has (read back
        once per call; the rows of a factor no group has are never selected, so the result is the same)."""
        if self._in_use is None:
            splits = self.splits
            if splits is None:
                self._in_use = (1,)
            else:
                self._in_use = tuple(sorted(set(splits.tolist()))) if self.host else SPLITS
        return self._in_use

    def _is(self, split: int) -> Tensor:
        """[G, 1, 1]: which groups have split-K factor ``split``."""
        if split not in self._masks:
            self._masks[split] = (self.splits == split).view(-1, 1, 1)
        return self._masks[split]

    def _product(self, x: Tensor, w: Tensor) -> Tensor:
        """x [G, ..., K] @ w [G, K, F] in one float32 matmul, rounded once to the activation dtype."""
        xs = x.float().reshape(x.shape[0], -1, x.shape[-1])
        return torch.bmm(xs, w).view(*x.shape[:-1], w.shape[-1]).to(self.act)

    @staticmethod
    def _partials(x: Tensor, w: Tensor) -> Tensor:
        """The float32 partial products [G, CHUNKS, M, F] of the CHUNKS K-chunks of x [G, ..., K] @ w [G, K, F]
        (M = the rows of x per group), from one batched matmul over G x CHUNKS."""
        g_, k, f = x.shape[0], x.shape[-1], w.shape[-1]
        c = k // CHUNKS
        xs = x.reshape(g_, -1, CHUNKS, c).transpose(1, 2)
        xs = torch.empty(xs.shape, dtype=torch.float32, device=x.device).copy_(xs)  # float32, chunk-major: one copy
        xs = xs.view(g_ * CHUNKS, -1, c)
        return torch.bmm(xs, w.reshape(g_ * CHUNKS, c, f)).view(g_, CHUNKS, -1, f)

    def _split_sums(self, q: Tensor, splits: Sequence[int]) -> dict[int, Tensor]:
        """{split: the product [G, M, F] under that split-K factor} for each of ``splits``, from the partials ``q``
        [G, CHUNKS, M, F] (module docstring; sums after the first in place, on fresh tensors only)."""
        act = self.act
        q0, q1, q2, q3 = q.unbind(1)
        out = {}
        if 4 in splits:
            r0, r1, r2, r3 = q.to(act).unbind(1)
            out[4] = (r0 + r1).add_(r2).add_(r3)
        if 1 in splits or 2 in splits:
            h = q0 + q1
            if 2 in splits:
                out[2] = h.to(act) + (q2 + q3).to(act)  # a dtype add: rounded
            if 1 in splits:
                out[1] = h.add_(q2).add_(q3).to(act)  # after split 2's use of h
        return out

    def mm_split(self, x: Tensor, w: Tensor, split: int) -> Tensor:
        """x [G, ..., K] @ w [G, K, F] (or [K, F]) with one split-K factor for every group (what ``mm`` gives a
        group of that factor)."""
        w = w[None].expand(x.shape[0], -1, -1) if w.dim() == 2 else w
        if x.shape[-1] % CHUNKS:
            return self._product(x, w)
        return self._split_sums(self._partials(x, w), (split,))[split].view(*x.shape[:-1], w.shape[-1])


def prefetch(calls: Sequence[_Call], plans: Sequence[Sequence[tuple[str, str, Sequence[int]]]]) -> None:
    """``calls[i].prefetch(plans[i])`` for calls of the same seeds and step (a rollout's, known before it starts), in
    one Philox evaluation: each draw is keyed by its own call's number, so the numbers are those of each call's own
    prefetch (or of separate draws)."""
    specs, owners = [], []
    for call, plan in zip(calls, plans):
        mine = call._plan(plan)
        specs += mine
        owners += [call] * len(mine)
    if specs:
        out = philox.draws(calls[0].seeds, calls[0].step, [c.call for c in owners], specs)
        for call, spec, drawn in zip(owners, specs, out):
            call._ready.append((spec, drawn))

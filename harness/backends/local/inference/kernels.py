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
                 stream: str | None = None):
        self.cfg, self.seeds, self.step, self.call, self.stream = cfg, seeds, step, call, stream
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
        self.planned = True
        specs = [] if not self.varies or self._splits is not None else [self._spec("uniform", "split", (), 0)]
        specs += [self._spec(kind, stream, shape, self.draws + i) for i, (kind, stream, shape) in enumerate(plan)]
        if specs:
            self._ready.extend(zip(specs, philox.draws(self.seeds, self.step, self.call, specs)))

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
        splits = self.splits
        sums = self._split_sums(self._partials(x, w), splits is not None)
        out = sums[1] if splits is None else torch.where(self._is(1), sums[1], torch.where(self._is(2), sums[2], sums[4]))
        return out.view(*x.shape[:-1], w.shape[-1])

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
        xs = x.float().reshape(g_, -1, CHUNKS, c).transpose(1, 2).reshape(g_ * CHUNKS, -1, c)
        return torch.bmm(xs, w.reshape(g_ * CHUNKS, c, f)).view(g_, CHUNKS, -1, f)

    def _split_sums(self, q: Tensor, every: bool) -> dict[int, Tensor]:
        """{split: the product [G, M, F] under that split-K factor} from the partials ``q`` [G, CHUNKS, M, F]
        (module docstring); only split 1 unless ``every``."""
        act = self.act
        q0, q1, q2, q3 = q.unbind(1)
        h = q0 + q1
        out = {1: ((h + q2) + q3).to(act)}
        if every:
            out[2] = h.to(act) + (q2 + q3).to(act)  # a dtype add: rounded
            r0, r1, r2, r3 = q.to(act).unbind(1)
            out[4] = ((r0 + r1) + r2) + r3
        return out

    def mm_split(self, x: Tensor, w: Tensor, split: int) -> Tensor:
        """x [G, ..., K] @ w [G, K, F] (or [K, F]) with one split-K factor for every group (what ``mm`` gives a
        group of that factor)."""
        w = w[None].expand(x.shape[0], -1, -1) if w.dim() == 2 else w
        if x.shape[-1] % CHUNKS:
            return self._product(x, w)
        return self._split_sums(self._partials(x, w), True)[split].view(*x.shape[:-1], w.shape[-1])

"""What the engine's kernels do to the numbers: the dtypes, ``rounder`` (a value rounded to a dtype, held in
float32) and ``_Call``, independent engine calls batched along a leading axis G, each with its own split-K factor
(``batch_variance``: ``y = round(...round(round(P_1) + round(P_2))... + round(P_s))`` with ``P_i`` the partial
product over the i-th K-chunk, s in ``SPLITS``) and its own random draws (combine orders, noise). That is how
``score(tokens, n)`` runs its n passes as one forward over n x B rows.
"""
from __future__ import annotations

import torch
from torch import Tensor

from harness.spec import InferenceConfig

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SPLITS = (1, 2, 4)


def rounder(dtype: torch.dtype):
    """x -> x rounded to ``dtype`` and held in float32 (identity for float32)."""
    if dtype == torch.float32:
        return lambda x: x
    return lambda x: x.to(dtype).float()


class _Call:
    """Per-call randomness of independent calls batched along a leading axis G: ``per`` calls for
    each generator (one generator per seed of a pack), group g = seed (g // per), pass (g % per).
    Every draw is made per generator in seed order, each seed exactly as if it ran alone: the
    split-K factor of each call, then combine orders and noise as the forward asks for them."""

    def __init__(self, cfg: InferenceConfig, gen: "torch.Generator | list[torch.Generator]", groups: int = 1,
                 rnd=None):
        gens = gen if isinstance(gen, (list, tuple)) else [gen]
        self.cfg, self.gens, self.per = cfg, list(gens), groups
        self.groups = groups * len(self.gens)
        self.act = DTYPES[cfg.dtype]
        self.r = rnd or rounder(self.act)
        splits = [1] * self.groups
        if cfg.batch_variance and not cfg.deterministic:
            idx = [i for g in self.gens for i in torch.randint(len(SPLITS), (groups,), generator=g, device=g.device).tolist()]
            splits = [SPLITS[i] for i in idx]
        self.splits = splits
        self.by_split = {s: [g for g in range(self.groups) if splits[g] == s] for s in sorted(set(splits))}
        self._seed_of: Tensor | None = None

    @property
    def gen(self) -> torch.Generator:
        return self.gens[0]

    def seed_of(self, device) -> Tensor:
        """The seed index of every group [G]."""
        if self._seed_of is None:
            self._seed_of = torch.arange(self.groups, device=device) // self.per
        return self._seed_of

    def per_group(self, w: Tensor, groups: list[int] | None = None) -> Tensor:
        """Per-seed weights [S, ...] -> one row per group [G, ...] (or per listed group)."""
        if groups is None:
            return w if self.per == 1 else w.index_select(0, self.seed_of(w.device))
        if self.per == 1 and len(groups) == w.shape[0]:
            return w
        return w.index_select(0, self.seed_of(w.device)[torch.tensor(groups, device=w.device)])

    def draw(self, kind: str, shape: tuple[int, ...], device) -> Tensor:
        """rand/randn of shape [G, *shape]: ``per`` rows from each seed's generator, in seed order."""
        fn = torch.rand if kind == "rand" else torch.randn
        parts = [fn((self.per, *shape), generator=g, device=device) for g in self.gens]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def mm(self, x: Tensor, w: Tensor) -> Tensor:
        """x [G, ..., K] @ w [S, K, F] (the weights of group g's seed; or [K, F]), each call g with its own
        split-K factor."""
        shared = w.dim() == 2  # [K, F]: the same weights for every group
        if len(self.by_split) == 1:
            return self._mm(x, w if shared else self.per_group(w), self.splits[0])
        out = x.new_empty(*x.shape[:-1], w.shape[-1], dtype=self.act)
        for s, groups in self.by_split.items():
            idx = torch.tensor(groups, device=x.device)
            out[idx] = self._mm(x[idx], w if shared else self.per_group(w, groups), s)
        return out

    def _mm(self, x: Tensor, w: Tensor, split: int) -> Tensor:
        """x [G, ..., K] @ w [G, K, F] (w [K, F]: shared), split-K partial products rounded to dtype."""
        act, k = self.act, x.shape[-1]
        if w.dim() == 2:
            w = w[None].expand(x.shape[0], -1, -1)
        x32 = x.float()

        def part(a: int, b: int) -> Tensor:  # float32 accumulation, rounded once to the activation dtype
            xs = x32[..., a:b].reshape(x.shape[0], -1, b - a)
            return torch.bmm(xs, w[:, a:b]).view(*x.shape[:-1], w.shape[-1]).to(act)

        if split == 1 or k % split:
            return part(0, k)
        c = k // split
        out = part(0, c)
        for i in range(1, split):
            out = out + part(i * c, (i + 1) * c)  # a dtype add: rounded each time
        return out

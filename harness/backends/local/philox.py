"""Keyed random numbers: Philox4x32-10 in tensor ops, for every seed of a pack in one call (issue 29, item 1).

Every draw is a pure function of its key and counter, not of a generator's state:

    key     = (seed, stream)                       two 32-bit words: the run's seed, the kind of draw
    counter = (step, call, draw, block)            four 32-bit words: the training step, the engine call within the
                                                   step, the draw within the call, and the block of four words
                                                   (element i of a draw is word i % 4 of block i // 4)

so a seed's draws are the same alone or in any pack (its rows of a batched call are computed from its own key only),
on any device, and a resumed run needs only its step counter. Philox4x32-10 is Salmon, Moraes, Dror & Shaw,
"Parallel random numbers: as easy as 1, 2, 3" (SC 2011), the generator of cuRAND and of JAX; ``philox4x32`` matches
the reference implementation's published known-answer vectors (Random123's ``kat_vectors``;
``tests/backends/local/test_philox.py``) and passes uniformity and independence tests there.

Arithmetic: 32-bit words are held in int64 tensors (values in [0, 2**32)); the 32 x 32 -> 64-bit products Philox
needs are formed from 16-bit halves so that no intermediate exceeds 2**63 (torch has no uint64 multiply on every
device). Each call is a fixed sequence of about 150 tensor operators whatever the number of seeds or elements.
The inference engine draws every random number here (local numerics version 4: ``harness.backends.local.inference``);
the trainer's own draws (prompts, minibatch shuffles) still come from one ``torch.Generator`` per seed and stream.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10
#: the streams of draws a run makes (the key's second word): one per kind, so that kinds never share numbers
STREAMS = {"sample": 1, "noise": 2, "combine": 3, "split": 4, "shuffle": 5, "score": 6, "refill": 7, "data": 8,
           "test": 99}


def _mulhilo(a: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """``(hi, lo)`` 32-bit words of the 64-bit product ``a * m`` (``a`` in [0, 2**32), ``m`` a 32-bit constant)."""
    m_hi, m_lo = m >> 16, m & 0xFFFF
    p_lo = a * m_lo  # < 2**48
    p_hi = a * m_hi  # < 2**48; a * m = p_hi * 2**16 + p_lo
    t = (p_hi & 0xFFFF) * 65536 + p_lo  # < 2**49
    return (p_hi >> 16) + (t >> 32), t & MASK32


def philox4x32(counter: Tensor, key: Tensor, rounds: int = ROUNDS) -> Tensor:
    """Philox4x32-``rounds`` of ``counter`` [..., 4] under ``key`` [..., 2] (int64 tensors of 32-bit words,
    broadcast against each other): four random 32-bit words per counter, [..., 4]. The round keys are formed
    once for all rounds (key + r * Weyl increment, mod 2**32)."""
    c0, c1, c2, c3 = (counter[..., i] for i in range(4))
    r = torch.arange(rounds, dtype=torch.int64, device=key.device)
    k0s = ((key[..., 0:1] + r * _W0) & MASK32).unbind(-1)
    k1s = ((key[..., 1:2] + r * _W1) & MASK32).unbind(-1)
    for k0, k1 in zip(k0s, k1s):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack(torch.broadcast_tensors(c0, c1, c2, c3), dim=-1)


def _counters(seeds: Tensor, stream: str, step: "int | Tensor", call: int, blocks: int, draw: int) -> tuple[Tensor, Tensor]:
    """The counters [S, blocks, 4] (step, call, draw, 0..blocks-1) and keys [S, blocks, 2] (seed, stream) of one
    draw of ``blocks`` blocks per seed."""
    device = seeds.device
    if blocks > MASK32:
        raise ValueError(f"a draw of {4 * blocks} words exceeds the counter's block word (<= {4 * MASK32})")
    block = torch.arange(blocks, device=device, dtype=torch.int64).expand(seeds.shape[0], blocks)
    step_t = torch.as_tensor(step, dtype=torch.int64, device=device).reshape(-1, 1).expand(seeds.shape[0], blocks)
    counter = torch.stack([step_t & MASK32, torch.full_like(block, call & MASK32), torch.full_like(block, draw & MASK32),
                           block], dim=-1)  # [S, blocks, 4]
    key = torch.stack([seeds & MASK32, torch.full_like(seeds, STREAMS[stream])], dim=-1)[:, None, :]  # [S, 1, 2]
    return counter, key.expand(seeds.shape[0], blocks, 2)


def bits(seeds: Tensor, stream: str, step: int | Tensor, call: int, n: int, draw: int = 0) -> Tensor:
    """``n`` random 32-bit words per seed, [S, n] int64: the words of key (seed, stream) at counters
    (step, call, draw, 0..ceil(n/4)-1). ``seeds`` [S] int64; ``step`` an int or a per-seed [S] tensor."""
    blocks = (n + 3) // 4
    counter, key = _counters(seeds, stream, step, call, blocks, draw)
    return philox4x32(counter, key).reshape(seeds.shape[0], blocks * 4)[:, :n]


#: 32-bit words per number of each kind of draw (``draws``)
WORDS = {"uniform": 1, "uniform64": 2, "normal": 1, "gumbel": 2}


def _words(kind: str, n: int) -> int:
    return 2 * ((n + 1) // 2) if kind == "normal" else WORDS[kind] * n  # normals come in Box-Muller pairs


def _uniform32(w: Tensor) -> Tensor:
    """float32 uniforms in (0, 1) from words: the top 24 bits, offset by half a unit."""
    return ((w >> 8).to(torch.float32) + 0.5) * 2.0 ** -24


def _uniform64(w: Tensor) -> Tensor:
    """float64 uniforms in (0, 1) from word pairs [..., 2]: 27 + 26 = 53 bits, offset by half a unit."""
    k = (w[..., 0] >> 6) * 134217728 + (w[..., 1] >> 5)
    return (k.to(torch.float64) + 0.5) * 2.0 ** -53


def _convert(kind: str, w: Tensor, n: int) -> Tensor:
    """The ``n`` numbers [S, n] of a kind from its words [S, _words(kind, n)]."""
    s_ = w.shape[0]
    if kind == "uniform":
        return _uniform32(w)
    if kind == "normal":  # Box-Muller on float32 uniform pairs, both outputs: |z| <= sqrt(-2 ln 2**-25) = 5.9
        u = _uniform32(w).view(s_, -1, 2).double()
        r, theta = torch.sqrt(-2.0 * torch.log(u[..., 0])), (2.0 * math.pi) * u[..., 1]
        return torch.stack([r * torch.cos(theta), r * torch.sin(theta)], -1).view(s_, -1)[:, :n].to(torch.float32)
    u = _uniform64(w.view(s_, n, 2))
    return u if kind == "uniform64" else -torch.log(-torch.log(u)).to(torch.float32)


def draws(seeds: Tensor, step: int | Tensor, call: int, specs: Sequence[tuple[str, str, Sequence[int], int]]
          ) -> list[Tensor]:
    """Several draws of one call in one Philox evaluation: ``specs`` (kind, stream, shape, draw), kind in
    ``WORDS`` (``uniform``: float32, ``uniform64``, ``normal``: float32, ``gumbel``: float32), -> one [S, *shape]
    tensor per spec, bitwise what ``uniform``/``normal``/``gumbel`` give for the same arguments."""
    sizes = [(math.prod(shape), _words(kind, math.prod(shape))) for kind, _, shape, _ in specs]
    blocks = [(w + 3) // 4 for _, w in sizes]
    parts = [_counters(seeds, stream, step, call, nb, draw) for (_, stream, _, draw), nb in zip(specs, blocks)]
    counter = parts[0][0] if len(parts) == 1 else torch.cat([c for c, _ in parts], 1)
    key = parts[0][1] if len(parts) == 1 else torch.cat([k for _, k in parts], 1)
    words = philox4x32(counter, key).reshape(seeds.shape[0], -1)
    out, at = [], 0
    for (kind, _, shape, _), (n, w), nb in zip(specs, sizes, blocks):
        out.append(_convert(kind, words[:, at:at + w], n).reshape(seeds.shape[0], *shape))
        at += 4 * nb
    return out


def uniform(seeds: Tensor, stream: str, step: int | Tensor, call: int, shape: Sequence[int],
            dtype: torch.dtype = torch.float32, draw: int = 0) -> Tensor:
    """Uniform draws in (0, 1), [S, *shape]: the top 24 bits of a word (float32) or 53 bits of two (float64),
    offset by half a unit so that neither 0 nor 1 occurs (a log or an inverse CDF of them is finite)."""
    kind = "uniform64" if dtype == torch.float64 else "uniform"
    return draws(seeds, step, call, [(kind, stream, shape, draw)])[0].to(dtype)


def normal(seeds: Tensor, stream: str, step: int | Tensor, call: int, shape: Sequence[int],
           dtype: torch.dtype = torch.float32, draw: int = 0) -> Tensor:
    """Standard normal draws, [S, *shape], by Box-Muller on pairs of float32 keyed uniforms (both outputs of a pair
    used; computed in float64, then cast): |z| <= 5.9, a tail of probability 4e-9 cut off."""
    return draws(seeds, step, call, [("normal", stream, shape, draw)])[0].to(dtype)


def gumbel(seeds: Tensor, stream: str, step: int | Tensor, call: int, shape: Sequence[int], draw: int = 0) -> Tensor:
    """Gumbel(0, 1) draws, [S, *shape] float32: ``argmax(logits + gumbel)`` samples the softmax of ``logits``."""
    return draws(seeds, step, call, [("gumbel", stream, shape, draw)])[0]


def permutation(seeds: Tensor, stream: str, step: int | Tensor, call: int, n: int, draw: int = 0) -> Tensor:
    """A uniformly random permutation of ``range(n)`` per seed, [S, n] int64: the argsort of 53-bit keyed uniforms
    (ties have probability ~ n**2 / 2**54, and break by position, as ``torch.argsort(stable=True)`` does)."""
    return torch.argsort(uniform(seeds, stream, step, call, (n,), torch.float64, draw), dim=-1, stable=True)


class KeyedInts:
    """A task's source of random integers for every seed of a pack at once (``harness.tasks.base.randint``): the
    rows of a draw are seed-major, ``rows / S`` per seed, each seed's from its own key (seed, ``stream``) at
    (``step``, ``call``, its n-th draw), so a seed's prompts are the same alone or in any pack."""

    def __init__(self, seeds: Tensor, stream: str, step: int, call: int = 0):
        self.seeds, self.stream, self.step, self.call, self.n = seeds, stream, step, call, 0

    def randint(self, low: int, high: int, shape: Sequence[int]) -> Tensor:
        """Integers in [low, high) of ``shape`` (rows seed-major): floor of a 53-bit uniform times the range."""
        size = self.seeds.shape[0]
        if shape[0] % size:
            raise ValueError(f"{shape[0]} rows do not split over a pack of {size} seeds")
        u = uniform(self.seeds, self.stream, self.step, self.call, (shape[0] // size, *shape[1:]), torch.float64,
                    self.n)
        self.n += 1
        return (low + (u * (high - low)).floor().to(torch.int64)).reshape(*shape)

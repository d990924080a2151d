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

Arithmetic: 32-bit words are held in int64 tensors (values in [0, 2**32)). A 32 x 32 -> 64-bit product is one
int64 multiply: it wraps modulo 2**64 (two's complement, on every device), which keeps the low word exact and the
high word in bits 32..63 (an arithmetic shift and a mask read it; ``_rounds`` masks once per round, after the
xors). The counter words shared by a whole draw (step, call, draw number) and the key's stream word stay Python
ints or small tensors, so the first rounds run mostly on scalars; the layout of a call's draws is built on the host
and cached. Each evaluation is a fixed sequence of about 110 tensor operators (and a few per draw to convert its
words) whatever the number of seeds or elements, and several calls' draws can share one (``draws`` with a call per
spec: a rollout's).
Every random number of the local backend is drawn here (local numerics version 4): the inference engine's
(``harness.backends.local.inference``) and the trainer's (prompts: ``KeyedInts``, minibatch shuffles:
``permutation``).
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
_W0, _W1 = 0x9E3779B9, 0xBB67AE85  # Weyl key increments (golden ratio, sqrt(3) - 1)
ROUNDS = 10
#: the streams of draws a run makes (the key's second word): one per kind, so that kinds never share numbers
STREAMS = {"sample": 1, "noise": 2, "combine": 3, "split": 4, "shuffle": 5, "score": 6, "refill": 7, "data": 8,
           "test": 99}


def _mulhilo(a: "int | Tensor", m: int) -> tuple["int | Tensor", "int | Tensor"]:
    """``(hi, lo)`` 32-bit words of the 64-bit product ``a * m`` (``a`` in [0, 2**32), ``m`` a 32-bit constant). A
    Python int gives both exactly. A tensor gives them in their low 32 bits only: its int64 product wraps modulo
    2**64 and the arithmetic shift keeps the high word in the low 32 bits, with the sign above; ``_rounds`` masks."""
    p = a * m
    if isinstance(p, int):
        return p >> 32, p & MASK32
    return p >> 32, p


def _xor3(a: "int | Tensor", b: "int | Tensor", c: "int | Tensor") -> "int | Tensor":
    """``(a ^ b ^ c) & MASK32``, the Python ints combined first (one scalar operand for the tensors)."""
    ints = [x for x in (a, b, c) if isinstance(x, int)]
    out = None
    for x in (a, b, c):
        if not isinstance(x, int):
            out = x if out is None else out ^ x
    s = 0
    for x in ints:
        s ^= x
    if out is None:
        return s & MASK32
    return (out ^ s if len(ints) else out) & MASK32


def _schedule(k: "int | Tensor", weyl: int, rounds: int) -> list:
    """The round keys k + r * weyl (mod 2**32), r = 0..rounds-1, of a key word (an int, or a tensor: one
    evaluation for every round)."""
    if isinstance(k, int):
        return [(k + r * weyl) & MASK32 for r in range(rounds)]
    r = torch.arange(rounds, dtype=torch.int64, device=k.device)
    return list(((k[..., None] + r * weyl) & MASK32).unbind(-1))


def _rounds(c: list, k0: "int | Tensor", k1: "int | Tensor", rounds: int) -> list:
    """Philox4x32-``rounds`` of the counter words ``c`` (four) under the key words k0, k1: each word a Python int
    or an int64 tensor of 32-bit values, broadcast against each other, so that a word shared by many counters
    (the step, the call, a draw's number) stays a scalar and the first rounds run on small tensors. The four
    output words: every value in [0, 2**32), bitwise the reference's (a wrapped tensor word's junk above bit 31
    only ever reaches a xor before the mask)."""
    c0, c1, c2, c3 = c
    for k0r, k1r in zip(_schedule(k0, _W0, rounds), _schedule(k1, _W1, rounds)):
        hi0, lo0 = _mulhilo(c0, _M0)
        hi1, lo1 = _mulhilo(c2, _M1)
        c0, c1, c2, c3 = _xor3(hi1, c1, k0r), lo1, _xor3(hi0, c3, k1r), lo0
    return [c0, c1 & MASK32, c2, c3 & MASK32]


def _stack(words: list, device: torch.device) -> Tensor:
    """Four output words (ints or tensors) -> one int64 tensor [..., 4]."""
    t = [torch.as_tensor(w, dtype=torch.int64, device=device) for w in words]
    return torch.stack(torch.broadcast_tensors(*t), dim=-1)


def philox4x32(counter: Tensor, key: Tensor, rounds: int = ROUNDS) -> Tensor:
    """Philox4x32-``rounds`` of ``counter`` [..., 4] under ``key`` [..., 2] (int64 tensors of 32-bit words,
    broadcast against each other): four random 32-bit words per counter, [..., 4]."""
    return _stack(_rounds(list(counter.unbind(-1)), key[..., 0], key[..., 1], rounds), counter.device)


@functools.lru_cache(maxsize=256)
def _layout(parts: tuple) -> tuple:
    """The counter and key words that vary along the blocks of draws ``parts`` ((blocks, call, draw, stream id),
    ...) laid end to end: (call word, draw word, block word, stream key word), each an int when it is the same for
    every block, else a host array [blocks in all] (cached: a call's plan repeats every step)."""
    for blocks, _, _, _ in parts:
        if blocks > MASK32:
            raise ValueError(f"a draw of {4 * blocks} words exceeds the counter's block word (<= {4 * MASK32})")
    counts = [p[0] for p in parts]

    def word(i: int) -> "int | np.ndarray":
        values = {p[i] & MASK32 for p in parts}
        if len(values) == 1:
            return values.pop()
        return np.repeat(np.array([p[i] & MASK32 for p in parts], dtype=np.int64), counts)

    return word(1), word(2), np.concatenate([np.arange(nb, dtype=np.int64) for nb in counts]), word(3)


def _keyed_words(seeds: Tensor, step: "int | Tensor", parts: Sequence[tuple[int, int, int, str]]) -> Tensor:
    """The words [S, 4 x blocks in all] of draws ``parts`` ((blocks, call, draw, stream), ...) laid end to end: for
    each seed, the Philox words of key (seed, stream) at counters (step, call, draw, 0..blocks-1)."""
    device = seeds.device
    call, draw, block, stream = (w if isinstance(w, int) else torch.from_numpy(w).to(device)  # read only
                                 for w in _layout(tuple((nb, c, d, STREAMS[st]) for nb, c, d, st in parts)))
    c0 = step & MASK32 if isinstance(step, int) else (torch.as_tensor(step, device=device) & MASK32).reshape(-1, 1)
    words = _rounds([c0, call, draw, block], (seeds & MASK32)[:, None], stream, ROUNDS)
    return _stack(words, device).expand(seeds.shape[0], block.shape[0], 4).reshape(seeds.shape[0], -1)


def bits(seeds: Tensor, stream: str, step: int | Tensor, call: int, n: int, draw: int = 0) -> Tensor:
    """``n`` random 32-bit words per seed, [S, n] int64: the words of key (seed, stream) at counters
    (step, call, draw, 0..ceil(n/4)-1). ``seeds`` [S] int64; ``step`` an int or a per-seed [S] tensor."""
    return _keyed_words(seeds, step, [((n + 3) // 4, call, draw, stream)])[:, :n]


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


def draws(seeds: Tensor, step: int | Tensor, call: "int | Sequence[int]",
          specs: Sequence[tuple[str, str, Sequence[int], int]]) -> list[Tensor]:
    """Several draws in one Philox evaluation: ``specs`` (kind, stream, shape, draw), kind in ``WORDS``
    (``uniform``: float32, ``uniform64``, ``normal``: float32, ``gumbel``: float32), of one ``call`` (or of the
    calls ``call[i]``, one per spec), -> one [S, *shape] tensor per spec, bitwise what ``uniform``/``normal``/
    ``gumbel`` give for the same arguments."""
    calls = [call] * len(specs) if isinstance(call, int) else list(call)
    sizes = [(math.prod(shape), _words(kind, math.prod(shape))) for kind, _, shape, _ in specs]
    blocks = [(w + 3) // 4 for _, w in sizes]
    words = _keyed_words(seeds, step, [(nb, c, draw, stream)
                                       for (_, stream, _, draw), nb, c in zip(specs, blocks, calls)])
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

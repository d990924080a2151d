"""``lookup``: a multi-turn tool-use task (local backend only): call a lookup tool, then answer from its output.

Layout (``length`` = L digits; P = L + 2, response R = C + O + A = (L + 1) + L + (L + 1)):

    prompt       BOS d1 .. dL =
    turn 1       the call: the prompt's small digits (d < 5) in prompt order, then CALL_END   (policy; slot C)
    observation  f(x) = (3 x + 7) mod 10 of each digit x of the call, in order               (environment; slot O)
    turn 2       the answer: the observed values sorted ascending, then EOS                   (policy; slot A)

each slot right-padded with PAD, so lengths vary with the number of small digits (0..L). The environment answers
whatever call the policy wrote: the digit tokens before its first CALL_END (others skipped, at most O); the
reference answer is that of the right call. Reward: the answer slot only (:func:`harness.tasks.base.eos_reward`).
"""
from __future__ import annotations

from harness.tasks import register
from harness.tasks.base import TaskSpec, Tool, eos_reward, randint
from harness.tasks.vocab import BOS, CALL_END, EOS, EQUALS, PAD

SMALL = 5  # the call asks for the digits d < SMALL


def lookup(x):
    """The tool's table: f(x) = (3 x + 7) mod 10, a permutation of the digits."""
    return (3 * x + 7) % 10


def compact(values, keep, width: int, end: int | None = None):
    """Per row: the ``values`` where ``keep``, moved left in order, then ``end`` (when given and room is
    left), then PAD, cut to ``width`` columns."""
    import torch

    order = (~keep).to(torch.int8).argsort(dim=-1, stable=True)
    out = values.gather(-1, order)
    count = keep.sum(-1, keepdim=True)
    col = torch.arange(out.shape[-1], device=out.device)
    out = torch.where(col < count, out, PAD)
    if out.shape[-1] < width:
        out = torch.cat([out, out.new_full((out.shape[0], width - out.shape[-1]), PAD)], -1)
    out = out[:, :width].clone()
    if end is not None:
        rows = (count[:, 0] < width).nonzero()[:, 0]
        out[rows, count[rows, 0]] = end
    return out


def call(prompts):
    """The right call [n, L + 1]: the small digits of the prompt, CALL_END, PAD."""
    d = prompts[:, 1:-1]
    return compact(d, d < SMALL, d.shape[1] + 1, CALL_END)


def observe(prompts, calls):
    """The observation [n, L] of any call [n, C]: f of its digit tokens before the first CALL_END."""
    before = (calls == CALL_END).cumsum(-1) == 0
    keep = before & (calls < 10)
    return compact(lookup(calls.clamp(max=9)), keep, prompts.shape[1] - 2)


def sample(n: int, length: int, gen):
    """n prompts [n, L + 2] and the reference answers [n, L + 1]: sorted f(small digits), EOS, PAD."""
    import torch

    d = randint(gen, 0, 10, (n, length))
    small = d < SMALL
    values = torch.where(small, lookup(d), 10).sort(-1).values  # the others sort last and are dropped
    return torch.cat([torch.full((n, 1), BOS), d, torch.full((n, 1), EQUALS)], 1), compact(values, small.sort(
        -1, descending=True).values, length + 1, EOS)


SPEC = register(TaskSpec(
    name="lookup", backends=("local",), summary="call a lookup tool on the small digits, answer its sorted values",
    default_length=4, prompt_len=lambda length: length + 2, answer_len=lambda length: length + 1, sample=sample,
    reward=eos_reward, tool=Tool(call_len=lambda length: length + 1, obs_len=lambda length: length, call=call,
                                 observe=observe)))

"""``sort``: the L digits in ascending order.

local: ``BOS d1 .. dL =`` -> ``sorted(d)`` (P = L + 2, R = L); verl: the same digits as a text prompt, the
answer the sorted digits separated by spaces after ``####``. Reward: :func:`harness.tasks.base.digit_reward`.
"""
from __future__ import annotations

from harness.tasks import register
from harness.tasks.base import INSTRUCTION, TaskSpec, digit_reward, digit_text_reward, digits, randint
from harness.tasks.vocab import BOS, EQUALS


def sample(n: int, length: int, gen):
    """n prompts [n, L + 2] and their sorted digits [n, L]."""
    import torch

    d = randint(gen, 0, 10, (n, length))
    return torch.cat([torch.full((n, 1), BOS), d, torch.full((n, 1), EQUALS)], 1), d.sort(-1).values


def text(ds: list[int]) -> tuple[str, str]:
    """(prompt, reference) of the example ``ds``."""
    q = (f"Sort these {len(ds)} digits in ascending order: {digits(ds)}. "
         f"Write the sorted digits separated by spaces. {INSTRUCTION}")
    return q, digits(sorted(ds))


def example(rng, length: int) -> tuple[str, str]:
    return text([rng.randrange(10) for _ in range(length)])


SPEC = register(TaskSpec(
    name="sort", backends=("local", "verl"), summary="sort L digits ascending", default_length=5,
    prompt_len=lambda length: length + 2, answer_len=lambda length: length, sample=sample, reward=digit_reward,
    example=example, text_reward=digit_text_reward))

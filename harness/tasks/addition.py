"""``addition``: the L + 1 digits of a + b, least significant first (a, b: L digits each).

local: ``BOS a1..aL + b1..bL =`` -> the digits of a + b (P = 2L + 3, R = L + 1); verl: the same numbers as a
text prompt, the answer digits separated by spaces after ``####``.
Reward: :func:`harness.tasks.base.digit_reward`.
"""
from __future__ import annotations

from harness.tasks import register
from harness.tasks.base import INSTRUCTION, TaskSpec, digit_reward, digit_text_reward, digits, randint
from harness.tasks.vocab import BOS, EQUALS, PLUS


def sample(n: int, length: int, gen):
    """n prompts [n, 2L + 3] and the digits of a + b, least significant first [n, L + 1]:
    a = sum_i a_i 10^(L-1-i), answer_j = floor((a + b) / 10^j) mod 10."""
    import torch

    a = randint(gen, 0, 10, (n, length))
    b = randint(gen, 0, 10, (n, length))
    place = 10 ** torch.arange(length - 1, -1, -1)
    total = (a * place).sum(-1) + (b * place).sum(-1)
    answer = torch.stack([(total // 10**i) % 10 for i in range(length + 1)], 1)
    prompt = [torch.full((n, 1), BOS), a, torch.full((n, 1), PLUS), b, torch.full((n, 1), EQUALS)]
    return torch.cat(prompt, 1), answer


def text(a: list[int], b: list[int]) -> tuple[str, str]:
    """(prompt, reference) of the example a + b (digits, most significant first)."""
    length = len(a)
    total = int("".join(map(str, a))) + int("".join(map(str, b)))
    answer = [(total // 10**i) % 10 for i in range(length + 1)]
    q = (f"Add {''.join(map(str, a))} and {''.join(map(str, b))}. Write the {length + 1} digits of the sum from the "
         f"least significant to the most significant (pad with a leading zero), separated by spaces. {INSTRUCTION}")
    return q, digits(answer)


def example(rng, length: int) -> tuple[str, str]:
    return text([rng.randrange(10) for _ in range(length)], [rng.randrange(10) for _ in range(length)])


SPEC = register(TaskSpec(
    name="addition", backends=("local", "verl"), summary="add two L-digit numbers", default_length=3,
    prompt_len=lambda length: 2 * length + 3, answer_len=lambda length: length + 1, sample=sample,
    reward=digit_reward, example=example, text_reward=digit_text_reward))

"""Generated, verifiable tasks: prompts, reference answers and reward functions.

``sort``:     BOS d1 .. dL =   ->  the L digits in ascending order
``addition``: BOS a1..aL + b1..bL =  ->  the L+1 digits of a+b, least significant first

Reward ``partial``: the share of answer positions that are right; ``exact``: 1 if all are.
``reward/accuracy`` is always the exact-match rate. Prompts come from a seeded generator.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from harness.backends.local.model import BOS, EQUALS, PLUS
from harness.config import TaskConfig


@dataclass
class Task:
    cfg: TaskConfig

    @property
    def prompt_len(self) -> int:
        return self.cfg.length + 2 if self.cfg.name == "sort" else 2 * self.cfg.length + 3

    @property
    def answer_len(self) -> int:
        return self.cfg.length if self.cfg.name == "sort" else self.cfg.length + 1

    def sample(self, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """n prompts [n, P] and their reference answers [n, R]."""
        L = self.cfg.length
        bos = torch.full((n, 1), BOS)
        eq = torch.full((n, 1), EQUALS)
        if self.cfg.name == "sort":
            digits = torch.randint(0, 10, (n, L), generator=gen)
            return torch.cat([bos, digits, eq], 1), digits.sort(-1).values
        a = torch.randint(0, 10, (n, L), generator=gen)
        b = torch.randint(0, 10, (n, L), generator=gen)
        place = 10 ** torch.arange(L - 1, -1, -1)
        total = (a * place).sum(-1) + (b * place).sum(-1)
        answer = torch.stack([(total // 10**i) % 10 for i in range(L + 1)], 1)  # least significant first
        return torch.cat([bos, a, torch.full((n, 1), PLUS), b, eq], 1), answer

    def reward(self, responses: Tensor, answers: Tensor) -> tuple[Tensor, Tensor]:
        """(reward [B], exact-match [B]) for responses [B, R]."""
        right = (responses == answers).float()
        exact = right.min(-1).values
        return (right.mean(-1) if self.cfg.reward == "partial" else exact), exact

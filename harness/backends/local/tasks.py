"""A task as the local backend runs it: the registered task (``harness.tasks``) bound to its config.

Prompts and answers are token ids of ``harness.backends.local.model``'s vocabulary, drawn from a seeded
generator; ``reward`` returns (reward, exact match) per response. ``reward/accuracy`` is always the
exact-match rate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness import tasks
from harness.config import TaskConfig
from harness.tasks.base import TaskSpec


@dataclass
class Task:
    cfg: TaskConfig
    spec: TaskSpec = field(init=False)

    def __post_init__(self):
        self.spec = tasks.get(self.cfg.name)
        if "local" not in self.spec.backends:
            raise ValueError(f"task {self.cfg.name!r} cannot run on the local backend; local tasks: "
                             f"{', '.join(tasks.names('local'))}")

    @property
    def prompt_len(self) -> int:
        return self.spec.prompt_len(self.cfg.length)

    @property
    def answer_len(self) -> int:
        return self.spec.answer_len(self.cfg.length)

    def sample(self, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """n prompts [n, P] and their reference answers [n, R]."""
        return self.spec.sample(n, self.cfg.length, gen)

    def reward(self, responses: Tensor, answers: Tensor) -> tuple[Tensor, Tensor]:
        """(reward [B], exact-match [B]) for responses [B, R]."""
        return self.spec.reward(responses, answers, self.cfg.reward)

"""A task as the local backend runs it: the registered task (``harness.tasks``) bound to its config.

Prompts and answers are token ids of ``harness.backends.local.model``'s vocabulary, drawn from a seeded
generator; ``reward`` returns (reward, exact match) per response. ``reward/accuracy`` is always the
exact-match rate.

A multi-turn task (``spec.tool`` set) has the response ``call (C) | observation (O) | answer (A)``:
``rollout`` runs the inference engine's ``generate_turns``, ``final`` is the answer slot the reward reads, and
``teacher`` the reference response with its loss targets (-100 on observation and padding) for the warm start.
A single-turn task's response is its answer (R = A) and every token is a target.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness import tasks
from harness.spec import TaskConfig
from harness.tasks.base import TaskSpec
from harness.tasks.vocab import CALL_END, EOS


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

    @property
    def multi_turn(self) -> bool:
        return self.spec.tool is not None

    @property
    def response_len(self) -> int:
        """R: the whole response (call + observation + answer slots for a multi-turn task)."""
        if not self.multi_turn:
            return self.answer_len
        return self.spec.tool.call_len(self.cfg.length) + self.spec.tool.obs_len(self.cfg.length) + self.answer_len

    def rollout(self, engine, prompts: Tensor):
        """The inference engine's rollout of ``prompts`` ([B, P] or [S, B, P]): a ``Rollout``."""
        if not self.multi_turn:
            return engine.generate(prompts, self.answer_len)
        return engine.generate_turns(prompts, self.spec.tool, self.cfg.length, self.answer_len)

    def final(self, tokens: Tensor) -> Tensor:
        """The answer the reward reads, from full sequences [B, T]: the last A tokens."""
        return tokens[:, self.prompt_len:] if not self.multi_turn else tokens[:, tokens.shape[1] - self.answer_len:]

    def teacher(self, prompts: Tensor, answers: Tensor) -> tuple[Tensor, Tensor]:
        """(reference response [n, R], its targets [n, R]: the token where the policy writes it, -100 on the
        observation and on padding after a stop): what the supervised warm start trains on."""
        if not self.multi_turn:
            return answers, answers
        tool = self.spec.tool
        calls = tool.call(prompts)
        obs = tool.observe(prompts, calls)
        written = lambda x, stop: torch.where((x == stop).cumsum(-1) - (x == stop).long() > 0, -100, x)  # noqa: E731
        targets = torch.cat([written(calls, CALL_END), torch.full_like(obs, -100), written(answers, EOS)], 1)
        return torch.cat([calls, obs, answers], 1), targets

    def sample(self, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
        """n prompts [n, P] and their reference answers [n, A] (a multi-turn task: of the answer slot)."""
        return self.spec.sample(n, self.cfg.length, gen)

    def reward(self, responses: Tensor, answers: Tensor) -> tuple[Tensor, Tensor]:
        """(reward [B], exact-match [B]) for responses [B, R]."""
        return self.spec.reward(responses, answers, self.cfg.reward)

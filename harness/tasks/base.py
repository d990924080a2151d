"""What a task is: a generator, a reward and an answer length, for each backend that can run it.

A task module (``harness/tasks/<name>.py``) declares one :class:`TaskSpec` and calls :func:`register`;
``harness.tasks`` imports every module of the package, so a new task is that module plus
``experiments/task/<name>.yaml``.

* local backend (token level, the vocabulary of ``harness.backends.local.model``):
  ``sample(n, length, gen) -> (prompts [n, P], answers [n, R])`` with ``P = prompt_len(length)``, its random
  integers drawn with ``randint(gen, low, high, shape)`` (``gen``: a torch.Generator or the trainer's keyed source),
  ``R = answer_len(length)``, and ``reward(responses [B, R], answers [B, R], mode) -> (reward [B], exact [B])``.
* verl backend (text, rows of verl's RLHFDataset): either generated, ``example(rng, length) -> (prompt,
  reference)`` drawn from a seeded ``random.Random``, or read from a file the user provides,
  ``read(path, split) -> rows``; scored by ``text_reward(solution, reference, mode) -> (reward, exact)``,
  or, when that is None, by verl's own rule reward chosen by the rows' ``data_source``.

* multi-turn (local backend only, ``tool`` set: :class:`Tool`): the response is a fixed slot layout
  ``call (C) | observation (O) | answer (A)``, each slot right-padded with PAD. The policy writes the tool call
  (ended by ``CALL_END``), the environment (``Tool.observe``) writes the observation, the policy writes the
  answer (ended by ``EOS``). ``answer_len`` is A, ``sample`` returns the reference answers ``[n, A]`` (EOS then
  PAD) and ``reward`` scores the answer slot only (:func:`eos_reward`).

Modes (``task.reward``): ``partial`` = share of answer positions that are right, ``exact`` = 1 if all are;
the exact-match rate is always logged beside the reward.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

if TYPE_CHECKING:
    import random

    import torch

MARKER = "####"  # the text answer follows the last marker (as in verl's GSM8K reward)
INSTRUCTION = f'Think briefly, then output the final answer after "{MARKER}".'


@dataclass(frozen=True)
class Tool:
    """The environment of a multi-turn task and its slot layout (lengths as functions of ``task.length``).

    ``call(prompts [n, P]) -> [n, C]``: the reference tool call (what the warm start teaches), right-padded;
    ``observe(prompts [n, P], calls [n, C]) -> [n, O]``: the observation of any call the policy wrote (a
    malformed call gets an observation too), right-padded with PAD."""

    call_len: Callable[[int], int]
    obs_len: Callable[[int], int]
    call: Callable[["torch.Tensor"], "torch.Tensor"]
    observe: Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    backends: tuple[str, ...]
    summary: str  # one line: what is asked
    rewards: tuple[str, ...] = ("partial", "exact")  # the task.reward modes it supports
    default_length: int = 1  # task.length when the data CLI is not told
    # local backend
    prompt_len: Optional[Callable[[int], int]] = None
    answer_len: Optional[Callable[[int], int]] = None
    sample: Optional[Callable[[int, int, "torch.Generator"], tuple["torch.Tensor", "torch.Tensor"]]] = None
    reward: Optional[Callable[["torch.Tensor", "torch.Tensor", str], tuple["torch.Tensor", "torch.Tensor"]]] = None
    tool: Optional[Tool] = None  # a multi-turn task's environment (local backend only)
    # verl backend
    example: Optional[Callable[["random.Random", int], tuple[str, str]]] = None
    read: Optional[Callable[[Path, str], list[dict]]] = None
    text_reward: Optional[Callable[[str, str, str], tuple[float, float]]] = None
    data_source: Optional[str] = None  # the rows' data_source; None = "harness/<name>"
    ability: str = "arithmetic"

    def __post_init__(self):
        local = (self.prompt_len, self.answer_len, self.sample, self.reward)
        if ("local" in self.backends) != all(f is not None for f in local):
            raise TypeError(f"task {self.name}: the local backend needs prompt_len, answer_len, sample and reward")
        if self.tool is not None and self.backends != ("local",):
            raise TypeError(f"task {self.name}: a multi-turn (tool) task runs on the local backend only")
        if "verl" in self.backends and (self.example is None) == (self.read is None):
            raise TypeError(f"task {self.name}: the verl backend needs exactly one of example (generated) or read")
        if "verl" in self.backends and self.text_reward is None and self.data_source is None:
            raise TypeError(f"task {self.name}: the verl backend needs a text_reward, or a data_source verl scores")

    @property
    def source(self) -> str:
        """The ``data_source`` of its verl rows (verl picks its rule reward by it when text_reward is None)."""
        return self.data_source or f"harness/{self.name}"

    @property
    def generated(self) -> bool:
        """True when its verl rows are generated here, False when read from a file the user provides."""
        return self.example is not None

    def data_dir(self, length: int) -> str:
        """Folder of its verl parquet files under ``verl.data.root``: ``<name>_L<length>`` when generated."""
        return f"{self.name}_L{length}" if self.generated else self.name


def randint(gen, low: int, high: int, shape: tuple[int, ...]) -> "torch.Tensor":
    """Integers in [low, high) of ``shape`` from ``gen``: a ``torch.Generator``, or a keyed source (any object with a
    ``randint(low, high, shape)`` method, e.g. the local trainer's draws for every seed of a pack at once). What a
    task's ``sample`` draws its digits with."""
    import torch

    if gen is None or isinstance(gen, torch.Generator):
        return torch.randint(low, high, shape, generator=gen)
    return gen.randint(low, high, shape)


def digit_reward(responses: "torch.Tensor", answers: "torch.Tensor", mode: str) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Token-level reward of digit answers: right_i = [response_i == answer_i],
    exact = min_i right_i, reward = mean_i right_i (partial) or exact."""
    right = (responses == answers).float()
    exact = right.min(-1).values
    return (right.mean(-1) if mode == "partial" else exact), exact


def eos_reward(responses: "torch.Tensor", answers: "torch.Tensor", mode: str) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Reward of a variable-length answer ended by EOS: the reference ``answers`` [B, A] is digits, EOS, then
    PAD; the counted positions are the reference's up to its EOS (c_i = [answer_i != PAD]):
    right_i = [response_i == answer_i], exact = min_{i: c_i} right_i, reward = sum_i c_i right_i / sum_i c_i
    (partial) or exact. A response that stops early or late misses the reference's EOS."""
    from harness.tasks.vocab import PAD

    counted = (answers != PAD).float()
    right = (responses == answers).float() * counted
    exact = (right.sum(-1) == counted.sum(-1)).float()
    return (right.sum(-1) / counted.sum(-1) if mode == "partial" else exact), exact


def digits_after_marker(solution: str) -> list[int] | None:
    """The digits after the last ``####`` (None when the marker is missing)."""
    if MARKER not in solution:
        return None
    return [int(c) for c in re.findall(r"\d", solution.rsplit(MARKER, 1)[1])]


def digit_text_reward(solution: str, reference: str, mode: str = "partial") -> tuple[float, float]:
    """Text form of :func:`digit_reward`: the reference is a space-separated digit string, the answer the digits
    after the last marker; exact also needs the answer to have the reference's length."""
    answer, ref = digits_after_marker(solution), [int(c) for c in str(reference).split()]
    if mode not in ("partial", "exact"):
        raise ValueError(f"mode must be partial or exact, got {mode!r}")
    if answer is None or not ref:
        return 0.0, 0.0
    right = sum(1 for i, d in enumerate(ref) if i < len(answer) and answer[i] == d)
    exact = float(right == len(ref) and len(answer) == len(ref))
    return (exact if mode == "exact" else right / len(ref)), exact


def digits(xs) -> str:
    """Digits as the text tasks write them: separated by spaces."""
    return " ".join(map(str, xs))

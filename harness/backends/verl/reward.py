"""Rule reward of the harness's generated tasks (sort, addition) for verl's reward loop.

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)``
(``reward.custom_reward_function``); translate.py passes ``mode`` = the spec's ``task.reward``.
The answer is the digits after the last ``####`` (as in verl's GSM8K reward); the reference is a
space-separated digit string. ``partial`` = share of answer positions that are right (the local
backend's reward), ``exact`` = 1 only if all are; ``acc`` (logged by verl) is always exact match.
This file is loaded by path (verl's load_extern_object), so it imports nothing from harness.
"""
from __future__ import annotations

import re

MARKER = "####"


def extract_digits(solution_str: str) -> list[int] | None:
    """Digits after the last ``####`` (None when the marker is missing)."""
    if MARKER not in solution_str:
        return None
    tail = solution_str.rsplit(MARKER, 1)[1]
    return [int(c) for c in re.findall(r"\d", tail)]


def score(answer: list[int] | None, reference: list[int], mode: str = "partial") -> tuple[float, float]:
    """(reward, exact) for one response."""
    if answer is None or not reference:
        return 0.0, 0.0
    right = sum(1 for i, d in enumerate(reference) if i < len(answer) and answer[i] == d)
    exact = float(right == len(reference) and len(answer) == len(reference))
    if mode == "exact":
        return exact, exact
    if mode != "partial":
        raise ValueError(f"mode must be partial or exact, got {mode!r}")
    return right / len(reference), exact


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, mode: str = "partial",
                  **kwargs) -> dict:
    reference = [int(c) for c in str(ground_truth).split()]
    reward, exact = score(extract_digits(solution_str), reference, mode)
    return {"score": reward, "acc": exact}

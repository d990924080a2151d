"""Rule reward of the harness's generated tasks for verl's reward loop.

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)``
(``reward.custom_reward_function``); translate.py passes ``mode`` = the spec's ``task.reward``.
The rows' ``data_source`` is their task's ``TaskSpec.source`` (``harness.backends.verl.data``); the task's module
declares its ``text_reward`` (sort, addition: :func:`harness.tasks.base.digit_text_reward`). ``acc``
(logged by verl) is always exact match. verl loads this file by path in processes that import
``harness.backends.verl.plugins`` (``VERL_USE_EXTERNAL_MODULES``), so ``harness`` is importable there.
"""
from __future__ import annotations

from harness import tasks


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, mode: str = "partial",
                  **kwargs) -> dict:
    scored = {s.source: s for s in tasks.REGISTRY.values() if s.text_reward is not None}  # TaskSpec.source
    spec = scored.get(data_source)
    if spec is None:
        raise ValueError(f"data_source {data_source!r} is not a harness task with a text reward "
                         f"(one of {', '.join(sorted(scored))})")
    reward, exact = spec.text_reward(solution_str, ground_truth, mode)
    return {"score": reward, "acc": exact}

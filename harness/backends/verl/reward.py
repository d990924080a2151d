"""Rule reward of the harness's generated tasks for verl's reward loop.

verl calls ``compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)``
(``reward.custom_reward_function``); translate.py passes ``mode`` = the spec's ``task.reward``.
The rows' ``data_source`` is ``harness/<task>`` (``harness.backends.verl.data``); the task's module
declares its ``text_reward`` (sort, addition: :func:`harness.tasks.base.digit_text_reward`). ``acc``
(logged by verl) is always exact match. verl loads this file by path in processes that import
``harness.backends.verl.plugins`` (``VERL_USE_EXTERNAL_MODULES``), so ``harness`` is importable there.
"""
from __future__ import annotations

from harness import tasks


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, mode: str = "partial",
                  **kwargs) -> dict:
    name = data_source.removeprefix("harness/")
    spec = tasks.get(name) if data_source.startswith("harness/") and name in tasks.REGISTRY else None
    if spec is None or spec.text_reward is None:
        raise ValueError(f"data_source {data_source!r} is not a harness task with a text reward "
                         f"(harness/<task>, task one of {', '.join(n for n in tasks.names() if tasks.get(n).text_reward)})")
    reward, exact = spec.text_reward(solution_str, ground_truth, mode)
    return {"score": reward, "acc": exact}

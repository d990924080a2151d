"""verl function tools for multi-turn rollouts: ``verl.tools=harness/backends/verl/tools.py``.

verl loads this file itself (``rollout.multi_turn.function_tool_path``, ``verl.tools.function_tool``) in
every agent-loop worker; nothing of the harness imports it. verl builds each tool's OpenAI schema, which
the chat template shows the model, from the function's signature and Google-style docstring
(``transformers.utils.get_json_schema``), so there is no schema file to write or download. For the
addition task (``task=addition``) the model may call ``add`` and then answer; the reward is still the
task's rule reward on the decoded response (which includes the tool's answer, as verl decodes it).

A stateful tool (per-trajectory state, its own reward) is a ``verl.tools.base_tool.BaseTool`` subclass
declared in a YAML tool config instead (``verl.tools=path/to/tools.yaml``; its format in docs/verl.md).
"""
from __future__ import annotations

from verl.tools.function_tool import function_tool


@function_tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return str(int(a) + int(b))

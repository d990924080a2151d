"""``mean_n`` in a multi-turn tool conversation: verl's ``ToolAgentLoop`` + n re-scorings of the whole sequence.

    logp_old[t] = log( (1/n) sum_i exp(logp_inf[i][t]) )   for every assistant token t (response_mask 1)
    logp_old[t] = 0.0                                        at observation tokens (response_mask 0)

The conversation runs exactly as verl's ``tool_agent`` runs it (the agent loop ``harness_mean_n_tool``,
selected by ``verl.tools``; translate.py): assistant turns sampled by vLLM, tool calls parsed
(``multi_turn.format``, hermes by default) and executed, tool responses appended through the chat
template as observation tokens with response_mask 0, until the assistant answers without a tool call,
a turn limit or the response length ends it. Then the **final** sequence (prompt + every turn,
truncated as verl truncates it) is sent n times as a scoring request (``max_tokens=1``,
``prompt_logprobs=0``), one pass after the other (plugins/mean_n.py, ``score_response``: every pass in a
later engine step), and each assistant token's rollout log-prob becomes log-mean-exp of its n scores,
in context: a token of turn 2 is scored given turn 1 and the tool's answer, as the trainer scores it.

Observation tokens keep response_mask 0 and the log-prob 0.0, the value verl's ToolAgentLoop puts
there (``ContinuousTokenBuilder.align_response_metadata``); the mask keeps them out of the loss and of
every estimator's sums, so the value is never read. The sampling log-probs of the assistant tokens
(0.0 at observations, as verl returns them) are kept in ``extra_fields["harness_sampling_logprobs"]``.
The code shared with the single-turn loop (the passes, log-mean-exp, the masking) is
``plugins/mean_n.MeanNRescoring``.
"""
from __future__ import annotations

from verl.experimental.agent_loop.agent_loop import register
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from harness.backends.verl.plugins.mean_n import MeanNRescoring
from harness.estimators.mean_n import TOOL_AGENT_LOOP


@register(TOOL_AGENT_LOOP)
class MeanNToolAgentLoop(MeanNRescoring, ToolAgentLoop):
    """verl's multi-turn tool loop + n re-scorings of the final sequence; assistant tokens get mean_n's pi_old."""

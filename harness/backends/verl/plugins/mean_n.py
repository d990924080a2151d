"""``mean_n`` inside verl: an agent loop that re-scores each sampled response n times with vLLM.

    logp_old = log( (1/n) sum_i exp(logp_inf[i]) )        (harness.estimators.mean_n.log_mean_prob)

The loop samples exactly as verl's ``single_turn_agent`` does, then sends prompt+response n times
to the same vLLM servers as a scoring request (``max_tokens=1``, ``prompt_logprobs=0``).

Independent passes. A scoring pass samples nothing, so a seed changes nothing; what makes two
passes differ is the batch they are computed in (vLLM is not batch-invariant unless
``VLLM_BATCH_INVARIANT=1``: the GEMM/attention reduction splits follow the batch shape, see
vllm-project/vllm#11778, prompt log-probs differ between batch size 1 and N). Sent at once, the n
identical requests would be scheduled into the same engine step, where identical rows of one batch
compute identically: n copies of one pass. So the passes of a response are issued **one after the
other** (pass i+1 is sent when pass i has returned), each with a fresh request id (verl's router
may place it on another replica): every pass lands in a later engine step, batched with whatever
else is in flight then (other responses' sampling and scoring), as the local backend's
``InferenceEngine.score`` recomputes each pass in a new batch. Different responses are still
scored concurrently. What remains to measure on a GPU is how much the passes then differ
(``scripts/verl_pass_variance.py``, ``make verl-pass-variance``). The log-mean-exp of the n per-token log-probs replaces the response's
rollout log-probs, and the run uses verl's bypass mode (``rollout_correction.bypass_mode=true``),
so this is pi_old in the PPO ratio, with no training forward. The sampling pass's own log-probs are
kept in ``extra_fields["harness_sampling_logprobs"]``. ``MeanNRescoring`` (the passes, log-mean-exp, 0.0 where
the response mask is 0) is shared with the multi-turn loop ``harness_mean_n_tool`` (plugins/mean_n_tool.py).

vLLM's prompt log-probs are the model's distribution before the sampler, so validate() requires
temperature 1, no top-k and top-p 1 with mean_n (and mean_n_tis). Greedy (temperature 0) validation rollouts are not
re-scored.
"""
from __future__ import annotations

from typing import Any
from uuid import uuid4

import torch

from harness.estimators.mean_n import AGENT_LOOP as AGENT_LOOP_NAME, log_mean_prob
SCORING_PARAMS = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0, "detokenize": False}


def response_logprobs(prompt_logprobs: list[list[float]], prompt_len: int, response_len: int) -> list[float]:
    """The response tokens' log-probs from verl's ``extra_fields["prompt_logprobs"]`` of a scoring pass.

    verl's vLLM server (``extract_prompt_logprobs``) returns one row per token of the scored
    sequence: row j holds the log-prob of token j+1 given tokens 0..j, and a dummy last row.
    Response token t sits at position prompt_len + t, so its log-prob is row prompt_len + t - 1.
    """
    if prompt_len < 1:
        raise ValueError("the scored sequence needs at least one prompt token")
    rows = prompt_logprobs[prompt_len - 1: prompt_len - 1 + response_len]
    if len(rows) != response_len:
        raise ValueError(f"scoring returned {len(prompt_logprobs)} rows for a sequence of "
                         f"{prompt_len}+{response_len} tokens")
    return [float(r[0]) for r in rows]


async def score_response(server_manager: Any, prompt_ids: list[int], response_ids: list[int], n: int) -> torch.Tensor:
    """[n, R] log-probs of the response from n vLLM scoring passes, issued one after the other."""
    seq = list(prompt_ids) + list(response_ids)

    async def one() -> list[float]:
        out = await server_manager.generate(request_id=uuid4().hex, prompt_ids=seq, sampling_params=dict(SCORING_PARAMS))
        if getattr(out, "stop_reason", None) == "aborted":
            # verl's server aborts requests when it pauses generation (a weight update, a shutdown): a retried
            # pass could score under other weights than the sampled response's, so it is not retried
            raise RuntimeError(f"a mean_n scoring pass was aborted by the rollout server (global step "
                               f"{out.extra_fields.get('global_steps', '?')}): the passes must score under the "
                               "weights that sampled the response, so this prompt's group fails rather than mix them")
        if "prompt_logprobs" not in out.extra_fields:
            raise RuntimeError("the rollout server returned no prompt_logprobs: mean_n needs verl's vLLM server")
        return response_logprobs(out.extra_fields["prompt_logprobs"], len(prompt_ids), len(response_ids))

    passes = [await one() for _ in range(n)]  # sequential: each pass in a later engine step (docstring)
    return torch.tensor(passes, dtype=torch.float64, device="cpu")  # vLLM's numbers, on the driver


def mean_n_logprobs(scores: torch.Tensor) -> list[float]:
    """log-mean-exp over the n passes, exactly the local backend's estimator."""
    return log_mean_prob(scores).tolist()


def masked_mean_n_logprobs(scores: torch.Tensor, response_mask: list[int]) -> list[float]:
    """mean_n's log-prob of every response token the policy generated (mask 1), 0.0 where the mask is 0.

    0.0 at observation tokens (tool responses, chat-template boundaries) is what verl's own ToolAgentLoop
    puts in ``response_logprobs`` there (``ContinuousTokenBuilder.align_response_metadata``); the mask keeps
    them out of every loss and estimator sum, so their value is never read."""
    if len(response_mask) != scores.shape[-1]:
        raise ValueError(f"response_mask has {len(response_mask)} entries for {scores.shape[-1]} scored tokens")
    return [lp if m else 0.0 for lp, m in zip(mean_n_logprobs(scores), response_mask)]


from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register  # noqa: E402
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop  # noqa: E402


class MeanNRescoring:
    """Mixed in before one of verl's agent loops: runs it as verl does, then re-scores the final sequence
    (prompt + every response token) n times and replaces the response log-probs with mean_n's."""

    @property
    def mean_n(self) -> int:
        h = self.config.get("harness", None) or {}
        n = h.get("mean_n", None)
        if n is None or int(n) < 1:
            raise RuntimeError(f"agent loop {type(self).__name__} needs +harness.mean_n=<n >= 1> in the verl config")
        return int(n)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        return await self.rescore(output, sampling_params)

    async def rescore(self, output: AgentLoopOutput, sampling_params: dict[str, Any]) -> AgentLoopOutput:
        if sampling_params.get("temperature", 1.0) == 0 or not output.response_ids:
            return output  # greedy validation: its log-probs are never a training denominator
        scores = await score_response(self.server_manager, output.prompt_ids, output.response_ids, self.mean_n)
        output.extra_fields["harness_sampling_logprobs"] = output.response_logprobs
        output.response_logprobs = masked_mean_n_logprobs(scores, output.response_mask)
        return output


@register(AGENT_LOOP_NAME)
class MeanNAgentLoop(MeanNRescoring, SingleTurnAgentLoop):
    """verl's single-turn loop + n re-scorings; the response log-probs become mean_n's pi_old (its
    response mask is all ones, so every token gets log-mean-exp)."""

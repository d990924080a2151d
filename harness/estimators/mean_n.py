"""``mean_n``: pi_old = the mean of the token PROBABILITIES of n fresh inference passes (KwaiKAT).

    logp_old = log( (1/n) sum_{i=1..n} exp(logp_inf[i]) )          (log-mean-exp)
    mask_t   = 0 where logp_old_t = -inf (no pass keeps the token: processed top-k / top-p)

Each ``logp_inf[i]`` is an independent re-scoring of prompt+response by the inference engine
(its own random expert-combine order, batch composition and injected noise), independent of the
sampling pass: so ``mean_n`` with n=1 is *not* ``rollout``. The mean of probabilities is an
unbiased estimate of E[pi_inference] whose variance falls as 1/n; the mean of log-probs would be
biased low (Jensen). Cost: n inference scoring passes, no training forward.
On verl: bypass mode + our agent loop ``harness_mean_n`` (plugins/mean_n.py): the rollout log-prob
it returns is log-mean-exp of n vLLM ``prompt_logprobs`` re-scorings; with ``verl.tools`` (multi-turn)
``harness_mean_n_tool`` (plugins/mean_n_tool.py) does the same for every assistant token of the conversation.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.errors import ConfigError
from harness.estimators.base import Estimator, Needs, OldPolicy, Params, Style, Verl, knob, register

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

#: at most this many passes per step (cost ~ n; a typo such as ``estimator.n=1e9`` hangs a run at step 0);
#: far above what the experiments use (n <= 16): raise it here if a study needs more
MAX_N = 64
AGENT_LOOP = "harness_mean_n"  # the verl agent loop of plugins/mean_n.py
TOOL_AGENT_LOOP = "harness_mean_n_tool"  # its multi-turn variant (plugins/mean_n_tool.py), with ``verl.tools``


def log_mean_prob(logps: Tensor) -> Tensor:
    """log((1/n) sum_i exp(logps[i])) over the first dimension, computed stably."""
    n = logps.shape[0]
    return logps.double().logsumexp(dim=0).sub(math.log(n)).to(logps.dtype)


@dataclass
class Passes(Params):
    n: int = knob("n", "number of fresh inference passes", axis=True, default=8)

    def validate(self) -> None:
        if self.n < 1:
            raise ConfigError("estimator.n", f"must be an integer >= 1, got {self.n}")
        if self.n > MAX_N:
            raise ConfigError("estimator.n", f"must be <= {MAX_N} (harness.estimators.mean_n.MAX_N), got {self.n}")


def _verl_check(cfg) -> None:
    i = cfg.inference
    if not (i.temperature == 1.0 and i.top_k == 0 and i.top_p == 1.0):
        raise ConfigError("inference.temperature", "mean_n re-scores with vLLM prompt_logprobs, which are the model's "
                          f"raw distribution: with temperature={i.temperature}, top_k={i.top_k}, top_p={i.top_p} they "
                          "would not be the sampling distribution. Use temperature 1.0, top_k 0 and top_p 1.0 with "
                          "mean_n on verl")
    if i.deterministic:
        raise ConfigError("inference.deterministic", "mean_n averages n re-scoring passes whose numerics differ by "
                          "batch composition; a batch-invariant vLLM (full determinism) makes every pass identical, "
                          "so mean_n would be mean_1")


@register
class MeanN(Estimator):
    name = "mean_n"
    Params = Passes
    rank = 6
    style = Style("orange", "-")
    camp = "sampling noise"
    verl = Verl(bypass=True, agent_loop=AGENT_LOOP, tool_agent_loop=TOOL_AGENT_LOOP, harness=lambda p: {"mean_n": p.n},
                check=_verl_check)

    def passes(self) -> int:
        return self.params.n

    def old_policy(self, ctx) -> OldPolicy:
        """pi_old = log_mean_prob of the n passes; a token that no pass keeps (log-prob -inf in all n: processed
        mode with top-k / top-p, the token outside every pass's nucleus) has no finite pi_old and is left out of
        the loss (mask 0, logp 0) rather than turning the PPO ratio and the loss infinite."""
        logp = log_mean_prob(ctx.score(self.params.n))
        kept = logp.isfinite()
        old = self.plain(ctx, logp.masked_fill(~kept, 0.0))
        old.mask = old.mask * kept.to(old.mask.dtype)
        return old

"""``mean_n``: pi_old = the mean of the token PROBABILITIES of n fresh inference passes (KwaiKAT).

    logp_old = log( (1/n) sum_{i=1..n} exp(logp_inf[i]) )          (log-mean-exp)

Each ``logp_inf[i]`` is an independent re-scoring of prompt+response by the inference engine
(its own random expert-combine order, batch composition and injected noise), independent of the
sampling pass: so ``mean_n`` with n=1 is *not* ``rollout``. The mean of probabilities is an
unbiased estimate of E[pi_inference] whose variance falls as 1/n; the mean of log-probs would be
biased low (Jensen). Cost: n inference scoring passes, no training forward.
"""
import math

import torch
from torch import Tensor

from harness.estimators.base import Estimator, OldPolicy, register


def log_mean_prob(logps: Tensor) -> Tensor:
    """log((1/n) sum_i exp(logps[i])) over the first dimension, computed stably."""
    n = logps.shape[0]
    return torch.logsumexp(logps.double(), dim=0).sub(math.log(n)).to(logps.dtype)


@register
class MeanN(Estimator):
    name = "mean_n"

    def old_policy(self, ctx) -> OldPolicy:
        return self.plain(ctx, log_mean_prob(ctx.score(self.cfg.n)))

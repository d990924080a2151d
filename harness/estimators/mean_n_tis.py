"""``mean_n_tis``: TIS whose behaviour probability is mean_n's estimate (KwaiKAT's TIS with mean_n's pi).

    logp_old  = logp_rec
    pi_mean_n = (1/n) sum_{i=1..n} exp(logp_inf[i])          (mean_n.log_mean_prob: log-mean-exp of n passes)
    w_t       = min( pi_rec_t / pi_mean_n_t , C )             (token level), or
    w         = min( exp(sum_t (logp_rec_t - log pi_mean_n_t)) , C ), broadcast over the response (sequence)

(log-ratios clamped to +-20 and zeroed on padding, as ``weights.importance_ratio`` / verl). TIS corrects the
train-inference mismatch with the sampling probability pi_roll in the denominator; here pi_roll is replaced
by mean_n's estimate of the engine's noise-averaged sampling probability, so the weight sees the systematic
part of the mismatch rather than one pass's noise. Composed on the seam: recompute's :class:`OldPolicy` with
``with_weight``; parameters n (``Passes``) + C and level (``CappedRatio``). Cost: 1 training forward + n
inference scoring passes per step.

On verl: decoupled mode (``bypass_mode=false``, pi_old = the actor's recompute) with ``rollout_is=<level>``,
``rollout_is_threshold=C``, and our agent loop ``harness_mean_n`` (plugins/mean_n.py), which replaces each
response's rollout log-probs by the log-mean-exp of n vLLM re-scorings: verl's IS weight
``min(exp(old_log_prob - rollout_log_probs), C)`` is then exactly w above. Its checks are mean_n's.
"""
from __future__ import annotations

from dataclasses import dataclass

from harness.estimators.base import Estimator, OldPolicy, Style, Verl, knob, register
from harness.estimators.mean_n import AGENT_LOOP, Passes, _verl_check, log_mean_prob
from harness.estimators.tis import tis_weights
from harness.estimators.weights import CappedRatio


@dataclass
class PassesAndCap(CappedRatio, Passes):
    """n passes, a cap C > 1 and a level (sequence by default)."""

    level: str = knob("", "token | sequence", default="sequence")

    def validate(self) -> None:
        Passes.validate(self)
        CappedRatio.validate(self)


@register
class MeanNTIS(Estimator):
    name = "mean_n_tis"
    Params = PassesAndCap
    rank = 7
    style = Style("teal", "--")
    camp = "re-weighting"
    verl = Verl(correction=lambda p: {"rollout_is": p.level, "rollout_is_threshold": float(p.clip_c)},
                agent_loop=AGENT_LOOP, harness=lambda p: {"mean_n": p.n}, check=_verl_check)

    def passes(self) -> int:
        return self.params.n

    def old_policy(self, ctx) -> OldPolicy:
        p = self.params
        logp_rec = ctx.recompute().logp
        logp_mean = log_mean_prob(ctx.score(p.n))
        return self.plain(ctx, logp_rec).with_weight(tis_weights(logp_rec, logp_mean, ctx.mask, p.clip_c, p.level))

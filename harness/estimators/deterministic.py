"""``deterministic``: pi_old = the sampling log-prob of a batch-invariant, fixed-order engine.

    logp_old = logp_roll   (inference engine in deterministic mode)

The infra fix (vLLM/SGLang deterministic inference): expert outputs summed in a fixed order, no
batch-composition effects, so repeated scoring has zero variance. It costs throughput, which
``time/rollout_s`` measures. On verl: bypass mode + ``rollout.full_determinism=true`` (batch-invariant
vLLM, from ``needs.deterministic``) + our agent loop ``harness_deterministic`` (plugins/deterministic.py).
"""
from harness.estimators.base import Estimator, Needs, OldPolicy, Style, Verl, register


@register
class Deterministic(Estimator):
    name = "deterministic"
    needs = Needs(deterministic=True)
    rank = 8
    style = Style("cyan", ":")
    verl = Verl(bypass=True)

    def old_policy(self, ctx) -> OldPolicy:
        return self.plain(ctx, ctx.logp_roll)

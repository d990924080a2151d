"""``deterministic``: pi_old = the sampling log-prob of a batch-invariant, fixed-order engine.

    logp_old = logp_roll   (inference engine in deterministic mode)

The infra fix (vLLM/SGLang deterministic inference): expert outputs summed in a fixed order, no
batch-composition effects, so repeated scoring has zero variance. It costs throughput, which
``time/rollout_s`` measures.
"""
from harness.estimators.base import Estimator, OldPolicy, register


@register
class Deterministic(Estimator):
    name = "deterministic"
    requires_deterministic_inference = True

    def old_policy(self, ctx) -> OldPolicy:
        return self.plain(ctx, ctx.logp_roll)

"""``rollout``: pi_old = the inference engine's sampling log-prob.

    logp_old = logp_roll

This is the exact probability the token was drawn with (in ``logprobs_mode: processed``), so the
IS ratio against it is unbiased however noisy the engine is; its cost is zero extra passes.
On verl: ``algorithm.rollout_correction.bypass_mode=true`` (old := rollout log-prob).
"""
from harness.estimators.base import Estimator, OldPolicy, Style, Verl, register


@register
class Rollout(Estimator):
    name = "rollout"
    rank = 0
    style = Style("green", "-")
    camp = "baseline"
    verl = Verl(bypass=True)

    def old_policy(self, ctx) -> OldPolicy:
        return self.plain(ctx, ctx.logp_roll)

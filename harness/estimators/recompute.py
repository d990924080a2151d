"""``recompute``: pi_old = the training engine's log-prob under the pre-update weights.

    logp_old = logp_rec = TrainEngine(theta_old)(tokens)

The standard of verl/OpenRLHF: one extra training forward; ignores the train-inference mismatch.
On verl: decoupled mode (verl's default), old := actor forward, no IS weight.
"""
from harness.estimators.base import Estimator, OldPolicy, Style, Verl, register


@register
class Recompute(Estimator):
    name = "recompute"
    rank = 1
    style = Style("blue", "-")
    camp = "baseline"
    verl = Verl()

    def old_policy(self, ctx) -> OldPolicy:
        return self.plain(ctx, ctx.recompute().logp)

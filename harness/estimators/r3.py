"""``r3``: Rollout Routing Replay - replay the inference engine's expert choices in training.

    logp_old = logp_rec computed with the rollout's routed experts S (layers x top_k per token)
    g_e = 1[e in S] exp(s_e) / sum_{j in S} exp(s_j)      (s = the *training* router's logits)

The replay is used in the recompute forward and in every update forward, so the selected experts
equal the rollout's for every token and layer while the gate weights (and their gradient into the
router) still come from the training router. Needs the routed experts from the rollout.
On verl: Megatron ``router_replay.mode=R3`` + ``rollout.enable_rollout_routing_replay`` (``needs.replay``),
so only on the megatron engine.
"""
from harness.errors import ConfigError
from harness.estimators.base import Estimator, Needs, OldPolicy, Style, Verl, register


def _verl_check(cfg) -> None:
    if cfg.verl.strategy != "megatron":
        raise ConfigError("estimator", f"r3 (rollout routing replay) runs only on verl's megatron engine "
                          f"(actor.megatron.router_replay.mode=R3); verl.strategy={cfg.verl.strategy} has no router "
                          "replay. Use a megatron model preset (model=qwen3_30b_a3b) or set verl.strategy=megatron")


@register
class R3(Estimator):
    name = "r3"
    needs = Needs(router=True, replay=True)
    rank = 5
    style = Style("red", "--")
    camp = "routing replay"
    verl = Verl(check=_verl_check)

    def old_policy(self, ctx) -> OldPolicy:
        if ctx.routed_experts is None:
            raise ValueError("r3 needs the rollout's routed experts; this model has no router (dense)")
        fwd = ctx.recompute(replay=ctx.routed_experts)
        return self.plain(ctx, fwd.logp, replay=ctx.routed_experts)

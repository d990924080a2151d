"""``r2``: Routing Replay of the training engine's own old-policy routes (R2; Qwen, "Stabilizing Reinforcement
Learning with LLMs", arXiv 2512.01374).

    logp_old = logp_rec = TrainEngine(theta_old)(tokens)                   (its own routing: nothing replayed)
    S        = the experts that recompute forward selected (layers x top_k, every position of the sequence)
    g_e      = 1[e in S] exp(s_e) / sum_{j in S} exp(s_j)    in every update forward (s = the current router's logits)

The update forwards replay the routes the *training* engine chose under the pre-update weights, so a later
minibatch or epoch of the same step routes every token as the old policy did (the ratio's numerator and
denominator share the experts; the gates and their gradient still come from the current router), whereas
``r3`` replays the *rollout's* routes (the inference engine's, in its precision and noise) in the recompute too.
With one update per step (``trainer.num_minibatches=1``, ``ppo_epochs=1``) the replay is the update's own routing
and r2 equals ``recompute``.

The replay covers every position [B, T, L, k], prompt included (``PolicyForward.routes``, the recompute's top-k of
the whole sequence; none is -1): as verl's Megatron R2, which records the routing of every token in the
old-log-prob pass and replays it in the update. A prompt position's routing reaches the response's log-probs
through attention, so replaying only the response positions would let the prompt's routes move with the update.
The last position (it predicts nothing) and padding are replayed too and read by nothing. The recompute needs
no replay, so pi_old is recompute's bitwise, and replaying its own routes at the old weights changes nothing (the
trainer's context answers that request from its cache: one training forward, as recompute). Refused on a dense
model (``needs.router``).
On verl: Megatron ``actor.megatron.router_replay.mode=R2`` (``Verl.router_replay``; no
``enable_rollout_routing_replay``: the rollout's routes are not needed), so only on the megatron engine.
"""
from harness.errors import ConfigError
from harness.estimators.base import Estimator, Needs, OldPolicy, Style, Verl, register


def _verl_check(cfg) -> None:
    if cfg.verl.strategy != "megatron":
        raise ConfigError("estimator", f"r2 (routing replay of the training engine's old routes) runs only on "
                          f"verl's megatron engine (actor.megatron.router_replay.mode=R2); verl.strategy="
                          f"{cfg.verl.strategy} has no router replay. Use a megatron model preset "
                          "(model=qwen3_30b_a3b) or set verl.strategy=megatron")


@register
class R2(Estimator):
    name = "r2"
    needs = Needs(router=True)
    rank = 5
    style = Style("magenta", "-.")
    camp = "routing replay"
    verl = Verl(router_replay="R2", check=_verl_check)

    def old_policy(self, ctx) -> OldPolicy:
        fwd = ctx.recompute()
        if fwd.routes is None:
            raise ValueError("r2 replays the training engine's routes; this model has no router (dense)")
        return self.plain(ctx, fwd.logp, replay=fwd.routes)

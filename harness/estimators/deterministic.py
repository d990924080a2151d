"""``deterministic``: pi_old = the sampling log-prob of a deterministic inference engine.

    logp_old = logp_roll   (inference engine in deterministic mode)

``noise: removed`` (the estimator; ``experiments/estimator/deterministic.yaml``) is deterministic
inference as vLLM/SGLang ship it: expert outputs summed in a fixed order, no split-K (batch invariant),
and the engine's noise sources REMOVED (``inference.router_noise_sigma`` and ``logit_noise_sigma`` set to
0 for this engine), so repeated scoring has zero variance and the only difference left to the training
engine is precision (bf16 vs float32; an explicit *bias*, ``inference.bias_delta``, is not noise and stays).

``noise: frozen`` is an explicitly **biased** arm (what ``deterministic`` meant before issue 15): the same
fixed order, but the noise knobs frozen into a fixed random projection of the hidden state (the inference
engine's deterministic mode, ``InferenceEngine._noise``), a large fixed bias at the default sigma. Runs of
the old ``deterministic`` meant this; no spec has their signature any more (``noise`` is always set, so it
is always signed).

Cost: throughput, which ``time/rollout_s`` measures. On verl (``noise: removed`` only; ``frozen`` has no
vLLM meaning and is refused): bypass mode + ``rollout.full_determinism=true`` (batch-invariant vLLM, from
``needs.deterministic``) + our agent loop ``harness_deterministic`` (plugins/deterministic.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.errors import ConfigError, one_of
from harness.estimators.base import Estimator, Needs, OldPolicy, Params, Style, Verl, knob, register

NOISE = ("removed", "frozen")


@dataclass
class Noise(Params):
    noise: str = knob("", "removed (deterministic inference) | frozen (a fixed projection: a biased arm)", default="removed")

    def validate(self) -> None:
        one_of(self.noise, NOISE, "estimator.noise")


def _verl_check(cfg) -> None:
    if cfg.estimator.noise != "removed":
        raise ConfigError("estimator.noise", f"deterministic with noise={cfg.estimator.noise} is the local engine's "
                          "frozen noise projection (a biased arm), which has no vLLM counterpart: on verl "
                          "deterministic is vLLM full determinism, estimator.noise=removed")


@register
class Deterministic(Estimator):
    name = "deterministic"
    Params = Noise
    needs = Needs(deterministic=True)
    rank = 8
    style = Style("cyan", ":")
    camp = "nondeterminism"
    verl = Verl(bypass=True, check=_verl_check)

    def inference(self, icfg):
        """Deterministic mode; ``removed`` also switches the engine's noise knobs off."""
        icfg = super().inference(icfg)
        if self.params.noise == "removed":
            icfg = dataclasses.replace(icfg, router_noise_sigma=0.0, logit_noise_sigma=0.0)
        return icfg

    def old_policy(self, ctx) -> OldPolicy:
        return self.plain(ctx, ctx.logp_roll)

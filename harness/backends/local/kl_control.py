"""KL-held perturbation: scale the inference engine's one explicit perturbation, per seed and step, so that
the train-inference KL stays at a target along training (issue 15, item 4: "match arms on KL along training").

A perturbation of fixed size gives a KL that drifts as the policy sharpens (router noise's k3 grows 3-11x over a
run, logit noise's and bias's shrink 2-10x: docs/results.md section 4), so arms matched at the warm start are
not matched later. Here the size is a controlled variable instead. With ``inference.kl_target = K* > 0`` and the
perturbation's configured level ``x_0`` (``router_noise_sigma``, ``logit_noise_sigma`` or ``bias_delta``), seed s
at step t runs the perturbation at scale ``c_t`` (the same for the rollout, the estimator's and the diagnostic
inference passes of that step):

    router / logit noise:   sigma_t = c_t * sigma_0
    bias:                   delta_t = delta_0 ** c_t        (log delta_t = c_t log delta_0)

and after the step, with ``K_t`` = the step's ``mismatch/rec_k3`` (the token-mean k3 of the training engine's
log-probs against the rollout's, an estimate of KL(p_inf || p_train)):

    log c_{t+1} = clip(log c_t + g (1 - K_t / K*), log C_MIN, log C_MAX),    c_0 = 1

``g`` = ``inference.kl_gain`` (0.1). It is a stochastic-approximation (Robbins-Monro) step whose fixed point is
E[K_t] = K*: the *arithmetic* mean of the per-step k3, the quantity ``python -m analysis dose`` reports and matches
arms on. (Version 1 of the rule, ``log c += g (log K* - log K_t)``, held the geometric mean instead; under router
noise the per-step k3 is heavy-tailed, its log spread ~1-1.5 late in a run, and the arithmetic mean came out
1.3-2x the target: ``harness.backends.local.identity.KL_CONTROL`` signs the rule.) Near the fixed point the log scale's error
contracts by (1 - a g) per step, k3 ~ c^a with a in [1, 2] (logit noise and bias a ~ 2; router noise, which flips
routes, nearer 1); a step below the target raises log c by at most g (c by at most 1.105x at g = 0.1), a step k times above it lowers
log c by g (k - 1). The update is causal (step t's scale depends on steps < t only) and deterministic given the
run's seed, so a held run is reproducible, bitwise the same alone or in a pack (each seed its own scale), and
resumes exactly (the scale is checkpointed with the seed's state). Logged per step: ``perturb/scale`` (c_t) and
``perturb/level`` (sigma_t or delta_t), the values that step ran at.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from harness import metrics as M
from harness.spec import InferenceConfig, perturbations_on

C_MIN, C_MAX = 1e-3, 1e3  # the scale stays within 1e-3..1e3 of the configured level


def held_knob(cfg: InferenceConfig) -> tuple[str, float]:
    """The perturbation the controller scales: (``router``/``logit``/``bias``, its configured level)."""
    on = perturbations_on(cfg)
    if len(on) != 1:
        raise ValueError("inference.kl_target needs exactly one perturbation on (config.validate refuses this spec)")
    kind, _, value = on[0]
    return kind, value


class KLController:
    """Per-seed scales ``c`` [S] (float64) of the held perturbation (module docstring)."""

    def __init__(self, cfg: InferenceConfig, seeds: int):
        self.target, self.gain = cfg.kl_target, cfg.kl_gain
        self.kind, self.level0 = held_knob(cfg)
        self.log_c = torch.zeros(seeds, dtype=torch.float64)

    @property
    def scale(self) -> Tensor:
        """c_t per seed, float32 [S]: what the inference engine multiplies its perturbation by."""
        return self.log_c.exp().float()

    def level(self) -> Tensor:
        """The perturbation's level this step per seed [S] (float64): sigma_t, or delta_t for the bias."""
        c = self.log_c.exp()
        return self.level0 ** c if self.kind == "bias" else self.level0 * c

    def metrics(self) -> dict[str, Tensor]:
        return {M.PERTURB_SCALE: self.log_c.exp(), M.PERTURB_LEVEL: self.level()}

    def update(self, k3: Tensor) -> None:
        """After a step: log c += g (1 - k3 / K*) per seed (a non-finite k3 leaves its seed's scale)."""
        k = k3.detach().double().cpu()
        step = torch.where(torch.isfinite(k), self.gain * (1.0 - k.clamp(min=0.0) / self.target), 0.0)
        self.log_c = (self.log_c + step).clamp(math.log(C_MIN), math.log(C_MAX))

    def state(self, s: int) -> dict:
        return {"log_c": float(self.log_c[s])}

    def load_state(self, s: int, state: dict) -> None:
        self.log_c[s] = state["log_c"]

"""Importance ratios between the training engine and the inference engine's sampling pass.

    log rho_t = logp_rec_t - logp_roll_t                                  (token level)
    log rho   = sum_t mask_t (logp_rec_t - logp_roll_t), broadcast over t  (sequence level)

clamped to +-20 before exponentiating (verl's SAFETY_BOUND) and zeroed on padding, exactly as
``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights`` does, so TIS, MIS and
IcePop agree with verl's functions on the same tensors (tests/estimators/test_verl_parity.py).
"""
import torch
from torch import Tensor

SAFETY_BOUND = 20.0
LEVELS = ("token", "sequence")


def importance_ratio(logp_rec: Tensor, logp_roll: Tensor, mask: Tensor, level: str) -> Tensor:
    log_ratio = logp_rec - logp_roll
    if level == "token":
        rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    elif level == "sequence":
        total = (log_ratio * mask).sum(-1, keepdim=True)
        rho = torch.exp(total.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    else:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    return rho * mask

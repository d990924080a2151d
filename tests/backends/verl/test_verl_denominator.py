"""MIS on verl: the tokens rejection sampling masks leave the token-mean denominator (issue 14).

The batch goes through the legacy trainer's own steps, in its order (``ray_trainer.fit``):
``compute_rollout_correction_and_add_to_batch`` (weights + rejection, updates ``response_mask``),
then ``_update_actor``'s ``left_right_2_no_padding`` (``loss_mask := response_mask``), the engine's
denominator ``batch_num_tokens = loss_mask.sum()`` (``FSDPEngine.forward_backward_batch``; the
megatron engine reads the same key), then verl's ``ppo_loss`` -> vanilla -> ``agg_loss``. Only the
one ``.sum()`` line of the engine is re-typed (it needs a process group and a model to call).
The V1 trainer stores ``loss_mask`` once at rollout, before rejection: the same sum over the
pre-rejection mask gives a different loss, which this test also shows.
"""
from __future__ import annotations

import pytest
import torch

from harness.backends.local.trainer import ppo_loss as local_ppo_loss
from harness.backends.verl import translate
from harness.estimators import build
from harness.estimators.base import PolicyForward

B, P, R = 32, 3, 10


def _legacy_batch(seed: int = 0):
    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(2, R + 1, (B,), generator=g)
    resp_mask = (torch.arange(R) < lens[:, None]).long()
    attn = torch.cat([torch.ones(B, P, dtype=torch.long), resp_mask], 1)
    input_ids = torch.randint(1, 50, (B, P + R), generator=g) * attn
    position_ids = (attn.cumsum(1) - 1).clamp(min=0)
    logp_roll = -torch.rand(B, R, generator=g, dtype=torch.float64) * 3
    logp_old = logp_roll + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.4
    logp_new = logp_old + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, R).contiguous()
    batch = DataProto.from_dict(tensors={
        "prompts": input_ids[:, :P], "responses": input_ids[:, P:], "input_ids": input_ids,
        "attention_mask": attn, "position_ids": position_ids, "response_mask": resp_mask,
        "old_log_probs": logp_old, "rollout_log_probs": logp_roll, "advantages": adv * resp_mask})
    return batch, logp_new, lens


def _nested_full_sequence_logprobs(logp_new, lens):
    """The engine's log-prob output: one value per token of each unpadded sequence (no_padding layout);
    no_padding_2_padding reads response token t at position P + t - 1."""
    rows = []
    for b in range(B):
        seq = torch.zeros(P + int(lens[b]), dtype=torch.float64)
        seq[P - 1: P - 1 + int(lens[b])] = logp_new[b, : int(lens[b])]
        rows.append(seq)
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


@pytest.mark.parametrize("level", ["sequence", "token"])
def test_mis_rejected_tokens_leave_the_denominator_on_the_legacy_trainer(spec, level):
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    cfg = spec("estimator=mis", f"estimator.level={level}", "model=qwen3_4b", "estimator.clip_c=1.5")
    vc = translate.verl_config(cfg, check=False)
    assert vc.trainer.use_v1 is False  # the trainer whose order of steps is reproduced here
    actor = omega_conf_to_dataclass(vc.actor_rollout_ref.actor)

    batch, logp_new, lens = _legacy_batch()
    pre_mask = batch.batch["response_mask"].clone()
    batch, metrics = compute_rollout_correction_and_add_to_batch(batch, vc.algorithm.rollout_correction)
    assert 0 < metrics["rollout_corr/rollout_rs_masked_fraction"] < 1  # some tokens are rejected

    td = left_right_2_no_padding(batch.to_tensordict())
    batch_num_tokens = td["loss_mask"].sum().item()  # FSDPEngine.forward_backward_batch
    tu.assign_non_tensor(td, batch_num_tokens=batch_num_tokens, dp_size=1, global_batch_size=B)
    loss, _ = ppo_loss(actor, {"log_probs": _nested_full_sequence_logprobs(logp_new, lens)}, td)

    # the local backend: MIS weight and mask from our estimator, token mean over the kept tokens
    class Ctx:
        logp_roll, mask, routed_experts = batch.batch["rollout_log_probs"], pre_mask.double(), None

        def recompute(self, replay=None):
            return PolicyForward(logp=batch.batch["old_log_probs"])

    old = build(cfg.estimator).old_policy(Ctx())
    ratio = torch.exp(logp_new - batch.batch["old_log_probs"])
    want, _ = local_ppo_loss(ratio, batch.batch["advantages"], old.weight, old.mask, cfg.trainer.clip_eps)
    assert batch_num_tokens == old.mask.sum().item() < pre_mask.sum().item()
    torch.testing.assert_close(loss.double(), want)

    # what V1 computes: the same numerator over the pre-rejection token count -> a smaller loss scale
    v1 = loss * batch_num_tokens / pre_mask.sum().item()
    assert not torch.allclose(v1.double(), want)

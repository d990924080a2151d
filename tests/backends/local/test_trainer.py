"""GRPO advantages, the PPO-clipped loss, and the trainer's use of estimator weights and masks."""
import torch

from harness.backends.local.trainer import grpo_advantages, ppo_loss


def test_grpo_advantages_are_group_normalised():
    r = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.2, 0.4])
    a = grpo_advantages(r, group_size=2)
    torch.testing.assert_close(a[:2], torch.tensor([0.7071, -0.7071]), atol=1e-3, rtol=0)
    torch.testing.assert_close(a[2:4], torch.zeros(2))  # identical rewards: no signal
    assert a.shape == r.shape


def test_ppo_loss_clips_and_weights_and_masks():
    ratio = torch.tensor([[1.5, 0.5, 1.0]])
    adv = torch.tensor([[1.0]])
    weight = torch.tensor([[2.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, clipfrac = ppo_loss(ratio, adv, weight, mask, clip_eps=0.2)
    # token 0: min(1.5, 1.2) * 2 = 2.4; token 1: min(0.5, 0.8) = 0.5; token 2 masked out
    torch.testing.assert_close(loss, torch.tensor(-(2.4 + 0.5) / 2))
    torch.testing.assert_close(clipfrac, torch.tensor(1.0))
    neg, _ = ppo_loss(ratio, -adv, torch.ones_like(weight), mask, clip_eps=0.2)
    # negative advantage: min(-1.5, -1.2) = -1.5 (unclipped: the PPO hazard of heavy-tailed ratios)
    torch.testing.assert_close(neg, torch.tensor((1.5 + 0.8) / 2))


def test_loss_gradient_flows_only_through_the_ratio():
    logp_new = torch.log(torch.tensor([[0.5, 0.4]])).requires_grad_()
    logp_old = torch.log(torch.tensor([[0.5, 0.5]]))
    loss, _ = ppo_loss(torch.exp(logp_new - logp_old), torch.tensor([[1.0]]), torch.ones(1, 2), torch.ones(1, 2), 0.2)
    loss.backward()
    assert logp_new.grad is not None and torch.all(logp_new.grad < 0)

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
    """d loss / d logp_new = -w A r / T on unclipped tokens (r = exp(logp_new - logp_old), w the estimator's
    weight, T tokens), 0 where the clip binds (A > 0, r > 1 + eps)."""
    logp_new = torch.log(torch.tensor([[0.5, 0.45, 0.8]])).requires_grad_()
    logp_old = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    ratio = torch.exp(logp_new - logp_old)  # [1, 0.9, 1.6]: the last one clipped at 1.2
    loss, _ = ppo_loss(ratio, torch.tensor([[1.0]]), torch.tensor([[1.0, 2.0, 1.0]]), torch.ones(1, 3), 0.2)
    loss.backward()
    torch.testing.assert_close(logp_new.grad, torch.tensor([[-1.0 / 3, -2 * 0.9 / 3, 0.0]]))


def test_mismatch_bias_and_variance_terms_add_up_to_the_mean_squared_log_ratio():
    from harness.backends.local.trainer import noise_terms

    g = torch.Generator().manual_seed(0)
    rec = torch.randn(2, 5, 7, generator=g)  # [S, B, R]
    inf = rec[:, None] + 0.3 + 0.5 * torch.randn(2, 4, 5, 7, generator=g)  # [S, n, B, R]: a bias and noise
    total = (rec[:, None] - inf).pow(2).mean(1).flatten(1).mean(1)  # E_i[(logp_rec - logp_inf[i])^2]
    t = noise_terms(rec, inf)
    torch.testing.assert_close(t["mismatch/bias_sq"] + t["noise/var_rollout"], total)
    assert torch.equal(t["noise/var_rollout"], inf.var(1, unbiased=False).flatten(1).mean(1))  # as before, bitwise
    assert torch.equal(t["mismatch/outside_support_frac"], torch.zeros(2))
    torch.testing.assert_close(noise_terms(rec, rec[:, None].expand_as(inf).clone())["mismatch/bias_sq"], torch.zeros(2))
    # seed 1: one pass gives token (0, 0) probability 0 (outside its nucleus): that token leaves both terms
    cut = inf.clone()
    cut[1, 2, 0, 0] = float("-inf")
    c = noise_terms(rec, cut)
    keep = torch.ones(5, 7, dtype=torch.bool)
    keep[0, 0] = False
    want = ((rec[1] - inf[1].mean(0)).pow(2))[keep].mean()
    torch.testing.assert_close(c["mismatch/bias_sq"][1], want)
    assert torch.equal(c["mismatch/bias_sq"][0], t["mismatch/bias_sq"][0])  # the other seed: untouched
    torch.testing.assert_close(c["mismatch/outside_support_frac"], torch.tensor([0.0, 1 / (4 * 5 * 7)]))


_DIAG = ["trainer.prompts_per_step=8", "trainer.group_size=4", "trainer.num_minibatches=2", "task.warmstart.max_steps=3",
         "task.warmstart.batch_size=8", "diagnostics.noise_passes=8", "diagnostics.noise_sequences=32",
         "inference.router_noise_sigma=0"]


def _bias_and_var(*arm: str) -> tuple[float, float]:
    from harness.backends.local.trainer import LocalTrainer
    from harness.spec import load

    m = LocalTrainer(load([*_DIAG, *arm]), torch.device("cpu")).run_step()
    return m["mismatch/bias_sq"], m["noise/var_rollout"]


def test_noise_shows_in_the_variance_term_and_a_bias_in_the_bias_term():
    """Fixed seeds, one step, 8 diagnostic passes. Logit noise (N(0, 0.5^2) on the output logits, unbiased in
    logit space; its log-prob bias is second order): the variance term dominates (0.186 vs 0.040 at seed 1).
    The bias perturbation (delta 0.3, no noise knob): the bias term dominates by orders of magnitude. (With n
    passes the bias term also carries Var/n of sampling error: E[bias_sq] = b^2 + sigma^2 / n.)"""
    bias, var = _bias_and_var("inference.logit_noise_sigma=0.5", "seed=1")
    assert var > 3 * bias > 0
    bias, var = _bias_and_var("inference.bias_delta=0.3", "seed=1")
    assert bias > 1000 * var > 0


def test_a_float16_inference_run_trains_end_to_end():
    """``inference.dtype=float16`` through the trainer: the rollout, scorings and diagnostics in float16, finite."""
    import math

    from harness.backends.local.trainer import LocalTrainer
    from harness.spec import load

    tiny = ["trainer.steps=2", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
            "task.warmstart.max_steps=3", "task.warmstart.batch_size=8", "diagnostics.noise_passes=2"]
    cfg = load(["estimator=geo_rs", "inference.dtype=float16", *tiny])
    torch.manual_seed(0)
    tr = LocalTrainer(cfg, torch.device("cpu"))
    assert tr.infer.dtype == torch.float16
    for _ in range(cfg.trainer.steps):
        m = tr.run_step()
        assert all(math.isfinite(v) for k, v in m.items() if not k.startswith("moe/replay")), m


def test_the_logged_update_norm_is_the_steps_parameter_change():
    """``policy/update_norm`` (issue 31's conservative-update control, docs/preregistration.md section 4) is the L2
    norm over every parameter of the change one step makes (all its minibatch updates), measured here from the
    policy's weights before and after the step; and ``mismatch/abs_diff`` is a mean absolute log-prob gap (>= 0,
    at least |k1|'s mean, the signed gap's)."""
    import math

    from harness.backends.local.trainer import LocalTrainer
    from harness.spec import load

    tiny = ["trainer.steps=2", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
            "task.warmstart.max_steps=3", "task.warmstart.batch_size=8", "diagnostics.noise_passes=2"]
    cfg = load(["estimator=recompute", *tiny])
    torch.manual_seed(0)
    tr = LocalTrainer(cfg, torch.device("cpu"))
    for _ in range(cfg.trainer.steps):
        before = {k: w.detach().clone() for k, w in tr.policy.weights().items()}
        m = tr.run_step()
        after = tr.policy.weights()
        by_hand = math.sqrt(sum(float(((after[k].detach() - before[k]).double() ** 2).sum()) for k in before))
        assert m["policy/update_norm"] > 0 and math.isclose(m["policy/update_norm"], by_hand, rel_tol=1e-5)
        assert m["mismatch/abs_diff"] >= abs(m["mismatch/rec_k1"]) - 1e-12

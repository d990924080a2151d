"""The trainer's IS and routing diagnostics against their formulas (docs/metrics.md), on hand-made tensors:
``is/ess`` = (sum w)^2 / (N sum w^2), ``moe/routing_flip_rate`` = share of tokens whose top-k set differs in
some layer, ``moe/router_kl`` = KL(router_rollout || router_train), mean over layers and tokens; per seed."""
import math

import torch

from harness.backends.local.trainer import is_ess, router_kl, routing_flip_rate


# ------------------------------------------------------------------------------------------------- is/ess
def test_ess_is_the_squared_sum_over_n_times_the_sum_of_squares_of_the_masked_weights():
    w = torch.tensor([[[1.0, 2.0, 3.0, 4.0]],
                      [[2.0, 0.5, 9.0, 1.0]]])  # [S=2, B=1, R=4]
    mask = torch.tensor([[[1.0, 1.0, 1.0, 1.0]],
                         [[1.0, 1.0, 0.0, 1.0]]])  # seed 1: the 9 is not a token
    want0 = (1 + 2 + 3 + 4) ** 2 / (4 * (1 + 4 + 9 + 16))  # 100 / 120
    want1 = (2 + 0.5 + 1) ** 2 / (3 * (4 + 0.25 + 1))  # 12.25 / 15.75: N = 3, the masked token left out
    torch.testing.assert_close(is_ess(w, mask), torch.tensor([want0, want1]))
    assert math.isclose(want0, 5 / 6) and math.isclose(want1, 7 / 9)


def test_ess_counts_a_zero_weight_token_in_n():
    """A token the estimator kept in its mask but weighted 0 (IcePop) is one of the N tokens."""
    w = torch.tensor([[[3.0, 0.0, 3.0, 0.0]]])
    torch.testing.assert_close(is_ess(w, torch.ones(1, 1, 4)), torch.tensor([(3.0 + 3.0) ** 2 / (4 * (9.0 + 9.0))]))
    assert is_ess(w, torch.ones(1, 1, 4)).item() == 0.5


def test_ess_of_a_seed_whose_weights_are_all_zero_is_zero_not_nan():
    """IcePop can zero every token it keeps: no weight mass, no effective sample (0/0 would log NaN)."""
    got = is_ess(torch.zeros(2, 1, 3), torch.ones(2, 1, 3))
    assert torch.equal(got, torch.zeros(2))


def test_ess_of_a_seed_without_tokens_is_zero_and_seeds_are_independent():
    w = torch.tensor([[[1.0, 2.0], [3.0, 4.0]],
                      [[5.0, 6.0], [7.0, 8.0]]])  # [S=2, B=2, R=2]
    mask = torch.tensor([[[1.0, 1.0], [0.0, 1.0]],
                         [[0.0, 0.0], [0.0, 0.0]]])
    got = is_ess(w, mask)
    assert got[1].item() == 0.0
    torch.testing.assert_close(got[0], torch.tensor((1 + 2 + 4) ** 2 / (3 * (1 + 4 + 16.0))))
    # the other seed's weights and tokens change nothing in seed 0 (bitwise)
    w2, mask2 = w.clone(), mask.clone()
    w2[1], mask2[1] = 100.0, 1.0
    got2 = is_ess(w2, mask2)
    assert torch.equal(got2[0], got[0]) and got2[1].item() == 1.0


def test_ess_bounds_one_for_equal_weights_one_over_n_for_a_single_weight_and_scale_invariance():
    n = 12
    mask = torch.ones(3, 3, 4)
    uniform = torch.full((3, 3, 4), 0.7)
    torch.testing.assert_close(is_ess(uniform, mask), torch.ones(3))
    single = torch.zeros(3, 3, 4)
    single[:, 1, 2] = torch.tensor([0.1, 2.0, 50.0])
    torch.testing.assert_close(is_ess(single, mask), torch.full((3,), 1 / n))
    # any weights: 1/N <= ESS <= 1 (Cauchy-Schwarz), and ESS(c w) = ESS(w)
    g = torch.Generator().manual_seed(0)
    w = torch.rand(3, 3, 4, generator=g).pow(4)
    ess = is_ess(w, mask)
    assert ((ess >= 1 / n) & (ess <= 1)).all() and (ess < 0.99).all()
    torch.testing.assert_close(is_ess(7.5 * w, mask), ess)
    # Kish's effective sample size (sum w)^2 / sum w^2, divided by N
    torch.testing.assert_close(ess, w.flatten(1).sum(1) ** 2 / w.flatten(1).pow(2).sum(1) / n)


# ------------------------------------------------------------------------------------ moe/routing_flip_rate
def _routing() -> tuple[torch.Tensor, torch.Tensor]:
    """[S=2, B=1, R=3, L=2, k=2] rollout and training top-k ids. Seed 0: token 0 the same sets in another
    slot order (no flip), token 1 one id differs in layer 1 only (a flip), token 2 every id differs in both
    layers (one flip, not four). Seed 1: the same routing everywhere."""
    roll = torch.tensor([[[[[1, 3], [0, 2]],
                           [[4, 5], [1, 2]],
                           [[0, 1], [2, 3]]]],
                         [[[[1, 2], [3, 4]],
                           [[0, 5], [1, 3]],
                           [[2, 4], [0, 1]]]]])
    rec = torch.tensor([[[[[3, 1], [2, 0]],
                          [[4, 5], [6, 2]],
                          [[6, 7], [4, 5]]]],
                        [[[[2, 1], [3, 4]],
                          [[0, 5], [3, 1]],
                          [[2, 4], [0, 1]]]]])
    return roll, rec


def test_flip_rate_is_the_share_of_tokens_with_another_top_k_set_in_any_layer_counted_once():
    roll, rec = _routing()
    torch.testing.assert_close(routing_flip_rate(roll, rec, None), torch.tensor([2 / 3, 0.0]))
    # the order of the k slots is no flip; any one id in any one layer is
    assert routing_flip_rate(roll[:, :, :1], rec[:, :, :1], None).tolist() == [0.0, 0.0]
    assert routing_flip_rate(roll[:, :, 1:2], rec[:, :, 1:2], None).tolist() == [1.0, 0.0]


def test_flip_rate_over_the_policy_tokens_leaves_out_masked_tokens_and_unknown_routing():
    roll, rec = _routing()
    policy = torch.ones(2, 1, 3)
    torch.testing.assert_close(routing_flip_rate(roll, rec, policy), torch.tensor([2 / 3, 0.0]))
    # seed 0's token 1 (a flip) not the policy's: 1 flip (token 2) in 2 tokens
    p = policy.clone()
    p[0, 0, 1] = 0.0
    torch.testing.assert_close(routing_flip_rate(roll, rec, p), torch.tensor([1 / 2, 0.0]))
    # token 2 without rollout routing in one layer (replay_on_miss=missing: -1): left out, not a flip;
    # seed 1's token 0 too (its rollout id -1 differs from training's: a flip, were it kept)
    unknown = roll.clone()
    unknown[0, 0, 2, 1] = -1
    unknown[1, 0, 0, 0, 0] = -1
    torch.testing.assert_close(routing_flip_rate(unknown, rec, policy), torch.tensor([1 / 2, 0.0]))
    # no known policy token: 0
    none_known = roll.clone()
    none_known[0] = -1
    assert routing_flip_rate(none_known, rec, policy)[0].item() == 0.0


def test_flip_rate_seeds_are_independent():
    roll, rec = _routing()
    got = routing_flip_rate(roll, rec, torch.ones(2, 1, 3))
    other = rec.clone()
    other[1] = 7  # every token of seed 1 flips
    got2 = routing_flip_rate(roll, other, torch.ones(2, 1, 3))
    assert torch.equal(got2[0], got[0]) and got2[1].item() == 1.0


# ---------------------------------------------------------------------------------------------- moe/router_kl
def _kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def test_router_kl_is_kl_of_rollout_to_training_mean_over_layers_then_tokens():
    # [S=1, B=1, R=2, L=2, E=2] router probabilities
    p_roll = torch.tensor([[[[[0.5, 0.5], [0.9, 0.1]],
                             [[0.2, 0.8], [0.6, 0.4]]]]])
    p_rec = torch.tensor([[[[[0.25, 0.75], [0.5, 0.5]],
                            [[0.2, 0.8], [0.3, 0.7]]]]])
    kl00 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # = 0.5 ln(4/3)
    kl01 = 0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    kl10 = 0.0  # the same distribution
    kl11 = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    assert math.isclose(kl00, 0.5 * math.log(4 / 3)) and math.isclose(kl01, _kl([0.9, 0.1], [0.5, 0.5]))
    want = ((kl00 + kl01) / 2 + (kl10 + kl11) / 2) / 2
    torch.testing.assert_close(router_kl(p_roll.log(), p_rec.log(), None), torch.tensor([want]))
    torch.testing.assert_close(router_kl(p_roll.log(), p_rec.log(), torch.ones(1, 1, 2)), torch.tensor([want]))
    # its direction: KL(rollout || training), not the reverse
    reverse = (_kl([0.25, 0.75], [0.5, 0.5]) + _kl([0.5, 0.5], [0.9, 0.1]) + _kl([0.3, 0.7], [0.6, 0.4])) / 4
    assert not math.isclose(want, reverse, rel_tol=1e-3)
    torch.testing.assert_close(router_kl(p_rec.log(), p_roll.log(), None), torch.tensor([reverse]))
    # a masked token (the observation of a multi-turn response) is left out
    torch.testing.assert_close(router_kl(p_roll.log(), p_rec.log(), torch.tensor([[[0.0, 1.0]]])),
                               torch.tensor([(kl10 + kl11) / 2]))


def test_router_kl_is_zero_for_identical_routers_nonnegative_and_seeds_are_independent():
    g = torch.Generator().manual_seed(1)
    a = torch.log_softmax(torch.randn(3, 2, 5, 2, 4, generator=g), -1)  # [S, B, R, L, E]
    b = torch.log_softmax(torch.randn(3, 2, 5, 2, 4, generator=g), -1)
    assert torch.equal(router_kl(a, a.clone(), None), torch.zeros(3))
    kl = router_kl(a, b, None)
    assert (kl > 0).all()
    # the same as torch's kl_div(input=log q, target=log p) = p (log p - log q), summed over experts
    ref = torch.nn.functional.kl_div(b, a, reduction="none", log_target=True).sum(-1).flatten(1).mean(1)
    torch.testing.assert_close(kl, ref)
    # seed 1 identical in both: 0, whatever the other seeds
    b2 = b.clone()
    b2[1] = a[1]
    kl2 = router_kl(a, b2, None)
    assert kl2[1].item() == 0.0 and torch.equal(kl2[[0, 2]], kl[[0, 2]])

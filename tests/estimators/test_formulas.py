"""Each estimator against hand-computed tensors (docs/design.md section 2)."""
import math
from pathlib import Path

import pytest
import torch

from harness.spec import ConfigError, EstimatorConfig
from harness.estimators import NAMES, PolicyForward, build
from harness.estimators.mean_n import log_mean_prob
from harness.estimators.rais import rais_ratio, router_shift_gamma

# the loss code runs under device_guard.StrictDevice: a tensor made on the default device fails (issue 44)
pytestmark = pytest.mark.usefixtures("strict_device")

ROOT = Path(__file__).resolve().parents[2]

L = torch.log


class Ctx:
    """Hand-made quantities in place of the engines (the estimator math is what is tested)."""

    def __init__(self, logp_roll, logp_rec, scores=None, routed=None, router_logp=None, selected=None):
        self.logp_roll = logp_roll
        self.mask = torch.ones_like(logp_roll)
        self.routed_experts = routed
        self._rec, self._scores = logp_rec, scores
        self.router_logp, self.selected = router_logp, selected
        self.calls = []

    def recompute(self, replay=None):
        self.calls.append(("recompute", replay))
        return PolicyForward(self._rec, router_logp=self.router_logp, selected=self.selected)

    def score(self, n):
        self.calls.append(("score", n))
        return self._scores[:n]


ROLL = L(torch.tensor([[0.25, 0.30], [0.50, 0.40]]))
REC = L(torch.tensor([[0.50, 0.90], [0.60, 0.40]]))  # ratios [[2, 3], [1.2, 1.0]]


def est(name, **kw):
    return build(EstimatorConfig(name=name, **kw))


def test_registry_finds_every_shipped_estimator():
    """Discovery (pkgutil over the package) finds at least the shipped modules; a new one only adds."""
    shipped = {p.stem for p in (ROOT / "experiments" / "estimator").glob("*.yaml")}
    assert shipped and shipped <= set(NAMES)


def test_rollout_and_deterministic_use_the_sampling_logprob_and_no_training_forward():
    for name, kw in (("rollout", {}), ("deterministic", {"noise": "removed"}), ("deterministic", {"noise": "frozen"})):
        ctx = Ctx(ROLL, REC)
        old = est(name, **kw).old_policy(ctx)
        torch.testing.assert_close(old.logp, ROLL)
        assert ctx.calls == [] and torch.all(old.weight == 1)
    assert build(EstimatorConfig("deterministic", noise="removed")).needs.deterministic
    assert not build(EstimatorConfig("rollout")).needs.deterministic


def test_deterministic_removes_the_noise_sources_or_freezes_them():
    """``removed``: deterministic mode with the noise knobs off (only precision differs from training);
    ``frozen``: deterministic mode keeping them (the engine freezes them: a biased arm). Nothing else moves."""
    from harness.spec import load

    icfg = load(["inference.router_noise_sigma=1.0", "inference.logit_noise_sigma=0.5",
                 "inference.bias_delta=0.7"]).inference
    removed = est("deterministic", noise="removed").inference(icfg)
    assert removed.deterministic and (removed.router_noise_sigma, removed.logit_noise_sigma) == (0.0, 0.0)
    assert removed.bias_delta == 0.7 and removed.dtype == icfg.dtype  # a bias is not noise; precision stays
    frozen = est("deterministic", noise="frozen").inference(icfg)
    assert frozen.deterministic and (frozen.router_noise_sigma, frozen.logit_noise_sigma) == (1.0, 0.5)
    assert est("rollout").inference(icfg) is icfg and not icfg.deterministic  # the spec's own is untouched
    with pytest.raises(ConfigError, match="removed, frozen"):
        est("deterministic", noise="fresh")
    from harness.estimators import label

    assert [label("deterministic", {"noise": v}) for v in ("removed", "frozen", None)] == [
        "deterministic(removed)", "deterministic(frozen)", "deterministic"]  # None: an old run's tags


def test_no_deterministic_spec_has_the_signature_of_the_old_frozen_runs():
    """Runs stored before issue 15 signed ``deterministic`` without ``noise`` and meant the frozen projection:
    both arms now sign their ``noise``, so neither answers with an old run."""
    from harness.spec import load, signature

    old = load(["estimator=deterministic"]).to_dict()
    del old["estimator"]["noise"]  # how the old runs were signed (the estimator had no parameters)
    new = {load(["estimator=deterministic", f"estimator.noise={v}"]).signature for v in ("removed", "frozen")}
    assert signature(old) not in new and len(new) == 2


def test_recompute():
    old = est("recompute").old_policy(Ctx(ROLL, REC))
    torch.testing.assert_close(old.logp, REC)
    assert torch.all(old.weight == 1)


def test_tis_token_and_sequence():
    old = est("tis", clip_c=2.5, level="token").old_policy(Ctx(ROLL, REC))
    torch.testing.assert_close(old.logp, REC)
    torch.testing.assert_close(old.weight, torch.tensor([[2.0, 2.5], [1.2, 1.0]]))
    old = est("tis", clip_c=2.5, level="sequence").old_policy(Ctx(ROLL, REC))
    torch.testing.assert_close(old.weight, torch.tensor([[2.5, 2.5], [1.2, 1.2]]))  # min(6, 2.5), min(1.2, 2.5)


def test_mis_masks_whole_sequences_above_c():
    old = est("mis", clip_c=2.0, level="sequence").old_policy(Ctx(ROLL, REC))
    torch.testing.assert_close(old.weight, torch.tensor([[0.0, 0.0], [1.2, 1.2]]))
    torch.testing.assert_close(old.mask, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    old = est("mis", clip_c=2.5, level="token").old_policy(Ctx(ROLL, REC))
    torch.testing.assert_close(old.weight, torch.tensor([[2.0, 0.0], [1.2, 1.0]]))


def test_icepop_zeroes_outside_the_band_but_keeps_tokens_in_the_denominator():
    roll = L(torch.tensor([[0.5, 0.4, 0.1]]))
    rec = L(torch.tensor([[0.2, 0.4, 0.6]]))  # k = 0.4, 1.0, 6.0
    old = est("icepop", alpha=0.5, beta=5.0).old_policy(Ctx(roll, rec))
    torch.testing.assert_close(old.weight, torch.tensor([[0.0, 1.0, 0.0]]))
    assert torch.all(old.mask == 1)


def test_mean_n_is_the_log_of_the_mean_probability_not_the_mean_log():
    scores = L(torch.tensor([[[0.2]], [[0.4]], [[0.9]], [[0.1]]]))
    ctx = Ctx(ROLL[:1, :1], REC[:1, :1], scores=scores)
    old = est("mean_n", n=2).old_policy(ctx)
    torch.testing.assert_close(old.logp, L(torch.tensor([[0.3]])))
    assert ctx.calls == [("score", 2)]
    assert not math.isclose(old.logp.item(), math.log(math.sqrt(0.2 * 0.4)))  # geometric mean differs
    torch.testing.assert_close(log_mean_prob(scores), L(torch.tensor([[0.4]])))


def test_mean_n_leaves_out_a_token_that_no_pass_keeps():
    """processed mode with top-k / top-p: a pass can give the sampled token probability 0 (log-prob -inf). With
    every pass at 0 there is no finite pi_old: that token is left out of the loss (mask 0, logp 0), never a -inf
    that makes the PPO ratio and the loss infinite (the run would be stopped as 'diverged')."""
    inf = float("inf")
    scores = torch.tensor([[[L(torch.tensor(0.2)).item(), -inf, -inf]], [[-inf, -inf, L(torch.tensor(0.4)).item()]]])
    ctx = Ctx(ROLL[:1, :1].expand(1, 3), REC[:1, :1].expand(1, 3), scores=scores)
    old = est("mean_n", n=2).old_policy(ctx)
    torch.testing.assert_close(old.logp, torch.tensor([[math.log(0.1), 0.0, math.log(0.2)]]))
    torch.testing.assert_close(old.mask, torch.tensor([[1.0, 0.0, 1.0]]))
    from harness.backends.local.trainer import ppo_loss
    loss, _ = ppo_loss((REC[:1, :1].expand(1, 3) - old.logp).exp(), torch.tensor([[1.0]]), old.weight, old.mask, 0.2)
    assert math.isfinite(loss.item())


def test_r3_replays_the_rollout_routing():
    routed = torch.tensor([[[[1, 2]], [[0, 3]], [[-1, -1]]]])
    ctx = Ctx(ROLL[:1], REC[:1], routed=routed)
    old = est("r3").old_policy(ctx)
    assert ctx.calls[0][0] == "recompute" and ctx.calls[0][1] is routed
    assert old.replay is routed
    with pytest.raises(ValueError, match="router"):
        est("r3").old_policy(Ctx(ROLL, REC, routed=None))


def test_rais_gamma_formula_and_floor():
    old_lp = L(torch.tensor([[[0.5, 0.3, 0.2]]]))  # [tokens=1, L=1, E=3]
    new_lp = old_lp + torch.tensor([[[0.1, -0.3, 5.0]]])
    top = torch.tensor([[[0, 1]]])  # old top-2: experts 0, 1
    gamma = router_shift_gamma(new_lp, old_lp, top)
    torch.testing.assert_close(gamma, torch.tensor([math.exp(-(0.1 + 0.3) / 2)]))
    r = torch.tensor([1.5])
    torch.testing.assert_close(rais_ratio(r, gamma, 0.8), r * math.exp(-0.2))
    torch.testing.assert_close(rais_ratio(r, torch.tensor([0.1]), 0.8), r * 0.8)


def test_rais_ratio_hook_uses_current_router_and_detaches_gamma():
    rlp = L(torch.tensor([[[[0.6, 0.3, 0.1]]]]))  # [B=1, R=1, L=1, E=3]
    sel = torch.tensor([[[[0, 1]]]])
    e = est("rais", gamma_min=0.8)
    old = e.old_policy(Ctx(L(torch.tensor([[0.5]])), L(torch.tensor([[0.5]])), router_logp=rlp, selected=sel))
    new_router = (rlp + torch.tensor([0.2, -0.2, 0.0])).requires_grad_()
    logp_new = L(torch.tensor([[0.6]])).requires_grad_()
    r = e.ratio(logp_new, old, PolicyForward(logp_new, router_logp=new_router))
    torch.testing.assert_close(r, torch.tensor([[1.2 * math.exp(-0.2)]]))
    r.sum().backward()
    assert new_router.grad is None or torch.all(new_router.grad == 0)
    assert logp_new.grad is not None and logp_new.grad.abs().sum() > 0


# two passes whose mean probability is exactly ROLL's: [[.2, .3], [.4, .5]] and [[.3, .3], [.6, .3]]
PASSES = L(torch.tensor([[[0.2, 0.3], [0.4, 0.5]], [[0.3, 0.3], [0.6, 0.3]]]))


def test_mean_n_tis_is_tis_with_the_mean_n_probability_in_the_denominator():
    """w = min(pi_rec / pi_mean_n, C), pi_mean_n = mean of the passes' probabilities (here = ROLL's), so the
    ratios are [[2, 3], [1.2, 1.0]] as in the TIS test; the sampling pass's own log-prob is never read."""
    far = torch.full_like(ROLL, math.log(0.9))  # a logp_roll that would give other weights
    ctx = Ctx(far, REC, scores=PASSES)
    old = est("mean_n_tis", n=2, clip_c=2.5, level="token").old_policy(ctx)
    torch.testing.assert_close(old.logp, REC)
    torch.testing.assert_close(old.weight, torch.tensor([[2.0, 2.5], [1.2, 1.0]]))
    assert ctx.calls == [("recompute", None), ("score", 2)] and torch.all(old.mask == 1)
    old = est("mean_n_tis", n=2, clip_c=2.5, level="sequence").old_policy(Ctx(far, REC, scores=PASSES))
    torch.testing.assert_close(old.weight, torch.tensor([[2.5, 2.5], [1.2, 1.2]]))  # min(6, 2.5), min(1.2, 2.5)
    # with n = 1 the single pass is the denominator: pi_rec / p1 = [[2.5, 3], [1.5, 0.8]]
    old = est("mean_n_tis", n=1, clip_c=10.0, level="token").old_policy(Ctx(far, REC, scores=PASSES))
    torch.testing.assert_close(old.weight, torch.tensor([[2.5, 3.0], [1.5, 0.8]]))


def test_mean_n_tis_checks_both_parameter_sets():
    with pytest.raises(ConfigError, match="estimator.n"):
        est("mean_n_tis", n=0, clip_c=2.0, level="token")
    with pytest.raises(ConfigError, match="estimator.clip_c"):
        est("mean_n_tis", n=4, clip_c=1.0, level="token")
    with pytest.raises(ConfigError, match="estimator.level"):
        est("mean_n_tis", n=4, clip_c=2.0, level="word")
    from harness.estimators import label

    assert label("mean_n_tis", {"n": 8, "clip_c": 2.0, "level": "sequence"}) == "mean_n_tis(n=8,C=2,sequence)"

"""``gmpo_rs`` (GMPO + router shift, RSPO's headline): with routing unchanged it is verl's own GMPO loss
(``compute_policy_loss_geo_mean``), value and gradient, on the same tensors; with routing shifted it is the
hand-written formula (gamma floored, detached, on each token ratio before the log-space clip); packs and masks;
its parameters' checks; and a 3-step run whose curves come back from MLflow."""
import math

import pytest
import torch
from mlflow.tracking import MlflowClient

from harness import metrics as M
from harness.backends.local.agg import agg_loss
from harness.backends.local.trainer import LocalTrainer, PackTrainer
from harness.spec import ConfigError, EstimatorConfig, load
from harness.estimators import OldPolicy, PolicyForward, build
from harness.estimators.rais import router_shift_gamma
from harness.run import execute

# the loss code runs under device_guard.StrictDevice: a tensor made on the default device fails (issue 44)
pytestmark = pytest.mark.usefixtures("strict_device")

B, R, NL, E, K = 6, 5, 2, 4, 2


def batch(seed: int, shift: float):
    """Random logps (a ratio beyond exp(+-0.4) somewhere), a ragged mask (row 5 has one token), advantages of
    both signs and a zero; router log-probs moved by ``shift`` between the old and the new forward."""
    g = torch.Generator().manual_seed(seed)
    old_logp = -torch.rand(B, R, generator=g) * 2
    logp_new = old_logp + torch.randn(B, R, generator=g) * 0.5
    mask = (torch.rand(B, R, generator=g) > 0.25).float()
    mask[:, 0] = 1
    mask[5, 1:] = 0
    adv = torch.tensor([[1.0], [-1.0], [0.5], [-2.0], [0.0], [1.5]])
    rold = torch.log_softmax(torch.randn(B, R, NL, E, generator=g), -1)
    rnew = torch.log_softmax(rold + shift * torch.randn(B, R, NL, E, generator=g), -1)
    sel = rold.topk(K, -1).indices
    old = OldPolicy(old_logp, torch.ones(B, R), mask, router_logp=rold, selected=sel)
    return logp_new.requires_grad_(), rnew.requires_grad_(), old, adv


def ours(logp_new, rnew, old, adv, size=1, gamma_min=0.8, log_clip=0.4):
    est = build(EstimatorConfig(name="gmpo_rs", gamma_min=gamma_min, log_clip=log_clip))
    terms = est.loss(logp_new, old, PolicyForward(logp_new, router_logp=rnew, selected=None), adv, 0.2)
    return agg_loss(terms, old.mask, size)  # as the trainer aggregates, per seed


def by_hand(logp_new, old, adv, gamma, gamma_min, eps):
    """The docstring's formula, one sequence at a time in float64 (no verl, no vectorised clamp)."""
    total = 0.0
    for i in range(B):
        s = float(torch.sign(adv[i, 0]))
        terms = []
        for t in range(R):
            if old.mask[i, t] > 0:
                lr = float(logp_new[i, t] - old.logp[i, t]) + math.log(max(float(gamma[i, t]), gamma_min))
                terms.append(s * min(s * lr, s * min(max(lr, -eps), eps)))
        total += math.exp(sum(terms) / len(terms)) * float(adv[i, 0])
    return -total / B


def verl_geo_mean(logp_new, old_logp, adv, mask, eps):
    core = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")
    clip = type("Clip", (), {"clip_ratio": eps, "clip_ratio_low": eps, "clip_ratio_high": eps})()
    loss, _ = core.compute_policy_loss_geo_mean(old_logp, logp_new, adv.expand(-1, R), mask, config=clip)
    return loss


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eps", [0.2, 0.4])
def test_with_routing_unchanged_it_is_verls_gmpo_loss_and_gradient(seed, eps):
    logp_new, _, old, adv = batch(seed, 0.0)
    loss, _ = ours(logp_new, old.router_logp, old, adv, log_clip=eps)  # new router = old: gamma = 1
    (g_ours,) = torch.autograd.grad(loss.sum(), logp_new)
    theirs = verl_geo_mean(logp_new, old.logp, adv, old.mask, eps)
    (g_theirs,) = torch.autograd.grad(theirs, logp_new)
    torch.testing.assert_close(loss[0], theirs)
    torch.testing.assert_close(g_ours, g_theirs)
    assert (g_ours[old.mask == 0] == 0).all() and (g_ours[4] == 0).all()  # masked tokens, A = 0: no gradient


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma_min", [0.5, 0.8])
def test_with_routing_shifted_it_is_the_formula_with_the_floored_detached_gamma(seed, gamma_min):
    logp_new, rnew, old, adv = batch(seed, 1.0)
    gamma = router_shift_gamma(rnew, old.router_logp, old.selected)
    assert (gamma < 1).all() and (gamma < gamma_min).any() and (gamma > gamma_min).any()  # floor both ways
    loss, clipfrac = ours(logp_new, rnew, old, adv, gamma_min=gamma_min)
    assert math.isclose(loss.item(), by_hand(logp_new.detach(), old, adv, gamma.detach(), gamma_min, 0.4), rel_tol=1e-5)
    assert 0 < clipfrac.item() < 1
    loss.sum().backward()
    assert rnew.grad is None or (rnew.grad == 0).all()  # stop-gradient: the router gets nothing through gamma
    assert logp_new.grad.abs().sum() > 0
    # gamma enters before the clip: with gamma = 1 the same batch gives another loss (and verl's)
    unshifted, _ = ours(logp_new, old.router_logp, old, adv, gamma_min=gamma_min)
    assert not math.isclose(unshifted.item(), loss.item(), rel_tol=1e-3)


def test_a_floor_of_one_removes_the_router_shift():
    logp_new, rnew, old, adv = batch(3, 1.0)
    shifted, _ = ours(logp_new, rnew, old, adv, gamma_min=1.0)
    unshifted, _ = ours(logp_new, old.router_logp, old, adv, gamma_min=1.0)
    assert torch.equal(shifted, unshifted)


def test_a_pack_gives_each_seed_its_own_loss():
    a, ra, oa, adv = batch(0, 1.0)
    b, rb, ob, _ = batch(1, 1.0)
    cat = lambda x, y: None if x is None else torch.cat([x, y])  # noqa: E731
    old = OldPolicy(*(cat(getattr(oa, f), getattr(ob, f)) for f in ("logp", "weight", "mask", "replay",
                                                                      "router_logp", "selected")))
    pack, _ = ours(cat(a, b), cat(ra, rb), old, cat(adv, adv), size=2)
    alone = [ours(a, ra, oa, adv)[0], ours(b, rb, ob, adv)[0]]
    torch.testing.assert_close(pack, torch.cat(alone))


def test_a_seed_trains_bitwise_the_same_alone_and_in_a_pack():
    """The real trainer: seed 1 of a pack of three gmpo_rs seeds has the curve and weights of seed 1 alone."""
    tiny = ["estimator=gmpo_rs", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
            "diagnostics.noise_sequences=4"]
    cfgs = [load([*tiny, f"seed={s}"]) for s in (0, 1, 2)]
    pack, alone = PackTrainer(cfgs, torch.device("cpu")), LocalTrainer(cfgs[1], torch.device("cpu"))
    timeless = lambda d: {k: v for k, v in d.items() if not k.startswith(("time/", "tokens/"))}  # noqa: E731
    for _ in range(3):
        packed, single = pack.step_seeds(), alone.run_step()
        assert timeless(packed[1]) == timeless(single) and timeless(packed[0]) != timeless(packed[1])
    for name, p in alone.policy.weights().items():
        assert torch.equal(p[0], pack.policy.weights()[name][1]), name


@pytest.mark.parametrize("key, value, text", [
    ("log_clip", 0.0, "> 0"), ("log_clip", float("inf"), "finite"), ("log_clip", float("nan"), "> 0"),
    ("gamma_min", 1.5, "(0, 1]"),
])
def test_bad_parameters_are_one_error_naming_the_key(key, value, text):
    with pytest.raises(ConfigError) as exc:
        build(EstimatorConfig(name="gmpo_rs", **{"gamma_min": 0.8, "log_clip": 0.4, key: value}))
    assert exc.value.key == f"estimator.{key}" and text in str(exc.value)
    assert load(["estimator=gmpo_rs", "estimator.log_clip=null"]).estimator.log_clip == 0.4  # null: the default


def test_three_steps_run_and_their_curves_come_back_from_mlflow(tiny_overrides):
    cfg = load(tiny_overrides("estimator=gmpo_rs", steps=3, name="gmpo_rs"))
    assert cfg.estimator.log_clip == 0.4 and cfg.estimator.gamma_min == 0.8
    summary = execute(cfg, progress=False)
    assert summary.status == "finished" and summary.steps_done == 3
    client = MlflowClient(cfg.tracking_uri)
    assert client.get_run(summary.run_id).data.tags["estimator"] == "gmpo_rs"
    for key in (M.POLICY_LOSS, M.POLICY_CLIPFRAC, M.REWARD_MEAN, M.POLICY_GRAD_NORM):
        hist = client.get_metric_history(summary.run_id, key)
        assert sorted(m.step for m in hist) == [0, 1, 2] and all(math.isfinite(m.value) for m in hist), key


def test_plain_gmpo_is_labelled_gmpo_and_gmpo_rs_names_its_floor():
    """gamma_min = 1 floors every gamma <= 1 away: no router shift, plain GMPO (the review: it was labelled
    `gmpo_rs(eps=0.4)`, which reads as GMPO+RS)."""
    from harness.estimators import label

    assert label("gmpo_rs", {"gamma_min": 1.0, "log_clip": 0.4}) == "gmpo(eps=0.4)"
    assert label("gmpo_rs", {"gamma_min": "1.0", "log_clip": 0.4}) == "gmpo(eps=0.4)"  # as a tag's text
    assert label("gmpo_rs", {"gamma_min": 0.8, "log_clip": 0.4}) == "gmpo_rs(gmin=0.8,eps=0.4)"
    assert label("gmpo_rs", {"log_clip": 0.4}) == "gmpo_rs(eps=0.4)"  # the floor unknown

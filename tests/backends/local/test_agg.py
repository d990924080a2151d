"""The loss hook is row-wise (issue 32): no estimator's ``loss`` receives the seed pack's size, and the trainer's
per-seed aggregation of its terms (``agg.agg_loss``) gives each seed of a pack bitwise the loss of that seed alone."""
import inspect

import pytest
import torch

from harness.backends.local.agg import agg_loss
from harness.estimators import REGISTRY, OldPolicy, PolicyForward, build
from harness.estimators.losses import LossTerms
from harness.spec import EstimatorConfig

S, B, R = 3, 4, 5


def test_no_estimator_loss_takes_the_pack_size():
    for name, cls in REGISTRY.items():
        assert list(inspect.signature(cls.loss).parameters) == ["self", "logp_new", "old", "new", "adv",
                                                                 "clip_eps"], name


def test_each_seed_of_a_pack_gets_the_loss_of_the_seed_alone():
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(S * B, R, generator=g)
    logp_new = logp_old + torch.randn(S * B, R, generator=g) * 0.3
    mask = (torch.rand(S * B, R, generator=g) > 0.3).float()
    adv = torch.randn(S * B, 1, generator=g)
    est = build(EstimatorConfig(name="recompute"))
    old = OldPolicy(logp_old, torch.ones_like(mask), mask)
    pack = agg_loss(est.loss(logp_new, old, PolicyForward(logp_new), adv, 0.2), mask, S)
    for j in range(S):
        rows = slice(j * B, (j + 1) * B)
        o = OldPolicy(logp_old[rows], torch.ones_like(mask[rows]), mask[rows])
        alone = agg_loss(est.loss(logp_new[rows], o, PolicyForward(logp_new[rows]), adv[rows], 0.2), mask[rows], 1)
        assert torch.equal(pack[0][j:j + 1], alone[0]) and torch.equal(pack[1][j:j + 1], alone[1]), j


def test_an_unknown_aggregation_is_refused():
    with pytest.raises(ValueError, match="seq-mean"):
        agg_loss(LossTerms(torch.zeros(B, R), torch.zeros(B, R), "sum"), torch.ones(B, R), 1)

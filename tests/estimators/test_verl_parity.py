"""TIS, MIS and IcePop weights, and the Geo-RS mask, equal verl's own ``rollout_corr_helper`` on the same random
tensors."""
import pytest
import torch

from harness.estimators.icepop import icepop_weights
from harness.estimators.mis import mis_weights
from harness.estimators.tis import tis_weights

# the loss code runs under device_guard.StrictDevice: a tensor made on the default device fails (issue 44)
pytestmark = pytest.mark.usefixtures("strict_device")

rch = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper", reason="verl is not installed")


def tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    b, t = 16, 12
    logp_roll = -torch.rand(b, t, generator=g) * 3
    logp_rec = logp_roll + torch.randn(b, t, generator=g) * 0.4
    logp_rec[0, 0] += 30.0  # beyond verl's +-20 safety bound
    mask = (torch.rand(b, t, generator=g) > 0.15).float()
    mask[:, 0] = 1
    return logp_rec, logp_roll, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("clip_c", [1.5, 2.0, 10.0])
def test_tis_matches_verl(seed, level, clip_c):
    logp_rec, logp_roll, mask = tensors(seed)
    theirs, _ = rch.compute_rollout_correction_weights(logp_rec - logp_roll, mask, rollout_is=level,
                                                        rollout_is_threshold=clip_c)
    torch.testing.assert_close(tis_weights(logp_rec, logp_roll, mask, clip_c, level), theirs)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_mis_matches_verl(seed, level):
    logp_rec, logp_roll, mask = tensors(seed)
    theirs, _ = rch.compute_rollout_correction_weights(logp_rec - logp_roll, mask, rollout_is=level,
                                                        rollout_is_threshold="1e-9_2.0")
    ours, keep = mis_weights(logp_rec, logp_roll, mask, 2.0, level)
    torch.testing.assert_close(ours, theirs)
    assert (ours == 0).any() and (ours > 0).any()  # the cap actually masks some, keeps others
    assert torch.equal(keep.bool() & mask.bool(), (ours > 0) & mask.bool())  # the mask drops exactly the capped


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_icepop_matches_verl(seed):
    logp_rec, logp_roll, mask = tensors(seed)
    theirs, _ = rch.compute_rollout_correction_weights(logp_rec - logp_roll, mask, rollout_is="token",
                                                        rollout_is_threshold="0.5_5.0")
    torch.testing.assert_close(icepop_weights(logp_rec, logp_roll, mask, 0.5, 5.0), theirs)


def _verl_geo_rs(logp_rec, logp_roll, mask, lower, upper):
    """verl's Geo-RS mask through our mapping's threshold (harness.estimators.geo_rs.verl_correction)."""
    from harness.estimators.geo_rs import GeoBand, verl_correction

    rc = verl_correction(GeoBand(lower=lower, upper=upper))
    assert rc["rollout_is"] is None and rc["rollout_rs"] == "seq_mean_k1"
    theirs, metrics = rch.compute_rollout_rejection_mask(logp_rec - logp_roll, mask, rollout_rs=rc["rollout_rs"],
                                                         rollout_rs_threshold=rc["rollout_rs_threshold"])
    return theirs, metrics


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("lower,upper", [(0.999, 1.001), (0.98, 1.02), (0.9, 1.1), (0.5, 1.0), (1.0, 1.5)])
def test_geo_rs_mask_matches_verl(seed, lower, upper):
    """Our Geo-RS mask is verl's ``compute_rollout_rejection_mask(rollout_rs="seq_mean_k1")`` with our mapping's
    threshold ``1/upper_1/lower`` (verl's k1 = -log ratio bounds 1/g): the same rows rejected, seed by seed."""
    from harness.estimators.geo_rs import geo_rs_keep

    logp_rec, logp_roll, mask = tensors(seed)
    logp_rec = logp_roll + (logp_rec - logp_roll) * 0.1  # geometric means around the bands' edges
    logp_rec[1] = logp_roll[1]  # g = 1 exactly: kept by every band
    theirs, metrics = _verl_geo_rs(logp_rec, logp_roll, mask, lower, upper)
    ours = mask * geo_rs_keep(logp_rec, logp_roll, mask, lower, upper)
    assert torch.equal(ours, theirs)
    assert ours[1].sum() == mask[1].sum() and (ours.sum(-1) == 0).any()  # kept and rejected rows
    masked = 1.0 - ours.sum() / mask.sum()
    assert masked.item() == pytest.approx(metrics["rollout_rs_masked_fraction"], abs=1e-6)


def test_geo_rs_mask_matches_verl_on_the_edges():
    """The safety bound (one token +30 in log space: clamped to 20 before the mean, as verl), a sequence without
    response tokens (kept by both: its mask is 0 anyway), a one-token sequence, ratios on either side of the band."""
    from harness.estimators.geo_rs import geo_mean_log_ratio, geo_rs_keep

    logp_roll = torch.full((6, 5), -1.0)
    d = torch.zeros(6, 5)
    d[0, 0] = 30.0  # mean of clamped log ratios 20/5 = 4: rejected (30/5 = 6 unclamped)
    d[1] = 0.015  # g = e^0.015 ~ 1.0151: inside [0.98, 1.02]
    d[2] = -0.03  # g ~ 0.970: below
    d[3] = 0.03  # above
    d[5, 0] = -25.0  # one-token sequence beyond the bound
    mask = torch.ones(6, 5)
    mask[4] = 0  # no response tokens
    mask[5, 1:] = 0
    logp_rec = logp_roll + d
    torch.testing.assert_close(geo_mean_log_ratio(logp_rec, logp_roll, mask)[[0, 5], 0], torch.tensor([4.0, -20.0]))
    for lower, upper in ((0.98, 1.02), (1e-3, 100.0), (1.0, 1.0)):
        theirs, _ = _verl_geo_rs(logp_rec, logp_roll, mask, lower, upper)
        ours = mask * geo_rs_keep(logp_rec, logp_roll, mask, lower, upper)
        assert torch.equal(ours, theirs), (lower, upper)
    ours = mask * geo_rs_keep(logp_rec, logp_roll, mask, 0.98, 1.02)
    assert ours.sum(-1).tolist() == [0.0, 5.0, 0.0, 0.0, 0.0, 0.0]

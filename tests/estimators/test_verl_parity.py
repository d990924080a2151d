"""TIS, MIS and IcePop weights equal verl's own ``rollout_corr_helper`` on the same random tensors."""
import pytest
import torch

from harness.estimators.icepop import icepop_weights
from harness.estimators.mis import mis_weights
from harness.estimators.tis import tis_weights

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

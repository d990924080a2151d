"""Every estimator's masking against hand-computed values (issue 17): a tiny batch of a multi-turn rollout with
known log-probs and a known response mask (0 = an observation or padding token). Each estimator's weight,
mask and loss (its ``loss`` hook: PPO, GMPO for gmpo_rs) are checked, and changing any log-prob at a masked position (sampling, recompute, mean_n's
scores, the new policy's) changes nothing."""
import math

import pytest
import torch

from harness.backends.local.agg import agg_loss
from harness.spec import EstimatorConfig
from harness.estimators import PolicyForward, build

# the loss code runs under device_guard.StrictDevice: a tensor made on the default device fails (issue 44)
pytestmark = pytest.mark.usefixtures("strict_device")

L = torch.log
T = torch.tensor
M = T([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]])  # row 0: a call then padding; row 1: observation at t=1
ROLL = T([[0.2, 0.8, 1.0, 1.0], [0.3, 1.0, 0.8, 0.4]])  # sampling probabilities (1: log-prob 0 where masked)
REC = T([[0.4, 0.2, 0.05, 0.05], [0.9, 0.05, 0.4, 0.8]])  # policy-token ratios: [[2, 1/4], [3, ., 1/2, 2]]
SCORES = T([[[0.1, 0.6, 0.05, 0.05], [0.2, 0.05, 0.7, 0.4]],  # mean_n, n=2: means [[.2, .8], [.3, ., .8, .4]]
            [[0.3, 1.0, 0.05, 0.05], [0.4, 0.05, 0.9, 0.4]]])
ADV = T([[1.0], [-1.0]])
ROUTED = torch.zeros(2, 9, 2, 1, dtype=torch.long)  # [B, T, L, k]: prompt 5 + response 4
ROUTER = torch.log_softmax(torch.arange(2 * 4 * 2 * 3, dtype=torch.float).view(2, 4, 2, 3) / 7, -1)
SELECTED = torch.zeros(2, 4, 2, 1, dtype=torch.long)
OWN_ROUTES = torch.ones(2, 9, 2, 1, dtype=torch.long)  # the recompute's routes, every position (r2's replay)


class Ctx:
    """Hand-made quantities in place of the engines (a stand-in for trainer.OldPolicyContext)."""

    def __init__(self, roll, rec, scores):
        self.logp_roll, self.mask, self.routed_experts = roll, M.clone(), ROUTED
        self._rec, self._scores, self.replays = rec, scores, []

    def recompute(self, replay=None):
        self.replays.append(replay)
        return PolicyForward(self._rec, router_logp=ROUTER, selected=SELECTED, routes=OWN_ROUTES)

    def score(self, n):
        return self._scores[:n]


#: estimator (spec) -> (weight on the policy tokens, mask, pi_old probability where m = 1, loss at ratio 1)
#: loss = -sum_t w_t m_t A / sum_t m_t with A = +1 (row 0), -1 (row 1)
CASES = {
    "rollout": ({}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, ROLL, (2 - 3) / -5),
    "deterministic": ({"noise": "removed"}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, ROLL, 0.2),
    "recompute": ({}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, REC, 0.2),
    "r3": ({}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, REC, 0.2),
    "r2": ({}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, REC, 0.2),
    "rais": ({"gamma_min": 0.8}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, REC, 0.2),
    # GMPO: -(1/B) sum_i S_i A_i with S_i = 1 at ratio 1 (routing unchanged): -(1 - 1) / 2
    "gmpo_rs": ({"gamma_min": 0.8, "log_clip": 0.4}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, REC, 0.0),
    "mean_n": ({"n": 2}, [[1, 1, 0, 0], [1, 0, 1, 1]], M, ROLL, 0.2),
    # token: min(rho_t, 2)
    "tis_token": ({"clip_c": 2.0, "level": "token"}, [[2, 0.25, 0, 0], [2, 0, 0.5, 2]], M, REC,
                  -((2 + 0.25) - (2 + 0.5 + 2)) / 5),
    # sequence: rho = prod over the policy tokens only: row 0 2 * 1/4 = 1/2, row 1 3 * 1/2 * 2 = 3 -> min(3, 2)
    "tis_sequence": ({"clip_c": 2.0, "level": "sequence"}, [[0.5, 0.5, 0, 0], [2, 0, 2, 2]], M, REC,
                     -((0.5 + 0.5) - 6) / 5),
    # sequence: row 1's rho 3 > 2 is masked out (leaves the denominator: 2 tokens left)
    "mis_sequence": ({"clip_c": 2.0, "level": "sequence"}, [[0.5, 0.5, 0, 0], [0, 0, 0, 0]],
                     T([[1.0, 1, 0, 0], [0, 0, 0, 0]]), REC, -(0.5 + 0.5) / 2),
    # token, C = 2.5 (a ratio of exactly 2 is on the edge in float32): 3 is masked
    "mis_token": ({"clip_c": 2.5, "level": "token"}, [[2, 0.25, 0, 0], [0, 0, 0.5, 2]],
                  T([[1.0, 1, 0, 0], [0, 0, 1, 1]]), REC, -((2 + 0.25) - (0.5 + 2)) / 4),
    # mean_n + TIS: the mean of the 2 passes' probabilities is ROLL at the policy tokens, so TIS's weights
    "mean_n_tis_token": ({"n": 2, "clip_c": 2.0, "level": "token"}, [[2, 0.25, 0, 0], [2, 0, 0.5, 2]], M, REC,
                         -((2 + 0.25) - (2 + 0.5 + 2)) / 5),
    "mean_n_tis_sequence": ({"n": 2, "clip_c": 2.0, "level": "sequence"}, [[0.5, 0.5, 0, 0], [2, 0, 2, 2]], M, REC,
                            -((0.5 + 0.5) - 6) / 5),
    # geometric means over the policy tokens: row 0 (2 * 1/4)^(1/2) = 0.71 in [0.5, 1.2], row 1 (3 * 1/2 * 2)^(1/3)
    # = 1.44 above: rejected whole (leaves the denominator); weight 1
    "geo_rs": ({"lower": 0.5, "upper": 1.2}, [[1, 1, 0, 0], [0, 0, 0, 0]], T([[1.0, 1, 0, 0], [0, 0, 0, 0]]), REC,
               -(1 + 1) / 2),
    # the band [1/2, 5]: 1/4 gets weight 0 but stays in the denominator
    "icepop": ({"alpha": 0.5, "beta": 5.0}, [[2, 0, 0, 0], [3, 0, 0.5, 2]], M, REC, -(2 - (3 + 0.5 + 2)) / 5),
}


def _run(case: str, roll, rec, scores, new_masked=None):
    kw, *_ = CASES[case]
    name = case.removesuffix("_token").removesuffix("_sequence")
    estimator = build(EstimatorConfig(name=name, **kw))
    ctx = Ctx(roll, rec, scores)
    old = estimator.old_policy(ctx)
    new_logp = old.logp.clone()  # the ratio is 1 on every policy token
    if new_masked is not None:
        new_logp = torch.where(M > 0, new_logp, new_masked)
    new = PolicyForward(new_logp, router_logp=ROUTER, selected=SELECTED)
    loss, _ = agg_loss(estimator.loss(new.logp, old, new, ADV, 0.2), old.mask, 1)  # its own loss (PPO but gmpo_rs)
    return old, loss[0], ctx


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_estimator_weights_masks_and_loss_by_hand(case):
    _, weight, mask, old_p, loss = CASES[case]
    old, got, ctx = _run(case, L(ROLL), L(REC), L(SCORES))
    torch.testing.assert_close(old.weight * old.mask, T(weight, dtype=torch.float) * old.mask)
    torch.testing.assert_close(old.mask, mask)
    torch.testing.assert_close(old.logp, torch.where(M > 0, L(old_p), 0.0))  # pi_old; 0 where masked
    assert math.isclose(got.item(), loss, rel_tol=1e-6, abs_tol=1e-7), (got.item(), loss)
    if case == "r3":
        assert ctx.replays and ctx.replays[0] is ROUTED  # every position's routing is replayed
    if case == "r2":  # its own recompute (no replay), whose routes are replayed in the update
        assert ctx.replays == [None] and old.replay is OWN_ROUTES


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("value", [40.0, -40.0, float("-inf")])
def test_a_log_prob_at_a_masked_position_changes_nothing(case, value):
    """Sampling, recomputed, scored and new log-probs at masked positions set to +-40 or -inf: the same pi_old,
    weight, mask and loss, bitwise."""
    old, loss, _ = _run(case, L(ROLL), L(REC), L(SCORES))
    hide = lambda x: torch.where(M > 0, x, value)  # noqa: E731
    old2, loss2, _ = _run(case, hide(L(ROLL)), hide(L(REC)), hide(L(SCORES)), new_masked=T(value))
    assert torch.isfinite(old2.logp).all() and torch.isfinite(loss2)
    for a, b in ((old.logp, old2.logp), (old.weight * old.mask, old2.weight * old2.mask), (old.mask, old2.mask)):
        assert torch.equal(a, b)
    assert torch.equal(loss, loss2)

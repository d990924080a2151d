"""Keyed random numbers (harness/backends/local/philox.py): the published known answers, pack invariance, and the
statistics of the draws (uniformity, independence across positions, seeds, streams and steps), with fixed seeds."""
import numpy as np
import pytest
import torch
from scipy import stats

from harness.backends.local import philox

# Random123's kat_vectors for philox4x32_10: (counter, key, output)
KAT = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
       ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
       ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
SEEDS = torch.tensor([0, 1, 7, 2**31 - 1], dtype=torch.int64)


@pytest.mark.parametrize("ctr, key, want", KAT)
def test_the_published_known_answers(ctr, key, want):
    out = philox.philox4x32(torch.tensor(ctr, dtype=torch.int64), torch.tensor(key, dtype=torch.int64))
    assert out.tolist() == list(want)


def test_the_known_answers_batched_in_one_call():
    ctr = torch.tensor([k[0] for k in KAT], dtype=torch.int64)
    key = torch.tensor([k[1] for k in KAT], dtype=torch.int64)
    assert philox.philox4x32(ctr, key).tolist() == [list(k[2]) for k in KAT]


def test_a_seeds_draws_are_the_same_alone_and_in_any_pack():
    pack = philox.uniform(SEEDS, "noise", 5, 2, (3, 7))
    for i, s in enumerate(SEEDS.tolist()):
        alone = philox.uniform(torch.tensor([s]), "noise", 5, 2, (3, 7))
        assert torch.equal(alone[0], pack[i])
    shuffled = philox.uniform(SEEDS.flip(0), "noise", 5, 2, (3, 7))
    assert torch.equal(shuffled.flip(0), pack)
    # per-seed steps: a seed resumed at another step than its pack mates draws its own step's numbers
    steps = torch.tensor([5, 9, 5, 9])
    mixed = philox.uniform(SEEDS, "noise", steps, 2, (3, 7))
    assert torch.equal(mixed[1], philox.uniform(SEEDS[1:2], "noise", 9, 2, (3, 7))[0])
    assert torch.equal(mixed[0], pack[0])


def test_every_key_and_counter_word_changes_the_draws():
    base = philox.bits(SEEDS, "noise", 3, 1, 8)
    for other in (philox.bits(SEEDS + 1, "noise", 3, 1, 8), philox.bits(SEEDS, "sample", 3, 1, 8),
                  philox.bits(SEEDS, "noise", 4, 1, 8), philox.bits(SEEDS, "noise", 3, 2, 8),
                  philox.bits(SEEDS, "noise", 3, 1, 8, draw=1)):
        assert not (other == base).any()
    longer = philox.bits(SEEDS, "noise", 3, 1, 13)  # a longer call extends the same sequence
    assert torch.equal(longer[:, :8], base)


def test_uniform_draws_are_uniform():
    u = philox.uniform(torch.tensor([11]), "test", 0, 0, (200_000,))[0].double().numpy()
    assert 0 < u.min() and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    counts = np.histogram(u, bins=256, range=(0, 1))[0]
    assert stats.chisquare(counts).pvalue > 1e-3
    u64 = philox.uniform(torch.tensor([12]), "test", 0, 0, (100_000,), torch.float64)[0].numpy()
    assert stats.kstest(u64, "uniform").pvalue > 1e-3


def test_draws_are_independent_across_positions_seeds_streams_and_steps():
    n = 50_000
    seeds = torch.arange(4, dtype=torch.int64)
    u = philox.uniform(seeds, "test", 0, 0, (n,)).double().numpy()
    pairs = [(u[0, :-1], u[0, 1:]),  # neighbouring positions
             (u[0], u[1]), (u[2], u[3]),  # neighbouring seeds
             (u[0], philox.uniform(seeds[:1], "noise", 0, 0, (n,))[0].double().numpy()),  # streams
             (u[0], philox.uniform(seeds[:1], "test", 1, 0, (n,))[0].double().numpy())]  # steps
    for a, b in pairs:
        assert abs(stats.pearsonr(a, b).statistic) < 4 / np.sqrt(n)
        joint = np.histogram2d(a, b, bins=16, range=[[0, 1], [0, 1]])[0].ravel()  # serial test on a 16 x 16 grid
        assert stats.chisquare(joint).pvalue > 1e-3


def test_normal_and_gumbel_draws_have_their_distributions():
    z = philox.normal(torch.tensor([3]), "test", 0, 0, (100_000,))[0].double().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3 and abs(z.mean()) < 0.02 and abs(z.var() - 1) < 0.02
    g = philox.gumbel(torch.tensor([4]), "test", 0, 0, (100_000,))[0].double().numpy()
    assert stats.kstest(g, "gumbel_r").pvalue > 1e-3


def test_the_two_normals_of_a_box_muller_pair_are_independent():
    z = philox.normal(torch.tensor([6]), "test", 0, 0, (100_000,))[0].double().numpy()
    a, b = z[0::2], z[1::2]  # r cos(theta), r sin(theta) of one pair of uniforms
    assert abs(stats.pearsonr(a, b).statistic) < 4 / np.sqrt(a.size)
    assert abs(stats.pearsonr(a ** 2, b ** 2).statistic) < 4 / np.sqrt(a.size)  # not only uncorrelated
    assert torch.equal(philox.normal(torch.tensor([6]), "test", 0, 0, (7,))[0],
                       torch.from_numpy(z[:7]).float())  # an odd count is a prefix of the longer draw


def test_several_draws_in_one_evaluation_are_the_separate_draws():
    specs = [("uniform", "combine", (3, 4), 1), ("normal", "noise", (5,), 2), ("gumbel", "sample", (2, 3), 0),
             ("uniform64", "split", (7,), 3)]
    got = philox.draws(SEEDS, 4, 2, specs)
    want = [philox.uniform(SEEDS, "combine", 4, 2, (3, 4), draw=1), philox.normal(SEEDS, "noise", 4, 2, (5,), draw=2),
            philox.gumbel(SEEDS, "sample", 4, 2, (2, 3)), philox.uniform(SEEDS, "split", 4, 2, (7,), torch.float64, draw=3)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_gumbel_max_samples_the_softmax():
    logits = torch.tensor([0.0, 1.0, -1.0, 2.0])
    g = philox.gumbel(torch.tensor([5]), "sample", 0, 0, (40_000, 4))[0]
    counts = np.bincount((logits + g).argmax(-1).numpy(), minlength=4)
    expected = torch.softmax(logits.double(), -1).numpy() * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_permutations_are_uniform():
    perms = philox.permutation(torch.arange(20_000, dtype=torch.int64), "shuffle", 0, 0, 5)
    assert torch.equal(perms.sort(-1).values, torch.arange(5).expand(20_000, 5))
    where_zero = (perms == 0).int().argmax(-1).numpy()  # the position element 0 lands in: uniform over 5
    assert stats.chisquare(np.bincount(where_zero, minlength=5)).pvalue > 1e-3


def test_the_operator_count_does_not_grow_with_the_pack():
    """One call is one fixed sequence of operators whatever the number of seeds: the device-independent check of
    issue 29 (no per-seed loop)."""
    from harness.backends.local.opcount import OpCount

    counts = []
    for size in (1, 64):
        with OpCount() as c:
            philox.normal(torch.arange(size, dtype=torch.int64), "noise", 3, 0, (16, 8))
        counts.append(c.ops)
    assert counts[0] == counts[1] and counts[0] < 400, counts

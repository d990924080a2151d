"""Grouped expert GEMMs (no padding) against the zero-padded batched GEMM they replaced: bitwise, groups of every
size (1-3 rows: the CPU GEMM's other kernel), empty groups, per-seed capacities, gradients included; and the GPU's
dense layout (one common capacity, one bmm), forced on the CPU."""
import pytest
import torch

from harness.backends.local import grouped as grouped_mod
from harness.backends.local.grouped import MIN_ROWS, GroupedMM, Layout, grouped
from harness.backends.local.opcount import OpCount


def _padded(x, w, counts, cap):
    """The old path: each group's rows in a [G, cap, K] zero-padded batch, one bmm, the rows read back."""
    group = torch.repeat_interleave(torch.arange(counts.numel()), counts)
    pos = torch.arange(x.shape[0]) - (counts.cumsum(0) - counts)[group]
    row = group * cap + pos
    xe = x.new_zeros(counts.numel() * cap, x.shape[1]).index_copy(0, row, x).view(counts.numel(), cap, -1)
    return torch.bmm(xe, w).view(counts.numel() * cap, -1).index_select(0, row)


@pytest.mark.parametrize("counts", [[1, 2, 3, 40, 0, 7], [3, 2, 1], [5, 0, 9, 2], [4, 4, 4], [1, 1, 300]])
@pytest.mark.parametrize("kn", [(64, 128), (64, 64), (16, 32)])
def test_each_row_is_bitwise_that_of_the_padded_batch(counts, kn):
    g = torch.Generator().manual_seed(sum(counts))
    counts = torch.tensor(counts)
    cap = int(counts.max())
    x = torch.randn(int(counts.sum()), kn[0], generator=g)
    w = torch.randn(counts.numel(), *kn, generator=g)
    assert torch.equal(grouped(x, w, Layout(counts, cap)), _padded(x, w, counts, cap))


def test_small_groups_are_padded_to_the_padded_batch_kernel_class_and_no_more():
    lay = Layout(torch.tensor([1, 0, 30, 2]), 30)
    assert lay.offs.tolist() == [MIN_ROWS, MIN_ROWS, MIN_ROWS + 30, 2 * MIN_ROWS + 30]  # empty stays empty
    assert Layout(torch.tensor([2, 3]), 3).offs.tolist() == [3, 6]  # cap below MIN_ROWS: padded to cap
    assert Layout(torch.tensor([20, 17]), 20).place is None  # nothing to pad: no copy


def test_gradients_are_bitwise_those_of_each_seeds_padded_batch():
    """Two seeds (capacities 9 and 4), an empty expert, groups of 2 and 3 rows: output, input gradient and weight
    gradient equal bitwise what autograd gives the per-seed padded bmm."""
    g = torch.Generator().manual_seed(0)
    e, k_in, n_out = 4, 64, 128
    counts = torch.tensor([[5, 0, 9, 2], [3, 3, 3, 4]])
    caps = counts.amax(1)
    x = torch.randn(int(counts.sum()), k_in, generator=g, requires_grad=True)
    w = torch.randn(2 * e, k_in, n_out, generator=g, requires_grad=True)
    grad = torch.randn(x.shape[0], n_out, generator=g)
    base = torch.cumsum(e * caps, 0) - e * caps
    flat = counts.reshape(-1)
    group = torch.repeat_interleave(torch.arange(2 * e), flat)
    pos = torch.arange(x.shape[0]) - (flat.cumsum(0) - flat)[group]
    row = base[group // e] + (group % e) * caps[group // e] + pos
    seeds = tuple(zip(base.tolist(), caps.tolist()))
    y = GroupedMM.apply(x, w, Layout(flat, caps.repeat_interleave(e)), row, seeds)
    gx, gw = torch.autograd.grad(y, (x, w), grad)

    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    rows = [slice(int(flat[:s * e].sum()), int(flat[:(s + 1) * e].sum())) for s in range(2)]
    y2 = torch.cat([_padded(x2[r], w2[s * e:(s + 1) * e], counts[s], int(caps[s])) for s, r in enumerate(rows)])
    gx2, gw2 = torch.autograd.grad(y2, (x2, w2), grad)
    assert torch.equal(y, y2)
    assert torch.equal(gx, gx2)
    assert torch.equal(gw, gw2)
    assert torch.equal(gw[1], torch.zeros_like(gw[1]))  # seed 0's empty expert


@pytest.fixture
def dense(monkeypatch):
    """The GPU's layout (one common capacity, one bmm per GEMM) forced on the CPU."""
    monkeypatch.setattr(grouped_mod, "DENSE", True)


def test_the_dense_layout_is_the_default_on_any_device_but_the_cpu():
    assert grouped_mod.DENSE is None
    assert not grouped_mod.dense_on(torch.device("cpu")) and grouped_mod.dense_on(torch.device("cuda"))
    assert not Layout(torch.tensor([2, 3]), 3).dense


def test_dense_gradients_match_the_per_seed_padded_batches(dense):
    """The GPU path against autograd through the per-seed padded bmm: the same values to float32 rounding (its
    weight gradient sums over the common capacity's rows: zeros beyond a seed's own, other rounding)."""
    g = torch.Generator().manual_seed(1)
    e, k_in, n_out = 4, 32, 48
    counts = torch.tensor([[5, 0, 9, 2], [3, 3, 3, 4]])
    caps, flat = counts.amax(1), counts.reshape(-1)
    x = torch.randn(int(counts.sum()), k_in, generator=g, requires_grad=True)
    w = torch.randn(2 * e, k_in, n_out, generator=g, requires_grad=True)
    grad = torch.randn(x.shape[0], n_out, generator=g)
    layout = Layout(flat, caps.repeat_interleave(e))
    assert layout.dense and layout.cap == 9 and layout.total == 2 * e * 9
    y = GroupedMM.apply(x, w, layout, None, None)  # the dense path needs no per-seed rows
    gx, gw = torch.autograd.grad(y, (x, w), grad)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    rows = [slice(int(flat[:s * e].sum()), int(flat[:(s + 1) * e].sum())) for s in range(2)]
    y2 = torch.cat([_padded(x2[r], w2[s * e:(s + 1) * e], counts[s], int(caps[s])) for s, r in enumerate(rows)])
    gx2, gw2 = torch.autograd.grad(y2, (x2, w2), grad)
    for a, b in ((y, y2), (gx, gx2), (gw, gw2)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(gw[1], torch.zeros_like(gw[1]))  # seed 0's empty expert


def test_dense_operators_do_not_grow_with_the_number_of_seeds(dense):
    """One bmm per GEMM and one for the weight gradient, whatever the number of seeds (the per-seed path adds a
    bmm per seed): the operator count of a forward and backward is the same for 1 and 16 seeds."""
    def ops(n_seeds):
        g = torch.Generator().manual_seed(n_seeds)
        e = 4
        flat = torch.randint(1, 9, (n_seeds * e,), generator=g)
        x = torch.randn(int(flat.sum()), 8, generator=g, requires_grad=True)
        w = torch.randn(n_seeds * e, 8, 8, generator=g, requires_grad=True)
        layout = Layout(flat, flat.view(n_seeds, e).amax(1).repeat_interleave(e))
        with OpCount() as count:
            torch.autograd.grad(GroupedMM.apply(x, w, layout, None, None).sum(), (x, w))
        return count.ops
    assert ops(1) == ops(16)

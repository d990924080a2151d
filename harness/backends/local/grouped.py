"""Grouped GEMMs for the experts, with the arithmetic of a zero-padded batched GEMM.

The experts' rows, sorted by group (a group = one expert of one seed), meet their group's weights:

    y[i] = x[i] @ w[group(i)]        x [M, K] sorted by group, w [G, K, N], counts [G] rows per group

What the engines computed before (and what every stored run was trained with) is the padded form: each group's
rows in a zero-padded [G, cap, K] batch, cap = the largest group, and one ``bmm``. ``grouped_mm`` skips the
padding (up to ~40% of the experts' FLOPs at this model size) and gives each row bitwise the same result, with one
exception this module handles: the CPU GEMM computes products of fewer than 4 rows with another kernel (other
rounding), and a padded batch has ``cap`` rows per group. So a group with fewer than ``min(cap, MIN_ROWS)`` rows
is zero-padded to that many (``Layout``), which puts it in the kernel class of the padded batch; measured on
this CPU (tests/backends/local/test_grouped.py): rows of GEMMs of 1-3 rows are one class, of 4 or more another,
for every K, N tried. The weight gradient of the training engine reduces over the rows of a group, and its
rounding depends on their number: it is computed as the padded batch's, per seed (``GroupedMM.backward``), so
curves stay bit-identical (tests/test_golden.py) and a seed's gradient does not depend on its pack.

On a GPU (any device but the CPU; ``DENSE`` overrides) every group is padded to one common capacity and each GEMM,
the weight gradient's included, is one ``bmm`` over [G, cap, K]. torch's ``grouped_mm`` runs float32 on CUDA as
a loop over the groups (its fast path is bfloat16 only), so a pack of S seeds launched S x E GEMMs, and the
per-seed weight gradient added ~100 operators per seed (measured on an H200: ``docs/speed.md``, "On one GPU").
The padding's extra FLOPs are what a GPU has in excess. A GPU's float32 results are not reproducible run to run
anyway (atomic adds; ``benchmarks/gpu_pack_check.py``), so this costs no identity the CPU path gives.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

MIN_ROWS = 16  # a group is padded to at least min(cap, MIN_ROWS) rows: the padded batch's kernel class
#: one common capacity and one ``bmm`` per GEMM: None = on any device but the CPU (benchmarks and tests set it)
DENSE: bool | None = None


def dense_on(device: torch.device) -> bool:
    return device.type != "cpu" if DENSE is None else DENSE


class Layout:
    """Where each of the M sorted rows goes: the groups' end offsets for ``grouped_mm`` and, when some groups
    need padding to ``min(cap, MIN_ROWS)`` rows, the row of each input row in the padded input (``place``).
    ``cap``: the padded batch's capacity, one for all groups (an int) or each group's ([G]: a seed's own).
    ``dense`` (on a GPU): every group padded to the largest capacity, ``place`` the row in that [G, cap] batch."""

    def __init__(self, counts: Tensor, cap: "int | Tensor"):
        self.dense = dense_on(counts.device)
        if self.dense:
            self.cap = max(1, int(cap.max()) if isinstance(cap, Tensor) else int(cap))
            group, pos = positions(counts)
            self.place = group * self.cap + pos
            self.total = counts.numel() * self.cap
            return
        need = cap.clamp(max=MIN_ROWS) if isinstance(cap, Tensor) else min(cap, MIN_ROWS)
        rows = torch.where(counts > 0, torch.maximum(counts, torch.as_tensor(need, device=counts.device)), counts)
        self.place: Tensor | None = None
        if not torch.equal(rows, counts):
            group, pos = positions(counts)
            self.place = (rows.cumsum(0) - rows)[group] + pos
            self.total = int(rows.sum())
        self.offs = rows.cumsum(0).to(torch.int32)


def positions(counts: Tensor) -> tuple[Tensor, Tensor]:
    """For the rows sorted by group: each row's group and its place within that group."""
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    return group, torch.arange(group.numel(), device=counts.device) - (counts.cumsum(0) - counts)[group]


def grouped(x: Tensor, w: Tensor, layout: Layout) -> Tensor:
    """x [M, K] (sorted by group) @ w[group] -> [M, N], each row bitwise as in the padded batched GEMM."""
    if layout.dense:
        return torch.bmm(_padded(x, layout), w).view(-1, w.shape[-1]).index_select(0, layout.place)
    if layout.place is None:
        return F.grouped_mm(x, w, offs=layout.offs)
    xp = x.new_zeros(layout.total, x.shape[1]).index_copy_(0, layout.place, x)
    return F.grouped_mm(xp, w, offs=layout.offs).index_select(0, layout.place)


class GroupedMM(torch.autograd.Function):
    """``grouped`` with the training engine's gradients. Input gradient: ``grad @ w[group]^T`` per row (bitwise the
    padded batch's, as the forward). Weight gradient: each seed's zero-padded batch's ``xe_s^T @ grad_s``, xe_s
    [E, cap_s, K] with cap_s that seed's largest group (``seeds``: each seed's first padded row and cap_s; ``row``:
    each input row's row there), whose reduction runs over the seed's own cap_s rows."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, layout: Layout, row: Tensor, seeds: tuple) -> Tensor:
        ctx.save_for_backward(x, w, row)
        ctx.layout, ctx.seeds = layout, seeds
        return grouped(x, w, layout)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, w, row = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[0]:
            gx = grouped(grad.contiguous(), w.transpose(-2, -1), ctx.layout)
        if ctx.needs_input_grad[1] and ctx.layout.dense:  # one bmm over the common capacity (a GPU)
            gw = _padded(x, ctx.layout).transpose(1, 2).bmm(_padded(grad, ctx.layout))
        elif ctx.needs_input_grad[1]:
            e = w.shape[0] // len(ctx.seeds)
            total = sum(e * cap for _, cap in ctx.seeds)
            xe = x.new_zeros(total, x.shape[1]).index_copy_(0, row, x)
            ge = grad.new_zeros(total, grad.shape[1]).index_copy_(0, row, grad)
            gws = [xe[b:b + e * cap].view(e, cap, -1).transpose(1, 2).bmm(ge[b:b + e * cap].view(e, cap, -1))
                   for b, cap in ctx.seeds]
            gw = gws[0] if len(gws) == 1 else torch.cat(gws)
        return gx, gw, None, None, None


def _padded(x: Tensor, layout: Layout) -> Tensor:
    """The rows x [M, F] in the dense layout's zero-padded [G, cap, F] batch."""
    return x.new_zeros(layout.total, x.shape[1]).index_copy_(0, layout.place, x).view(-1, layout.cap, x.shape[1])

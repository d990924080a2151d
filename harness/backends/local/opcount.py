"""Counting ATen operator calls: issue 29's device-independent check that a step of a seed pack is one fixed sequence
of operators whatever the pack size (``benchmarks/pack_scaling.py``, ``tests/backends/local/test_engines.py``).
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: ATen operators that make the host wait for the device (a read-back or a data-dependent shape)
SYNCS = ("_local_scalar_dense", "nonzero", "item", "unique", "masked_select")


class OpCount(TorchDispatchMode):
    """While active (``with OpCount() as c:``), counts ATen operator calls (``c.ops``) and the host synchronisations
    among them (``c.syncs``: ``SYNCS`` and copies of a device tensor to the CPU)."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        name = func.__name__.split(".")[0]
        to_host = name in ("_to_copy", "copy_") and any(isinstance(a, torch.Tensor) and a.device.type != "cpu"
                                                        for a in args) and (kwargs or {}).get("device") == "cpu"
        if name in SYNCS or to_host:
            self.syncs += 1
        return func(*args, **(kwargs or {}))

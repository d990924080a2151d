"""``StrictDevice``: a torch function mode that fails on a tensor factory called without ``device=`` (issue 44).

On a GPU, a tensor made on the default device (``torch.arange(k)``) is a CPU tensor beside CUDA tensors, and the
first op mixing them raises ("index is on cpu, different from other tensors on cuda:0"); on the CPU, where every
test runs, nothing can tell. The ``meta`` device does not help either: a meta tensor gathers with a CPU index without
complaint. Under ``StrictDevice`` such a factory call fails on the CPU too, when it is made from the watched code
(``harness/estimators`` and ``harness/backends/verl`` by default: the code that runs inside verl's workers); torch's,
verl's and the test's own calls pass. ``*_like`` factories and ``Tensor.new_*`` take their device from a tensor and
pass; an explicit ``device=None`` is the default device and fails.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
WATCHED = (ROOT / "harness" / "estimators", ROOT / "harness" / "backends" / "verl")
TORCH_DIR = str(Path(torch.__file__).resolve().parent)

#: the factories whose device defaults to torch's default device
FACTORIES = {getattr(torch, n) for n in (
    "arange", "range", "zeros", "ones", "full", "empty", "empty_strided", "tensor", "as_tensor", "scalar_tensor",
    "rand", "randn", "randint", "randperm", "normal", "linspace", "logspace", "eye", "tril_indices", "triu_indices",
    "sparse_coo_tensor") if hasattr(torch, n)}


class DefaultDeviceTensor(AssertionError):
    """A tensor factory was called without ``device=`` from watched code."""


def _caller(frame) -> str:
    """The file of the first frame outside torch's package (the code that called the factory)."""
    while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
        frame = frame.f_back
    return frame.f_code.co_filename if frame is not None else ""


class StrictDevice(TorchFunctionMode):
    """Raise ``DefaultDeviceTensor`` on a factory of ``FACTORIES`` called without a device from ``watched`` files."""

    def __init__(self, watched: tuple[Path, ...] = WATCHED):
        super().__init__()
        self.watched = tuple(str(p.resolve()) for p in watched)
        self.caught: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            where = _caller(sys._getframe(1))
            if where.startswith(self.watched):
                line = sys._getframe(1)
                while line is not None and line.f_code.co_filename != where:
                    line = line.f_back
                msg = f"torch.{func.__name__} without device= at {where}:{line.f_lineno if line else '?'}"
                self.caught.append(msg)
                raise DefaultDeviceTensor(msg + ": make it on its inputs' device (device=x.device)")
        return func(*args, **kwargs)

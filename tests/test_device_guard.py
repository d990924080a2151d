"""tests/device_guard.py's ``StrictDevice`` (issue 44): what it catches, what it lets pass.

The code under test is compiled with a file name inside the watched folders, so the guard sees it as the harness's
own code; the real plugin (``gamma_from_router``, which made its index on the default device before issue 44) runs
under it too."""
from __future__ import annotations

import pytest
import torch

from device_guard import WATCHED, DefaultDeviceTensor, StrictDevice  # noqa: E402  (tests/conftest.py loads it)


def _as_watched(src: str, name: str = "estimators_stand_in.py"):
    """``src`` compiled as if it were a file of harness/estimators (a stand-in module, named so)."""
    code = compile(src, str(WATCHED[0] / name), "exec")
    ns = {"torch": torch}
    exec(code, ns)  # noqa: S102  (test code, fixed text)
    return ns


@pytest.mark.parametrize("call", ["torch.arange(3)", "torch.zeros(2)", "torch.ones(2, dtype=torch.float64)",
                                  "torch.full((2,), 1.0)", "torch.empty(2)", "torch.tensor([1.0])",
                                  "torch.randn(2)", "torch.rand(2)", "torch.randint(0, 3, (2,))",
                                  "torch.linspace(0, 1, 3)", "torch.eye(2)", "torch.arange(3, device=None)"])
def test_a_factory_without_a_device_in_watched_code_fails(call):
    f = _as_watched(f"def f():\n    return {call}\n")["f"]
    with StrictDevice() as mode, pytest.raises(DefaultDeviceTensor, match="without device=.*estimators_stand_in.py:2"):
        f()
    assert len(mode.caught) == 1


@pytest.mark.parametrize("call", ["torch.arange(3, device=x.device)", "torch.zeros_like(x)", "x.new_zeros(2)",
                                  "torch.full_like(x, 2.0)", "torch.tensor([1.0], device='cpu')", "x.gather(0, x.long())"])
def test_a_factory_given_its_device_passes(call):
    f = _as_watched(f"def f(x):\n    return {call}\n")["f"]
    with StrictDevice() as mode:
        f(torch.zeros(3))
    assert mode.caught == []


def test_code_outside_the_watched_folders_is_not_checked():
    with StrictDevice() as mode:
        torch.arange(3)  # the test's own call
        torch.nn.functional.one_hot(torch.tensor([0, 2]), 3)  # torch's
    assert mode.caught == []


def test_the_rais_plugins_gamma_runs_under_the_guard():
    from harness.backends.verl.plugins.rais import gamma_from_router

    old = torch.log_softmax(torch.randn(5, 2, 4), -1).topk(2, -1).values
    with StrictDevice() as mode:
        gamma = gamma_from_router(old + 0.1, old)  # torch.arange(k) without device= before issue 44
    assert mode.caught == [] and torch.allclose(gamma, torch.full((5,), torch.exp(torch.tensor(-0.1)).item()))

"""harness/numerics.py: the pins are in effect in a run's process, a process that computed before pinning is refused,
and a run records what its bits depend on."""
import json
import subprocess
import sys

import pytest
import torch

from harness import numerics


def test_pinned_in_this_process():
    # conftest pins before torch's first operator, as every entry point does
    assert numerics.pinned()
    fp = numerics.fingerprint()
    assert fp["mkl"] in (numerics.MKL_BRANCH, "none")
    if numerics.target_capability():
        assert fp["aten"] == torch.backends.cpu.get_cpu_capability() == "AVX2"
    assert fp["key"] == f"torch {torch.__version__} | aten {fp['aten']} | mkl {fp['mkl']}"
    assert fp["cpu"]
    numerics.check()  # no error


def _child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.skipif(numerics.target_capability() is None and not torch.backends.mkl.is_available(),
                    reason="nothing to pin on this CPU/torch")
def test_an_operator_before_the_pin_is_refused():
    """torch's first operator fixes ATen's kernels and MKL's branch: pinning after it cannot work, and check() says
    so (a ConfigError naming 'numerics' and the fix) instead of training a curve that depends on the CPU."""
    code = ("import os; os.environ.pop('ATEN_CPU_CAPABILITY', None); os.environ.pop('MKL_CBWR', None)\n"
            "import torch; a = torch.randn(64, 64); (a @ a).sum()\n"
            "from harness import numerics\n"
            "try:\n    numerics.check()\nexcept Exception as e:\n    print(type(e).__name__, e)\n")
    out = _child(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ConfigError numerics: CPU numerics not pinned"), out.stdout
    assert "ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE" in out.stdout


def test_pin_before_the_first_operator_takes_effect():
    code = ("import os; os.environ.pop('ATEN_CPU_CAPABILITY', None); os.environ.pop('MKL_CBWR', None)\n"
            "import json, torch; torch.set_num_threads(1)\n"
            "from harness import numerics; numerics.pin(); a = torch.randn(64, 64); (a @ a).sum()\n"
            "print(json.dumps([numerics.pinned(), numerics.fingerprint()]))")
    out = _child(code)
    ok, fp = json.loads(out.stdout)
    assert ok, fp
    assert fp["key"] == numerics.fingerprint()["key"]


def test_a_run_records_its_fingerprint(tiny_overrides):
    from mlflow.tracking import MlflowClient

    from harness.backends.local.run import execute
    from harness.spec import load

    cfg = load(tiny_overrides(steps=1))
    summary = execute(cfg, progress=False)
    run = MlflowClient(cfg.tracking_uri).get_run(summary.run_id)
    assert run.data.tags["numerics.key"] == numerics.fingerprint()["key"]
    assert run.data.tags["numerics.cpu"] == numerics.cpu_model()



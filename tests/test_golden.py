"""Identity and numerics are frozen across refactors (issue 11: behaviour unchanged, curves bit-identical).

``tests/golden/signatures.json`` holds the spec signature of every run of every shipped sweep and of each
estimator's default spec; ``tests/golden/curves.json`` every metric of 3 tiny training steps per estimator
(as ``float.hex``; a metric added later may appear beside them). Both were written by ``tests/golden/make_*.py``
on the code before the redesign; issue 15 regenerated the ``deterministic`` entries on purpose (its meaning
changed: noise removed; the old meaning is ``deterministic(frozen)``, pinned to the old curve); issue 29 regenerated both files on purpose for local numerics version 4 (keyed random
numbers, split-K selected per row: every local signature carries the version, every curve moved); issue 31 added
the entries of ``geo_rs`` and ``r2`` (new estimators: every other entry of both files unchanged, bitwise). A change
that alters a signature would orphan every run in the stores; one that alters a curve must bump
``harness.backends.local.identity.LOCAL_NUMERICS`` and regenerate the golden files on purpose.

What the curves guarantee across CPUs (issue 27): the runs pin their CPU numerics (``harness/numerics.py``: MKL's
``COMPATIBLE`` branch, ATen's AVX2 kernels, the spec's thread count), so the bits depend on the fingerprint *key*
(torch version and the pins in effect), not on the CPU model or vendor. ``curves.json`` records the fingerprint it
was written with (``_fingerprint``). Same key: every pinned metric bitwise equal, whatever the CPU (written on an AMD
EPYC; ``test_pins_hide_the_blas_isa`` shows MKL's instruction set no longer reaches the bits). Another key (another
torch, a CPU without AVX2, a torch without MKL): the robust metrics within ``ACROSS`` (stated below), with a warning
that bitwise identity was not checked; routing and mismatch diagnostics of 3 tiny steps can move by tens of
percent when one near-tied router flips, so they are compared bitwise only.
"""
import json
import math
import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

from harness import numerics

GOLDEN = Path(__file__).parent / "golden"
ROOT = GOLDEN.parents[1]
#: across fingerprint keys: metric -> (absolute, relative) tolerance, for the metrics that a rounding difference
#: cannot move far in 3 steps (a 3-step curve on another BLAS: rewards equal, entropy to ~1e-5, grad norm ~1e-3)
ACROSS = {"reward/mean": (0.1, 0.0), "policy/entropy": (0.0, 1e-3), "policy/grad_norm": (0.0, 2e-2),
          "is/ess": (2e-2, 0.0)}


def _by_sweep(sigs: dict[str, str]) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for key, sig in sigs.items():
        out.setdefault(key.split("|")[0], Counter())[sig] += 1
    return out


def test_signatures_unchanged(tmp_path):
    subprocess.run([sys.executable, str(GOLDEN / "make_signatures.py"), str(tmp_path / "s.json")], cwd=ROOT, check=True)
    now = json.loads((tmp_path / "s.json").read_text())
    want = json.loads((GOLDEN / "signatures.json").read_text())
    assert _by_sweep(now) == _by_sweep(want)
    # run by run too: the same multiset per sweep would still pass with two runs' signatures swapped
    changed = sorted(k for k in want.keys() | now.keys() if now.get(k) != want.get(k))
    assert not changed, f"signature changed or run renamed: {changed[:5]}"


def _curves(tmp_path, env=None) -> dict:
    subprocess.run([sys.executable, str(GOLDEN / "make_curves.py"), str(tmp_path / "c.json")], cwd=ROOT, check=True,
                   capture_output=True, env=env)
    return json.loads((tmp_path / "c.json").read_text())


def test_curves_bit_identical(tmp_path):
    now = _curves(tmp_path)
    want = json.loads((GOLDEN / "curves.json").read_text())
    fp_now, fp_want = now.pop("_fingerprint"), want.pop("_fingerprint")
    assert fp_now["key"] == numerics.fingerprint()["key"]  # the curves were computed with the pins in effect
    bitwise = fp_now["key"] == fp_want["key"]
    if not bitwise:
        warnings.warn(f"golden curves written with '{fp_want['key']}' ({fp_want['cpu']}), this machine computes "
                      f"'{fp_now['key']}' ({fp_now['cpu']}): compared within tolerance, not bitwise")
    assert set(now) >= set(want)  # a new estimator may add an entry; none may go
    for name, run in want.items():
        assert now[name]["signature"] == run["signature"], f"{name}: signature changed"
        assert len(now[name]["steps"]) == len(run["steps"])
        for i, (got, step) in enumerate(zip(now[name]["steps"], run["steps"])):
            if bitwise:  # a new metric may be logged beside them; none of the pinned ones may move or go
                assert {k: got.get(k) for k in step} == step, f"{name}: step {i} changed"
                continue
            for key, (atol, rtol) in ACROSS.items():
                a, b = float.fromhex(got[key]), float.fromhex(step[key])
                assert math.isclose(a, b, abs_tol=atol, rel_tol=rtol), f"{name}: step {i} {key} {a} vs {b}"


def test_pins_hide_the_blas_isa(tmp_path):
    """MKL limited to SSE4.2 (as on an older CPU) computes the same bits as MKL free to pick its kernels: under the
    pins (MKL_CBWR=COMPATIBLE) the BLAS's choice of kernel by CPU no longer reaches a curve."""
    (tmp_path / "free").mkdir(), (tmp_path / "sse42").mkdir()
    free = _curves(tmp_path / "free")
    sse42 = _curves(tmp_path / "sse42", env={**os.environ, "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"})
    assert free.pop("_fingerprint")["mkl"] == sse42.pop("_fingerprint")["mkl"] == numerics.MKL_BRANCH
    assert free == sse42

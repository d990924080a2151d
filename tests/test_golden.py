"""Identity and numerics are frozen across refactors (issue 11: behaviour unchanged, curves bit-identical).

``tests/golden/signatures.json`` holds the spec signature of every run of every shipped sweep and of each
estimator's default spec; ``tests/golden/curves.json`` every metric of 3 tiny training steps per estimator
(as ``float.hex``; a metric added later may appear beside them). Both were written by ``tests/golden/make_*.py``
on the code before the redesign; issue 15 regenerated the ``deterministic`` entries on purpose (its meaning
changed: noise removed; the old meaning is ``deterministic(frozen)``, pinned to the old curve). A change
that alters a signature would orphan every run in the stores; one that alters a curve must bump
``harness.config.LOCAL_NUMERICS`` and regenerate the golden files on purpose.
"""
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"
ROOT = GOLDEN.parents[1]


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


def test_curves_bit_identical(tmp_path):
    subprocess.run([sys.executable, str(GOLDEN / "make_curves.py"), str(tmp_path / "c.json")], cwd=ROOT, check=True,
                   capture_output=True)
    now = json.loads((tmp_path / "c.json").read_text())
    want = json.loads((GOLDEN / "curves.json").read_text())
    assert set(now) >= set(want)  # a new estimator may add an entry; none may go
    for name, run in want.items():
        assert now[name]["signature"] == run["signature"], f"{name}: signature changed"
        assert len(now[name]["steps"]) == len(run["steps"])
        for i, (got, step) in enumerate(zip(now[name]["steps"], run["steps"])):
            # a new metric may be logged beside them; none of the pinned ones may move or go
            assert {k: got.get(k) for k in step} == step, f"{name}: step {i} changed"

"""scripts/conservative_control.py applies the pre-registered reading (docs/preregistration.md section 4) to a
report's verdicts and along-training tables: each of its three outcomes on hand-made tables."""
import importlib.util
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "conservative_control.py"
spec = importlib.util.spec_from_file_location("conservative_control", SCRIPT)
cc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cc)


def _report(tmp_path, h1: dict, h5: dict, norms: dict) -> Path:
    rows = []
    for (a, b), verdicts in (((cc.BASE, cc.MEAN8), h1), ((cc.MEAN8, cc.DAMPED), h5)):  # H5 stored as mean_8 - damped
        for endpoint, (verdict, effect) in verdicts.items():
            rows.append({"kind": "pair", "a": a, "b": b, "endpoint": endpoint, "family": "primary",
                         "verdict": verdict, "effect": effect})
    rows.append({"kind": "pair", "a": cc.DAMPED, "b": cc.MEAN8, "endpoint": "final", "family": "exploratory",
                 "verdict": "separates", "effect": -0.5})  # an exploratory row is never read
    pd.DataFrame(rows).to_csv(tmp_path / "verdicts.csv", index=False)
    pd.DataFrame([{"group": g, cc.NORM: v} for g, v in norms.items()]).to_csv(tmp_path / "along.csv", index=False)
    return tmp_path


NORMS_LOW = {cc.BASE: 0.3, cc.DAMPED: 0.1, cc.MEAN8: 0.2}


@pytest.mark.parametrize("h1, h5, norms, answer", [
    # damped recompute moves less than mean_8 and still collapses more (mean_8 - damped < 0 on collapse): denominator
    ({"collapse": ("separates", 0.4)}, {"collapse": ("separates", -0.4)}, NORMS_LOW, "the denominator, not damping"),
    # the same verdicts, but damped recompute moved more than mean_8: the damping is not matched
    ({"collapse": ("separates", 0.4)}, {"collapse": ("separates", -0.4)}, {**NORMS_LOW, cc.DAMPED: 0.25},
     "not answered at this power"),
    # recompute loses to mean_8, damped recompute does not: consistent with damping
    ({"final": ("separates", -0.1)}, {"final": ("not shown", 0.0)}, NORMS_LOW, "consistent with damping"),
    # H5 separates in damped recompute's favour (mean_8 ends lower): not the denominator's win
    ({"final": ("not shown", 0.0)}, {"final": ("separates", -0.1)}, NORMS_LOW, "not answered at this power"),
])
def test_the_three_readings(tmp_path, h1, h5, norms, answer):
    assert cc.reading(_report(tmp_path, h1, h5, norms))[0] == answer


def test_a_report_without_the_pairs_is_refused(tmp_path):
    folder = _report(tmp_path, {}, {}, NORMS_LOW)
    with pytest.raises(SystemExit):
        cc.reading(folder)


def test_without_a_mean_8_group_the_reference_is_rollout(tmp_path):
    """v3_bias runs no mean_8 (it is rollout bitwise there): H1 and H5 are read against rollout."""
    rows = [{"kind": "pair", "a": cc.BASE, "b": cc.ROLLOUT, "endpoint": "final", "family": "primary",
             "verdict": "separates", "effect": -0.1},
            {"kind": "pair", "a": cc.DAMPED, "b": cc.ROLLOUT, "endpoint": "final", "family": "primary",
             "verdict": "not shown", "effect": 0.0}]
    pd.DataFrame(rows).to_csv(tmp_path / "verdicts.csv", index=False)
    pd.DataFrame([{"group": cc.ROLLOUT, cc.NORM: 0.2}, {"group": cc.DAMPED, cc.NORM: 0.1},
                  {"group": cc.BASE, cc.NORM: 0.3}]).to_csv(tmp_path / "along.csv", index=False)
    answer, facts = cc.reading(tmp_path)
    assert answer == "consistent with damping" and facts["reference"] == cc.ROLLOUT

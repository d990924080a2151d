"""Issue 31's conservative-update control, read by the rule fixed before the runs (docs/preregistration.md section 4).

Does mean_8 help by its denominator, or by damping the update? From a report folder's ``verdicts.csv`` (the primary
family) and ``along.csv`` (per arm: the median over seeds of the run mean of ``policy/update_norm``):

- ``DAMPED`` = recompute at half the lr, ``BASE`` = recompute, ``MEAN8`` = mean_n(n=8) (the sweep's group labels;
  ``rollout`` where the report has no mean_8 group: on the bias-only engine mean_n(n=8) is rollout bitwise, and
  ``v3_bias`` tests against rollout, docs/preregistration.md section 9);
- H1 = BASE vs MEAN8, H5 = DAMPED vs MEAN8 (primary pairs, both endpoints: collapse, final reward);
- "the denominator, not damping": DAMPED's median update norm <= MEAN8's, and H5 separates (Holm) on an endpoint in
  MEAN8's favour (DAMPED collapses more, or ends lower);
- "consistent with damping": H1 separates on an endpoint and H5 separates on none ("not shown" is not "equal");
- otherwise "not answered at this power".

    python scripts/conservative_control.py docs/results/v3_sparse [docs/results/v3_bias ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

BASE, DAMPED, MEAN8 = "recompute[trainer.lr=0.0003]", "recompute[trainer.lr=0.00015]", "mean_n(n=8)"
ROLLOUT = "rollout"
NORM = "policy/update_norm"


def _pair(verdicts: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """The primary rows of the pair (a, b), with the effect (and its interval ``lo``, ``hi``, where the table has
    one) signed as a - b."""
    v = verdicts[(verdicts["kind"] == "pair") & (verdicts["family"] == "primary")]
    ab = v[(v["a"] == a) & (v["b"] == b)].copy()
    ba = v[(v["a"] == b) & (v["b"] == a)].copy()
    ba["effect"] = -ba["effect"]
    if {"lo", "hi"} <= set(ba.columns):
        ba["lo"], ba["hi"] = -ba["hi"], -ba["lo"]
    return pd.concat([ab, ba])


def _favours_b(rows: pd.DataFrame) -> bool:
    """A row of a - b separates in b's favour: a collapses more (effect > 0) or ends lower (effect < 0)."""
    sep = rows[rows["verdict"] == "separates"]
    return bool(((sep["endpoint"] == "collapse") & (sep["effect"] > 0)).any()
                or ((sep["endpoint"] == "final") & (sep["effect"] < 0)).any())


def reading(folder: Path) -> tuple[str, dict]:
    """(the reading, the numbers it rests on) for one report folder."""
    verdicts = pd.read_csv(folder / "verdicts.csv")
    norms = pd.read_csv(folder / "along.csv").set_index("group")[NORM]
    ref = MEAN8 if ((verdicts["a"] == MEAN8) | (verdicts["b"] == MEAN8)).any() else ROLLOUT
    h1, h5 = _pair(verdicts, BASE, ref), _pair(verdicts, DAMPED, ref)
    if h1.empty or h5.empty:
        raise SystemExit(f"{folder}: the primary pairs H1 ({BASE} | {ref}) and H5 ({DAMPED} | {ref}) are not in "
                         "verdicts.csv: is this a v3 report made after every run finished?")
    facts = {"reference": ref, "update_norm": {k: float(norms.get(k, float("nan"))) for k in (BASE, DAMPED, ref)},
             "H1": dict(zip(h1["endpoint"], h1["verdict"])), "H5": dict(zip(h5["endpoint"], h5["verdict"]))}
    if facts["update_norm"][DAMPED] <= facts["update_norm"][ref] and _favours_b(h5):
        return "the denominator, not damping", facts
    if (h1["verdict"] == "separates").any() and not (h5["verdict"] == "separates").any():
        return "consistent with damping", facts
    return "not answered at this power", facts


def main(argv: list[str] | None = None) -> int:
    folders = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not folders:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    for folder in folders:
        answer, facts = reading(folder)
        print(f"{folder}: {answer}  (update norm medians {facts['update_norm']}; H1 {facts['H1']}; H5 {facts['H5']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

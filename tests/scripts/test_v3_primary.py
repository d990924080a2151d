"""scripts/v3_primary.py: the pre-registered contrasts of both conditions in one table, from report folders made by
the real verdicts code (analysis.verdicts) on synthetic per-run measures with the study's labels and primary list."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.verdicts import frame, verdicts

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "v3_primary.py"
spec = importlib.util.spec_from_file_location("v3_primary", SCRIPT)
vp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vp)

MEANS = ["mean_n(n=1)", "mean_n(n=2)", "mean_n(n=4)", "mean_n(n=8)"]


def _folder(root: Path, name: str, rates: dict, seeds: int = 12, seed: int = 0) -> Path:
    """A report folder: runs.csv, verdicts.csv (the study's primary list; bias: against rollout) and along.csv."""
    rng = np.random.default_rng(seed)
    rows = []
    for lab, rate in rates.items():
        col = rng.random(seeds) < rate
        fin = 0.8 - 0.4 * col + rng.normal(0, 0.03, seeds)
        rows += [{"run_id": f"{lab}-{s}", "label": lab, "seed": s, "collapsed": bool(col[s]), "final": fin[s],
                  "auc": fin[s]} for s in range(seeds)]
    m = pd.DataFrame(rows)
    ref = vp.MEAN8 if vp.MEAN8 in rates else vp.ROLLOUT
    primary = [(vp.BASE, ref), (vp.TIS, ref), (vp.R3, vp.BASE), (vp.DAMPED, ref)]
    trends = {}
    if ref == vp.MEAN8:
        primary += [(vp.ROLLOUT, vp.MEAN8), ("trend", vp.TREND)]
        trends = {vp.TREND: [(float(lab[9:-1]), lab) for lab in MEANS]}
    cs = verdicts(m, list(rates), primary=primary, trends=trends, reps=200)
    folder = root / name
    folder.mkdir()
    frame(cs).to_csv(folder / "verdicts.csv", index=False)
    m.to_csv(folder / "runs.csv", index=False)
    pd.DataFrame([{"group": g, vp.cc.NORM: 0.1 + 0.01 * i} for i, g in enumerate(rates)]).to_csv(
        folder / "along.csv", index=False)
    return folder


SPARSE = {vp.BASE: 0.9, vp.DAMPED: 0.5, vp.ROLLOUT: 0.5, vp.TIS: 0.5, vp.R3: 0.5,
          **dict(zip(MEANS, [0.9, 0.6, 0.3, 0.0]))}
BIAS = {vp.BASE: 0.3, vp.DAMPED: 0.3, vp.ROLLOUT: 0.3, vp.TIS: 0.3, vp.R3: 0.3}


def test_one_row_per_hypothesis_and_condition_with_the_reports_numbers(tmp_path):
    sparse = _folder(tmp_path, "v3_sparse", SPARSE)
    bias = _folder(tmp_path, "v3_bias", BIAS, seed=1)
    assert vp.main([str(sparse), str(bias), "--out", str(tmp_path / "out" / "v3_primary")]) == 0
    df = pd.read_csv(tmp_path / "out" / "v3_primary.csv")
    assert list(zip(df["H"], df["condition"])) == [(h, "sparse noise") for h in ("H1", "H2", "H3", "H4", "H5", "H6")] \
        + [(h, "bias only") for h in ("H1", "H2", "H3", "H4", "H5", "H6")]
    v = pd.read_csv(sparse / "verdicts.csv")
    runs = pd.read_csv(sparse / "runs.csv")
    h1 = df.iloc[0]
    k = runs.groupby("label")["collapsed"].sum()
    assert h1["contrast"] == "recompute vs mean_8"
    assert h1["collapsed A / B"] == f"{k[vp.BASE]}/12 vs {k[vp.MEAN8]}/12"
    (col,) = v[(v["kind"] == "pair") & (v["endpoint"] == "collapse") & v["a"].isin([vp.BASE])
               & v["b"].isin([vp.MEAN8])].itertuples()
    assert h1["collapse p (Holm)"] == vp._p(col.p, col.p_holm)
    # the planted difference (0.9 vs 0.0 over 12 seeds) separates, as the report's own verdict says
    assert col.verdict == "separates" and h1["verdict"].startswith("**separates**") and "collapse" in h1["verdict"]
    # the shift is signed A - B whichever order the report stored the pair in
    (fin,) = v[(v["kind"] == "pair") & (v["endpoint"] == "final") & (v["family"] == "primary")
               & (((v["a"] == vp.BASE) & (v["b"] == vp.MEAN8)) | ((v["a"] == vp.MEAN8) & (v["b"] == vp.BASE)))
               ].itertuples()
    sign = 1 if fin.a == vp.BASE else -1
    assert float(h1["final A - B [CI]"].split()[0]) == pytest.approx(sign * fin.effect, abs=5e-4) and sign * fin.effect < 0
    h6 = df.iloc[5]
    assert h6["collapsed A / B"] == ", ".join(f"{k[lab]}/12" for lab in MEANS) and "rises with n" in h6["final A - B [CI]"]
    # bias only: mean_8 is rollout there; H2 and H6 are not tested, H1 is against rollout
    b = df[df["condition"] == "bias only"].set_index("H")
    assert b.loc["H1", "contrast"] == "recompute vs rollout"
    assert b.loc["H2", "verdict"].startswith("not tested") and b.loc["H6", "verdict"].startswith("not tested")
    assert b.loc["H4", "verdict"] in ("not shown", "**separates**: collapse", "**separates**: final",
                                      "**separates**: collapse, final")
    md = (tmp_path / "out" / "v3_primary.md").read_text()
    assert md.count("\n| H | contrast") == 1 and "Holm over 12 primary tests, 12 paired seeds" in md
    assert "Holm over 8 primary tests" in md and "conservative-update control (H5)" in md


def test_a_report_without_a_primary_pair_is_exit_2(tmp_path, capsys):
    folder = _folder(tmp_path, "v3_sparse", SPARSE)
    v = pd.read_csv(folder / "verdicts.csv")
    v = v[~((v["kind"] == "pair") & (v["a"].isin([vp.TIS]) | v["b"].isin([vp.TIS])))]
    v.to_csv(folder / "verdicts.csv", index=False)
    assert vp.main([str(folder), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "tis(C=2,token)" in err and "H3" in err and not (tmp_path / "x.md").exists()
    assert vp.main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2


def test_the_footer_states_the_power_of_the_family(tmp_path):
    from analysis import power

    line = vp.footer(_folder(tmp_path, "v3_sparse", SPARSE))
    shift = power.smallest_shift_detectable(12, 0.05, 12, 0.8)
    assert f"shift of {shift:.2f} sd" in line and math.isfinite(shift)


def test_the_forest_plot_has_each_pair_hypothesis_of_each_condition(tmp_path):
    folders = [_folder(tmp_path, "v3_sparse", SPARSE), _folder(tmp_path, "v3_bias", BIAS, seed=1)]
    data = vp.effects(folders)
    # sparse: H1-H5 on 2 endpoints; bias: H1, H3, H4, H5 (H2 is an identity there)
    assert len(data) == 18 and set(data[data["condition"] == "bias only"]["H"]) == {"H1", "H3", "H4", "H5"}
    h1 = data[(data["H"] == "H1") & (data["condition"] == "sparse noise") & (data["endpoint"] == "final")].iloc[0]
    assert h1["lo"] <= h1["effect"] <= h1["hi"] and h1["effect"] < 0 and h1["separates"]
    paths = vp.forest(data, tmp_path / "forest")
    assert [p.suffix for p in paths] == [".pdf", ".png"] and all(p.stat().st_size > 5000 for p in paths)


def test_the_footer_says_whether_the_contrasts_were_declared_before_the_runs(tmp_path):
    folder = _folder(tmp_path, "v3_bias", BIAS)
    assert "declared" not in vp.footer(folder)  # no report.md: nothing claimed
    (folder / "report.md").write_text(
        "## Notes\n\n- primary contrasts (a vs b) declared by the sweep at 2026-11-26 13:39 UTC, before the first run "
        "started: pre-registered; tested first, Holm among themselves, everything else exploratory.\n")
    assert vp.footer(folder).startswith(
        "bias only (declared at 2026-11-26 13:39 UTC, before the first run started: pre-registered): Holm over 8")
    (folder / "report.md").write_text("## Notes\n\n- primary contrasts (a vs b) given to the report (x): tested "
                                      "first, Holm among themselves; not pre-registered\n")
    assert "not pre-registered" in vp.footer(folder)

"""The report over small synthetic experiments in a tmp MLflow store: every file written, images of
the expected size, notes instead of crashes, the summary run logged and skipped by loaders."""
from __future__ import annotations

import numpy as np
import pytest
from matplotlib import image as mpimg
from mlflow.tracking import MlflowClient

from analysis.figures import FIG_SIZES, FORMATS, camp_panels, pixel_size
from analysis.load import load_experiment
from analysis.report import build_report

TABLE_EXTS = ("md", "csv", "tex")


def assert_png(path, name, dpi, panels: int = 1):
    img = mpimg.imread(path)
    w, h = pixel_size(name, dpi, panels)
    assert img.shape[:2] == (h, w), (path, img.shape)
    rgb = img[..., :3]
    assert rgb.std() > 0.01, f"{path} looks blank"
    assert (rgb < 0.5).any(), f"{path} has no dark pixels (no axes / text?)"


@pytest.fixture(scope="module")
def demo_report(store, tmp_path_factory):
    from analysis.config import AnalysisConfig

    out = tmp_path_factory.mktemp("report") / "demo"
    cfg = AnalysisConfig(bootstrap_reps=1000, curve_reps=100)
    return build_report("demo", store.uri, out, cfg, x="n", echo=None), cfg


def test_report_writes_every_figure_and_table(demo_report, store):
    result, cfg = demo_report
    drawn = set(FIG_SIZES) - {"forest"}  # 3 seeds per group: no pair is tested, no forest plot
    assert set(result.figures) == drawn, result.skipped
    assert "too few seeds" in result.skipped["forest"]
    panels = len(camp_panels(load_experiment("demo", store.uri))[1])  # 9 groups: small multiples
    assert panels == 2
    for name in drawn:
        for fmt in FORMATS:
            path = result.out_dir / f"{name}.{fmt}"
            assert path.exists() and path.stat().st_size > 1000, path
        assert_png(result.out_dir / f"{name}.png", name, cfg.dpi,
                   panels if name in ("reward_vs_step", "kl_vs_step", "survival") else 1)
    for table in ("summary", "runs", "poi", "sweep_n", "sweep_clip_c", "noise_probe"):
        for ext in TABLE_EXTS:
            assert (result.out_dir / f"{table}.{ext}").stat().st_size > 0
    md = result.report_md.read_text()
    for name in drawn:
        assert f"]({name}.png)" in md
    assert md.count("Not drawn") == 1 and "KwaiKAT" in md
    assert "max(7*sigma/sqrt" in md  # parameters under the tables
    assert md.index("![n_sweep]") < md.index("![reward_vs_step]")  # --x n puts the sweep first


def test_report_numbers_match_the_known_answers(demo_report):
    result, _ = demo_report
    s = result.tables["summary"].data.set_index("group")
    assert s.loc["rollout", "collapsed"] == 3 and s.loc["mean_n(n=1)", "collapsed"] == 3
    assert s.loc["mean_n(n=4)", "collapsed"] == 1 and s.loc["mean_n(n=16)", "collapsed"] == 0
    assert 85 <= s.loc["rollout", "onset_km_median"] <= 100  # drops at 90, 95, 100
    sweep = result.tables["sweep_n"].data
    assert list(sweep["collapse_rate"]) == pytest.approx([1.0, 1 / 3, 0.0])


def test_summary_run_logged_and_skipped_by_loaders(demo_report, store):
    result, _ = demo_report
    assert result.summary_run_id
    client = MlflowClient(store.uri)
    run = client.get_run(result.summary_run_id)
    assert run.data.tags["analysis_summary"] == "1" and run.info.status == "FINISHED"
    arts = {a.path for a in client.list_artifacts(result.summary_run_id)}
    assert {"report.md", "reward_vs_step.png", "reward_vs_step.pdf", "summary.tex"} <= arts
    exp = load_experiment("demo", store.uri)
    assert result.summary_run_id not in set(exp.runs["run_id"]) and len(exp.runs) == 27


def test_single_seed_experiment_reports_with_a_note(store, tmp_path, fast_cfg):
    result = build_report("single", store.uri, tmp_path / "single", fast_cfg, echo=None, log_to_mlflow=False)
    md = result.report_md.read_text()
    assert "single seed" in md and "need >= 2 seeds" in md
    for name in ("reward_vs_step", "kl_vs_step", "survival", "collapse_onset"):
        assert_png(tmp_path / "single" / f"{name}.png", name, fast_cfg.dpi)
    # the sweeps and the probe table have no inputs here: notes, not crashes
    assert "needs runs of mean_n at >= 2 values of `n`" in md
    assert "no probe runs" in md
    s = result.tables["summary"].data.set_index("group")
    assert s.loc["rollout", "collapsed"] == 1 and np.isnan(s.loc["rollout", "final_iqm_lo"])


def test_missing_metrics_experiment_reports_with_notes(store, tmp_path, fast_cfg):
    out = tmp_path / "missing"
    result = build_report("missing", store.uri, out, fast_cfg, x="clip_c", echo=None, log_to_mlflow=False)
    md = result.report_md.read_text()
    assert "kl_vs_step" in result.skipped and "`mismatch/k3`" in result.skipped["kl_vs_step"]
    assert "no run logged `mismatch/k3`" in md and "missing in any run" in md
    assert "`--x clip_c` asked for a sweep" in md
    assert_png(out / "reward_vs_step.png", "reward_vs_step", fast_cfg.dpi)
    assert not (out / "kl_vs_step.png").exists()


def test_report_to_a_store_without_the_experiment_raises(store, tmp_path):
    from analysis.load import AnalysisError

    with pytest.raises(AnalysisError, match="experiments there"):
        build_report("nope", store.uri, tmp_path, echo=None)


def test_probe_only_experiment_reports_the_probe_table(store, tmp_path, fast_cfg):
    result = build_report("probes_only", store.uri, tmp_path / "p", fast_cfg, echo=None, log_to_mlflow=False)
    md = result.report_md.read_text()
    assert "only probe runs" in md and "Noise probe" in md and "0.008" in md
    assert not result.figures and set(result.skipped) >= set(FIG_SIZES)
    assert (tmp_path / "p" / "noise_probe.tex").exists()


def test_palette_is_shared_and_distinct(store):
    from analysis.palette import Palette

    exp = load_experiment("demo", store.uri)
    pal = Palette.from_runs(exp.runs)
    again = Palette.from_runs(exp.runs)
    assert all(pal[lab] == again[lab] for lab in exp.labels)
    colours = [pal[lab].colour for lab in exp.labels]
    assert len(set(colours)) == len(colours)
    assert pal["tis(C=2,token)"].linestyle == "-" and pal["tis(C=2,sequence)"].linestyle == "--"


def test_declared_primary_contrasts_are_tested_first_and_called_pre_registered(fresh_store, fast_cfg, tmp_path):
    """A sweep's declaration (experiment tag primary_contrasts, harness/launch/primary.py) older than the runs: the
    report's primary family holds exactly the declared pair (both endpoints), and its note says pre-registered;
    a declaration newer than the first run is labelled primary, not pre-registered."""
    import json

    from mlflow.tracking import MlflowClient

    from analysis.synthetic import demo_runs, log_runs
    from harness.metrics import EXPERIMENT_TAGS

    exp_id = log_runs(fresh_store.uri, "prim", [r for r in demo_runs(seeds=6, T=130)
                                               if r.tags()["estimator"] in ("rollout", "mean_n")])
    client = MlflowClient(fresh_store.uri)
    decl = {"contrasts": [["rollout", "mean_n(n=16)"]], "declared_at_ms": 0, "history": []}
    client.set_experiment_tag(exp_id, EXPERIMENT_TAGS["primary"], json.dumps(decl))
    res = build_report("prim", fresh_store.uri, tmp_path / "a", fast_cfg, log_to_mlflow=False, echo=None)
    data = res.tables["verdicts"].data
    prim = data[data["family"] == "primary"]
    assert set(prim["endpoint"]) == {"collapse", "final"} and len(prim) == 2
    assert set(prim["a"]) | set(prim["b"]) == {"rollout", "mean_n(n=16)"}
    assert any("before the first run started: pre-registered" in n for n in res.notes)
    decl["declared_at_ms"] = int(4e12)  # 2096: after every run
    client.set_experiment_tag(exp_id, EXPERIMENT_TAGS["primary"], json.dumps(decl))
    res = build_report("prim", fresh_store.uri, tmp_path / "b", fast_cfg, log_to_mlflow=False, echo=None)
    assert any("labelled primary, not pre-registered" in n for n in res.notes)


def test_a_primary_trend_that_names_no_ordered_family_is_said_not_tested():
    """A declared trend names an ordered family (``mean_n over n``, analysis.verdict_tables.ordered_families); one
    that names none (a typo, or too few levels) would silently leave the primary family: the note says so, as it
    does for a pair whose label is no group's."""
    import pandas as pd

    from analysis.load import Experiment
    from analysis.report import primary_note

    rows = [{"label": f"mean_n(n={n})", "estimator": "mean_n", "n": float(n), "clip_c": float("nan"), "level": "",
             "seed": s, "start_time": 1} for n in (1, 2, 4, 8) for s in (0, 1)]
    rows += [{"label": "recompute", "estimator": "recompute", "n": float("nan"), "clip_c": float("nan"), "level": "",
              "seed": s, "start_time": 1} for s in (0, 1)]
    exp = Experiment("x", "0", "sqlite://", pd.DataFrame(rows), {}, pd.DataFrame())
    good = primary_note(exp, [("recompute", "mean_n(n=8)"), ("trend", "mean_n over n")], None)
    assert "not tested" not in good
    bad = primary_note(exp, [("recompute", "mean_n(n=8)"), ("trend", "mean_n over N")], None)
    assert "no ordered family 'mean_n over N'" in bad and "families: mean_n over n" in bad

"""A report over a small real experiment made by the harness in the test: 2 estimators x 2 seeds plus
one rollout run that differs only in the learning rate, 6 steps each, tiny batches, logged to a tmp
sqlite store (never the project's mlruns.db)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from matplotlib import image as mpimg

from analysis.figures import FIG_SIZES, pixel_size
from analysis.load import project_root
from analysis.report import build_report

ROOT = project_root()
ESTIMATORS = ("rollout", "recompute")
SEEDS = (0, 1)
STEPS = 6


LR_RUN = ("rollout", 0, "trainer.lr=0.0001")  # the default lr is 3e-4


def harness_run(tmp, estimator: str, seed: int, *extra: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "harness.run", f"estimator={estimator}", f"seed={seed}", f"trainer.steps={STEPS}",
         "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2", *extra,
         f"tracking.uri=sqlite:///{tmp}/m.db", "tracking.experiment=small",
         f"out_dir={tmp}/run_{estimator}_{seed}{'_lr' if extra else ''}"],
        check=True, cwd=ROOT, capture_output=True, text=True,
    )


@pytest.fixture(scope="module")
def small_experiment(empty_db, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    shutil.copy(empty_db, tmp / "m.db")  # an initialised store: no migrations in every subprocess
    jobs = [(e, s) for e in ESTIMATORS for s in SEEDS] + [LR_RUN]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time on a small machine
        for f in [pool.submit(harness_run, tmp, *job) for job in jobs]:
            try:
                f.result()
            except subprocess.CalledProcessError as exc:
                raise AssertionError(f"harness.run failed:\n{exc.stderr[-3000:]}") from exc
    return tmp


def test_report_over_real_harness_runs(small_experiment, fast_cfg):
    tmp = small_experiment
    out = tmp / "figures" / "small"
    result = build_report("small", f"sqlite:///{tmp}/m.db", out, fast_cfg, echo=None)
    summary = result.tables["summary"].data.set_index("group")
    # the run that differs only in lr is its own group, never a third "seed" of rollout
    lr_label, default = "rollout[trainer.lr=0.0001]", "rollout[trainer.lr=0.0003]"  # both named by what differs
    assert sorted(summary.index) == sorted(["recompute", default, lr_label])
    assert summary.loc[lr_label, "runs"] == 1
    summary = summary.drop(lr_label)
    assert (summary["runs"] == len(SEEDS)).all() and (summary["seeds"] == len(SEEDS)).all()
    groups = result.tables["groups"].data.set_index("label")
    assert "trainer.lr=0.0001" in groups.loc[lr_label, "apart"] and "seed" not in groups.loc[lr_label, "apart"]
    # the default experiment's explicit perturbation is printed in the table and the report
    assert (summary["perturbation"] == "router=1").all()
    assert (result.tables["summary"].frame["perturbation"] == "router=1").all()
    runs = result.tables["runs"].data
    assert (runs["n_steps"] == STEPS).all() and runs["final"].between(0, 1).all()
    # one definition: the run's own summary (its run line) equals the report's final and peak
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp}/m.db")
    for row in runs.itertuples():
        logged = client.get_run(row.run_id).data.metrics
        assert logged["summary/final_reward"] == pytest.approx(row.final)
        assert logged["summary/peak_reward"] == pytest.approx(row.peak)
    drawable = ("reward_vs_step", "kl_vs_step", "survival", "collapse_onset")
    assert set(drawable) <= set(result.figures), result.skipped
    for name in drawable:
        for fmt in ("png", "pdf"):
            assert (out / f"{name}.{fmt}").stat().st_size > 1000
        img = mpimg.imread(out / f"{name}.png")
        w, h = pixel_size(name, fast_cfg.dpi)
        assert img.shape[:2] == (h, w) and img[..., :3].std() > 0.01
    # no sweep and no probe in this experiment: notes, not crashes
    md = result.report_md.read_text()
    for name in set(FIG_SIZES) - set(drawable):
        assert name in result.skipped and f"![{name}]" not in md
    assert "no probe runs" in md and "the runs are short" in md and result.summary_run_id
    assert "- perturbation: router=1" in md


def test_report_from_exported_histories_matches_the_store(small_experiment, fast_cfg):
    """`export` then `report --from` over real harness runs (the whole metric catalogue): every table byte for byte."""
    from analysis.histories import export

    tmp = small_experiment
    uri = f"sqlite:///{tmp}/m.db"
    path = export("small", uri, tmp / "small.json.gz").path
    build_report("small", uri, tmp / "from_store", fast_cfg, echo=None, log_to_mlflow=False)
    build_report(None, None, tmp / "from_file", fast_cfg, echo=None, source=path)
    tables = lambda d: {p.name: p.read_bytes() for p in sorted(d.iterdir())  # noqa: E731
                        if p.suffix in (".md", ".csv", ".tex") and p.name != "report.md"}
    a = tables(tmp / "from_store")
    assert {"summary.csv", "runs.csv", "groups.md"} <= set(a) and a == tables(tmp / "from_file")

"""Histories that travel: an experiment exported from a tmp MLflow store to one .json.gz file, and the report,
compare and dose rebuilt from the file alone, byte for byte the tables the store gives."""
from __future__ import annotations

import gzip
import json
import math
import time

import numpy as np
import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from analysis.__main__ import main
from analysis.dose import build_dose
from analysis.histories import FORMAT, export, load
from analysis.load import AnalysisError, load_experiment
from analysis.report import build_report
from analysis.synthetic import SyntheticRun, curve, log_probe_run, log_runs
from harness import metrics as M

from .test_dose import dose_runs

T = 100
TABLE_EXTS = (".md", ".csv", ".tex")
TRICKY = (0.1 + 0.2, 1e-320, -0.0, 2.0 ** -1074, 1.7976931348623157e308 / 2, 123456789.123456789)


def _log(client, exp_id, run: SyntheticRun, status: str, params: dict[str, str] | None = None) -> str:
    """``run`` logged like :func:`analysis.synthetic.log_runs`, ending in ``status`` (RUNNING: never ended)."""
    rid = client.create_run(exp_id, run_name=f"{run.estimator}-s{run.seed}", tags=run.tags()).info.run_id
    if params:
        client.log_batch(rid, params=[Param(k, v) for k, v in params.items()])
    ts = int(time.time() * 1000)
    batch = [Metric(k, float(v), ts + i, i) for k, arr in run.metrics().items() for i, v in enumerate(arr)]
    for i in range(0, len(batch), 1000):
        client.log_batch(rid, metrics=batch[i:i + 1000])
    if status != "RUNNING":
        client.set_terminated(rid, status=status)
    return rid


@pytest.fixture(scope="module")
def mixed(empty_db, tmp_path_factory):
    """An experiment of 6 groups x 2 seeds (sweeps over n and C), with everything the loader leaves out or
    keeps apart: a superseded run, a KILLED, a FAILED and a RUNNING run, a run without an estimator tag, a
    summary run, two probe runs; a NaN loss, an inf loss, values that print long."""
    import shutil

    root = tmp_path_factory.mktemp("hist")
    shutil.copy(empty_db, root / "m.db")
    uri = f"sqlite:///{root / 'm.db'}"
    lr = {"trainer.lr": "0.0003", "trainer.steps": str(T)}
    log_runs(uri, "mixed", [SyntheticRun("rollout", 0, curve(T, seed=99), params=lr)])  # superseded below
    time.sleep(0.01)
    runs = []
    for s in range(2):
        runs.append(SyntheticRun("rollout", s, curve(T, drop_at=60 + 5 * s, seed=s), params=lr))
        runs.append(SyntheticRun("recompute", s, curve(T, plateau=0.75, seed=10 + s), loss_nan_at=70 if s == 0 else None,
                                 params=lr, all_metrics=True))
        for n in (4, 16):
            runs.append(SyntheticRun("mean_n", s, curve(T, drop_at=50 if n == 4 else None, seed=20 + s + n), n=n,
                                     params=lr))
        for c in (2.0, 8.0):
            runs.append(SyntheticRun("tis", s, curve(T, plateau=0.8 - c / 100, seed=40 + s + int(c)), clip_c=c,
                                     level="token", params={**lr, "trainer.lr": "0.0001" if c == 8.0 else "0.0003"}))
    log_runs(uri, "mixed", runs)
    client = MlflowClient(uri)
    exp_id = client.get_experiment_by_name("mixed").experiment_id
    left = {status: _log(client, exp_id, SyntheticRun("tis", 2, curve(40, seed=60 + k), clip_c=2.0, level="token"),
                         status, params=lr)
            for k, status in enumerate(("KILLED", "FAILED", "RUNNING"))}
    rid = client.search_runs([exp_id], "tags.estimator = 'rollout' and tags.seed = '1'")[0].info.run_id
    ts = int(time.time() * 1000)
    client.log_batch(rid, metrics=[Metric(M.POLICY_LOSS, math.inf, ts, T + 1), Metric(M.POLICY_LOSS, -math.inf, ts, T + 2),
                                   *(Metric(M.MISMATCH_K3, v, ts, T + 3 + i) for i, v in enumerate(TRICKY))])
    client.create_run(exp_id, tags={"something": "else"})  # no estimator tag: skipped with a note
    client.create_run(exp_id, tags={"analysis_summary": "1"})  # skipped silently
    log_probe_run(uri, "mixed", "moe", 0.009, 2e-3, 1e-7)
    log_probe_run(uri, "mixed", "dense", 0.002, 1e-5, 0.0)
    # primary contrasts declared as a sweep does (harness.launch.primary): they must travel with the file
    client.set_experiment_tag(exp_id, M.EXPERIMENT_TAGS["primary"], json.dumps(
        {"contrasts": [["recompute", "rollout"], ["trend", "mean_n over n"]], "declared_at_ms": 1, "history": []}))
    path = root / "mixed.json.gz"
    done = export("mixed", uri, path)
    return uri, path, left, rid, done


def _tables(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())
            if p.suffix in TABLE_EXTS and p.name != "report.md"}


def _report_md(folder) -> list[str]:
    """report.md less the two lines that may differ: where the runs came from and when."""
    return [ln for ln in (folder / "report.md").read_text().splitlines()
            if not ln.startswith(("- tracking URI:", "- generated:"))]


@pytest.mark.parametrize("options", [{}, {"include_unfinished": True, "group_by": ["trainer.lr"], "x": "clip_c"}],
                         ids=["default", "unfinished-group-by"])
def test_report_from_the_file_is_the_stores_byte_for_byte(mixed, tmp_path, fast_cfg, options):
    uri, path, _, _, _ = mixed
    store = build_report("mixed", uri, tmp_path / "store", fast_cfg, echo=None, log_to_mlflow=False, **options)
    file = build_report(None, None, tmp_path / "file", fast_cfg, echo=None, source=path, **options)
    a, b = _tables(tmp_path / "store"), _tables(tmp_path / "file")
    assert {"summary.md", "groups.csv", "runs.tex", "poi.csv", "separation.md", "sweep_n.csv", "noise_probe.md"} <= set(a)
    assert ("by_trainer.lr.csv" in a) if options else ("sweep_clip_c.tex" in a)
    assert list(a) == list(b)
    for name in a:
        assert a[name] == b[name], name
    assert set(store.figures) == set(file.figures) and store.figures and store.skipped == file.skipped
    figs = {p.name for p in (tmp_path / "store").iterdir() if p.suffix in (".png", ".pdf")}
    assert figs and figs == {p.name for p in (tmp_path / "file").iterdir() if p.suffix in (".png", ".pdf")}
    assert _report_md(tmp_path / "store") == _report_md(tmp_path / "file")
    assert file.summary_run_id is None  # nothing logged anywhere
    # the declared primary contrasts travel with the file: the same note (declared before the runs) as the store's
    note = [n for n in file.notes if n.startswith("primary contrasts (recompute vs rollout")]
    assert note and "declared by the sweep at 1970-01-01 00:00 UTC, before the first run started: pre-registered" \
        in note[0] and file.notes == store.notes


def test_left_out_runs_notes_and_histories_are_the_stores(mixed):
    uri, path, left, rid, done = mixed
    assert done.runs == 20 and done.size == path.stat().st_size
    for options in ({}, {"include_unfinished": True}, {"group_by": ["trainer.lr"]}):
        metrics = (M.REWARD_MEAN, M.POLICY_LOSS, M.MISMATCH_K3, M.IS_ESS, M.MOE_ROUTER_KL)
        s, f = load_experiment("mixed", uri, metrics=metrics, **options), load(path, metrics=metrics, **options)
        pd.testing.assert_frame_equal(s.runs, f.runs)
        pd.testing.assert_frame_equal(s.excluded, f.excluded)
        pd.testing.assert_frame_equal(s.groups, f.groups)
        pd.testing.assert_frame_equal(s.probes, f.probes)
        assert s.notes == f.notes and s.group_params == f.group_params and s.name == f.name == "mixed"
        assert s.experiment_id == f.experiment_id and f.tracking_uri == f"histories:{path}"
        for metric in metrics:
            assert set(s.histories[metric]) == set(f.histories[metric]), metric
            for run_id, series in s.histories[metric].items():
                other = f.histories[metric][run_id]
                assert series.index.equals(other.index) and series.to_numpy().tobytes() == other.to_numpy().tobytes()
    why = dict(zip(s.excluded["run_id"], s.excluded["why"]))
    default = load(path)
    assert {left["KILLED"]: "status KILLED", left["FAILED"]: "status FAILED", left["RUNNING"]: "status RUNNING"}.items() \
        <= dict(zip(default.excluded["run_id"], default.excluded["why"])).items()
    assert any("superseded" in w for w in why.values())
    assert any("without an `estimator` tag" in n for n in default.notes)


def test_non_finite_and_long_floats_round_trip_exactly(mixed):
    _, path, _, rid, _ = mixed
    exp = load(path, metrics=(M.POLICY_LOSS, M.MISMATCH_K3))
    loss, k3 = exp.series(M.POLICY_LOSS, rid), exp.series(M.MISMATCH_K3, rid)
    assert loss.loc[T + 1] == math.inf and loss.loc[T + 2] == -math.inf
    assert [k3.loc[T + 3 + i] for i in range(len(TRICKY))] == list(TRICKY)
    nan_run = exp.runs.loc[(exp.runs["estimator"] == "recompute") & (exp.runs["seed"] == 0), "run_id"].iloc[0]
    assert np.isnan(exp.series(M.POLICY_LOSS, nan_run).loc[70:]).all()
    with gzip.open(path, "rt") as f:
        text = f.read()
    assert '"Infinity"' in text and '"-Infinity"' in text and '"NaN"' in text
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


def test_encoded_values_read_back_bit_for_bit():
    from analysis.histories import _decode_values, _encode_values

    values = np.array([*TRICKY, math.nan, math.inf, -math.inf, -0.0, 1 / 3, 5e-324, 1.7976931348623157e308])
    text = json.dumps(_encode_values(values), allow_nan=False)  # sqlite turns -0.0 into 0.0; the file need not
    back = _decode_values(json.loads(text))
    assert back.dtype == np.float64 and back.tobytes() == values.tobytes()


def test_file_records_every_metric_and_every_run(mixed):
    uri, path, _, _, done = mixed
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    assert doc["format"] == FORMAT and doc["version"] == 1 and doc["complete"] is True
    assert doc["experiment"]["name"] == "mixed" and doc["experiment"]["tracking_uri"] == "sqlite:///<local>/m.db"
    assert set(M.CATALOGUE) <= set(doc["metrics"]) and set(M.PROBE_METRICS) <= set(doc["metrics"])
    assert done.metrics == len(doc["metrics"])
    assert {r["status"] for r in doc["runs"]} == {"FINISHED", "KILLED", "FAILED", "RUNNING"}
    probe = next(r for r in doc["runs"] if r["tags"].get("probe") == "1" and r["tags"]["model_kind"] == "moe")
    assert probe["latest"]["probe/diff"] == 0.009
    again = export("mixed", uri, path.with_name("again.json.gz"))
    assert again.path.read_bytes() == path.read_bytes()  # no name, no time in the gzip header


def test_cli_export_then_report_and_compare_from_the_file(mixed, tmp_path, capsys):
    uri, _, _, _, _ = mixed
    out = tmp_path / "h" / "mixed.json.gz"
    assert main(["export", "-e", "mixed", "--tracking-uri", uri, "--out", str(out)]) == 0
    assert "20 runs" in capsys.readouterr().out and out.exists()
    assert main(["report", "--from", str(out), "--out", str(tmp_path / "r"), "--set", "bootstrap_reps=200",
                 "--set", "curve_reps=50"]) == 0
    assert (tmp_path / "r" / "summary.md").exists() and "histories:" in (tmp_path / "r" / "report.md").read_text()
    capsys.readouterr()
    args = ["--a", "mean_n(n=16)", "--b", "rollout", "--set", "bootstrap_reps=500"]
    assert main(["compare", "--from", str(out), *args]) == 0
    from_file = capsys.readouterr().out
    assert main(["compare", "-e", "mixed", "--tracking-uri", uri, *args]) == 0
    assert from_file == capsys.readouterr().out and "P(A > B)" in from_file
    few = tmp_path / "h" / "few.json.gz"  # --metrics: a chosen list, and the file says it is not complete
    assert main(["export", "-e", "mixed", "--tracking-uri", uri, "--out", str(few), "--metrics",
                 "reward/mean, mismatch/k3"]) == 0
    with gzip.open(few, "rt") as f:
        doc = json.load(f)
    assert doc["metrics"] == ["mismatch/k3", "reward/mean"] and doc["complete"] is False
    capsys.readouterr()
    assert main(["export", "-e", "mixed", "--tracking-uri", uri, "--out", str(few), "--metrics",
                 "reward/mean,reward_mean"]) == 0  # a name no run logged (a typo): kept, and said on stderr
    assert "no run logged reward_mean" in capsys.readouterr().err


def _one_line_exit_2(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_bad_input_is_one_line_and_exit_2(mixed, tmp_path, capsys):
    uri, path, _, _, _ = mixed
    _one_line_exit_2(capsys, ["report", "--from", str(path), "--filter", "tags.seed = '0'", "--out", str(tmp_path)],
                     "--filter", "--from")
    _one_line_exit_2(capsys, ["report", "--from", str(path), "--tracking-uri", uri], "--tracking-uri", "--from")
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    doc["version"] = 2
    other = tmp_path / "v2.json.gz"
    with gzip.open(other, "wt") as f:
        json.dump(doc, f)
    _one_line_exit_2(capsys, ["report", "--from", str(other)], "version 2", "reads version 1", "export")
    plain = tmp_path / "plain.json.gz"
    plain.write_text("{}")
    _one_line_exit_2(capsys, ["report", "--from", str(plain)], "not a gzip-compressed JSON histories file")
    _one_line_exit_2(capsys, ["dose", "--from", str(tmp_path / "none.json.gz")], "no such file")
    _one_line_exit_2(capsys, ["export", "-e", "mixed", "--tracking-uri", uri, "--out", str(tmp_path / "x.json")],
                     "--out", ".json.gz")
    with pytest.raises(AnalysisError, match="holds experiment 'mixed', not 'demo'"):
        load(path, "demo")


def test_a_file_of_chosen_metrics_refuses_the_others(mixed, tmp_path):
    uri, _, _, _, _ = mixed
    path = export("mixed", uri, tmp_path / "some.json.gz", metrics=[M.REWARD_MEAN, M.POLICY_LOSS]).path
    assert len(load(path, metrics=[M.REWARD_MEAN]).runs) == 12
    with pytest.raises(AnalysisError, match="exported without mismatch/k3"):
        load(path, metrics=[M.REWARD_MEAN, M.MISMATCH_K3])


def test_dose_from_the_file_is_the_stores_byte_for_byte(empty_db, tmp_path, fast_cfg):
    import shutil

    shutil.copy(empty_db, tmp_path / "m.db")
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    log_runs(uri, "dose", dose_runs()[:12])  # two seeds of each arm
    path = export("dose", uri, tmp_path / "dose.json.gz").path
    build_dose("dose", uri, tmp_path / "store", fast_cfg, echo=None)
    build_dose(None, None, tmp_path / "file", fast_cfg, echo=None, source=path)
    a, b = _tables(tmp_path / "store"), _tables(tmp_path / "file")
    assert {"dose.md", "dose.csv", "dose.tex", "dose_equal_kl.csv"} <= set(a) and a == b


def test_the_file_holds_no_credential_and_no_absolute_local_path(empty_db, tmp_path):
    """Issue 45 (wrong case 2): on d747b32 the header held the URI as given (``sqlite:///<the author's path>``, or
    ``http://alice:<password>@...``) and the ``tracking.uri``/``out_dir`` params the author's absolute paths."""
    import shutil

    shutil.copy(empty_db, tmp_path / "s.db")
    uri = f"sqlite:///{tmp_path / 's.db'}"
    log_runs(uri, "shared", [SyntheticRun("rollout", 0, curve(20, seed=1), params={
        "out_dir": f"{tmp_path}/runs/shared/abc123", "tracking.uri": "http://alice:pw-one@store.example:5000",
        "note": "mysql://bob@db.example/x?password=pw-two&x=1"})])
    client = MlflowClient(uri)
    client.set_experiment_tag(client.get_experiment_by_name("shared").experiment_id, "origin",
                              f"file://{tmp_path}/exported")
    path = export("shared", uri, tmp_path / "shared.json.gz").path
    with gzip.open(path, "rt") as f:
        text = f.read()
    assert str(tmp_path) not in text and "pw-one" not in text and "pw-two" not in text
    doc = json.loads(text)
    (run,) = doc["runs"]
    assert doc["experiment"]["tracking_uri"] == "sqlite:///<local>/s.db"
    assert run["params"]["out_dir"] == "<local>/abc123"
    assert run["params"]["tracking.uri"] == "http://store.example:5000"
    assert run["params"]["note"] == "mysql://db.example/x?password=***&x=1"
    assert doc["experiment"]["tags"]["origin"] == "file:///<local>/exported"
    assert load(path).runs["seed"].tolist() == [0]


def test_shareable_leaves_names_relative_paths_and_numbers_alone():
    from analysis.shareable import shareable

    for text in ("rollout", "a/b/c", "runs/x/y", "1/2", "lr=3e-4", "mean_n(n=4)", "{\"contrasts\": [[\"a\", \"b\"]]}",
                 "http://host:5000/api/x"):
        assert shareable(text) == text
    assert shareable("/home/alice/runs/x") == "<local>/x"
    assert shareable("cmd --out /home/alice/f.json.gz") == "cmd --out <local>/f.json.gz"

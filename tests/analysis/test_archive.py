"""analysis/archive.py: finished runs archived as parts written once, restored into a new store with their tags,
params, start time and histories, never twice; a sweep then counts them as finished (tests/launch)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from analysis.archive import archive, archived, parts, restore
from analysis.load import AnalysisError, load_experiment
from analysis.synthetic import SyntheticRun, curve, log_runs
from harness import metrics as M
from harness.store import finished_signatures

KEEP = [M.REWARD_MEAN, M.POLICY_LOSS, M.MISMATCH_K3]


def runs(seeds, drop=None):
    return [SyntheticRun("recompute", s, curve(40, drop_at=drop, seed=s)) for s in seeds]


def new_store(empty_db, path):
    path.mkdir()
    shutil.copy(empty_db, path / "m.db")
    return f"sqlite:///{path / 'm.db'}"


def histories(uri, name="study"):
    exp = load_experiment(name, uri, metrics=tuple(KEEP))
    by_seed = {}
    for _, row in exp.runs.iterrows():
        by_seed[int(row["seed"])] = {m: exp.histories[m][row["run_id"]] for m in KEEP}
    return by_seed


def test_parts_are_written_once_and_a_new_store_gets_every_run_back(empty_db, tmp_path):
    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0, 1, 2], drop=20))
    folder = tmp_path / "parts"
    first = archive("study", folder, KEEP, a)
    assert first.path.name == "part-000.json.gz" and first.runs == 3 and first.already == 0
    assert archive("study", folder, KEEP, a).path is None  # nothing new: no part written
    log_runs(a, "study", runs([3]))
    second = archive("study", folder, KEEP, a)
    assert second.path.name == "part-001.json.gz" and (second.runs, second.already) == (1, 3)
    assert [p.name for p in parts(folder)] == ["part-000.json.gz", "part-001.json.gz"]
    before = first.path.read_bytes()

    b = new_store(empty_db, tmp_path / "b")
    done = restore(folder, b)
    assert (done.written, done.present, done.parts) == (4, 0, 2)
    assert finished_signatures(b, "study") == finished_signatures(a, "study") and len(finished_signatures(b, "study")) == 4
    old, new = histories(a), histories(b)
    assert sorted(new) == [0, 1, 2, 3]
    for seed in old:
        for m in KEEP:
            np.testing.assert_array_equal(new[seed][m].index, old[seed][m].index)
            np.testing.assert_array_equal(new[seed][m].to_numpy(), old[seed][m].to_numpy())

    from mlflow.tracking import MlflowClient
    ca, cb = MlflowClient(a), MlflowClient(b)
    ra = {r.data.tags["seed"]: r for r in ca.search_runs([ca.get_experiment_by_name("study").experiment_id])}
    rb = {r.data.tags["seed"]: r for r in cb.search_runs([cb.get_experiment_by_name("study").experiment_id])}
    for seed, run in rb.items():
        assert run.info.start_time == ra[seed].info.start_time and run.info.status == "FINISHED"
        assert run.data.tags["restored_run_id"] == ra[seed].info.run_id
        assert run.data.tags["restored_from"] in {"part-000.json.gz", "part-001.json.gz"}
        assert run.data.tags["spec_sig"] == ra[seed].data.tags["spec_sig"]
        assert set(run.data.metrics) == set(KEEP)  # only the archived metrics come back

    again = restore(folder, b)  # never twice
    assert (again.written, again.present) == (0, 4)
    assert archive("study", folder, KEEP, b).path is None  # restored runs are archived already
    assert first.path.read_bytes() == before  # a part is never rewritten


def test_a_rerun_is_archived_once_as_its_newest_run(empty_db, tmp_path):
    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0]))
    log_runs(a, "study", [SyntheticRun("recompute", 0, curve(40, drop_at=10, seed=99))])  # the same identity, later
    done = archive("study", tmp_path / "parts", KEEP, a)
    assert done.runs == 1
    from analysis.histories import load
    exp = load(tmp_path / "parts", metrics=tuple(KEEP))
    newest = histories(a)[0][M.REWARD_MEAN]
    assert len(exp.runs) == 1
    np.testing.assert_array_equal(exp.histories[M.REWARD_MEAN][exp.runs["run_id"].item()].to_numpy(), newest.to_numpy())


def test_unfinished_and_pruned_runs_are_not_archived(empty_db, tmp_path):
    from mlflow.tracking import MlflowClient

    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0]) + [SyntheticRun("recompute", 1, curve(40, seed=1), extra_tags={"status": "pruned"})])
    client = MlflowClient(a)
    exp_id = client.get_experiment_by_name("study").experiment_id
    running = client.create_run(exp_id, tags=SyntheticRun("recompute", 2, curve(5)).tags())  # still RUNNING
    done = archive("study", tmp_path / "parts", KEEP, a)
    assert done.runs == 1
    held = archived(tmp_path / "parts")
    assert [seed for _, seed in held] == ["0"]
    assert running.info.status == "RUNNING"


def test_one_folder_holds_one_experiment_and_bad_input_is_refused(empty_db, tmp_path):
    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0]))
    log_runs(a, "other", runs([0]))
    folder = tmp_path / "parts"
    archive("study", folder, KEEP, a)
    with pytest.raises(AnalysisError, match="holds experiment 'study', not 'other'"):
        archive("other", folder, KEEP, a)
    with pytest.raises(AnalysisError, match="--metrics"):
        archive("study", folder, [], a)
    with pytest.raises(AnalysisError, match="holds no parts"):
        restore(tmp_path / "empty", a)


def test_the_cli_archives_and_restores(empty_db, tmp_path, capsys):
    from analysis.__main__ import main

    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0, 1]))
    folder = str(tmp_path / "parts")
    assert main(["archive", "-e", "study", "--dir", folder, "--metrics", ",".join(KEEP), "--tracking-uri", a]) == 0
    assert "2 runs ->" in capsys.readouterr().out
    b = new_store(empty_db, tmp_path / "b")
    assert main(["restore", "--dir", folder, "--tracking-uri", b]) == 0
    assert "2 runs restored from 1 parts" in capsys.readouterr().out
    assert main(["restore", "--dir", str(tmp_path / "none"), "--tracking-uri", b]) == 2


def test_a_folder_of_parts_reads_as_the_store_does(empty_db, tmp_path):
    """``--from DIR``: the analysis reads the parts' runs, under one experiment, as it reads the store's."""
    from analysis.histories import load

    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0, 1], drop=20))
    archive("study", tmp_path / "parts", KEEP, a)
    log_runs(a, "study", runs([2]))
    archive("study", tmp_path / "parts", KEEP, a)
    store = load_experiment("study", a, metrics=tuple(KEEP))
    folder = load(tmp_path / "parts", metrics=tuple(KEEP))
    assert folder.name == "study" and len(folder.runs) == 3
    assert sorted(folder.runs["seed"].astype(int)) == [0, 1, 2]
    for m in KEEP:
        for rid, seed in zip(store.runs["run_id"], store.runs["seed"]):
            other = folder.runs.loc[folder.runs["seed"] == seed, "run_id"].item()
            np.testing.assert_array_equal(folder.histories[m][other].to_numpy(), store.histories[m][rid].to_numpy())
    with pytest.raises(AnalysisError, match="exported without"):
        load(tmp_path / "parts", metrics=(M.TIME_STEP,))
    with pytest.raises(AnalysisError, match="no parts"):
        load(tmp_path / "a")


def test_two_archives_at_once_write_two_parts_and_overwrite_none(empty_db, tmp_path, monkeypatch):
    """One archive at a time per folder (a lock): the second sees the first's part and writes only what is new."""
    import threading
    import time as _time

    from analysis import archive as A
    from analysis import histories as H

    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0, 1]))
    slow = H.encode

    def encode(head, rows):
        _time.sleep(0.5)  # the window in which a second archive would number its part alike
        return slow(head, rows)

    monkeypatch.setattr(H, "encode", encode)
    done = []
    threads = [threading.Thread(target=lambda: done.append(A.archive("study", tmp_path / "parts", KEEP, a)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(d.runs for d in done) == [0, 2]  # the second found everything archived
    assert [p.name for p in parts(tmp_path / "parts")] == ["part-000.json.gz"]


def test_a_restore_interrupted_half_way_leaves_no_run_behind(empty_db, tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0, 1]))
    archive("study", tmp_path / "parts", KEEP, a)
    b = new_store(empty_db, tmp_path / "b")
    calls = {"n": 0}
    real = MlflowClient.log_batch

    def flaky(self, run_id, metrics=(), params=(), tags=(), **kw):
        if metrics:
            calls["n"] += 1
            if calls["n"] == 1:
                raise KeyboardInterrupt  # the first run's histories, half-way
        return real(self, run_id, metrics=metrics, params=params, tags=tags, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", flaky)
    with pytest.raises(KeyboardInterrupt):
        restore(tmp_path / "parts", b)
    client = MlflowClient(b)
    exp_id = client.get_experiment_by_name("study").experiment_id
    assert client.search_runs([exp_id]) == []  # no RUNNING copy of the interrupted run
    assert restore(tmp_path / "parts", b).written == 2
    assert {r.info.status for r in client.search_runs([exp_id])} == {"FINISHED"}


def test_marks_are_enough_to_skip_and_the_analysis_leaves_them_out_of_a_store(empty_db, tmp_path):
    """restore --marks (a device call's restore): tags and params only; the launcher counts the runs finished, the
    analysis of the store leaves them out with the reason (their histories are read from the parts)."""
    from mlflow.tracking import MlflowClient

    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0, 1]))
    archive("study", tmp_path / "parts", KEEP, a)
    b = new_store(empty_db, tmp_path / "b")
    assert restore(tmp_path / "parts", b, marks=True).written == 2
    assert finished_signatures(b, "study") == finished_signatures(a, "study")
    client = MlflowClient(b)
    (run, _) = client.search_runs([client.get_experiment_by_name("study").experiment_id])
    assert run.data.metrics == {} and run.data.tags["restored_histories"] == "none"
    log_runs(b, "study", runs([2]))  # a run trained in this store
    exp = load_experiment("study", b, metrics=tuple(KEEP))
    assert list(exp.runs["seed"].astype(int)) == [2]
    assert any("restored as a mark only" in w for w in exp.excluded["why"])
    assert restore(tmp_path / "parts", b).written == 0  # present (FINISHED) already: not written again


def test_a_damaged_part_is_refused_in_one_line_naming_it(empty_db, tmp_path, capsys):
    from analysis.__main__ import main

    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "part-000.json.gz").write_bytes(b"not gzip")
    b = new_store(empty_db, tmp_path / "b")
    assert main(["restore", "--dir", str(tmp_path / "parts"), "--tracking-uri", b]) == 2
    err = capsys.readouterr().err.strip()
    assert "--dir" in err and "part-000.json.gz" in err and "--from" not in err and len(err.splitlines()) == 1


def test_one_exported_histories_file_restores_like_a_part(empty_db, tmp_path):
    """`analysis export`'s file (e.g. a finished experiment's committed histories): its FINISHED runs restored."""
    from analysis.histories import export

    a = new_store(empty_db, tmp_path / "a")
    log_runs(a, "study", runs([0, 1, 2]))
    export("study", a, tmp_path / "h.json.gz", metrics=KEEP)
    b = new_store(empty_db, tmp_path / "b")
    assert restore(tmp_path / "h.json.gz", b).written == 3
    assert finished_signatures(b, "study") == finished_signatures(a, "study")

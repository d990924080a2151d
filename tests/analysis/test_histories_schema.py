"""A histories file is checked before it is read (analysis/histories_schema.py, issue 45): one line naming the run
and the field, exit 2. On d747b32 each edit below gave a traceback or was read silently wrong; a repeated run_id
reported one run's curve as two seeds (mixed up); a gzip bomb was read whole."""
from __future__ import annotations

import copy
import gzip
import json

import pytest

from analysis.__main__ import main
from analysis.histories import encode


def _doc() -> dict:
    runs = []
    for seed in (1, 2):
        runs.append({"run_id": f"r{seed}", "run_name": f"rollout-s{seed}", "status": "FINISHED",
                     "start_time": 1000 + seed, "tags": {"estimator": "rollout", "seed": str(seed)},
                     "params": {"trainer.lr": "0.0003"}, "latest": {"reward/mean": 0.5},
                     "histories": {"reward/mean": {"step": [0, 1, 2], "value": [0.1, 0.2, 0.5]}}})
    return {"format": "moe-rl-harness histories", "version": 1,
            "experiment": {"name": "e", "experiment_id": "1", "tags": {}}, "metrics": ["reward/mean"],
            "complete": True, "runs": runs}


def _set(doc: dict, path: tuple, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


DELETE = object()
R = ("runs", 1)
H = (*R, "histories", "reward/mean")
CASES = {  # edit -> what the one line must say
    "histories a list": ((*R, "histories"), [], "run 2 ('r2'): histories must be an object"),
    "histories null": ((*R, "histories"), None, "run 2 ('r2'): histories must be an object"),
    "unequal lengths": ((*H, "step"), [0, 1], "run 2 ('r2'): histories['reward/mean']: 2 steps but 3 values"),
    "a string value": ((*H, "value"), [0.1, "foo", 0.5], "histories['reward/mean'].value: not all numbers"),
    "a string step": ((*H, "step"), [0, "x", 2], "histories['reward/mean'].step: not all integers"),
    "duplicate steps": ((*H, "step"), [0, 1, 1], "histories['reward/mean'].step: not ascending, each step once"),
    "step 1e30": ((*H, "step"), [0, 1, 1e30], "histories['reward/mean'].step: not all integers"),
    "start_time a string": ((*R, "start_time"), "noon", "run 2 ('r2'): start_time must be an integer"),
    "tags a list": ((*R, "tags"), [], "run 2 ('r2'): tags must be an object of strings"),
    "seed abc": ((*R, "tags", "seed"), "abc", "run 2 ('r2'): tags.seed 'abc' is not an integer"),
    "no experiment name": (("experiment",), {}, "experiment.name: missing or not a string"),
    "repeated run_id": ((*R, "run_id"), "r1", "run 2 ('r1'): run_id repeats run 1's"),
    "run_id a number": ((*R, "run_id"), 7, "run 2: run_id missing or not a string"),
    "latest a string": ((*R, "latest", "reward/mean"), "high", "run 2 ('r2'): latest must be an object of numbers"),
    "no status": ((*R, "status"), DELETE, "run 2 ('r2'): status missing"),
    "experiment tags of numbers": (("experiment", "tags"), {"a": 1}, "experiment.tags must be an object of strings"),
}


def _write(path, doc) -> None:
    path.write_bytes(encode({k: v for k, v in doc.items() if k != "runs"}, doc["runs"]))


def _refused(path, capsys) -> str:
    assert main(["report", "--from", str(path), "--out", str(path.parent / "out")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (path.parent / "out").exists()  # nothing written
    return err


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_file_is_one_line_naming_the_run_and_the_field(tmp_path, capsys, case):
    key, value, says = CASES[case]
    path = tmp_path / "h.json.gz"
    _write(path, _set(_doc(), key, value))
    assert says in _refused(path, capsys)


def test_nesting_deeper_than_python_reads_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.json.gz"
    text = json.dumps(_doc())[:-1] + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}"
    path.write_bytes(gzip.compress(text.encode()))
    assert "is not a gzip-compressed JSON histories file (RecursionError)" in _refused(path, capsys)


def test_a_gzip_bomb_is_refused_past_the_bound_without_reading_it_whole(tmp_path, capsys):
    from analysis import histories_schema as schema

    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b'{"format": "moe-rl-harness histories", "x": "' + b"0" * (schema.MIN_LIMIT + 1)
                                   + b'"}'))
    assert path.stat().st_size < schema.MIN_LIMIT // 500
    assert "decompresses to more than 67,108,864 bytes" in _refused(path, capsys)


def test_the_unedited_file_is_read(tmp_path):
    from analysis.histories import load

    path = tmp_path / "h.json.gz"
    _write(path, _doc())
    assert sorted(load(path).runs["seed"]) == [1, 2]

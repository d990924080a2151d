"""scripts/reproduce.py: a stored run retrained by this code gives every logged value again; a changed value, or a
folder whose spec this code signs differently, is reported and fails."""
import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest

from harness.spec import load
from harness.run import execute

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "reproduce.py"


@pytest.fixture(scope="module")
def reproduce():
    spec = importlib.util.spec_from_file_location("reproduce", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def stored(tiny_overrides):
    cfg = load(tiny_overrides("estimator=mean_n", "estimator.n=2", steps=4))
    execute(cfg, progress=False)
    return cfg


def test_a_stored_run_is_reproduced_value_for_value(reproduce, stored, capsys):
    assert reproduce.main([str(stored.run_dir), "--steps", "0"]) == 0
    line = capsys.readouterr().out
    assert "mean_n seed 0, 4 steps" in line and ", 0 differ" in line
    assert int(line.split(" values compared")[0].rsplit(" ", 1)[1]) > 4 * 20  # every metric of every step


def test_a_changed_value_is_found_and_named(reproduce, stored, capsys):
    run_id = json.loads((stored.run_dir / "run.json").read_text())["run_id"]
    db = sqlite3.connect(stored.tracking_uri.removeprefix("sqlite:///"))
    db.execute("update metrics set value = value + 1e-6 where run_uuid = ? and key = 'mismatch/k3' and step = 2",
               (run_id,))
    db.commit()
    assert reproduce.main([str(stored.run_dir), "--steps", "0"]) == 1
    line = capsys.readouterr().out
    assert ", 1 differ (first at step 2: mismatch/k3" in line


def test_a_folder_of_another_signature_is_not_compared(reproduce, stored, capsys):
    ident = stored.run_dir / "run.json"
    ident.write_text(json.dumps({**json.loads(ident.read_text()), "signature": "0000000000"}))
    assert reproduce.main([str(stored.run_dir)]) == 1
    assert "not comparable" in capsys.readouterr().out


def test_a_folder_whose_run_is_not_in_its_store_is_reported(reproduce, stored, capsys):
    ident = stored.run_dir / "run.json"
    ident.write_text(json.dumps({**json.loads(ident.read_text()), "run_id": "0" * 32}))
    assert reproduce.main([str(stored.run_dir)]) == 1
    assert f"MLflow run {'0' * 32} is not in the store" in capsys.readouterr().out

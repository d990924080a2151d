"""scripts/run_study_v4.sh plans its stage as blocks of seeds across every cell or arm, restores the stage's archived
parts before it trains and archives after each block. Checked with a stand-in for Python that records the commands
it is given (``-c`` snippets and scripts run for real: the seed count, the parts' numerics), so no run is trained."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def plan(tmp_path, **env) -> subprocess.CompletedProcess:
    shim = tmp_path / "python"
    shim.write_text(f'#!/usr/bin/env bash\nif [ "$1" = -c ] || [[ "$1" == *.py ]]; then exec {sys.executable} "$@"; fi\n'
                    'echo "CALL $*"\n')
    shim.chmod(0o755)
    return subprocess.run(["bash", "scripts/run_study_v4.sh"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": str(shim), **env})


def test_stage_a_restores_its_parts_then_runs_two_blocks_of_four_seeds_each_archived(tmp_path):
    done = plan(tmp_path)
    assert done.returncode == 0, done.stderr
    calls = [line[5:] for line in done.stdout.splitlines() if line.startswith("CALL ")]
    archive = "-m analysis archive --experiment v4_map --dir docs/results/v4_map/parts --metrics "
    assert calls[0] == "-m analysis restore --dir docs/results/v4_map/parts --marks"  # parts are committed
    assert calls[1] == "-m harness.sweep sweeps/v4_map.yaml launcher=local seeds=[200,201,202,203] --wait"
    assert calls[2].startswith(archive)
    assert calls[3] == "-m harness.sweep sweeps/v4_map.yaml launcher=local seeds=[204,205,206,207] --wait"
    assert calls[4].startswith(archive) and len(calls) == 5


def test_one_block_on_request_and_clear_errors(tmp_path):
    done = plan(tmp_path, BLOCKS="1")
    sweeps = [line for line in done.stdout.splitlines() if "harness.sweep" in line]
    assert sweeps == ["CALL -m harness.sweep sweeps/v4_map.yaml launcher=local seeds=[204,205,206,207] --wait"]
    for blocks in ("2", "x"):
        wrong = plan(tmp_path, BLOCKS=blocks)
        assert wrong.returncode == 2 and "is not a block of sweeps/v4_map.yaml (0..1)" in wrong.stderr
        assert "harness.sweep" not in wrong.stdout
    bad = plan(tmp_path, STAGE="c")
    assert bad.returncode == 2 and "STAGE must be a or b" in bad.stderr
    if not (ROOT / "sweeps" / "v4_stage_b.yaml").exists():  # stage B's sweep is written from stage A's cell
        b = plan(tmp_path, STAGE="b")
        assert b.returncode == 2 and "scripts/v4_stage_b.py" in b.stderr and "CALL" not in b.stdout


def test_every_archived_stage_a_run_is_a_run_of_todays_sweep_on_todays_numerics():
    """The committed parts stand for runs the runner will not train again: each must be a run of sweeps/v4_map.yaml as
    the code expands it today (its signature and seed) and carry the numerics key a run trained here would, or the
    map would mix two versions (a signature drift would retrain them; a numerics change must stop the study)."""
    from analysis.histories import read_source
    from harness import numerics
    from harness.launch.expand import validate
    from harness.launch.spec import load_spec

    numerics.pin()
    here = numerics.fingerprint("cpu")["key"]
    doc = read_source(ROOT / "docs" / "results" / "v4_map" / "parts")
    if {r["tags"]["numerics.key"] for r in doc["runs"]} != {here}:  # the runner refuses such a machine (tested below)
        pytest.skip(f"this machine trains numerics {here!r}, not the parts' (stage A runs where its parts were trained)")
    planned = {(p.cfg.signature, str(p.cfg.seed)) for p in validate(load_spec(str(ROOT / "sweeps" / "v4_map.yaml")))}
    held = [(r["tags"]["spec_sig"], r["tags"]["seed"]) for r in doc["runs"]]
    assert held and len(set(held)) == len(held)
    assert set(held) <= planned, sorted(set(held) - planned)
    assert {r["status"] for r in doc["runs"]} == {"FINISHED"}


def test_parts_of_other_numerics_stop_the_runner_before_it_trains(monkeypatch, capsys):
    """A machine whose numerics key differs from the parts' (another torch build or pins) must not restore them and
    train the rest: the stage would mix two versions. The runner calls this check first (exit 2 stops it)."""
    import importlib.util

    from harness import numerics

    spec = importlib.util.spec_from_file_location("parts_numerics", ROOT / "scripts" / "parts_numerics.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    parts = str(ROOT / "docs" / "results" / "v4_map" / "parts")
    monkeypatch.setattr(numerics, "fingerprint", lambda device: {"key": "another build"})
    assert mod.main([parts]) == 2 and "would not pool" in capsys.readouterr().err
    assert "scripts/parts_numerics.py" in (ROOT / "scripts" / "run_study_v4.sh").read_text()


def test_stage_b_verdicts_run_the_sweep_headers_survival_command_verbatim(tmp_path):
    """`STAGE=b ... --verdicts` (what `make study-v4-b` runs after training) hands Python the header's survival
    command argument by argument: the quoted --pair labels (with '|', '@', ',') stay whole. Stage A's header declares
    none: a clear error, exit 2, nothing run."""
    import shlex

    shim = tmp_path / "python"
    shim.write_text(f'#!/usr/bin/env bash\nif [ "$1" = -c ] || [[ "$1" == *.py ]]; then exec {sys.executable} "$@"; fi\n'
                    'printf "ARG %s\\n" "$@"\n')
    shim.chmod(0o755)
    run = lambda stage: subprocess.run(["bash", "scripts/run_study_v4.sh", "--verdicts"], cwd=ROOT, capture_output=True,
                                       text=True, timeout=120, env={**os.environ, "PYTHON": str(shim), "STAGE": stage})
    done = run("b")
    assert done.returncode == 0, done.stderr
    header = [l for l in (ROOT / "sweeps" / "v4_stage_b.yaml").read_text().splitlines()
              if l.startswith("#   python -m analysis survival ")]
    assert len(header) == 1
    args = [line[4:] for line in done.stdout.splitlines() if line.startswith("ARG ")]
    assert args == shlex.split(header[0][1:])[1:]  # -m analysis survival --from ... --out docs/results/v4_stage_b
    assert args.count("--pair") == 5 and "tis(C=2,token)[router@k3=0.01]|mean_n(n=8)[router@k3=0.01]" in args
    a = run("a")
    assert a.returncode == 2 and "declares no" in a.stderr and "ARG" not in a.stdout
    assert "run_study_v4.sh --verdicts" in (ROOT / "Makefile").read_text()

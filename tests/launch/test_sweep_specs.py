"""Fast tests without a scheduler: the shipped sweep specs expand and validate, bad specs are
refused naming the run and the key, overrides and the pre-registered scores behave."""
from __future__ import annotations

import math
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
import yaml

from analysis import measures as analysis_measures
from harness.uri import ROOT
from harness.estimators import NAMES

#: the ten estimators of the stored ablation runs; gmpo_rs came later (issue 15: its arm is a calibrated sweep's),
#: geo_rs and r2 later still (issue 31: the shipped sweeps are not extended under their stored runs)
ESTIMATORS = tuple(e for e in NAMES if e not in ("gmpo_rs", "geo_rs", "r2"))
from harness.launch.tune import objective, report
from harness.launch.cluster import slurm_ready
from harness.launch.expand import validate
from harness.launch.spec import SweepError, hydra_value, load_spec, parse_spec

SWEEPS = ROOT / "sweeps"


def runs_of(name: str, *overrides: str):
    return validate(load_spec(SWEEPS / f"{name}.yaml", list(overrides)))


def test_same_spec_in_two_experiments_is_two_runs():
    """noise_bias's router-noise arm is the ablation's run spec: same signature, a folder of its own, so a
    finished ablation run does not make the noise_bias sweep skip it (its experiment would lack the arm)."""
    abl = {r.signature: r for r in runs_of("ablation")}
    shared = [r for r in runs_of("noise_bias") if r.signature in abl]
    assert len(shared) == 20  # rollout/recompute/tis/mean_n x 5 seeds under router noise 1.0
    assert all(r.cfg.run_dir != abl[r.signature].cfg.run_dir for r in shared)
    assert all(r.cfg.run_dir.parent.name == "noise_bias" for r in shared)


def test_ablation_is_every_estimator_and_plain_gmpo_times_ten_seeds():
    runs = runs_of("ablation")
    assert len(runs) == 10 * (len(ESTIMATORS) + 2) == 120
    assert Counter(r.cfg.estimator.name for r in runs) == {**{e: 10 for e in ESTIMATORS}, "gmpo_rs": 20}
    assert sorted(r.cfg.estimator.gamma_min for r in runs if r.cfg.estimator.name == "gmpo_rs") == [0.8] * 10 + [1.0] * 10
    assert {r.cfg.seed for r in runs} == set(range(10))
    assert len({r.signature for r in runs}) == 120
    assert all(r.cfg.tracking.experiment == "ablation" for r in runs)
    assert all(r.cfg.run_dir == ROOT / "runs" / "ablation" / r.signature for r in runs)
    assert all(r.cfg.trainer.checkpoint_every == 10 for r in runs)


def test_n_sweep_is_mean_n_over_n_and_seeds():
    runs = runs_of("n_sweep")
    assert {r.cfg.estimator.name for r in runs} == {"mean_n"}
    assert Counter(r.cfg.estimator.n for r in runs) == {1: 5, 2: 5, 4: 5, 8: 5, 16: 5}


def test_tis_grid_is_c_times_level_times_seeds():
    runs = runs_of("tis_grid")
    assert len(runs) == 50
    cells = Counter((r.cfg.estimator.clip_c, r.cfg.estimator.level) for r in runs)
    assert set(cells) == {(c, lv) for c in (1.5, 2.0, 3.0, 5.0, 10.0) for lv in ("token", "sequence")}
    assert set(cells.values()) == {5}
    assert {r.cfg.estimator.name for r in runs} == {"tis"}


def test_tune_specs_validate():
    from harness.launch.tune.spec import parse_tune, validate_tune

    for name in ("tis_clip", "tiny_tune"):
        spec = load_spec(SWEEPS / f"{name}.yaml")
        tc = parse_tune(spec)
        assert [p.key for p in tc.params] == ["estimator.clip_c"]
        assert validate_tune(spec, tc)


def test_launcher_is_not_identity():
    """Where and how a run is executed does not change its signature (same folder, same MLflow run)."""
    local = {r.name: r.signature for r in runs_of("tiny")}
    slurm = {r.name: r.signature for r in runs_of("tiny", "launcher=slurm", "launcher.partition=gpu",
                                                   "launcher.mem_gb=8", "experiment=other", "runs_dir=/tmp/x")}
    assert local == slurm
    changed = {r.name: r.signature for r in runs_of("tiny", "trainer.lr=0.01")}
    assert set(changed.values()).isdisjoint(local.values())


def test_cli_overrides():
    spec = load_spec(SWEEPS / "tiny.yaml", ["launcher=slurm", "launcher.partition=p", "launcher.additional.qos=high",
                                            "seeds=[7]", "grid.estimator=[mis]", "trainer.steps=3"])
    assert spec.launcher.name == "slurm" and spec.launcher.partition == "p"
    assert spec.launcher.additional == {"qos": "high"}
    runs = validate(spec)
    assert [(r.cfg.estimator.name, r.cfg.seed, r.cfg.trainer.steps) for r in runs] == [("mis", 7, 3)]


def test_slurm_parameters_from_the_spec():
    from harness.launch.submit import slurm_parameters

    spec = load_spec(SWEEPS / "ablation.yaml", ["launcher=slurm", "launcher.partition=gpu", "launcher.gpus_per_node=2",
                                                "launcher.nodes=2", "launcher.additional={reservation: rl}"])
    p = slurm_parameters(spec)
    assert p["partition"] == "gpu" and p["gpus_per_node"] == 2 and p["nodes"] == 2 and p["time"] == 120
    assert p["cpus_per_task"] == 1 and p["mem"] == "4096MB" and p["array_parallelism"] == 16
    assert p["additional_parameters"] == {"reservation": "rl"}
    assert any("OMP_NUM_THREADS=1" in line for line in p["setup"])


def write(tmp_path, data: dict):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_one_invalid_run_names_the_run_and_the_key(tmp_path):
    p = write(tmp_path, {"base": ["estimator=tis"], "grid": {"estimator.clip_c": [2.0, 3.0, 0.5]}, "seeds": [0, 1]})
    with pytest.raises(SweepError) as e:
        validate(load_spec(p))
    msg = str(e.value)
    assert e.value.key == "estimator.clip_c"
    assert "2 of 6 runs invalid" in msg and "nothing submitted" in msg
    assert "run 5/6 (estimator.clip_c=0.5 seed=0): estimator.clip_c: the cap C must be > 1, got 0.5 (the same for 1 " \
           "more run)" in msg and "run 6/6" not in msg  # one line for the two seeds of the bad value


def test_a_bad_key_every_run_shares_is_one_line_with_the_run_count(tmp_path):
    """A bad key in ``base`` fails every run alike: said once, not once per run (it was 10 lines and "... more")."""
    p = write(tmp_path, {"base": ["trainer.lrr=1"], "grid": {"estimator": ["tis", "recompute"]}, "seeds": [0, 1, 2]})
    with pytest.raises(SweepError) as e:
        validate(load_spec(p))
    lines = str(e.value).splitlines()
    assert lines[0].endswith("6 of 6 runs invalid, nothing submitted:") and len(lines) == 2, lines
    assert lines[1].startswith("  all 6 runs: trainer.lrr: unknown key; trainer has: checkpoint_every,")


@pytest.mark.parametrize("data, key", [
    ({"grid": {"estimator": ["tis", "nope"]}}, "estimator"),
    ({"grid": {"trainer.stepz": [1]}}, "trainer.stepz"),
    ({"base": ["trainer.lr=-1"]}, "trainer.lr"),
    ({"launcher": {"name": "pbs"}}, "launcher"),
    ({"launcher": {"name": "slurm", "partitions": "x"}}, "launcher.partitions"),
    ({"launcher": {"cpus_per_task": 0}}, "launcher.cpus_per_task"),
    ({"seeds": [0, 0]}, "seeds"),
    ({"grids": {}}, "grids"),
    ({"name": "../../../../x", "grid": {"estimator": ["tis"]}}, "name"),
    ({"experiment": "a/b", "base": ["estimator=tis"]}, "experiment"),
    ({"launcher": {"name": "local"}}, "grid"),  # nothing to run: one default 300-step run on 56d12ff
])
def test_bad_specs_are_refused_naming_the_key(tmp_path, data, key):
    with pytest.raises(SweepError) as e:
        validate(load_spec(write(tmp_path, data)))
    assert e.value.key == key, str(e.value)
    assert key in str(e.value)


def test_cli_exit_code_2_and_nothing_written(tmp_path):
    p = write(tmp_path, {"base": ["estimator=mean_n"], "grid": {"estimator.n": [1, 0]}, "runs_dir": str(tmp_path / "r")})
    r = subprocess.run([sys.executable, "-m", "harness.sweep", str(p), "launcher=slurm"], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "estimator.n" in r.stderr and "run 2/2" in r.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text, override", [("", None), ("launcher: local\n", None),
                                            ("grid: {estimator: [tis]}\n", "name=../../../../x"),
                                            ("grid: {estimator: [tis]}\n", "experiment=..")])
def test_paths_and_empty_specs_exit_2_before_anything_is_written(tmp_path, capsys, text, override):
    """Issue 27 item 3: on 56d12ff ``name: ../../../../x`` wrote jobs.json and submitit's logs outside the project and
    an empty spec submitted one default run; now one line naming the key, exit 2, and no file anywhere."""
    from harness.launch.sweep import main

    work = tmp_path / "a" / "b" / "c" / "d"
    work.mkdir(parents=True)
    p = work / "spec.yaml"
    p.write_text(text)
    args = [str(p), f"runs_dir={work / 'runs'}", "launcher=local", *([override] if override else [])]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    key = (override or "grid").split("=")[0]
    assert key in err and ("a sweep needs a grid" in err or "plain name" in err), err
    assert sorted(q.relative_to(tmp_path) for q in tmp_path.rglob("*")) == [
        q.relative_to(tmp_path) for q in (tmp_path / "a", tmp_path / "a/b", tmp_path / "a/b/c", work, p)]


def test_a_study_name_is_a_plain_name(tmp_path):
    from harness.launch.tune.spec import parse_tune

    with pytest.raises(SweepError, match="plain name") as e:
        parse_tune(load_spec(SWEEPS / "tiny_tune.yaml", [f"runs_dir={tmp_path}", "tune.study=../x"]))
    assert e.value.key == "tune.study"


def test_tune_refuses_a_backend_without_a_pruner_callback(tmp_path, capsys):
    """A trial reports every step to the pruner (``Backend.prunable``): verl runs cannot, so exit 2 naming it."""
    from harness.launch.tune.cli import main

    data = {"name": "verl_tune", "seeds": [0], "launcher": {"name": "local"},
            "base": ["backend=verl", "model=qwen3_4b", "task=gsm8k_verl", "estimator=tis", "estimator.level=sequence"],
            "tune": {"params": {"estimator.clip_c": {"type": "float", "low": 1.5, "high": 10.0}}},
            "sweep_dir": str(tmp_path / "sweep"), "runs_dir": str(tmp_path / "runs")}
    assert main([str(write(tmp_path, data)), "--no-wait"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: backend: ") and "backend=verl cannot" in err, err
    assert not (tmp_path / "sweep").exists()


def test_bad_tune_bounds_are_refused(tmp_path):
    from harness.launch.tune.spec import parse_tune, validate_tune

    data = yaml.safe_load((SWEEPS / "tiny_tune.yaml").read_text())
    data["tune"]["params"]["estimator.clip_c"]["low"] = 0.5
    spec = load_spec(write(tmp_path, data))
    with pytest.raises(SweepError) as e:
        validate_tune(spec, parse_tune(spec))
    assert e.value.key == "estimator.clip_c" and "tune.params.estimator.clip_c" in str(e.value)
    data["tune"]["params"] = {"estimator.clip_c": {"type": "float", "low": 2.0}}
    with pytest.raises(SweepError, match="tune.params.estimator.clip_c.high"):
        parse_tune(load_spec(write(tmp_path, data)))


def test_tune_objective_is_pre_registered(tmp_path):
    """The objective, space and base run are stored in the study: a spec that changes them cannot add trials."""
    from harness.launch.tune.spec import parse_tune, store_of, validate_tune
    from harness.launch.tune.study import open_study

    spec = load_spec(SWEEPS / "tiny_tune.yaml", [f"runs_dir={tmp_path}"])
    tc = parse_tune(spec)
    open_study(spec, tc, validate_tune(spec, tc), store_of(spec, tc))
    open_study(spec, tc, validate_tune(spec, tc), store_of(spec, tc))  # the same spec again: fine
    for change in ("tune.objective.tail_frac=0.5", "trainer.lr=0.01"):
        spec2 = load_spec(SWEEPS / "tiny_tune.yaml", [f"runs_dir={tmp_path}", change])
        tc2 = parse_tune(spec2)
        with pytest.raises(SweepError, match="was registered with a different") as e:
            open_study(spec2, tc2, validate_tune(spec2, tc2), store_of(spec2, tc2))
        assert e.value.key == "tune.study"


def study_of(spec, create: bool = True):
    """The tune spec's study, opened as ``harness.tune`` (``create``) or its report opens it: bound to the spec's store."""
    from harness.launch.tune.spec import parse_tune, store_of, validate_tune
    from harness.launch.tune.study import open_study

    tc = parse_tune(spec)
    return open_study(spec, tc, validate_tune(spec, tc), store_of(spec, tc), create=create)


def test_a_study_is_bound_to_its_store(tmp_path, capsys):
    """Issue 27 item 5: on 56d12ff tuning again against a new store continued the old study, whose best trial named
    a run only the old store held. Now the store (redacted) is registered: another store is exit 2 with the fix,
    before anything is submitted; the same store with other credentials is the same store."""
    from harness.launch.tune.cli import main

    def spec_for(uri, *more):
        return load_spec(SWEEPS / "tiny_tune.yaml", [f"runs_dir={tmp_path}", f"tracking_uri={uri}", *more])

    old, new = f"sqlite:///{tmp_path}/old.db", f"sqlite:///{tmp_path}/new.db"
    spec = spec_for(old)
    assert study_of(spec).user_attrs["registration"]["store"] == old
    for create in (True, False):  # tuning, and --report / harness.status
        with pytest.raises(SweepError, match="is bound to the MLflow store") as e:
            study_of(spec_for(new), create=create)
        assert e.value.key == "tune.study" and old in str(e.value) and new in str(e.value)
        assert "tune.study=NAME" in str(e.value)
    assert main([str(SWEEPS / "tiny_tune.yaml"), f"runs_dir={tmp_path}", f"tracking_uri={new}", "--no-wait"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tune.study: ") and len(err.strip().splitlines()) == 1, err
    assert not (spec.sweep_dir / "jobs.json").exists()  # nothing submitted
    # an http store: recorded and compared without its credentials
    web = spec_for("http://alice:s3cret@127.0.0.1:9", "tune.study=web")
    assert study_of(web).user_attrs["registration"]["store"] == "http://127.0.0.1:9"
    study_of(spec_for("http://bob:other@127.0.0.1:9", "tune.study=web"))  # the same store: fine
    assert "s3cret" not in (web.sweep_dir / "optuna.journal").read_text()


def test_a_study_registered_before_stores_were_is_bound_only_where_its_runs_are(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path}/m.db"
    spec = load_spec(SWEEPS / "tiny_tune.yaml", [f"runs_dir={tmp_path}", f"tracking_uri={uri}"])
    study = study_of(spec)
    legacy = {k: v for k, v in study.user_attrs["registration"].items() if k != "store"}
    study.set_user_attr("registration", legacy)
    trial = study.ask()
    trial.set_user_attr("run_id", "0" * 32)  # a run of another store
    with pytest.raises(SweepError, match="names MLflow runs that are not in"):
        study_of(spec)
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("x"))
    trial.set_user_attr("run_id", run.info.run_id)  # its run is in this store: bound to it
    assert study_of(spec).user_attrs["registration"] == {**legacy, "store": uri}


def test_hydra_values_round_trip():
    assert hydra_value(2.0) == "2.0" and hydra_value(True) == "true" and hydra_value(None) == "null"
    assert hydra_value("tis") == "tis" and hydra_value([1, 2]) == "[1,2]"
    assert hydra_value("a b") == '"a b"' and hydra_value("true") == '"true"'  # stays a string


def test_duplicate_runs_run_once(tmp_path):
    # recompute has no C: two grid values that resolve to the same run collapse into one
    spec = parse_spec({"grid": {"estimator": ["recompute", "recompute"]}})
    assert len(validate(spec)) == 1


# ------------------------------------------------------------------------------ the tune objective
def test_objective_tail_mean_and_collapse():
    """The objective calls the report's collapse rule (analysis.measures), not a copy of it."""
    obj = objective.Objective(tail_frac=0.2, window=1)
    flat = [0.5] * 8 + [0.8, 0.8]
    assert objective.score(flat, 10, obj)[0] == pytest.approx(0.8)
    rng = np.random.default_rng(0)
    up = list(np.clip(np.r_[np.linspace(0.2, 0.8, 40), np.full(60, 0.8)] + rng.normal(0, 0.02, 100), 0, 1))
    collapsed = up + list(0.3 + rng.normal(0, 0.02, 20))  # 120 steps, onset at 100, tail = steps 96..119
    value, onset = objective.score(collapsed, 120, obj)
    assert onset is not None and abs(onset - 100) <= 2 and value == pytest.approx(0.3, abs=0.02)
    assert onset == analysis_measures.collapse_onset_index(collapsed, obj.rule)  # the report's, the same function
    value, onset = objective.score(up, 100, obj)
    assert onset is None and value == pytest.approx(0.8, abs=0.02)
    assert objective.score(flat, 10, obj, diverged=True)[0] == 0.0
    assert objective.score(up, 100, obj, losses=[0.0] * 50 + [math.nan] * 50) == (0.0, 50)


def test_objective_rejects_bad_keys():
    with pytest.raises(SweepError, match="tune.objective.delta_abs: unknown key"):
        objective.Objective.from_dict({"delta_abs": 0.1})
    with pytest.raises(SweepError, match="collapse_gain_frac"):
        objective.Objective.from_dict({"collapse_gain_frac": 2.0})


# ------------------------------------------------------------------------------ no Slurm
def test_slurm_absent_gives_a_clear_reason():
    ok, why = slurm_ready(install=False, path="/nonexistent")
    assert not ok
    assert "Slurm tools absent" in why and "sbatch" in why and "slurm/install.sh" in why


def test_submitting_to_slurm_without_tools_fails_clearly(tmp_path, monkeypatch):
    from harness.backends.local.jobs import RunJob
    from harness.launch import submit
    from harness.launch.submit import SubmissionError

    monkeypatch.setenv("PATH", "/nonexistent")
    spec = load_spec(SWEEPS / "tiny.yaml", ["launcher=slurm", f"runs_dir={tmp_path}"])
    with pytest.raises(SubmissionError, match="Slurm client tools not found"):
        submit.submit(spec, [RunJob({})])


def test_slurm_tests_skip_with_the_reason_when_tools_are_absent(tmp_path):
    env = {"PATH": "/nonexistent", "HARNESS_SLURM_INSTALL": "0", "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/launch/test_tune_slurm.py", "-q", "-rs",
                        "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped" in r.stdout and "no Slurm: Slurm tools absent" in r.stdout, r.stdout


@pytest.mark.parametrize("module", ["harness.sweep", "harness.status"])
def test_a_reader_that_stops_early_ends_the_command_quietly(module, tmp_path):
    """`python -m harness.sweep sweeps/noise_bias.yaml --dry-run | head`: the pipe is closed before the
    command writes (here: at once), and it ends with exit 1 and no traceback."""
    args = [sys.executable, "-m", module, str(SWEEPS / "noise_bias.yaml"), f"runs_dir={tmp_path}",
            f"tracking_uri=sqlite:///{tmp_path}/m.db"] + (["--dry-run"] if module == "harness.sweep" else [])
    p = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1 and "Traceback" not in err and "Exception ignored" not in err, err


def test_tune_plots_name_the_objective(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    study.optimize(lambda t: t.suggest_float("estimator.clip_c", 1.1, 20.0, log=True), n_trials=4)
    labels = []
    monkeypatch.setattr(plt, "close", lambda fig: labels.extend(a.get_ylabel() for a in fig.axes))
    from harness.launch.tune.spec import ParamSpec

    params = [ParamSpec("estimator.clip_c", low=1.1, high=20.0, log=True)]
    paths = report.save_plots(study, tmp_path, params, objective.Objective())
    assert len(paths) == 2 and labels
    assert "Objective Value" not in labels and sum("tail_mean" in lab and "last 20%" in lab for lab in labels) == 2, labels


def test_agentic_is_r3_over_replay_coverage_beside_mean_8_and_recompute():
    runs = runs_of("agentic")
    assert len(runs) == 60 and len({r.signature for r in runs}) == 60
    arms = Counter((r.cfg.estimator.name, r.cfg.estimator.n, r.cfg.inference.prefix_cache_capacity) for r in runs)
    assert arms == {("r3", None, 1.0): 10, ("r3", None, 0.85): 10, ("r3", None, 0.53): 10, ("r3", None, 0.22): 10,
                    ("mean_n", 8, 1.0): 10, ("recompute", None, 1.0): 10}
    assert {r.cfg.seed for r in runs} == set(range(10))
    assert all(r.cfg.task.name == "lookup" and r.cfg.inference.replay_on_miss == "recompute" for r in runs)
    assert all(r.cfg.tracking.experiment == "agentic" for r in runs)
    spec = load_spec(SWEEPS / "agentic.yaml")
    assert spec.launcher.name == "local" and spec.launcher.array_parallelism == 2


def test_sweep_runs_are_named_for_what_they_train():
    """The MLflow run name: the estimator's label and the seed, then the other keys that vary (issue 27 item 8)."""
    assert [r.cfg.tracking.run_name for r in runs_of("n_sweep") if r.cfg.seed == 3] == [
        f"mean_n(n={n}) s3" for n in (1, 2, 4, 8, 16)]
    names = {r.cfg.tracking.run_name for r in runs_of("noise_bias")}
    assert "mean_n(n=8) s4 inference.router_noise_sigma=0.0 inference.bias_delta=0.3" in names
    assert len(names) == 100


def test_the_demo_sweep_runs_every_registered_estimator():
    """The README says the demo runs every estimator: a newly registered one must be added to sweeps/demo.yaml."""
    import yaml

    from harness.estimators import NAMES
    from harness.uri import ROOT

    grid = yaml.safe_load((ROOT / "sweeps" / "demo.yaml").read_text())["grid"]["estimator"]
    assert sorted(grid) == sorted(NAMES)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_a_sweep_file_that_is_not_a_mapping_is_refused_with_overrides_too(tmp_path, capsys, text, command):
    """Issue 45: on d747b32 a list or scalar sweep file plus any key=value override was a TypeError traceback."""
    from harness.launch.sweep import main as sweep_main
    from harness.launch.tune.cli import main as tune_main

    p = tmp_path / "spec.yaml"
    p.write_text(text)
    run = sweep_main if command == "sweep" else tune_main
    assert run([str(p), f"runs_dir={tmp_path / 'runs'}", "launcher=local"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {p}: expected a YAML mapping at the top level") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_a_sweep_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    """Issue 45: on d747b32 a read-only sweep folder was an OSError traceback (here: a path through a file, which
    root cannot write either)."""
    from harness.launch.sweep import main as sweep_main

    (tmp_path / "file").write_text("")
    args = [str(SWEEPS / "tiny.yaml"), f"runs_dir={tmp_path / 'runs'}", f"sweep_dir={tmp_path / 'file' / 'sweep'}",
            f"tracking_uri=sqlite:///{tmp_path}/s.db", "launcher=local"]
    assert sweep_main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: sweep tiny: cannot write the sweep folder") and len(err.strip().splitlines()) == 1


def test_a_study_folder_that_cannot_be_written_is_one_line(tmp_path, capsys):
    """Issue 45: on d747b32 ``harness.tune`` with a read-only ``runs/sweeps/<study>`` was an OSError traceback."""
    from harness.launch.tune.cli import main as tune_main

    (tmp_path / "file").write_text("")
    args = [str(SWEEPS / "tiny_tune.yaml"), f"runs_dir={tmp_path / 'runs'}", f"sweep_dir={tmp_path / 'file' / 'sweep'}",
            f"tracking_uri=sqlite:///{tmp_path}/s.db", "launcher=local", "tune.n_trials=1"]
    assert tune_main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write or read") and len(err.strip().splitlines()) == 1, err

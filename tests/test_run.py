"""End-to-end runs of the local backend into a real (temporary) MLflow sqlite store."""
import math
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from harness import metrics as M
from harness.spec import load
from harness.estimators import NAMES as ESTIMATORS
from harness.run import execute

CURVES = (M.REWARD_MEAN, M.MISMATCH_K3, M.POLICY_LOSS, M.IS_WEIGHT_MAX, M.NOISE_VAR_ROLLOUT)


def history(cfg, summary, key):
    client = MlflowClient(cfg.tracking_uri)
    return [(m.step, m.value) for m in sorted(client.get_metric_history(summary.run_id, key), key=lambda m: m.step)]


def test_every_estimator_runs_and_its_curves_come_back_from_mlflow(tiny_overrides):
    for name in ESTIMATORS:
        cfg = load(tiny_overrides(f"estimator={name}", steps=20, name=name))
        summary = execute(cfg, progress=False)
        assert summary.status == "finished" and summary.steps_done == 20
        run = MlflowClient(cfg.tracking_uri).get_run(summary.run_id)
        assert run.data.tags["estimator"] == name and run.data.tags["spec_sig"] == cfg.signature
        for tag in M.RUN_TAGS:
            assert tag in run.data.tags
        # the default task is single-turn and holds no KL: neither the multi-turn nor the KL-held metrics
        for key in (k for k in M.CATALOGUE if k not in M.MULTI_TURN_ONLY + M.KL_HELD_ONLY):
            hist = history(cfg, summary, key)
            assert [s for s, _ in hist] == list(range(20)), (name, key)
        assert run.info.status == "FINISHED"


def test_same_spec_and_seed_give_identical_curves_and_other_seeds_differ(tiny_overrides):
    curves = []
    for i, seed in enumerate((0, 0, 1)):
        # one experiment each: in one experiment the second seed-0 run would be the first, found finished
        cfg = load(tiny_overrides("estimator=tis", f"seed={seed}", f"tracking.experiment=t{i}", steps=8, name=f"r{i}"))
        summary = execute(cfg, progress=False)
        curves.append({"run_id": summary.run_id, **{k: history(cfg, summary, k) for k in CURVES}})
    assert len({c.pop("run_id") for c in curves}) == 3  # three runs, really trained
    assert curves[0] == curves[1]
    assert curves[0][M.REWARD_MEAN] != curves[2][M.REWARD_MEAN]


def test_resume_after_interruption_continues_the_same_run_with_each_step_once(tiny_overrides):
    base = load(tiny_overrides("trainer.checkpoint_every=3", steps=10, name="straight"))
    straight = execute(base, progress=False)
    # the same spec and seed in the same store and experiment is one run: the interrupted one goes to another experiment
    cfg = load(tiny_overrides("trainer.checkpoint_every=3", "tracking.experiment=test2", steps=10, name="interrupted"))

    class Preempted(Exception):
        pass

    def preempt_at_7(step, values):
        if step == 7:
            raise Preempted
        return False

    with pytest.raises(Preempted):
        execute(cfg, on_step=preempt_at_7, progress=False)
    assert (cfg.run_dir / "checkpoint.pt").exists()
    import torch

    interrupted_run = torch.load(cfg.run_dir / "checkpoint.pt", weights_only=True)["run_id"]
    resumed = execute(cfg, progress=False)
    for key in CURVES:
        assert history(cfg, resumed, key) == history(base, straight, key), key
    assert resumed.run_id == interrupted_run != straight.run_id  # the same MLflow run, continued
    again = execute(cfg, progress=False)  # finished: returned, not retrained
    assert again == resumed


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "harness.run", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("args, key", [
    (["estimator=nope"], "estimator"),
    (["estimator=mean_n", "estimator.n=0"], "estimator.n"),
    (["estimator=tis", "estimator.clip_c=1"], "estimator.clip_c"),
    (["trainer.lr=0"], "trainer.lr"),
    (["task=nope"], "task"),
    (["estimator=tis", "estimator.n=4"], "estimator.n"),
])
def test_bad_input_gives_one_clear_error_exit_2_and_no_run(tmp_path, args, key):
    db = tmp_path / "m.db"
    res = _cli(*args, f"tracking.uri=sqlite:///{db}", f"out_dir={tmp_path}/o")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(f"error: {key}:"), res.stderr
    assert "Traceback" not in res.stderr
    assert not db.exists() and not (tmp_path / "o").exists()


def test_unknown_values_list_the_allowed_ones(tmp_path):
    res = _cli("estimator=nope", f"tracking.uri=sqlite:///{tmp_path}/m.db")
    for name in ESTIMATORS:
        assert name in res.stderr


def test_cli_one_run_prints_a_one_line_summary(tmp_path, tiny_overrides):
    res = _cli("estimator=mean_n", "estimator.n=2", "seed=3", *tiny_overrides(steps=3))
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("mean_n(n=2) seed=3 sort/moe_tiny: finished after 3 steps"), line


def test_missing_mlflow_server_is_a_clear_error(tmp_path, tiny_overrides):
    over = [o for o in tiny_overrides(steps=2) if not o.startswith("tracking.uri")]
    res = subprocess.run([sys.executable, "-m", "harness.run", *over, "tracking.uri=http://127.0.0.1:9"],
                         capture_output=True, text=True, env={**__import__("os").environ,
                                                              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
                                                              "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"})
    assert res.returncode == 1
    assert "cannot reach the MLflow tracking store at 'http://127.0.0.1:9'" in res.stderr


def test_help_lists_each_groups_choices_and_rerun(capsys):
    from harness.spec import GROUPS, group_options
    from harness.run import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--rerun" in out
    for group in GROUPS:
        line = next(l for l in out.splitlines() if l.strip().startswith(group + " "))
        assert all(opt in line for opt in group_options(group)), (group, line)


def test_an_uncached_warm_start_says_what_it_does(tmp_path, monkeypatch, capfd):
    from harness.backends.local import warmstart

    monkeypatch.setattr(warmstart, "CACHE", tmp_path)
    cfg = load(["task.warmstart.max_steps=5", "task.warmstart.eval_every=5"])
    warmstart.warm_start(cfg.model, cfg.task, cfg.seed)
    err = capfd.readouterr().err
    assert "warm start of moe_tiny on sort (seed 0, not cached yet)" in err and "warm start done: 5 steps" in err


def test_a_probe_of_a_spec_is_not_its_finished_run(tiny_overrides):
    """``harness.probe`` logs to the spec's experiment without the identity tags (``probe_of`` instead of
    ``spec_sig``), so the store does not take the probe for the spec's FINISHED run: the spec still trains."""
    over = tiny_overrides(steps=2)
    res = subprocess.run([sys.executable, "-m", "harness.probe", "--passes", "1", "--sequences", "4", *over],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    cfg = load(over)
    client = MlflowClient(cfg.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id])
    (probe,) = [r for r in runs if r.data.tags.get("model") == cfg.model.name]
    assert probe.data.tags["probe"] == "1" and probe.data.tags["probe_of"] == cfg.signature
    assert "spec_sig" not in probe.data.tags and "group_sig" not in probe.data.tags
    summary = execute(cfg, progress=False)
    assert summary.run_id != probe.info.run_id and summary.steps_done == 2 and math.isfinite(summary.final_reward)


def test_a_run_finished_in_the_store_says_so_and_mlflow_names_it_for_what_it_trained(tiny_overrides, capsys):
    """Issue 27 item 8: the second command trains nothing and says so (it printed the fresh run's line before);
    the MLflow run is named for what it trained (it was ``resilient-quail-678``) in an experiment of MLflow 3's
    model-training kind (the UI's GenAI overview was its landing page)."""
    import json

    from harness.run import main
    from harness.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    over = tiny_overrides("estimator=mean_n", "estimator.n=2", "seed=3", steps=2)
    assert main(over) == 0
    fresh = capsys.readouterr().out.strip().splitlines()[-1]
    assert main(over) == 0
    cached = capsys.readouterr().out.strip().splitlines()[-1]
    cfg = load(over)
    client = MlflowClient(cfg.tracking_uri)
    exp = client.get_experiment_by_name("test")
    (run,) = client.search_runs([exp.experiment_id])
    assert fresh.startswith("mean_n(n=2) seed=3 sort/moe_tiny: finished after 2 steps") and "not retrained" not in fresh
    assert cached.startswith(f"mean_n(n=2) seed=3 sort/moe_tiny: already finished in {cfg.tracking_uri} (run "
                             f"{run.info.run_id}), not retrained (--rerun trains it again): finished after 2 steps")
    assert run.info.run_name == "mean_n(n=2) s3"
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    assert "found_in" not in json.loads((cfg.run_dir / "summary.json").read_text())  # the run's record, not this answer
    named = load(tiny_overrides("tracking.run_name=mine", "seed=4", steps=2, name="named"))
    assert client.get_run(execute(named, progress=False).run_id).info.run_name == "mine"  # a chosen name is kept


def test_off_a_terminal_the_run_writes_no_progress_frames(tiny_overrides):
    """Issue 45: on d747b32 a run whose output went to a file or a pipe (a job's log) still wrote the progress bar's
    ``\\r`` frames (60 frames, 6 KB for 30 steps); off a terminal there is no bar now (tqdm's own rule)."""
    proc = subprocess.run([sys.executable, "-m", "harness.run", *tiny_overrides(steps=3)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\r" not in proc.stderr + proc.stdout and "it/s" not in proc.stderr

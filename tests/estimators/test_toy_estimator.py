"""A new estimator is one module plus one YAML file (issue 11, "Done when").

In a copy of the repository (its files as they stand, without ignored ones such as .venv, mlruns, runs/),
the test writes ``harness/estimators/toy.py`` (recompute with a constant weight ``scale``, validated > 0,
no verl mapping) and ``experiments/estimator/toy.yaml``, edits nothing else, and runs the copy's harness
(``cwd`` and ``PYTHONPATH`` = the copy): it trains 2 tiny local steps, fails closed on verl, refuses a bad
``estimator.scale``, and the registry, labels, palette and signatures take it in.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.spec import load

ROOT = Path(__file__).resolve().parents[2]
SKIP = (".venv/", "mlruns", "runs/")

TOY = '''"""``toy``: pi_old = logp_rec with a constant weight ``scale`` (a test's estimator; no verl mapping)."""
from dataclasses import dataclass

from harness.errors import ConfigError
from harness.estimators.base import Estimator, OldPolicy, Params, knob, register


@dataclass
class Scale(Params):
    scale: float = knob("scale", "the constant weight, > 0")

    def validate(self) -> None:
        if not self.scale > 0:
            raise ConfigError("estimator.scale", f"must be > 0, got {self.scale}")


@register
class Toy(Estimator):
    name = "toy"
    Params = Scale

    def old_policy(self, ctx) -> OldPolicy:
        old = self.plain(ctx, ctx.recompute().logp)
        return old.with_weight(old.weight * self.params.scale)
'''
TINY = ["trainer.steps=2", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
        "task.warmstart.max_steps=3", "task.warmstart.batch_size=8", "diagnostics.noise_sequences=4"]
REGISTRY_PROBE = """
import json
from analysis.palette import Palette
from harness import estimators
from harness.spec import load
print(json.dumps({"names": estimators.NAMES, "label": estimators.label("toy", {"scale": 0.5}),
                  "styled": "toy(scale=0.5)" in Palette([("toy(scale=0.5)", "toy", "")]),
                  "sig_recompute": load(["estimator=recompute"]).signature,
                  "sig_toy": load(["estimator=toy"]).signature}))
"""


def _copy_repo(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in files:
        src = ROOT / rel
        if rel and not rel.startswith(SKIP) and src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


def test_a_toy_estimator_is_one_module_and_one_yaml(tmp_path):
    copy = tmp_path / "repo"
    _copy_repo(copy)
    assert not (copy / "harness/estimators/toy.py").exists()
    (copy / "harness/estimators/toy.py").write_text(TOY)
    (copy / "experiments/estimator/toy.yaml").write_text("name: toy\nscale: 0.5\n")
    env = {**os.environ, "PYTHONPATH": str(copy), "MLFLOW_ENABLE_ASYNC_LOGGING": "false"}
    store = f"tracking.uri=sqlite:///{tmp_path}/mlruns.db"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True, text=True,
                              timeout=300)

    # (1) it trains locally
    res = run("-m", "harness.run", "estimator=toy", *TINY, store, f"out_dir={tmp_path}/toy")
    assert res.returncode == 0, res.stderr[-3000:]
    line = res.stdout.strip().splitlines()[-1]
    assert line.startswith("toy(scale=0.5) seed=0 ") and "finished after 2 steps" in line, line
    # its parameter reaches the run's tags, and analysis labels the run by it
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.split("=", 1)[1])
    (mlrun,) = client.search_runs([client.get_experiment_by_name("default").experiment_id])
    assert mlrun.data.tags["estimator"] == "toy" and mlrun.data.tags["scale"] == "0.5"

    # (2) on verl it fails closed, naming it
    res = run("-m", "harness.run", "backend=verl", "estimator=toy", "model=qwen3_30b_a3b", "trainer.lr=1e-6",
              store, "--dry-run")
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.startswith("error: estimator:") and "'toy' has no verl mapping" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr

    # (3) its own validation names its parameter
    res = run("-m", "harness.run", "estimator=toy", "estimator.scale=-1", store)
    assert res.returncode == 2 and res.stderr.startswith("error: estimator.scale:"), res.stderr
    assert "must be > 0" in res.stderr and "Traceback" not in res.stderr

    # the registry, labels and palette know it; existing signatures do not move (scale is unset there)
    res = run("-c", REGISTRY_PROBE)
    assert res.returncode == 0, res.stderr[-3000:]
    probe = json.loads(res.stdout)
    assert probe["names"][-1] == "toy" and "recompute" in probe["names"]
    assert probe["label"] == "toy(scale=0.5)" and probe["styled"]
    assert probe["sig_recompute"] == load(["estimator=recompute"]).signature
    assert probe["sig_toy"] != probe["sig_recompute"]

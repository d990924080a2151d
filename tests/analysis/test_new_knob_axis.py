"""Issue 43's "done when": a copied estimator with a new knob is swept, tabled and plotted (``report --x <knob>``)
while touching only its own module and YAML.

In a temporary copy of the project (``harness/``, ``analysis/``, ``experiments/``), the test adds exactly those two
files: ``harness/estimators/tis_scaled.py`` (TIS with a new knob ``scale``, declared a sweep axis) and
``experiments/estimator/tis_scaled.yaml``. Then, in that copy: a sweep over ``estimator.scale`` expands into valid
specs (``harness.launch.expand``), its runs' tags and params (synthetic curves) go to a real SQLite MLflow store, and
``python -m analysis report --x scale`` tables, plots and trend-tests the knob."""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULE = '''
"""tis_scaled: TIS whose weight is multiplied by a new knob ``scale`` (a test's copy of ``tis``)."""
from __future__ import annotations

from dataclasses import dataclass

from harness.errors import ConfigError
from harness.estimators.base import Estimator, OldPolicy, knob, register
from harness.estimators.tis import tis_weights
from harness.estimators.weights import CappedRatio


@dataclass
class Scaled(CappedRatio):
    scale: float = knob("s", "the weight's scale", axis=True, default=1.0)

    def validate(self) -> None:
        super().validate()
        if not self.scale > 0:
            raise ConfigError("estimator.scale", f"must be > 0, got {self.scale}")


@register
class TisScaled(Estimator):
    name = "tis_scaled"
    Params = Scaled

    def old_policy(self, ctx) -> OldPolicy:
        p = self.params
        logp_rec = ctx.recompute().logp
        return self.plain(ctx, logp_rec).with_weight(
            p.scale * tis_weights(logp_rec, ctx.logp_roll, ctx.mask, p.clip_c, p.level))
'''

SCRIPT = '''
import sys
from pathlib import Path

from analysis.synthetic import SyntheticRun, curve, log_runs
from harness.launch.expand import validate
from harness.launch.spec import load_spec
from harness.summary import flat
from harness.tags import run_tags

here = Path(sys.argv[1])
runs = []
for planned in validate(load_spec(here / "scale.yaml")):
    cfg = planned.cfg
    params = {k: str(v) for k, v in flat(cfg.public_dict()).items()}
    for seed in (0, 1):
        tags = {**run_tags(cfg, commit="x"), "seed": str(seed), "spec_sig": f"{cfg.group_signature}-{seed}"}
        hot = cfg.estimator.scale == 4.0
        reward = curve(T=80, ramp=20, drop_at=50 if hot else None, drop_to=0.1, seed=seed)
        runs.append(SyntheticRun("tis_scaled", seed, reward, extra_tags=tags, params={**params, "seed": seed}))
log_runs(sys.argv[2], "scale", runs, artifact_location=str(here / "artifacts"))
'''

SWEEP = """
name: scale
experiment: scale
base:
  - estimator=tis_scaled
grid:
  estimator.scale: [0.5, 1.0, 4.0]
seeds: [0]
"""


def test_a_copied_estimator_with_a_new_knob_is_swept_tabled_and_plotted(tmp_path):
    copy = tmp_path / "project"
    for part in ("harness", "analysis", "experiments"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    # the two files a new estimator is, and nothing else
    (copy / "harness" / "estimators" / "tis_scaled.py").write_text(textwrap.dedent(MODULE))
    (copy / "experiments" / "estimator" / "tis_scaled.yaml").write_text(
        "# TIS with a scaled weight (a test's copy): its defaults are its Params'\nname: tis_scaled\n")
    (tmp_path / "scale.yaml").write_text(SWEEP)
    (tmp_path / "make.py").write_text(SCRIPT)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(copy)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    made = run("-c", "import harness.estimators as e; print(e.__file__)")
    assert made.stdout.startswith(str(copy)), made  # the copy's package, not this checkout's
    made = run(str(tmp_path / "make.py"), str(tmp_path), uri)
    assert made.returncode == 0, made.stderr[-3000:]
    out = tmp_path / "report"
    rep = run("-m", "analysis", "report", "-e", "scale", "--x", "scale", "--out", str(out), "--no-log")
    assert rep.returncode == 0, rep.stderr[-3000:]
    table = (out / "sweep_scale.md").read_text()
    for s in ("0.5", "1", "4"):
        assert f"| tis_scaled(C=2,token) | {s} | 2 |" in table, table
    assert "| tis_scaled(C=2,token) | 4 | 2 | 2/2 |" in table
    assert (out / "sweep.png").stat().st_size > 10_000
    assert "trend: tis_scaled(C=2,token) over scale (0.5<1<4)" in (out / "verdicts.md").read_text()
    groups = (out / "groups.md").read_text()
    assert "tis_scaled(C=2,token,s=4)" in groups  # the knob in the group's label, from its declaration

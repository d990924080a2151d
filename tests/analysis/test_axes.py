"""Any spec key a report axis (issue 43): ``report --x trainer.lr`` and ``--x inference.kl_target`` on a hazard-map
sweep (KL-held noise dose x learning rate), from the store and ``--from`` its exported histories file.

The runs carry what a real sweep's runs carry: the tags (``harness.tags.run_tags``) and logged params (the flat
spec) of the specs ``harness.launch.expand`` builds from a sweep file; their reward curves are synthetic
(``analysis.synthetic``: known answers, a real SQLite MLflow store), so no training runs here."""
from __future__ import annotations

import pytest

from analysis.__main__ import main
from analysis.histories import export
from analysis.synthetic import SyntheticRun, curve, log_runs
from harness.launch.expand import validate
from harness.launch.spec import load_spec
from harness.summary import flat
from harness.tags import run_tags

DOSES, LRS = (0.001, 0.003, 0.01), (1e-4, 3e-4, 1e-3)
SWEEP = f"""
name: hazard
experiment: hazard
base:
  - estimator=recompute
  - inference.router_noise_sigma=4.0
  - inference.router_noise_rate=0.02
grid:
  inference.kl_target: {list(DOSES)}
  trainer.lr: {list(LRS)}
seeds: [0]
"""


@pytest.fixture(scope="module")
def hazard(tmp_path_factory):
    """A hazard-map experiment in a store: 3 doses x 3 lrs, 2 seeds each; it collapses at the top dose and lr."""
    tmp = tmp_path_factory.mktemp("hazard")
    (tmp / "hazard.yaml").write_text(SWEEP)
    runs = []
    for planned in validate(load_spec(tmp / "hazard.yaml")):
        cfg = planned.cfg
        params = {k: str(v) for k, v in flat(cfg.public_dict()).items()}
        hot = cfg.inference.kl_target == DOSES[-1] and cfg.trainer.lr == LRS[-1]
        for seed in (0, 1):
            tags = {**run_tags(cfg, commit="x"), "seed": str(seed), "spec_sig": f"{cfg.group_signature}-{seed}"}
            reward = curve(T=80, ramp=20, drop_at=50 if hot else None, drop_to=0.1, seed=seed)
            runs.append(SyntheticRun("recompute", seed, reward, extra_tags=tags, params={**params, "seed": seed}))
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    log_runs(uri, "hazard", runs, artifact_location=str(tmp / "artifacts"))
    export("hazard", uri, tmp / "hazard.json.gz")
    return tmp, uri


def _report(args: list[str]) -> int:
    return main(["report", "--no-log", *args])


@pytest.mark.parametrize("source", ["store", "file"])
def test_report_x_takes_the_learning_rate_and_the_noise_dose(hazard, source):
    tmp, uri = hazard
    where = ["-e", "hazard", "--tracking-uri", uri] if source == "store" else ["--from", str(tmp / "hazard.json.gz")]
    out = tmp / f"lr-{source}"
    assert _report([*where, "--x", "trainer.lr", "--out", str(out)]) == 0
    table = (out / "sweep_trainer.lr.md").read_text()
    for dose in DOSES:  # one family per dose, three lrs each; the dose's perturbation names it
        assert f"| recompute[router@k3={dose:g}] | {LRS[0]:g} |" in table
    assert "| recompute[router@k3=0.01] | 0.001 | 2 | 2/2 |" in table
    assert (out / "sweep.png").exists() and "Sweep over trainer.lr" in (out / "report.md").read_text()
    assert "recompute[router@k3=0.01] over trainer.lr" in (out / "verdicts.md").read_text()  # a trend family

    out = tmp / f"dose-{source}"
    assert _report([*where, "--x", "inference.kl_target", "--out", str(out)]) == 0
    table = (out / "sweep_inference.kl_target.md").read_text()
    for lr in LRS:  # one family per lr: the perturbation, computed from the dose, leaves the family's name
        assert f"| recompute[trainer.lr={lr:g}] | {DOSES[0]:g} |" in table
    assert "| recompute[trainer.lr=0.001] | 0.01 | 2 | 2/2 |" in table
    assert "recompute[trainer.lr=0.001] over inference.kl_target" in (out / "verdicts.md").read_text()


def test_an_axis_the_runs_do_not_differ_in_is_exit_2_before_any_file(hazard, capsys):
    tmp, uri = hazard
    for key, why in (("trainer.steps", "they differ in: inference.kl_target, trainer.lr"),
                     ("nn", "they differ in: inference.kl_target, trainer.lr"),
                     ("perturbation", "its values are not numbers (router@k3=0.001, router@k3=0.003, router@k3=0.01)")):
        out = tmp / f"bad-{key}"
        assert _report(["--from", str(tmp / "hazard.json.gz"), "--x", key, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --x {key}: ") and why in err and err.count("\n") == 1, err
        assert not out.exists()

"""scripts/v4_stage_b.py: stage B's sweep from stage A's cell, as docs/preregistration_v4.md fixes it."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("v4_stage_b", ROOT / "scripts" / "v4_stage_b.py")
v4_stage_b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(v4_stage_b)


def test_the_sweep_has_the_preregistered_arms_seeds_and_declared_pairs(tmp_path):
    from harness.launch.expand import validate
    from harness.launch.spec import load_spec

    out = tmp_path / "b.yaml"
    assert v4_stage_b.main(["--dose", "0.003", "--lr", "6e-4", "--seeds", "64", "--out", str(out)]) == 0
    sweep = load_spec(out)
    runs = validate(sweep)
    assert len(runs) == 10 * 64 and {r.cfg.seed for r in runs} == set(range(400, 464))
    cells = {(r.cfg.estimator.name, r.cfg.inference.kl_target, r.cfg.inference.router_noise_rate)
             for r in runs if r.cfg.inference.router_noise_sigma > 0}
    assert ("recompute", 0.0015, 0.03) in cells and ("mean_n", 0.006, 0.12) in cells and ("tis", 0.003, 0.06) in cells
    control = [r.cfg for r in runs if r.cfg.inference.router_noise_sigma == 0]
    assert len(control) == 64 and {c.estimator.name for c in control} == {"recompute"}
    assert {(r.cfg.trainer.lr, r.cfg.trainer.steps, r.cfg.trainer.max_grad_norm) for r in runs} == {(6e-4, 1650, 1.0)}
    labels = v4_stage_b.labels_of(out, 0.003)
    assert sweep.primary == [[labels[a], labels[b]] for a, b in v4_stage_b.PAIRS]
    assert labels["control"] == "recompute[none]" and labels["mean_8"] == "mean_n(n=8)[router@k3=0.003]"
    assert '--interaction "recompute|mean_n(n=8)"' in out.read_text()


def test_out_of_rule_arguments_exit_2_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "b.yaml"
    assert v4_stage_b.main(["--dose", "0.003", "--lr", "6e-4", "--seeds", "32", "--out", str(out)]) == 2
    assert "--seeds within 64..256" in capsys.readouterr().err and not out.exists()

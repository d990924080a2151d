"""scripts/gpu_engine_check.py on CPU (issue 30, item 8): verl's FSDP2 engine with our plugins, under torchrun.

The script runs as ``make gpu-engine-check`` would on a GPU machine (``torchrun --nproc_per_node=1``), here with
``--device cpu`` (a gloo group; the CPU stand-ins the script names) and ``--stub-ray`` (the GPU machine has no ray, fastapi,
uvicorn: verl's import-time imports of them get stubs). Every check must say ``ok``: none is skipped on CPU. The run is
under ``tests/device_guard.StrictDevice`` (issue 44): a tensor the harness's verl plugins or estimators make on the
default device fails it on the CPU, as it would crash on a GPU (rais's CPU index in a CUDA gather did). A second
run breaks gmpo_rs's global-batch normalisation (issue 30, item 4) and must see the check fail.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="verl==0.9.1 (the tests extra) runs the engine")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_engine_check.py"
ENGINE_ESTIMATORS = ["tis", "mis", "geo_rs", "icepop", "rais", "gmpo_rs", "mean_n", "mean_n_tis"]
CHECKS = ["logprob", "tis_step", "rais_gamma", "gmpo_rs_micro", *[f"step_{e}" for e in ENGINE_ESTIMATORS],
          "router_replay_fsdp", "save_reload", "memory"]
STRICT = """
import sys, runpy
sys.argv = ["gpu_engine_check.py", *sys.argv[1:]]
sys.path.insert(0, "tests")
from device_guard import StrictDevice
with StrictDevice():  # a tensor factory without device= in harness/estimators or harness/backends/verl fails
    runpy.run_path("scripts/gpu_engine_check.py", run_name="__main__")
"""


def _run(args: list[str], tmp: Path, prelude: str | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    """torchrun (``python -m torch.distributed.run``, a free port) of the script, or of ``prelude`` then its main."""
    out = tmp / "result.json"
    target = [str(SCRIPT)] if prelude is None else ["-c", prelude]
    target = target if prelude is None else ["--no-python", sys.executable, *target]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", *target,
           "--device", "cpu", "--stub-ray", "--work", str(tmp / "work"), "--out", str(out), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc, (json.loads(out.read_text()) if out.exists() else {})


def _lines(stdout: str) -> dict[str, str]:
    return {line.split(":")[0].removeprefix("CHECK "): line.split(": ", 1)[1].split(" ", 1)[0]
            for line in stdout.splitlines() if line.startswith("CHECK ")}


def test_every_check_passes_on_cpu_under_torchrun(tmp_path):
    proc, res = _run([], tmp_path, prelude=STRICT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert _lines(proc.stdout) == {c: "ok" for c in CHECKS}
    assert res["device"] == "cpu" and res["stubbed"] == ["ray", "fastapi", "uvicorn"]
    assert [r["check"] for r in res["checks"]] == CHECKS
    by = {r["check"]: r for r in res["checks"]}
    assert by["logprob"]["max_abs_diff"] <= 1e-5
    tis = by["tis_step"]
    assert tis["loss_mode"] == "vanilla" and tis["grad_norm"][0] > 0
    assert tis["loss_with_is_weights"] == pytest.approx(tis["reference_loss"], rel=1e-5)  # the weights reach the loss
    assert tis["loss_with_is_weights"] != pytest.approx(tis["loss_with_w=1"], abs=1e-4)
    assert by["rais_gamma"]["before_first_step"] == pytest.approx(1.0, abs=1e-6)
    assert by["rais_gamma"]["after_first_step"] < 1 - 1e-4
    assert by["gmpo_rs_micro"]["max_rel_grad_diff"] <= 1e-5
    assert by["save_reload"]["bitwise_equal"] and by["save_reload"]["optimizer_state_equal"]
    assert by["save_reload"]["max_change_by_the_step_in_between"] > 0  # the reload undid a real change
    assert by["memory"]["engine_params"] == by["memory"]["plan_params"]  # --plan counts the engine's parameters
    assert by["memory"]["measured_max_rss_gb"] > 0
    steps = {e: by[f"step_{e}"] for e in ENGINE_ESTIMATORS}  # one training mini-batch per FSDP loss path
    assert {e: s["loss_mode"] for e, s in steps.items()} == {
        "tis": "vanilla", "mis": "vanilla", "geo_rs": "vanilla", "icepop": "vanilla", "rais": "harness_rais",
        "gmpo_rs": "harness_gmpo_rs", "mean_n": "bypass_mode", "mean_n_tis": "vanilla"}
    assert all(min(s["grad_norm"]) > 0 and s["max_weight_change"] > 0 for s in steps.values())
    assert steps["mis"]["tokens_kept"] < steps["mis"]["tokens"] and steps["geo_rs"]["tokens_kept"] < 30  # rejection
    assert steps["icepop"]["is_weight_min_max"][0] == 0.0 and steps["tis"]["is_weight_min_max"][1] <= 2.0
    assert steps["rais"]["rais_gamma_mean"][-1] < 1 and steps["gmpo_rs"]["rais_gamma_mean"][-1] < 1
    assert by["router_replay_fsdp"]["r2"].startswith("refused") and by["router_replay_fsdp"]["r3"].startswith("refused")


BROKEN_GMPO = """
import sys, runpy
sys.argv = ["gpu_engine_check.py", *sys.argv[1:]]
import harness.backends.verl.plugins.gmpo_rs as g
g.global_scale = lambda response_mask, config: 1.0  # geo_mean's micro-batch mean, as before issue 30 item 4
runpy.run_path("scripts/gpu_engine_check.py", run_name="__main__")
"""


def test_the_micro_batch_check_fails_without_global_normalisation(tmp_path):
    proc, res = _run(["--checks", "gmpo_rs_micro"], tmp_path, prelude=BROKEN_GMPO)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert _lines(proc.stdout) == {"gmpo_rs_micro": "FAIL"}
    assert res["checks"][0]["max_rel_grad_diff"] > 0.5  # 4 micro-batch means summed: about 4x the gradient

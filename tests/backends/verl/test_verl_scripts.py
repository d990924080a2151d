"""The GPU scripts' CPU-checkable parts: every smoke-run spec passes our and verl's validation; the
pass-variance script converts vLLM's prompt log-probs to verl's layout as mean_n reads it. The GPU
runs themselves (``make verl-smoke``, ``make verl-pass-variance``) are not run here."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.config import ROOT, load

SCRIPTS = ROOT / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.filterwarnings("ignore:Disabled critic:UserWarning")
def test_every_smoke_run_spec_is_valid_for_verl(tmp_path):
    from harness.backends.verl import translate
    from harness.backends.verl.config import validate
    from harness import estimators

    smoke = _script("verl_smoke")
    assert set(smoke.ESTIMATORS) == {e for e in estimators.NAMES if estimators.get(e).verl is not None}
    for est in smoke.ESTIMATORS:
        cfg = validate(load(smoke.overrides(est, tmp_path / "model", tmp_path, 1)))
        vc = translate.verl_config(cfg, check=True)  # verl's validate_config
        assert cfg.trainer.steps == 1 and vc.trainer.n_gpus_per_node == 1 and vc.trainer.use_v1 is False
        assert vc.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert smoke.main(["--estimators", "nope"]) == 2


@pytest.mark.filterwarnings("ignore:Disabled critic:UserWarning")
def test_every_multi_turn_smoke_spec_is_valid_for_verl(tmp_path):
    """``make verl-smoke-multi-turn``: every estimator but deterministic and mean_n_tis (refused with tools: mean_n_tis
    has its own single-turn agent loop and no multi-turn variant), on verl's tool loop."""
    from harness.backends.verl import translate
    from harness.backends.verl.config import validate

    smoke = _script("verl_smoke")
    ests = smoke.multi_turn_estimators(tmp_path)
    assert set(ests) == set(smoke.ESTIMATORS) - {"deterministic", "mean_n_tis"}
    for est in ests:
        cfg = validate(load(smoke.overrides(est, tmp_path / "model", tmp_path, 1, multi_turn=True)))
        r = translate.verl_config(cfg, check=True).actor_rollout_ref.rollout
        assert r.multi_turn.enable and Path(r.multi_turn.function_tool_path).is_file()
        assert r.agent.default_agent_loop == ("harness_mean_n_tool" if est == "mean_n" else "tool_agent")
        assert cfg.run_dir.name == f"{est}-multi_turn"
    assert smoke.main(["--multi-turn", "--estimators", "deterministic"]) == 2
    assert smoke.main(["--multi-turn", "--estimators", "mean_n_tis"]) == 2


def test_pass_variance_layout_matches_what_mean_n_reads():
    from harness.backends.verl.plugins.mean_n import response_logprobs

    pv = _script("verl_pass_variance")
    seq = [7, 3, 9, 4, 1]  # 3 prompt tokens, 2 response tokens
    vllm_rows = [None] + [{tok: SimpleNamespace(logprob=-0.1 * (j + 1))} for j, tok in enumerate(seq[1:])]
    rows = pv.verl_prompt_logprobs(seq, vllm_rows)
    assert len(rows) == len(seq)  # verl: one row per token after the first, plus a dummy row
    assert response_logprobs(rows, 3, 2) == [pytest.approx(-0.3), pytest.approx(-0.4)]  # log p of tokens 4 and 1
    if importlib.util.find_spec("vllm") is None:
        assert pv.main(["--n", "2"]) == 2

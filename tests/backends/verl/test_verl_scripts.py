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

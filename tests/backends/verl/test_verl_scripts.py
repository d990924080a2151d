"""The GPU scripts' CPU-checkable parts: every smoke-run spec passes our and verl's validation; the
pass-variance script converts vLLM's prompt log-probs to verl's layout as mean_n reads it. The GPU
runs themselves (``make verl-smoke``, ``make verl-pass-variance``) are not run here."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.uri import ROOT

from harness.spec import load

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


class FakeSamplingParams:
    """FAKE of ``vllm.SamplingParams`` (vLLM is not installed here): keeps the fields the script sets."""

    def __init__(self, max_tokens: int = 16, temperature: float = 1.0, seed: int | None = None,
                 prompt_logprobs: int | None = None, detokenize: bool = True):
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.prompt_logprobs, self.detokenize = prompt_logprobs, detokenize


class FakeAsyncLLM:
    """FAKE of vLLM's ``AsyncLLM`` (needs vLLM and a GPU): the same ``generate`` stream, computed by the HF model of
    ``--model`` on CPU, one request at a time. Scoring requests (``prompt_logprobs``) get vLLM's layout: None,
    then ``{token: Logprob}`` per prompt token; sampling requests ``max_tokens`` tokens drawn with their seed."""

    instances: list["FakeAsyncLLM"] = []

    def __init__(self, model: str):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model).float().eval()
        self.requests: list[str] = []
        self.shut = False
        FakeAsyncLLM.instances.append(self)

    @classmethod
    def from_engine_args(cls, args):
        return cls(args.model)

    async def generate(self, prompt, params, request_id):
        import asyncio

        ids = list(prompt["prompt_token_ids"])
        self.requests.append("score" if params.prompt_logprobs is not None else "sample")
        await asyncio.sleep(0)  # other requests go on meanwhile, as between engine steps
        with torch.no_grad():
            if params.prompt_logprobs is not None:
                lp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)
                rows = [None] + [{ids[j + 1]: SimpleNamespace(logprob=float(lp[j, ids[j + 1]]))}
                                 for j in range(len(ids) - 1)]
                yield SimpleNamespace(prompt_logprobs=rows, outputs=[SimpleNamespace(token_ids=[0])])
                return
            g = torch.Generator().manual_seed(int(params.seed or 0))
            seq = list(ids)
            for _ in range(params.max_tokens):
                p = torch.softmax(self.model(torch.tensor([seq])).logits[0, -1].float() / params.temperature, -1)
                seq.append(int(torch.multinomial(p, 1, generator=g)))
            yield SimpleNamespace(prompt_logprobs=None, outputs=[SimpleNamespace(token_ids=seq[len(ids):])])

    def shutdown(self):
        self.shut = True


@pytest.fixture
def fake_vllm(monkeypatch):
    """``import vllm`` and the three names the script imports, answered by the fakes above."""
    import types

    mods = {name: types.ModuleType(name) for name in
            ("vllm", "vllm.engine", "vllm.engine.arg_utils", "vllm.v1", "vllm.v1.engine", "vllm.v1.engine.async_llm")}
    mods["vllm"].SamplingParams = FakeSamplingParams
    mods["vllm.engine.arg_utils"].AsyncEngineArgs = lambda **kw: SimpleNamespace(**kw)
    mods["vllm.v1.engine.async_llm"].AsyncLLM = FakeAsyncLLM
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)
    FakeAsyncLLM.instances.clear()
    return FakeAsyncLLM


@pytest.fixture(scope="module")
def tiny_random_model(tmp_path_factory) -> Path:
    """A tiny random Qwen3-MoE with weights (2 layers, d=32) and the offline word tokenizer, saved locally."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from harness.backends.verl.tokenizer import write_word_tokenizer

    out = tmp_path_factory.mktemp("tiny_random_qwen3_moe")
    n_vocab = write_word_tokenizer(out, [str(d) for d in range(10)] + "Sort these digits : user assistant".split())
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(Qwen3MoeConfig(
        vocab_size=n_vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
        architectures=["Qwen3MoeForCausalLM"])).save_pretrained(out)
    return out


def test_pass_variance_runs_end_to_end_on_a_tiny_model(tiny_random_model, fake_vllm, no_hf_network, capsys):
    """``make verl-pass-variance``'s script, all of it (tokenizer, chat template under transformers 5, sampling,
    mean_n's ``score_response`` both ways, background load, the statistics), with vLLM's engine faked by the HF
    model on CPU. A deterministic CPU forward gives identical passes: spread 0, every token bit-identical."""
    import json

    pv = _script("verl_pass_variance")
    rc = pv.main(["--model", str(tiny_random_model), "--tp", "1", "--n", "3", "--responses", "2",
                  "--max-tokens", "4", "--background", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    res = json.loads(out)
    for mode in ("concurrent", "sequential"):
        assert res[mode] == {"tokens": 2 * 4, "std_mean": 0.0, "std_max": 0.0, "identical_frac": 1.0}, mode
    (engine,) = fake_vllm.instances
    assert engine.shut and engine.requests.count("score") == 2 * 2 * 3  # n passes per response, both ways
    assert engine.requests.count("sample") >= 2 + 2  # the responses, then the background load


def test_chat_prompt_ids_are_a_flat_list_under_transformers_5(tiny_random_model):
    from transformers import AutoTokenizer

    pv = _script("verl_pass_variance")
    tok = AutoTokenizer.from_pretrained(tiny_random_model)
    raw = tok.apply_chat_template([{"role": "user", "content": "Sort"}], add_generation_prompt=True, tokenize=True)
    ids = pv.chat_prompt_ids(tok, "Sort")
    assert isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)
    assert ids == list(raw["input_ids"] if hasattr(raw, "keys") else raw)


def test_pass_variance_refuses_bad_arguments_and_a_hub_id_offline(fake_vllm, no_hf_network, capsys):
    pv = _script("verl_pass_variance")
    assert pv.main(["--model", "Qwen/Qwen3-30B-A3B"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model: 'Qwen/Qwen3-30B-A3B' is not a local folder") and "HF_HUB_OFFLINE=1" in err
    assert len(err.strip().splitlines()) == 1
    assert pv.main(["--n", "1"]) == 2 and "error: --n: must be >= 2" in capsys.readouterr().err
    assert not fake_vllm.instances  # nothing started

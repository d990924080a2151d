"""mean_n in a multi-turn tool conversation on verl (issue 17, item 4): ``harness_mean_n_tool``.

Built for real: verl's composed config from our overrides (``translate.verl_config``), the agent loop
instantiated from verl's registry by ``hydra.utils.instantiate`` as ``AgentLoopWorker._run_agent_loop``
does, our shipped tool file loaded by verl's ``load_all_tools``, verl's ToolAgentLoop state machine,
hermes tool parser and Continuous Token builder on an offline word-level tokenizer. The one fake is the
vLLM server (``ToolFakeVLLMServer``: scripted assistant turns, noisy scoring passes), as for the
single-turn loop (test_verl_plugins.py).
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from harness.backends.verl import translate
from harness.errors import ConfigError
from harness.estimators.mean_n import log_mean_prob

from .test_verl_plugins import StepFakeVLLMServer

MOE = "model=qwen3_30b_a3b"
TOOLS = "verl.tools=harness/backends/verl/tools.py"
CALL = '{"name":"add","arguments":{"a":2,"b":3}}'  # one word of the test tokenizer: the hermes tool call body
TURN1 = ["<tool_call>", CALL, "</tool_call>", "<|im_end|>"]  # the assistant calls the tool...
TURN2 = ["the", "sum", "is", "5", "<|im_end|>"]  # ...then answers
SPECIAL = ["<|im_start|>", "<tool_call>", "</tool_call>"]


@pytest.fixture(scope="module")
def tool_tokenizer(tmp_path_factory):
    """The word-level tokenizer of the verl tests (chat template included) with the hermes tool-call markers
    and one tool-call body as words; the markers and ``<|im_start|>`` are special (never split)."""
    from transformers import AutoTokenizer

    from harness.backends.verl.tokenizer import write_word_tokenizer

    out = tmp_path_factory.mktemp("tool_tokenizer")
    words = [str(d) for d in range(10)] + "add and the sum is tool user assistant".split() + SPECIAL[1:] + [CALL]
    write_word_tokenizer(out, words)
    tok = AutoTokenizer.from_pretrained(out)
    tok.add_special_tokens({"additional_special_tokens": SPECIAL})
    assert tok.convert_tokens_to_ids(CALL) != tok.unk_token_id
    return tok


class ToolFakeVLLMServer(StepFakeVLLMServer):
    """FAKE of verl's vLLM server (vLLM needs a GPU). Sampling requests answer a scripted conversation, by
    the number of turns the request id (one per conversation in verl's ToolAgentLoop) has had: a tool call,
    then an answer, with known sampling log-probs. Scoring requests (``prompt_logprobs``) are
    ``StepFakeVLLMServer``'s: fresh noise per pass, and the engine step each pass shares with other requests."""

    # a 50 ms engine step: the agent loop tokenizes in a thread pool, so on a busy machine a conversation's passes
    # could otherwise each finish in one event-loop turn before another conversation's arrive (no overlap to test)
    step_s = 0.05

    def __init__(self, tokenizer, **kwargs):
        super().__init__(**kwargs)
        self.turns = [tokenizer.convert_tokens_to_ids(TURN1), tokenizer.convert_tokens_to_ids(TURN2)]
        self.sampled: dict[str, int] = {}
        self.scored: list[tuple[int, ...]] = []

    @staticmethod
    def sampling_logprobs(turn: int, length: int) -> list[float]:
        return [-0.25 * (turn + 1) - 0.01 * t for t in range(length)]

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if sampling_params.get("prompt_logprobs") is not None:
            self.scored.append(tuple(prompt_ids))
            return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        assert sampling_params["logprobs"]
        turn = self.sampled.get(request_id, 0)
        self.sampled[request_id] = turn + 1
        await asyncio.sleep(0)  # an engine step, so conversations interleave
        tokens = self.turns[turn]
        return TokenOutput(token_ids=tokens, log_probs=self.sampling_logprobs(turn, len(tokens)), extra_fields={})


def _verl_config(spec, *extra: str):
    cfg = spec("estimator=mean_n", MOE, TOOLS, *extra)
    return cfg, translate.verl_config(cfg)  # composed with verl's ppo_trainer.yaml and validated by verl


def _loop(vc, name: str, tokenizer, server):
    """The agent loop ``name`` as verl's AgentLoopWorker builds it (registry entry + hydra.instantiate, the
    tools loaded from the config's multi_turn paths by verl's own loader)."""
    import hydra
    import harness.backends.verl.plugins  # noqa: F401  (registers our loops, as VERL_USE_EXTERNAL_MODULES does)
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
    from verl.tools.tool_registry import load_all_tools
    from verl.utils.dataset.rl_dataset import RLHFDataset

    mt = vc.actor_rollout_ref.rollout.multi_turn
    tools = load_all_tools(tool_config_path=mt.tool_config_path, function_tool_path=mt.function_tool_path)
    return hydra.utils.instantiate(config=_agent_loop_registry[name], trainer_config=DictConfigWrap(config=vc),
                                   server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
                                   dataset_cls=RLHFDataset, data_config=DictConfigWrap(vc.data),
                                   tools=ToolListWrap(tools))


def _converse(vc, name, tokenizer, server, prompts):
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}

    async def run_all():
        loops = [_loop(vc, name, tokenizer, server) for _ in prompts]
        return await asyncio.gather(*(lp.run(dict(params), raw_prompt=[{"role": "user", "content": p}])
                                      for lp, p in zip(loops, prompts)))

    return asyncio.run(run_all())


def test_translation_of_a_multi_turn_mean_n_spec(spec):
    cfg, vc = _verl_config(spec, "estimator.n=6")
    r = vc.actor_rollout_ref.rollout
    assert r.agent.default_agent_loop == "harness_mean_n_tool"
    assert r.multi_turn.enable and r.multi_turn.tool_config_path is None
    assert r.multi_turn.function_tool_path == str(Path(translate.ROOT) / "harness/backends/verl/tools.py")
    assert Path(r.multi_turn.function_tool_path).is_file()
    assert vc.harness.mean_n == 6 and vc.algorithm.rollout_correction.bypass_mode  # mean_n's pi_old, as single-turn
    # the same spec without tools: single-turn, no multi_turn key emitted, and the signature it had before verl.tools
    plain = spec("estimator=mean_n", MOE, "estimator.n=6")
    single = translate.overrides(plain, "c")
    multi = translate.overrides(cfg, "c")
    R = "actor_rollout_ref.rollout"

    def what(items):  # the overrides that are not the run's identity (signature, its folder and name)
        ids = (plain.signature, cfg.signature, plain.group_signature, cfg.group_signature)
        return {o for o in items if not any(i in o for i in ids)}

    assert what(multi) - what(single) == {f"{R}.agent.default_agent_loop=harness_mean_n_tool", f"{R}.multi_turn.enable=true",
                                          f"{R}.multi_turn.function_tool_path={translate.ROOT}/harness/backends/verl/tools.py"}
    assert what(single) - what(multi) == {f"{R}.agent.default_agent_loop=harness_mean_n"}
    assert cfg.signature != plain.signature
    d = plain.to_dict()
    d["verl"].pop("tools")
    from harness.spec import signature
    assert signature(d) == plain.signature  # verl.tools unset does not enter the signature (golden specs stay)
    # a yaml tool config goes to verl's tool_config_path
    yaml_cfg = spec("estimator=mean_n", MOE, "verl.tools=/cluster/tools.yaml")
    r = translate.verl_config(yaml_cfg, check=False).actor_rollout_ref.rollout
    assert r.multi_turn.tool_config_path == "/cluster/tools.yaml" and r.multi_turn.function_tool_path is None
    # estimators without a loop of their own run verl's tool_agent
    vc = translate.verl_config(spec("estimator=tis", MOE, TOOLS))
    assert vc.actor_rollout_ref.rollout.agent.default_agent_loop == "tool_agent"


@pytest.mark.parametrize("extra, why", [
    (("estimator=deterministic", TOOLS), "seeded single-turn loop"),
    (("estimator=mean_n", "verl.tools=tools.json"), ".py file"),
    (("estimator=recompute", "inference.deterministic=true", TOOLS), "seeded single-turn loop"),
])
def test_multi_turn_refusals_name_verl_tools(spec, extra, why):
    with pytest.raises(ConfigError) as err:
        spec(MOE, *extra)
    assert err.value.key == "verl.tools" and why in str(err.value)


def test_an_own_loop_without_a_multi_turn_variant_is_refused(spec, monkeypatch):
    """An estimator that samples with its own loop but declares no tool_agent_loop never runs single-turn
    (or as verl's plain tool loop) under verl.tools."""
    import dataclasses

    from harness import estimators

    mean_n = estimators.get("mean_n")
    monkeypatch.setattr(mean_n, "verl", dataclasses.replace(mean_n.verl, tool_agent_loop=None))
    with pytest.raises(ConfigError, match="no multi-turn variant") as err:
        spec("estimator=mean_n", MOE, TOOLS)
    assert err.value.key == "verl.tools"


def test_two_turn_conversation_rescored_at_assistant_tokens(spec, tool_tokenizer, no_hf_network):
    cfg, vc = _verl_config(spec, "estimator.n=5")
    n, prompt = cfg.estimator.n, "add 2 and 3"
    server = ToolFakeVLLMServer(tool_tokenizer, seed=7)
    (out,) = _converse(vc, "harness_mean_n_tool", tool_tokenizer, server, [prompt])

    # the conversation: 2 assistant turns around one tool response, as verl's own tool loop runs it
    t1, t2 = server.turns
    obs = out.response_ids[len(t1):len(out.response_ids) - len(t2)]
    assert out.response_ids == t1 + obs + t2 and out.num_turns == 4  # user, assistant, tool, assistant
    assert tool_tokenizer.decode(obs).split() == ["<|im_start|>", "tool", "5", "<|im_end|>", "<|im_start|>",
                                                  "assistant"]  # the tool's answer (add(2, 3)) and the next turn's header
    assert out.response_mask == [1] * len(t1) + [0] * len(obs) + [1] * len(t2)

    # n scoring passes of the whole final sequence, each its own request
    seq = tuple(out.prompt_ids + out.response_ids)
    assert server.scored == [seq] * n and len(server.calls) == n
    P, R = len(out.prompt_ids), len(out.response_ids)
    passes = torch.tensor([c[P - 1:P - 1 + R] for c in server.calls], dtype=torch.float64)  # row j: token j+1
    want = log_mean_prob(passes)
    got = torch.tensor(out.response_logprobs, dtype=torch.float64)
    mask = torch.tensor(out.response_mask, dtype=torch.bool)
    torch.testing.assert_close(got[mask], want[mask])
    assert got[~mask].eq(0.0).all()  # observation tokens: 0.0, as verl's ToolAgentLoop puts there
    # the passes scored the right tokens: their noiseless part is the fake model's log-prob of each token
    clean = torch.tensor([server._logp(a, b) for a, b in zip(seq[P - 1:-1], seq[P:])], dtype=torch.float64)
    assert (passes.mean(0) - clean)[mask].abs().max() < 0.5

    # the sampling log-probs are kept, as verl returns them (0.0 at observations)
    sampled = server.sampling_logprobs(0, len(t1)) + [0.0] * len(obs) + server.sampling_logprobs(1, len(t2))
    assert out.extra_fields["harness_sampling_logprobs"] == pytest.approx(sampled)
    assert out.as_dict()["rollout_log_probs"].shape == (R,)


def test_conversation_is_verls_own(spec, tool_tokenizer, no_hf_network):
    """Our loop changes only the log-probs: tokens, mask and turns are verl's tool_agent's on the same server."""
    _, vc = _verl_config(spec, "estimator.n=3")
    prompts = ["add 2 and 3", "add 4 and 1"]
    ours = _converse(vc, "harness_mean_n_tool", tool_tokenizer, ToolFakeVLLMServer(tool_tokenizer), prompts)
    verls = _converse(vc, "tool_agent", tool_tokenizer, ToolFakeVLLMServer(tool_tokenizer), prompts)
    for a, b in zip(ours, verls):
        assert (a.prompt_ids, a.response_ids, a.response_mask, a.num_turns) == \
               (b.prompt_ids, b.response_ids, b.response_mask, b.num_turns)
        assert a.extra_fields["harness_sampling_logprobs"] == b.response_logprobs
        assert 0 in a.response_mask and a.response_logprobs != b.response_logprobs


def test_conversations_scored_concurrently_passes_never_share_an_engine_step(spec, tool_tokenizer, no_hf_network):
    """As the single-turn loop: a sequence's n passes one after the other, conversations side by side."""
    cfg, vc = _verl_config(spec, "estimator.n=4")
    n, prompts = cfg.estimator.n, ["add 2 and 3", "add 4 and 1", "add 6 and 2"]
    server = ToolFakeVLLMServer(tool_tokenizer)
    outs = _converse(vc, "harness_mean_n_tool", tool_tokenizer, server, prompts)
    seqs = [tuple(o.prompt_ids + o.response_ids) for o in outs]
    assert len(set(seqs)) == len(prompts)
    assert sorted(server.scored) == sorted(s for s in seqs for _ in range(n))  # n passes per sequence
    assert len(set(server.ids)) == len(server.ids)  # a fresh request id per pass
    assert max(len(b) for b in server.batches) > 1  # conversations' passes overlap...
    for b in server.batches:
        assert len(b) == len(set(b))  # ...but never two passes of one sequence in one step
    assert sum(server.sampled.values()) == 2 * len(prompts)  # two assistant turns per conversation


def test_greedy_validation_is_not_rescored(spec, tool_tokenizer, no_hf_network):
    _, vc = _verl_config(spec, "estimator.n=3")
    server = ToolFakeVLLMServer(tool_tokenizer)
    params = {"temperature": 0, "top_p": 1.0, "top_k": -1, "logprobs": True}

    async def run():  # built inside the event loop, as verl's worker builds it (the loop keeps it)
        loop = _loop(vc, "harness_mean_n_tool", tool_tokenizer, server)
        return await loop.run(params, raw_prompt=[{"role": "user", "content": "add 2 and 3"}])

    out = asyncio.run(run())
    assert 0 in out.response_mask and server.sampled  # the conversation ran...
    assert server.scored == [] and "harness_sampling_logprobs" not in out.extra_fields  # ...and was not re-scored


def test_shipped_tool_schema_is_generated_by_verl():
    """verl.tools=harness/backends/verl/tools.py: verl builds the schema the chat template shows (no file to write)."""
    from verl.tools.tool_registry import load_all_tools

    (tool,) = load_all_tools(tool_config_path=None, function_tool_path=str(translate.ROOT / "harness/backends/verl/tools.py"))
    schema = tool.tool_schema.model_dump(exclude_none=True)
    assert schema["function"]["name"] == "add" and schema["function"]["parameters"]["required"] == ["a", "b"]
    assert asyncio.run(tool.call(json.loads(CALL)["arguments"])) == "5"


def test_preflight_names_a_missing_tool_file(spec, tmp_path):
    from harness.backends.verl import runner

    with pytest.raises(runner.VerlUnavailable, match=f"verl.tools file {tmp_path}/tools.py is missing"):
        runner.preflight(spec("estimator=mean_n", MOE, f"verl.tools={tmp_path}/tools.py"))
    with pytest.raises(runner.VerlUnavailable) as err:  # the shipped one is there
        runner.preflight(spec("estimator=mean_n", MOE, TOOLS))
    assert "verl.tools" not in str(err.value)

"""Sampler semantics as vLLM + verl: temperature -> top-k -> top-p, logprobs_mode raw | processed for generate
and score, and the training engine's log-probs at the sampler's temperature (docs/engines.md, "Sampler")."""
import dataclasses
import math

import pytest
import torch

from harness.backends.local import train_engine
from harness.backends.local.inference_engine import InferenceEngine, sampler_logp
from harness.backends.local.model import build_policy
from harness.backends.local.tasks import Task
from harness.backends.local.train_engine import TrainEngine
from harness.spec import load

Q = torch.tensor([0.5, 0.3, 0.15, 0.05])  # a 4-token vocabulary


def test_sampler_on_a_tiny_vocabulary_against_hand_computed_values():
    logq = Q.log()
    # T = 0.5: p ~ q^2 = [.25, .09, .0225, .0025]; top-k 3 drops .0025; top-p 0.9: .25/.3625 = .6897 < .9 keeps
    # the second (mass before it .6897 < .9), the third has mass .9379 >= .9 before it: dropped -> [25, 9] / 34
    out = sampler_logp(logq, temperature=0.5, top_k=3, top_p=0.9)
    want = torch.tensor([math.log(25 / 34), math.log(9 / 34), -math.inf, -math.inf])
    torch.testing.assert_close(out, want)
    # top-p alone (T = 1): 0.75 keeps 0.5 and 0.3 (mass before 0.3 is 0.5 < 0.75; before 0.15 it is 0.8)
    torch.testing.assert_close(sampler_logp(logq, top_p=0.75), torch.tensor([math.log(.625), math.log(.375),
                                                                               -math.inf, -math.inf]))
    # temperature alone: log_softmax(log q / T)
    torch.testing.assert_close(sampler_logp(logq, temperature=2.0), torch.log_softmax(logq / 2, -1))
    # the most probable token is always kept, however small p
    assert torch.isfinite(sampler_logp(logq, top_p=1e-6)).tolist() == [True, False, False, False]


def test_sampler_defaults_are_the_identity():
    logq = torch.log_softmax(torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0)), -1)
    assert sampler_logp(logq) is logq  # T = 1, no top-k, no top-p: untouched, bitwise


def _reference_processed(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Written independently of the engine: a token is kept iff the probability mass of the tokens more
    probable than it is < p (vLLM's 'drop the ascending cumulative mass <= 1 - p', read from the top)."""
    p = torch.softmax(logits.double() / temperature, -1)
    order = p.argsort(-1, descending=True)
    before = p.gather(-1, order).cumsum(-1) - p.gather(-1, order)
    keep = torch.zeros_like(p, dtype=torch.bool).scatter(-1, order, before < top_p)
    kept = p * keep
    return (kept / kept.sum(-1, keepdim=True)).log()


@pytest.fixture(scope="module")
def exact():
    """A float32, deterministic, noiseless inference engine: numerically the training engine's distribution,
    so the training engine's logits are the reference for what generate and score report."""
    cfg = load(["inference.router_noise_sigma=0", "inference.dtype=float32", "inference.deterministic=true",
                "inference.batch_variance=false", "inference.temperature=0.7", "inference.top_p=0.8"])
    policy = build_policy(cfg.model, seed=0)
    task = Task(cfg.task)
    prompts, _ = task.sample(16, torch.Generator().manual_seed(0))
    return cfg, policy, task, prompts


@pytest.mark.parametrize("mode", ["raw", "processed"])
def test_generate_and_score_report_the_mode_of_vllm(exact, mode):
    cfg, policy, task, prompts = exact
    icfg = dataclasses.replace(cfg.inference, logprobs_mode=mode)
    eng = InferenceEngine(policy, icfg, seed=0)
    roll = eng.generate(prompts, task.answer_len)
    pl, tokens = task.prompt_len, roll.tokens
    logits = train_engine.forward(policy, tokens).logits[:, pl - 1:-1]
    if mode == "raw":  # the model's log-softmax, before temperature and top-p
        ref = torch.log_softmax(logits, -1)
    else:  # the distribution sampled from
        ref = _reference_processed(logits, 0.7, 0.8).float()
    want = ref.gather(-1, tokens[:, pl:, None]).squeeze(-1)
    assert torch.isfinite(roll.logp).all()  # a sampled token is inside the nucleus it was drawn from
    torch.testing.assert_close(roll.logp, want, atol=2e-4, rtol=0)
    torch.testing.assert_close(eng.score_once(tokens, pl), want, atol=2e-4, rtol=0)
    if mode == "processed":  # the nucleus really truncates here: some sampled tokens gain probability mass
        raw = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[:, pl:, None]).squeeze(-1)
        assert (roll.logp - raw > 1e-3).any()


def test_sampled_tokens_stay_inside_the_nucleus(exact):
    cfg, policy, task, prompts = exact
    icfg = dataclasses.replace(cfg.inference, temperature=1.0, top_p=0.3)
    roll = InferenceEngine(policy, icfg, seed=1).generate(prompts, task.answer_len)
    logits = train_engine.forward(policy, roll.tokens).logits[:, task.prompt_len - 1:-1]
    ref = _reference_processed(logits, 1.0, 0.3).gather(-1, roll.tokens[:, task.prompt_len:, None])
    assert torch.isfinite(ref).all()


def test_training_engine_applies_the_sampler_temperature_only(exact):
    cfg, policy, task, prompts = exact
    tokens = InferenceEngine(policy, cfg.inference, seed=2).generate(prompts, task.answer_len).tokens
    pl = task.prompt_len
    logits = train_engine.forward(policy, tokens).logits[:, pl - 1:-1]
    got = TrainEngine(policy, 0.7).logprobs(tokens, pl).logp
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[:, pl:, None]).squeeze(-1)
    torch.testing.assert_close(got, want)  # temperature, and no top-p truncation (as verl's actor)
    plain = torch.log_softmax(logits, -1).gather(-1, tokens[:, pl:, None]).squeeze(-1)
    assert torch.equal(TrainEngine(policy).logprobs(tokens, pl).logp, plain)  # T = 1: no division at all

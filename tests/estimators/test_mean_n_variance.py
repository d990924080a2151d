"""mean_n on the real inference engine: fresh passes, and variance falling as ~1/n (fixed seeds)."""
import numpy as np
import pytest
import torch

from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import build_policy
from harness.backends.local.tasks import Task
from harness.backends.local.trainer import OldPolicyContext
from harness.backends.local.train_engine import TrainEngine
from harness.spec import EstimatorConfig, load
from harness.estimators import build
from harness.estimators.mean_n import log_mean_prob


@pytest.fixture(scope="module")
def engine_and_rollout():
    cfg = load(["inference.router_noise_sigma=0.1"])  # a noisier engine makes the statistics sharper
    policy = build_policy(cfg.model, seed=0)
    task = Task(cfg.task)
    prompts, _ = task.sample(16, torch.Generator().manual_seed(0))
    eng = InferenceEngine(policy, cfg.inference, seed=0)
    return policy, eng, eng.generate(prompts, task.answer_len), task


def test_mean_n_with_one_pass_is_a_fresh_pass_not_the_sampling_logprob(engine_and_rollout):
    policy, eng, roll, task = engine_and_rollout
    ctx = OldPolicyContext(TrainEngine(policy), eng, roll, task.prompt_len, torch.ones_like(roll.logp))
    old = build(EstimatorConfig("mean_n", n=1)).old_policy(ctx)
    assert old.logp.shape == roll.logp.shape
    assert not torch.equal(old.logp, roll.logp)
    rollout = build(EstimatorConfig("rollout")).old_policy(ctx)
    assert torch.equal(rollout.logp, roll.logp)


def test_variance_of_the_mean_n_estimate_falls_as_one_over_n(engine_and_rollout):
    _, eng, roll, task = engine_and_rollout
    reps, ns = 40, (1, 2, 4, 8)
    eng.begin_step(123)
    var = {}
    for n in ns:  # every score() is a fresh engine call: its own keyed draws
        est = torch.stack([log_mean_prob(eng.score(roll.tokens, task.prompt_len, n)).exp() for _ in range(reps)])
        var[n] = est.var(0).sum().item()
    assert var[1] > 0
    slope = np.polyfit(np.log(ns), np.log([var[n] for n in ns]), 1)[0]
    assert -1.25 < slope < -0.75, (slope, var)
    assert 4.0 < var[1] / var[8] < 16.0, var

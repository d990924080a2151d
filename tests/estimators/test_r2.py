"""``r2``: the training engine's own old-policy routes, replayed in every update forward (harness/estimators/r2.py)."""
import pytest
import torch

from harness import estimators
from harness.backends.local import train_engine
from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import build_policy
from harness.backends.local.tasks import Task
from harness.backends.local.train_engine import TrainEngine
from harness.backends.local.trainer import LocalTrainer, OldPolicyContext
from harness.errors import ConfigError
from harness.spec import load

TINY = ["trainer.steps=2", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
        "task.warmstart.max_steps=3", "task.warmstart.batch_size=8", "diagnostics.noise_passes=0"]


@pytest.fixture(scope="module")
def setup():
    cfg = load(["model=moe_tiny", "estimator=r2"])
    policy = build_policy(cfg.model, seed=0)
    task = Task(cfg.task)
    prompts, _ = task.sample(16, torch.Generator().manual_seed(0))
    roll = InferenceEngine(policy, cfg.inference, seed=1).generate(prompts, task.answer_len)
    mask = torch.ones_like(roll.logp)
    return cfg, policy, task, roll, mask


def _ctx(policy, cfg, task, roll, mask):
    return OldPolicyContext(TrainEngine(policy), InferenceEngine(policy, cfg.inference, seed=2), roll,
                            task.prompt_len, mask)


def test_r2_denominator_is_recompute_bitwise_and_its_replay_the_recompute_routes(setup):
    cfg, policy, task, roll, mask = setup
    old = estimators.build(cfg.estimator).old_policy(_ctx(policy, cfg, task, roll, mask))
    rec = estimators.build(load(["estimator=recompute"]).estimator).old_policy(_ctx(policy, cfg, task, roll, mask))
    assert torch.equal(old.logp, rec.logp) and torch.all(old.weight == 1) and torch.equal(old.mask, mask)
    m = cfg.model
    own = train_engine.forward(policy, roll.tokens)  # the training engine's routes, every position, old weights
    assert old.replay.shape == (*roll.tokens.shape, m.n_layers, m.top_k) and torch.all(old.replay >= 0)
    assert torch.equal(old.replay, own.selected)  # prompt positions included: nothing left to the own routing
    # at the old weights the replay changes nothing: the replayed forward is the recompute, bitwise
    again = TrainEngine(policy).logprobs(roll.tokens, task.prompt_len, old.replay)
    assert torch.equal(again.logp, rec.logp)


def test_after_an_update_the_replay_keeps_the_old_routes_where_own_routing_moves(setup):
    cfg, policy, task, roll, mask = setup
    old = estimators.build(cfg.estimator).old_policy(_ctx(policy, cfg, task, roll, mask))
    moved = build_policy(cfg.model, seed=0)
    moved.load_state_dict(policy.state_dict())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():  # an update that moves the routers
        for block in moved.blocks:
            block.ffn.router.add_(torch.randn(block.ffn.router.shape, generator=g) * 0.3)
    replayed = train_engine.forward(moved, roll.tokens, replay=old.replay)
    free = train_engine.forward(moved, roll.tokens)
    assert torch.equal(replayed.selected, old.replay)  # every position, every layer: the old routes
    assert (free.selected.sort(-1).values != old.replay.sort(-1).values).any()  # without replay they change


def test_the_trainer_replays_the_recorded_routes_in_every_update_forward(monkeypatch):
    """Through the trainer (2 minibatches per step): each update forward gets its rows of the recompute's routes
    and routes exactly so, though the weights moved after the first minibatch."""
    cfg = load(["estimator=r2", *TINY])
    torch.manual_seed(0)
    tr = LocalTrainer(cfg, torch.device("cpu"))
    calls, fwd = [], tr.train.forward

    def spy(tokens, prompt_len, replay=None, with_entropy=False):
        out = fwd(tokens, prompt_len, replay, with_entropy)
        if with_entropy:  # the update path (the recompute is logprobs -> forward without entropy)
            calls.append((replay, out.routes))
        return out

    monkeypatch.setattr(tr.train, "forward", spy)
    tr.run_step()
    assert len(calls) == cfg.trainer.num_minibatches * cfg.trainer.ppo_epochs
    for replay, routes in calls:
        assert replay is not None and torch.all(replay >= 0) and torch.equal(routes, replay)


def test_r2_is_refused_on_a_dense_model_and_mapped_to_megatron_r2_on_verl():
    with pytest.raises(ConfigError, match="needs a router"):
        load(["model=dense_tiny", "estimator=r2"])

    class Dense:  # a context whose recompute has no routes (a dense model)
        mask = torch.ones(1, 2)
        logp_roll = torch.zeros(1, 2)
        routed_experts = None

        def recompute(self, replay=None):
            return estimators.PolicyForward(torch.zeros(1, 2))

    with pytest.raises(ValueError, match="no router"):
        estimators.build(load(["estimator=r2"]).estimator).old_policy(Dense())
    r2 = estimators.get("r2")
    assert r2.needs.router and not r2.needs.replay and r2.verl.router_replay == "R2" and not r2.verl.bypass



def test_replaying_the_recompute_routes_costs_no_second_forward(setup):
    """The trainer's diagnostics ask for the recompute under the estimator's replay: for r2 that is the plain
    recompute (bitwise, above), so the context answers it from its cache."""
    cfg, policy, task, roll, mask = setup
    ctx = _ctx(policy, cfg, task, roll, mask)
    old = estimators.build(cfg.estimator).old_policy(ctx)
    assert ctx.recompute(old.replay) is ctx.recompute()
    assert ctx.recompute(old.replay.clone()) is not ctx.recompute()  # any other replay is a forward of its own

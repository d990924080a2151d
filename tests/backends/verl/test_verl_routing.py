"""``moe/routing_flip_rate`` on verl (harness/backends/verl/routing.py) against the local backend's definition of
the same metric (``harness.backends.local.trainer.routing_flip_rate``), on synthetic tensors in verl's layouts:
the rollout's routes [B, T, L, k] aligned with a left-padded prompt and a right-padded response, the training
engine's routes one jagged row per sequence (R2's record)."""
from __future__ import annotations

import pytest
import torch

from harness.backends.local.trainer import routing_flip_rate as local_flip_rate
from harness.backends.verl.routing import NO_ROUTE, padded_routes, routing_flip_rate

P, R, L, K, E = 4, 5, 3, 2, 8  # padded prompt length, padded response length, layers, top-k, experts


def _batch(seed: int = 0):
    """Three sequences: prompts of 4, 2, 3 tokens (left-padded to P), responses of 5, 3, 1 tokens (right-padded to
    R); rollout routes random top-k sets, training's the same with about a third of the (token, layer) sets
    changed in one slot; training's as jagged rows over the non-padding tokens."""
    g = torch.Generator().manual_seed(seed)
    prompt, response = [4, 2, 3], [5, 3, 1]
    mask = torch.zeros(3, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt, response)):
        mask[i, P - p:P + r] = 1
    response_mask = mask[:, P:].clone()
    roll = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(3 * (P + R) * L)]).view(3, P + R, L, K)
    train = roll.clone()
    change = torch.rand(3, P + R, L, generator=g) < 0.35
    train[..., 0] = torch.where(change, (train[..., 0] + 1 + (train[..., 1] == (train[..., 0] + 1) % E)) % E,
                                train[..., 0])
    roll = roll * mask[..., None, None]  # vLLM leaves zeros where it recorded nothing
    rows = [train[i, mask[i].bool()] for i in range(3)]
    return roll, train, rows, mask, response_mask


def _local(roll: torch.Tensor, train: torch.Tensor, response_mask: torch.Tensor) -> float:
    """The local backend's metric on the predicting positions ([prompt_len - 1:-1]), one seed."""
    sl = slice(P - 1, -1)
    return float(local_flip_rate(roll[None, :, sl], train[None, :, sl], response_mask[None].float())[0])


@pytest.mark.parametrize("seed", range(4))
def test_the_verl_flip_rate_is_the_local_definition(seed):
    roll, train, rows, mask, response_mask = _batch(seed)
    nested = torch.nested.nested_tensor(rows, layout=torch.jagged)
    for routes in (rows, nested):
        got = routing_flip_rate(roll, padded_routes(routes, mask), response_mask)
        assert got == pytest.approx(_local(roll, train, response_mask), abs=1e-7)
    assert 0.0 < got < 1.0  # the synthetic batch has both flipped and kept tokens


def test_padded_routes_put_each_row_at_its_tokens_and_no_route_elsewhere():
    roll, train, rows, mask, _ = _batch()
    padded = padded_routes(rows, mask)
    assert torch.equal(padded[mask.bool()], train[mask.bool()])
    assert (padded[~mask.bool()] == NO_ROUTE).all()
    assert padded_routes(padded, mask) is padded  # already in the rollout's layout
    with pytest.raises(ValueError, match="route rows"):
        padded_routes([rows[0][:-1], *rows[1:]], mask)


def test_one_flipped_slot_counts_one_token_and_padding_counts_nothing():
    roll, _, _, mask, response_mask = _batch()
    n = int(response_mask.sum())
    assert routing_flip_rate(roll, roll, response_mask) == 0.0
    flipped = roll.clone()
    flipped[0, P - 1 + 2, 1, 0] = (flipped[0, P - 1 + 2, 1, 0] + 1) % E  # predicts response token 2 of sequence 0
    if flipped[0, P - 1 + 2, 1, 0] == flipped[0, P - 1 + 2, 1, 1]:
        flipped[0, P - 1 + 2, 1, 0] = (flipped[0, P - 1 + 2, 1, 0] + 1) % E
    assert routing_flip_rate(roll, flipped, response_mask) == pytest.approx(1 / n)
    swapped = roll.flip(-1)  # the order of the k slots is no flip
    assert routing_flip_rate(roll, swapped, response_mask) == 0.0
    padding = roll.clone()
    padding[2, -1] = (padding[2, -1] + 3) % E  # the last position predicts no token; sequence 2's is padding too
    padding[2, P + 1:] = (padding[2, P + 1:] + 3) % E  # after sequence 2's only response token: padding
    assert routing_flip_rate(roll, padding, response_mask) == 0.0
    unknown = padded_routes([r for r in _batch()[2]], mask)
    unknown[0, P - 1:] = NO_ROUTE  # sequence 0's training routes unknown: left out, not flips
    assert routing_flip_rate(roll, unknown, response_mask) == pytest.approx(
        _local(roll, _batch()[1], response_mask * torch.tensor([[0], [1], [1]])), abs=1e-7)


# ------------------------------------------------------------------------------------ the hook in verl's trainer
def _old_log_prob(rows):
    """What verl's ``_compute_old_log_prob`` returns under R2: log-probs and the recorded routes (jagged)."""
    from verl.protocol import DataProto
    from verl.utils import tensordict_utils as tu

    nested = torch.nested.nested_tensor(rows, layout=torch.jagged)
    td = tu.get_tensordict({"old_log_probs": torch.zeros(len(rows), R), "routed_experts": nested})
    return DataProto.from_tensordict(td)


def test_the_hook_takes_the_rollout_routes_out_and_compares_them_with_the_recorded_ones(monkeypatch):
    from verl.protocol import DataProto

    from harness.backends.verl.plugins import routing as hook
    from harness.metrics import MOE_ROUTING_FLIP_RATE

    roll, train, rows, mask, response_mask = _batch(1)
    batch = DataProto.from_dict(tensors={"routed_experts": roll, "attention_mask": mask,
                                         "response_mask": response_mask})
    seen = []

    def verl_pass(trainer, b):  # verl's R2 records only for a batch without routes
        seen.append("routed_experts" in b.batch.keys())
        return _old_log_prob(rows), 0.5

    monkeypatch.setattr(hook, "PENDING", {})
    out = hook.wrap(verl_pass)(object(), batch)
    assert seen == [False] and out[1] == 0.5 and "routed_experts" in out[0].batch.keys()
    expected = _local(roll, train, response_mask)
    assert hook.take_pending() == {MOE_ROUTING_FLIP_RATE: pytest.approx(expected, abs=1e-7)}
    assert hook.take_pending() == {}  # taken once


def test_the_hook_leaves_a_step_without_routes_alone(monkeypatch):
    from verl.protocol import DataProto

    from harness.backends.verl.plugins import routing as hook

    _, _, rows, mask, response_mask = _batch()
    monkeypatch.setattr(hook, "PENDING", {})
    batch = DataProto.from_dict(tensors={"attention_mask": mask, "response_mask": response_mask})
    hook.wrap(lambda trainer, b: (_old_log_prob(rows), 0.0))(object(), batch)  # no rollout routes
    assert hook.take_pending() == {}


# ------------------------------------------------------------------------------------ verl.routing_metrics
ONE_UPDATE = ("trainer.num_minibatches=1", "trainer.ppo_epochs=1")


def test_routing_metrics_ask_vllm_for_routes_and_megatron_to_record_its_own(spec):
    """verl.routing_metrics: rollout routes (vLLM) + R2 record, the hook's switch in the workers' environment;
    composed with verl's config and through its validate_config (R2 needs bypass_mode=false: tis is decoupled)."""
    from harness.backends.verl import translate
    from harness.backends.verl.routing import ROUTING_ENV

    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", "verl.routing_metrics=true", *ONE_UPDATE)
    vc = translate.verl_config(cfg)
    assert vc.actor_rollout_ref.actor.megatron.router_replay.mode == "R2"
    assert vc.actor_rollout_ref.rollout.enable_rollout_routing_replay is True
    assert vc.ray_kwargs.ray_init.runtime_env.env_vars[ROUTING_ENV] == "1"
    assert translate.environment(cfg)[ROUTING_ENV] == "1"
    off = translate.verl_config(spec("estimator=tis", "model=qwen3_30b_a3b"), check=False)
    assert off.actor_rollout_ref.actor.megatron.router_replay.mode == "disabled"
    assert off.actor_rollout_ref.rollout.enable_rollout_routing_replay is False
    assert ROUTING_ENV not in off.ray_kwargs.ray_init.runtime_env.env_vars
    r3 = translate.verl_config(spec("estimator=r3", "model=qwen3_30b_a3b"), check=False)  # R3 is unchanged
    assert r3.actor_rollout_ref.actor.megatron.router_replay.mode == "R3"


@pytest.mark.parametrize("args,why", [
    (("estimator=tis", "model=qwen3_30b_a3b_fsdp", *ONE_UPDATE), "megatron"),
    (("estimator=tis", "model=qwen3_4b", "verl.strategy=megatron", *ONE_UPDATE), "MoE"),
    (("estimator=r3", "model=qwen3_30b_a3b", *ONE_UPDATE), "r3 replays"),
    (("estimator=rollout", "model=qwen3_30b_a3b", *ONE_UPDATE), "bypass"),
    (("estimator=tis", "model=qwen3_30b_a3b"), "num_minibatches=1"),
], ids=["fsdp", "dense", "r3", "bypass", "minibatches"])
def test_routing_metrics_are_refused_where_verl_has_no_training_routes_to_compare(spec, args, why):
    from harness.errors import ConfigError

    with pytest.raises(ConfigError, match=why) as err:
        spec(*args, "verl.routing_metrics=true")
    assert "verl.routing_metrics" in str(err.value)


def test_the_tracking_plugin_logs_the_pending_routing_metrics_once(monkeypatch):
    from harness.backends.verl.plugins import routing as hook
    from harness.backends.verl.plugins import tracking
    from harness.metrics import MOE_ROUTING_FLIP_RATE, REWARD_MEAN

    monkeypatch.setattr(hook, "PENDING", {MOE_ROUTING_FLIP_RATE: 0.25})
    h = {"estimator": "tis", "tags": {"level": "sequence"}}
    first = tracking.harness_metrics({"critic/score/mean": 0.5}, h)
    assert first[MOE_ROUTING_FLIP_RATE] == 0.25 and first[REWARD_MEAN] == 0.5
    assert MOE_ROUTING_FLIP_RATE not in tracking.harness_metrics({"critic/score/mean": 0.5}, h)


def test_routing_metrics_enter_the_signature_only_when_on(spec):
    """A later key (Dora's rule): specs without it keep their signature; on, R2 changes the run's training."""
    base = spec("estimator=tis", "model=qwen3_30b_a3b", *ONE_UPDATE)
    assert spec("estimator=tis", "model=qwen3_30b_a3b", *ONE_UPDATE, "verl.routing_metrics=false").signature \
        == base.signature
    assert spec("estimator=tis", "model=qwen3_30b_a3b", *ONE_UPDATE, "verl.routing_metrics=true").signature \
        != base.signature

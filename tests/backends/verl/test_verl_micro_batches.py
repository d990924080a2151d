"""Our policy losses are normalised over the global batch: the micro-batch count changes nothing (issue 30, item 4).

verl's engines call the policy loss once per micro-batch, backpropagate each and let the gradients add up
(``FSDPEngine.forward_backward_batch``); each micro-batch loss must therefore be normalised over the global
mini-batch (``agg_loss`` with ``config.global_batch_info``), not over the micro-batch. verl's own ``geo_mean``
(which ``harness_gmpo_rs`` calls) takes ``torch.mean`` over the micro-batch: summed over 1/2/4 micro-batches of
the same data its loss and gradient double and quadruple (shown below, so the test can tell).

Here verl's real ``forward_backward_batch`` (its token count all-reduce, ``prepare_micro_batches``, one
``forward_step`` + ``backward`` per micro-batch) runs on CPU with a tiny random HF Qwen3-MoE and verl's
``ppo_loss``, for every policy loss the harness sends to verl (``harness_gmpo_rs``, ``harness_rais`` with our
router patch, verl's ``vanilla`` for the other estimators): split into 1, 2, 4 micro-batches and into dynamic
(token-balanced, unequal) micro-batches, the summed loss and every parameter's gradient must be the same. The
fakes are the conftest's ``cpu_fsdp_engine`` (the engine object without FSDP wrapping, device lookups "cpu")
and a one-process gloo group. A second test covers data parallelism at the loss level: two ranks' micro-batch
losses, computed with ``dp_size=2`` as the engine hands them, average (as FSDP averages gradients) to the
one-rank loss.
"""
from __future__ import annotations

import copy
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.backends.verl import translate

B, P, R = 8, 3, 7
LENS = [7, 2, 5, 6, 3, 7, 4, 1]  # response lengths: unequal, so token- and sequence-means differ


def _actor(spec, estimator: str, *extra: str, loss_mode: str | None = None):
    """verl's ActorConfig for the translated spec (optionally with another verl loss mode) and the workers' env."""
    from verl.utils.config import omega_conf_to_dataclass

    args = ["model=qwen3_30b_a3b_fsdp", "verl.experimental_rais=true"] if estimator in ("rais", "gmpo_rs") else \
        ["model=qwen3_30b_a3b_fsdp"]
    vc = translate.verl_config(spec(f"estimator={estimator}", *args, *extra), check=False)
    if loss_mode is not None:
        vc.actor_rollout_ref.actor.policy_loss.loss_mode = loss_mode
    return omega_conf_to_dataclass(vc.actor_rollout_ref.actor), dict(vc.ray_kwargs.ray_init.runtime_env.env_vars)


def _model():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    hf = Qwen3MoeConfig(vocab_size=40, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        num_experts=8, num_experts_per_tok=2)
    return Qwen3MoeForCausalLM(hf).float().eval()  # (its grouped-mm experts take no float64)


def _batch(dtype=torch.float32):
    """The update's batch as ``_update_actor`` hands it over: left_right_2_no_padding of the padded DataProto."""
    from verl.protocol import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(3)
    lens = torch.tensor(LENS)
    attn = torch.cat([torch.ones(B, P, dtype=torch.long), (torch.arange(R) < lens[:, None]).long()], 1)
    ids = torch.randint(1, 40, (B, P + R), generator=g) * attn
    adv = torch.randn(B, 1, generator=g, dtype=dtype).expand(B, R).contiguous()
    batch = DataProto.from_dict(tensors={
        "prompts": ids[:, :P], "responses": ids[:, P:], "input_ids": ids, "attention_mask": attn,
        "position_ids": (attn.cumsum(1) - 1).clamp(min=0), "response_mask": attn[:, P:],
        "advantages": adv * attn[:, P:]})
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, temperature=1.0, use_remove_padding=True, calculate_entropy=False)
    return td


def _prepare(eng, model, td, env: dict, monkeypatch):
    """The step up to the update: the workers' env, old log-probs from the pre-update weights (and, for the
    router-shift losses, our snapshot pass), then an update that moved every router and the LM head."""
    from verl.workers.utils.padding import no_padding_2_padding

    from harness.backends.verl.plugins import rais_fsdp

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if rais_fsdp.active():
        worker = SimpleNamespace(engine=eng, model_config={"use_remove_padding": True}, engine_config=SimpleNamespace(
            use_dynamic_bsz=True, infer_max_token_len_per_gpu=2 * (P + R), infer_micro_batch_size_per_gpu=1,
            use_fused_kernels=False))
        rais_fsdp.train_mini_batch(lambda self, data: None, worker, td)  # tags the samples, records the old routers
    with torch.no_grad():
        _, out = type(eng).forward_step(eng, td, None, True)
    td["old_log_probs"] = no_padding_2_padding(out["model_output"]["log_probs"], td)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.add_(torch.randn(layer.mlp.gate.weight.shape, generator=g) * 0.3)
        model.lm_head.weight.add_(torch.randn(model.lm_head.weight.shape, generator=g) * 0.3)


def _update(eng, model, td, actor, split: dict):
    """One mini-batch through verl's ``forward_backward_batch``: summed micro-batch losses, the gradients, and
    how many micro-batches it made."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    data = td.copy()
    tu.assign_non_tensor(data, global_batch_size=B, **split)  # ray_trainer: ppo_mini_batch_size x rollout.n
    model.zero_grad(set_to_none=True)
    out = type(eng).forward_backward_batch(eng, data, partial(ppo_loss, config=actor))
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return sum(out["loss"]), grads, len(out["loss"])


SPLITS = {"1": dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=B),
          "2": dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=B // 2),
          "4": dict(use_dynamic_bsz=False, micro_batch_size_per_gpu=B // 4),
          "dynamic": dict(use_dynamic_bsz=True, max_token_len_per_gpu=2 * (P + R))}


#: the estimators whose losses are checked below: one per policy loss the harness sends to verl (verl's vanilla with
#: and without IS weights, and every plugin loss); test_every_policy_loss_the_harness_sends_to_verl_is_checked_here
#: keeps the list complete
CHECKED = [("gmpo_rs", ["estimator.log_clip=0.3", "estimator.gamma_min=0.8"]), ("rais", ["estimator.gamma_min=0.8"]),
           ("recompute", []), ("tis", [])]


def test_every_policy_loss_the_harness_sends_to_verl_is_checked_here(spec, tmp_path):
    """Every mapped estimator's verl loss mode (its smoke spec, ``scripts/verl_smoke.py``), and every ``harness_*``
    loss our plugins register with verl, is the loss of an estimator in CHECKED: a new plugin loss, or an estimator
    sent to another of verl's losses, fails here until it is added to the micro-batch checks."""
    import importlib.util

    import harness.backends.verl.plugins  # noqa: F401  (registers our losses)
    from harness.spec import load
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY

    root = Path(__file__).resolve().parents[3]
    mod_spec = importlib.util.spec_from_file_location("verl_smoke", root / "scripts" / "verl_smoke.py")
    smoke = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(smoke)
    checked = {_actor(spec, est, *extra)[0].policy_loss.loss_mode for est, extra in CHECKED}
    sent = {est: translate.verl_config(load(smoke.overrides(est, tmp_path / "m", tmp_path, 1)), check=False)
            .actor_rollout_ref.actor.policy_loss.loss_mode for est in smoke.ESTIMATORS}
    assert {"vanilla", "harness_gmpo_rs", "harness_rais"} <= checked
    assert set(sent.values()) <= checked, {e: m for e, m in sent.items() if m not in checked}
    assert {k for k in POLICY_LOSS_REGISTRY if k.startswith("harness_")} <= checked


@pytest.mark.parametrize("estimator,extra", CHECKED)
def test_summed_loss_and_gradient_do_not_depend_on_the_micro_batches(spec, estimator, extra, process_group,
                                                                      cpu_fsdp_engine, monkeypatch):
    actor, env = _actor(spec, estimator, *extra)
    model = _model()
    eng = cpu_fsdp_engine(model)
    td = _batch()
    _prepare(eng, model, td, env, monkeypatch)

    runs = {name: _update(eng, model, td, actor, split) for name, split in SPLITS.items()}
    assert [runs[k][2] for k in SPLITS] == [1, 2, 4, 4], "the micro-batches verl made"
    loss1, grads1, _ = runs["1"]
    assert loss1 != 0 and len(grads1) > 10
    for name, (loss, grads, _) in runs.items():
        torch.testing.assert_close(torch.as_tensor(loss), torch.as_tensor(loss1), rtol=1e-5, atol=1e-7,
                                   msg=lambda m: f"{estimator}, {name} micro-batches, the summed loss: {m}")
        assert grads.keys() == grads1.keys()
        for n in grads1:
            torch.testing.assert_close(grads[n], grads1[n], rtol=1e-4, atol=1e-6,
                                       msg=lambda m: f"{estimator}, {name} micro-batches, {n}: {m}")


def test_verls_geo_mean_alone_grows_with_the_micro_batch_count(spec, process_group, cpu_fsdp_engine, monkeypatch):
    """What harness_gmpo_rs corrects: verl 0.9.1's ``geo_mean``, on the same data through the same engine, sums
    to k x the one-micro-batch loss and gradient over k equal micro-batches."""
    actor, env = _actor(spec, "gmpo_rs", "estimator.log_clip=0.3", loss_mode="geo_mean")
    model = _model()
    eng = cpu_fsdp_engine(model)
    td = _batch()
    _prepare(eng, model, td, env, monkeypatch)
    loss1, grads1, _ = _update(eng, model, td, actor, SPLITS["1"])
    for k in (2, 4):
        loss, grads, _ = _update(eng, model, td, actor, SPLITS[str(k)])
        torch.testing.assert_close(torch.as_tensor(loss), k * torch.as_tensor(loss1))
        n = "lm_head.weight"
        torch.testing.assert_close(grads[n], k * grads1[n])


@pytest.mark.parametrize("estimator,extra", [("gmpo_rs", ["estimator.log_clip=0.3", "estimator.gamma_min=0.8"]),
                                             ("rais", ["estimator.gamma_min=0.8"]), ("recompute", [])])
def test_data_parallel_ranks_average_to_the_one_rank_loss(spec, estimator, extra, monkeypatch):
    """verl's ``ppo_loss`` per micro-batch as two data-parallel ranks see it (``dp_size=2``, the global token
    count, ``global_batch_size`` over both ranks; each rank's micro-batches from ``prepare_micro_batches``):
    the ranks' summed losses and gradients, averaged as FSDP averages gradients, equal the one-rank ones."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.losses import ppo_loss

    from harness.backends.verl.plugins.rais import router_shift

    actor, env = _actor(spec, estimator, *extra)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    td = _batch(torch.float64)
    td["harness_row"] = torch.arange(B)
    g = torch.Generator().manual_seed(7)
    old = -torch.rand(B, R, generator=g, dtype=torch.float64) * 2
    td["old_log_probs"] = old
    theta = (old + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.3).requires_grad_()  # "the model"
    gamma = torch.rand(B, R, generator=g, dtype=torch.float64) * 0.5 + 0.6
    n_tokens = int(td["loss_mask"].sum())

    def rank_loss(data, dp_size: int):
        """One rank: its micro-batches (dynamic, as the engine makes them), each loss with the global info."""
        tu.assign_non_tensor(data, batch_num_tokens=n_tokens, dp_size=dp_size, global_batch_size=B,
                             use_dynamic_bsz=True, max_token_len_per_gpu=P + R)
        micro, _ = prepare_micro_batches(data=data, dp_group=None, same_micro_num_in_dp=False)
        total = 0
        for mb in micro:
            rows = mb["harness_row"]
            nested = torch.nested.as_nested_tensor(  # the engine's layout: response token t at position P + t - 1
                [torch.cat([theta.new_zeros(P - 1), theta[r, :LENS[r]], theta.new_zeros(1)]) for r in rows.tolist()],
                layout=torch.jagged)
            with router_shift(gamma[rows]):
                loss, _ = ppo_loss(actor, {"log_probs": nested}, mb)
            total = total + loss
        return total

    one = rank_loss(td.copy(), 1)
    (g_one,) = torch.autograd.grad(one, theta)
    halves = [rank_loss(part, 2) for part in tu.chunk_tensordict(td.copy(), 2)]  # the dispatch's split over ranks
    two = (halves[0] + halves[1]) / 2  # FSDP's gradient reduction averages over the data-parallel ranks
    (g_two,) = torch.autograd.grad(two, theta)
    torch.testing.assert_close(two, one)
    torch.testing.assert_close(g_two, g_one)

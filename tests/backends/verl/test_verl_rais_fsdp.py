"""RAIS on verl's FSDP engine: router logits from the HF Qwen3-MoE forward reach ``harness_rais`` (issue 14).

verl's own ``FSDPEngineWithLMHead.forward_step`` (with its ``prepare_model_inputs/outputs``) runs
here on CPU, patched by ``plugins/rais_fsdp.py``, with a tiny random HF Qwen3-MoE as the module and
verl's ``ppo_loss`` as the loss. What cannot run here is replaced and named: the engine object is
made without ``__init__`` (no FSDP wrapping; a one-process gloo group), and verl's device lookups
return "cpu". Our ``train_mini_batch`` wrapper runs for real (sample ids, the snapshot pass through verl's
``engine.infer_batch`` as on a GPU); the verl ``train_mini_batch`` it then calls (the update loop
with verl's optimizer step) is replaced by a recorder. The reference is computed
independently: plain HF forwards and the local backend's ``router_shift_gamma`` / ``rais_ratio``
/ ``ppo_loss``.
"""
from __future__ import annotations

import copy
from functools import partial
from types import SimpleNamespace

import pytest
import torch

from harness.backends.local.trainer import ppo_loss as local_ppo_loss
from harness.backends.verl import translate
from harness.estimators import rais
from harness.estimators.rais import rais_ratio, router_shift_gamma

# the loss code runs under device_guard.StrictDevice: a tensor made on the default device fails (issue 44)
pytestmark = pytest.mark.usefixtures("strict_device")

B, P, R = 4, 3, 6


@pytest.fixture
def rais_env(monkeypatch):
    monkeypatch.setenv(rais.RAIS_ENV, "1")
    monkeypatch.setenv(rais.GAMMA_MIN_ENV, "0.8")


def _micro_batch(vocab: int):
    """A micro batch as verl's update sees it: left_right_2_no_padding of a padded DataProto batch."""
    from verl.protocol import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(1)
    lens = torch.tensor([6, 3, 5, 2])
    attn = torch.cat([torch.ones(B, P, dtype=torch.long), (torch.arange(R) < lens[:, None]).long()], 1)
    ids = torch.randint(1, vocab, (B, P + R), generator=g) * attn
    adv = torch.randn(B, 1, generator=g).expand(B, R).contiguous()
    batch = DataProto.from_dict(tensors={
        "prompts": ids[:, :P], "responses": ids[:, P:], "input_ids": ids, "attention_mask": attn,
        "position_ids": (attn.cumsum(1) - 1).clamp(min=0), "response_mask": attn[:, P:], "advantages": adv * attn[:, P:]})
    td = left_right_2_no_padding(batch.to_tensordict())
    td["harness_sample_id"] = torch.arange(B)  # what the patched train_mini_batch adds
    tu.assign_non_tensor(td, temperature=1.0, use_remove_padding=True, calculate_entropy=False)
    return td, ids, attn


def _hf_reference(model, ids, attn):
    """Plain HF forward of the packed batch: per packed token, the next-token log-prob row and the
    router log-probs [tokens, L, E]."""
    packed = ids[attn.bool()].unsqueeze(0)
    pos = ((attn.cumsum(1) - 1)[attn.bool()]).unsqueeze(0)
    with torch.no_grad():
        out = model(input_ids=packed, position_ids=pos, output_router_logits=True, use_cache=False)
    logp = torch.log_softmax(out.logits[0].float(), -1)
    router = torch.stack([torch.log_softmax(r.float(), -1) for r in out.router_logits], 1)
    return logp, router


def _response_rows(x, attn):
    """[tokens, ...] packed values -> [B, R, ...] at each response token's predicting position."""
    out, start = [], 0
    for b in range(B):
        n_seq = int(attn[b].sum())
        n_resp = n_seq - P
        rows = x[start + P - 1: start + n_seq - 1]
        out.append(torch.cat([rows, rows.new_zeros((R - n_resp, *rows.shape[1:]))]))
        start += n_seq
    return torch.stack(out)


def test_patched_fsdp_forward_feeds_router_shift_to_the_rais_loss(spec, rais_env, process_group, cpu_fsdp_engine,
                                                                  monkeypatch):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    from harness.backends.verl.plugins import rais_fsdp

    torch.manual_seed(0)
    hf = Qwen3MoeConfig(vocab_size=40, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                        num_experts=8, num_experts_per_tok=2)
    model = Qwen3MoeForCausalLM(hf).float().eval()
    eng = cpu_fsdp_engine(model)
    td, ids, attn = _micro_batch(hf.vocab_size)

    # the step's update call: our train_mini_batch tags the samples and runs the snapshot pass (pre-update
    # weights) through verl's engine.infer_batch: eval mode, token-balanced micro batches (dynamic bsz),
    # each forward recording the old top-K router log-probs per sample. verl's own train_mini_batch
    # (the update loop, which needs its optimizer) is replaced by a recorder of what it would get.
    del td["harness_sample_id"]
    worker = SimpleNamespace(engine=eng, model_config={"use_remove_padding": True}, engine_config=SimpleNamespace(
        use_dynamic_bsz=True, infer_max_token_len_per_gpu=2 * (P + R), infer_micro_batch_size_per_gpu=1,
        use_fused_kernels=False))
    handed = []
    rais_fsdp.train_mini_batch(lambda self, data: handed.append(data), worker, td)
    assert handed[0] is td and td["harness_sample_id"].tolist() == list(range(B))
    snap = eng._harness_router_snapshot
    assert sorted(snap.samples) == list(range(B)) and not snap.recording
    assert [snap.samples[b][1].shape for b in range(B)] == [(int(attn[b].sum()), hf.num_hidden_layers, 2) for b in range(B)]
    _, out = type(eng).forward_step(eng, td, None, True)  # compute_log_prob's forward: old_log_prob
    old_logp = no_padding_2_padding(out["model_output"]["log_probs"], td).double()
    old_model = copy.deepcopy(model)

    # an update moved the routers (and the rest): perturb every layer's router and the LM head
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.add_(torch.randn_like(layer.mlp.gate.weight) * 0.06)
        model.lm_head.weight.add_(torch.randn_like(model.lm_head.weight) * 0.05)

    cfg = spec("estimator=rais", "model=qwen3_30b_a3b_fsdp", "verl.experimental_rais=true", "estimator.gamma_min=0.8")
    actor = omega_conf_to_dataclass(translate.verl_config(cfg, check=False).actor_rollout_ref.actor)
    td["old_log_probs"] = old_logp.float()
    n_tokens = int(td["loss_mask"].sum())
    tu.assign_non_tensor(td, batch_num_tokens=n_tokens, dp_size=1, global_batch_size=B)
    loss, _ = type(eng).forward_step(eng, td, partial(ppo_loss, config=actor), False)
    assert model.config.output_router_logits is False  # only the actor's forward call asked for them

    # independent reference: HF forwards, the local backend's gamma, ratio and loss
    logp_new_all, router_new = _hf_reference(model, ids, attn)
    _, router_old = _hf_reference(old_model, ids, attn)
    next_tok = torch.cat([torch.cat([ids[b, attn[b].bool()][1:], ids.new_zeros(1)]) for b in range(B)])
    logp_new = _response_rows(logp_new_all.gather(-1, next_tok[:, None])[:, 0], attn).double()
    gamma = router_shift_gamma(router_new, router_old, router_old.topk(hf.num_experts_per_tok, -1).indices)
    gamma = _response_rows(gamma, attn).double()
    mask = attn[:, P:].double()
    assert ((gamma < 0.8) & mask.bool()).any() and ((gamma > 0.8) & mask.bool()).any()
    ratio = rais_ratio(torch.exp(logp_new - old_logp), gamma, cfg.estimator.gamma_min)
    want, _ = local_ppo_loss(ratio, td["advantages"].double(), torch.ones_like(mask), mask, cfg.trainer.clip_eps)
    torch.testing.assert_close(torch.as_tensor(loss).double(), want, rtol=1e-4, atol=1e-6)

    # without the patch's gamma the loss refuses (plain vanilla PPO is never trained silently)
    monkeypatch.delenv(rais.RAIS_ENV)
    with pytest.raises(RuntimeError, match="router"):
        type(eng).forward_step(eng, td, partial(ppo_loss, config=actor), False)


def test_sample_id_rides_with_its_row_through_verls_batching():
    """The snapshot is keyed by ``harness_sample_id``: verl's shuffled mini-batches
    (``tu.make_iterator``) and token-balanced micro-batches (``prepare_micro_batches``, dynamic
    bsz) must keep it on its sample's row."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.utils import prepare_micro_batches

    from harness.backends.verl.plugins.rais_fsdp import SAMPLE_ID

    td, ids, attn = _micro_batch(40)
    first_tok = {int(ids[b, 0]): b for b in range(B)}
    assert len(first_tok) == B  # each row recognisable by its first token
    seen = []
    for mb in tu.make_iterator(td, mini_batch_size=2, epochs=1, seed=1, dataloader_kwargs={"shuffle": True}):
        tu.assign_non_tensor(mb, use_dynamic_bsz=True, max_token_len_per_gpu=P + R, micro_batch_size_per_gpu=1)
        micro, _ = prepare_micro_batches(data=mb, dp_group=None, same_micro_num_in_dp=False)
        for m in micro:
            rows = [first_tok[int(x[0])] for x in m["input_ids"].unbind()]
            assert m[SAMPLE_ID].tolist() == rows
            seen += rows
    assert sorted(seen) == list(range(B)) and seen != list(range(B))  # all rows, shuffled

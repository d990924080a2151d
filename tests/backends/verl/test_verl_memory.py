"""The per-GPU memory plan (``--plan``) against numbers worked out by hand for Qwen3-30B-A3B.

Hand computation (Qwen3-30B-A3B's config.json: h=2048, L=48, 32 query heads, 4 KV heads of 128,
128 experts of 768, top-8, vocab 151936, untied embeddings), preset TP2/EP8/ETP1 on 8 GPUs:

    attention/layer = 2048*4096 + 2*2048*512 + 4096*2048 + 2*128 + 2*2048 = 18,878,720
    experts/layer   = 128 * 3 * 2048 * 768 = 603,979,776;  router/layer = 2048*128 = 262,144
    embeddings      = 2 * 151936*2048 + 2048 = 622,336,000
    total           = 48*(18,878,720 + 603,979,776 + 262,144) + 622,336,000 = 30,532,122,624  (30.5B, as published)
    per GPU: dense  = (48*18,878,720 + 622,336,000) / 2 = 764,257,280;  experts = 48*603,979,776 / 8
             router = 48*262,144 (replicated over TP)
    GPU Adam: 12 B * (dense+router)/dp(=4) + 12 B * experts/edp(=1)  -> ~45.8 GB: the update cannot fit 80 GB
"""
from __future__ import annotations

import pytest

from harness.backends.verl.memory import GB, LOGIT_BYTES, OVERHEAD_GB, params, plan

H, L, HEADS, KV, D, E, K, F, V = 2048, 48, 32, 4, 128, 128, 8, 768, 151936


def test_parameter_count_of_qwen3_30b_a3b(spec):
    c = params(spec("estimator=tis", "model=qwen3_30b_a3b"))
    attention_layer = H * HEADS * D + 2 * H * KV * D + HEADS * D * H + 2 * D + 2 * H
    assert attention_layer == 18_878_720
    assert c.attention == L * attention_layer and c.experts == L * E * 3 * H * F and c.router == L * H * E
    assert c.embeddings == 2 * V * H + H
    assert c.total == 30_532_122_624
    assert abs(c.total / 30.5e9 - 1) < 0.005  # Qwen's published 30.5B
    assert abs(params(spec("estimator=tis", "model=qwen3_4b")).total / 4.02e9 - 1) < 0.01  # Qwen3-4B: 4.0B


def test_megatron_preset_plan_equals_the_hand_computation(spec):
    cfg = spec("estimator=tis", "model=qwen3_30b_a3b")
    p = cfg.verl.parallel
    assert (p.tp, p.ep, p.etp, p.cpu_adam, p.recompute, p.param_offload) == (2, 8, 1, True, "full", True)
    dense = (L * 18_878_720 + 2 * V * H + H) / 2
    experts, router = L * E * 3 * H * F / 8, L * H * E
    on_gpu = dense + experts + router
    got = plan(cfg)
    assert got.weights == pytest.approx(2 * on_gpu / GB) and got.grads == pytest.approx(4 * on_gpu / GB)
    assert got.optimizer == 0.0 and got.optimizer_cpu  # CPU Adam
    s = 8192  # max_token_len_per_gpu
    layer = s * (4 * H + 2 * (HEADS + 2 * KV) * D) / 2 + 2 * HEADS * D * s / 2 + s * (K * (2 * H + 6 * F) + 4 * E)
    assert got.activations == pytest.approx((L * s * H * 2 / 2 + layer) / GB)
    assert got.logits == pytest.approx(s * V * LOGIT_BYTES / 2 / GB)
    assert got.update_peak == pytest.approx(got.weights + got.grads + got.activations + got.logits + OVERHEAD_GB)
    assert got.rollout_peak == pytest.approx(0.6 * 80 + OVERHEAD_GB)  # weights/grads offloaded while vLLM runs
    assert got.fits and got.update_peak < 0.9 * 80

    # the 56d12ff preset: GPU Adam, no recompute -> unsharded expert states (edp = 8/(8*1) = 1) alone ~43 GB
    old = plan(spec("estimator=tis", "model=qwen3_30b_a3b", "verl.parallel.cpu_adam=false",
                    "verl.parallel.recompute=none", "verl.parallel.optimizer_offload=true"))
    assert old.optimizer == pytest.approx(12 * ((dense + router) / 4 + experts / 1) / GB)
    assert 12 * experts / GB > 43
    assert old.activations == pytest.approx(L * layer / GB)
    assert not old.fits


def test_fsdp_plans(spec):
    dense = plan(spec("estimator=tis", "model=qwen3_4b"))
    total = params(spec("estimator=tis", "model=qwen3_4b")).total
    assert dense.weights + dense.grads + dense.optimizer == pytest.approx(16 * total / 8 / GB)
    assert dense.rollout_residue == pytest.approx(12 * total / 8 / GB)  # no offload: fp32 weights + Adam stay
    assert dense.fits
    rais = plan(spec("estimator=rais", "model=qwen3_30b_a3b_fsdp", "verl.experimental_rais=true"))
    assert rais.weights == rais.grads == rais.optimizer == rais.rollout_residue == 0.0  # CPUOffloadPolicy
    assert rais.fits and any("host memory" in n for n in rais.notes)

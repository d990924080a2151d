"""``rais`` on verl's FSDP engine: router log-probs from the HF MoE forward, into ``harness_rais``.

verl 0.9.1 hands policy losses no router information (plugins/rais.py). On the FSDP engine the
model is the Hugging Face one (Qwen3-MoE: ``Qwen3MoeForCausalLM``), whose forward returns every
layer's router logits with ``output_router_logits=True``. ``install()`` patches three methods,
active only in processes with ``HARNESS_RAIS=1`` (translate.py sets it for rais runs only):

* ``FSDPEngineWithLMHead.prepare_model_inputs`` adds ``output_router_logits=True`` to the actor's
  forward. That forward serves compute_log_prob and the update only: rollouts are vLLM's, so
  ``generate`` never sees it. The packed (remove-padding) input gives one [tokens, E] tensor per layer.
* ``FSDPEngineWithLMHead.forward_step`` keeps them; in the **snapshot pass** it stores, per sample,
  the log-probs of the old top-K experts and their indices; in the **update** it wraps the loss:

      gamma[token] = exp(-(1/L) sum_l (1/K) sum_{e in old top-K} |log p_l(e) - log p_l_old(e)|)

  at each response token's predicting position (the position whose output predicts it: verl's
  ``no_padding_2_padding`` layout, as the log-probs), and calls the loss inside
  ``rais.router_shift(gamma)``; ``harness_rais`` multiplies the ratio by max(gamma, gamma_min).
* ``TrainingWorker.train_mini_batch`` (one call per step with this rank's whole batch) tags each
  sample with ``harness_sample_id`` and, before the first optimizer step, runs the snapshot pass:
  one forward-only pass over the batch with the pre-update weights, i.e. exactly the old policy
  (verl's decoupled mode computes ``old_log_prob`` with the same weights just before). Costs one
  extra forward per step, and [tokens, L, K] floats + indices of host memory.

Megatron: not patched (its router is Megatron's, not HF's); validate() refuses rais there.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from harness.backends.verl.plugins.rais import gamma_from_router, router_shift
from harness.estimators.rais import RAIS_ENV
SAMPLE_ID = "harness_sample_id"


def active() -> bool:
    return os.environ.get(RAIS_ENV) == "1"


def router_logp(router_logits) -> torch.Tensor:
    """HF's per-layer router logits (tuple of L [tokens, E]) -> log-probs [tokens, L, E] (fp32)."""
    return torch.stack([torch.log_softmax(r.float(), dim=-1) for r in router_logits], dim=1)


def old_topk(router_logits, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The snapshot of one forward: log-probs at the top-K experts and the indices, [tokens, L, K]."""
    lp = router_logp(router_logits)
    idx = lp.topk(k, dim=-1).indices
    return lp.gather(-1, idx), idx


def packed_gamma(router_logits, old_logp: torch.Tensor, old_idx: torch.Tensor) -> torch.Tensor:
    """gamma per packed token [tokens] from the current router logits and the old snapshot."""
    new = router_logp(router_logits).gather(-1, old_idx.to(torch.long))
    return gamma_from_router(new, old_logp.to(new.dtype))


class RouterSnapshot:
    """Old top-K router log-probs per sample id (one step of one data-parallel rank)."""

    def __init__(self):
        self.samples: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.recording = False

    def store(self, sample_ids: torch.Tensor, offsets: torch.Tensor, logp: torch.Tensor, idx: torch.Tensor) -> None:
        for i, sid in enumerate(sample_ids.tolist()):
            a, b = int(offsets[i]), int(offsets[i + 1])
            self.samples[int(sid)] = (logp[a:b].detach().cpu(), idx[a:b].detach().cpu())

    def packed(self, sample_ids: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        missing = [int(s) for s in sample_ids.tolist() if int(s) not in self.samples]
        if missing:
            raise RuntimeError(f"rais: no old router snapshot for samples {missing[:5]}: the snapshot pass did not run")
        parts = [self.samples[int(s)] for s in sample_ids.tolist()]
        return torch.cat([p[0] for p in parts]).to(device), torch.cat([p[1] for p in parts]).to(device)


def _top_k(module) -> int:
    cfg = getattr(getattr(module, "module", module), "config", None)
    k = getattr(cfg, "num_experts_per_tok", None)
    if not k:
        raise RuntimeError("rais: the actor model has no num_experts_per_tok (not an HF MoE model)")
    return int(k)


def forward_step(orig: Callable, self, micro_batch, loss_function, forward_only):
    """The patched ``FSDPEngineWithLMHead.forward_step`` (module docstring)."""
    if not active():
        return orig(self, micro_batch, loss_function, forward_only)
    snap: RouterSnapshot = self.__dict__.setdefault("_harness_router_snapshot", RouterSnapshot())
    if snap.recording:
        out = orig(self, micro_batch, loss_function, forward_only)
        logp, idx = old_topk(self._harness_router_logits, _top_k(self.module))
        snap.store(micro_batch[SAMPLE_ID], micro_batch["input_ids"].offsets(), logp, idx)
        return out
    if loss_function is None or forward_only or SAMPLE_ID not in micro_batch.keys():
        return orig(self, micro_batch, loss_function, forward_only)

    def loss_with_gamma(model_output, data, dp_group=None):
        from verl.workers.utils.padding import no_padding_2_padding

        logits = self._harness_router_logits
        old_logp, old_idx = snap.packed(data[SAMPLE_ID], logits[0].device)
        gamma = packed_gamma(logits, old_logp, old_idx)
        nested = torch.nested.nested_tensor_from_jagged(gamma, offsets=data["input_ids"].offsets())
        with router_shift(no_padding_2_padding(nested, data).detach()):
            return loss_function(model_output=model_output, data=data, dp_group=dp_group)

    return orig(self, micro_batch, loss_with_gamma, forward_only)


def prepare_model_inputs(orig: Callable, self, micro_batch):
    model_inputs, output_args = orig(self, micro_batch)
    if active():
        model_inputs["output_router_logits"] = True
    return model_inputs, output_args


def prepare_model_outputs(orig: Callable, self, output, output_args, micro_batch, logits_processor_func):
    if active():
        logits = getattr(output, "router_logits", None)
        if not logits:
            raise RuntimeError("rais: the actor's forward returned no router_logits (output_router_logits=True)")
        self._harness_router_logits = logits
    return orig(self, output, output_args, micro_batch, logits_processor_func)


def snapshot(engine, data) -> None:
    """The snapshot pass: a forward-only pass of the whole (pre-update) batch recording the old top-K."""
    from verl.utils import tensordict_utils as tu

    snap: RouterSnapshot = engine.__dict__.setdefault("_harness_router_snapshot", RouterSnapshot())
    snap.samples.clear()
    td = data.copy()
    tu.assign_non_tensor(td, calculate_entropy=False, compute_loss=False)
    snap.recording = True
    try:
        with engine.eval_mode():  # loads offloaded weights for the pass (and offloads them after), as infer_batch
            engine.infer_batch(td, loss_function=None)
    finally:
        snap.recording = False


def train_mini_batch(orig: Callable, self, data):
    if active():
        from verl.utils import tensordict_utils as tu

        data[SAMPLE_ID] = torch.arange(data.shape[0], device=data["input_ids"].device)
        defaults = dict(use_remove_padding=self.model_config.get("use_remove_padding", False),
                        use_dynamic_bsz=self.engine_config.use_dynamic_bsz,
                        max_token_len_per_gpu=self.engine_config.infer_max_token_len_per_gpu,
                        micro_batch_size_per_gpu=self.engine_config.infer_micro_batch_size_per_gpu,
                        use_fused_kernels=self.engine_config.use_fused_kernels)
        td = data.copy()
        tu.assign_non_tensor(td, **defaults)
        snapshot(self.engine, td)
    return orig(self, data)


def _wrap(cls, name: str, fn: Callable) -> None:
    orig = getattr(cls, name)
    if getattr(orig, "_harness_rais", False):
        return

    def method(self, *args, **kwargs):
        return fn(orig, self, *args, **kwargs)

    method._harness_rais = True
    method.__name__ = name
    setattr(cls, name, method)


def install() -> None:
    """Patch verl's FSDP engine and training worker (no effect unless HARNESS_RAIS=1 at call time)."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
    from verl.workers.engine_workers import TrainingWorker

    _wrap(FSDPEngineWithLMHead, "prepare_model_inputs", prepare_model_inputs)
    _wrap(FSDPEngineWithLMHead, "prepare_model_outputs", prepare_model_outputs)
    _wrap(FSDPEngineWithLMHead, "forward_step", forward_step)
    _wrap(TrainingWorker, "train_mini_batch", train_mini_batch)


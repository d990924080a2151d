"""verl's FSDP2 engine with the harness's plugins on a tiny random Qwen3-MoE, without vLLM or Ray (issue 30, item 8).

    torchrun --standalone --nproc_per_node=1 scripts/gpu_engine_check.py [--device cuda|cpu] [--out results.json]
    make gpu-engine-check

One process, one rank: verl's ``FSDPEngineWithLMHead`` is constructed directly (its engine registry lists it
for cuda/npu only) and initialised for real (HF ``from_pretrained`` of a random checkpoint written here, FSDP2
``fully_shard``, verl's AdamW and LR scheduler, its checkpoint manager); the update runs through verl's
``TrainingWorker.train_mini_batch`` (the worker object made without its Ray ``__init__``) with verl's
``ppo_loss`` and the policy loss of the harness's translated spec. Each check prints one line
``CHECK <name>: ok|FAIL (<numbers>)`` (none is skipped, on CPU either); the exit status is 1 if any check failed.

* ``logprob``    the engine's log-probs (``infer_batch``, eval mode) against a plain HF forward of the same
                 weights, each sequence alone, unpadded: max |diff|
* ``tis_step``   ``estimator=tis`` (verl's vanilla loss with ``rollout_is_weights``): on-policy, the loss equals
                 -sum(A w) / tokens computed here and differs from the loss with w = 1; then one training
                 mini-batch: loss and grad norm finite, grad norm > 0, the weights moved
* ``rais_gamma`` ``estimator=rais`` with our FSDP router patch (plugins/rais_fsdp.py): one ``train_mini_batch``
                 of two mini-batches; gamma (``actor/rais_gamma_mean``) is 1 before the first optimizer step,
                 < 1 after it
* ``gmpo_rs_micro`` ``estimator=gmpo_rs``: the gradient of one mini-batch in 1 and in 4 micro-batches (verl's
                 ``forward_backward_batch``), max relative difference
* ``step_<estimator>`` for each estimator whose loss runs on the FSDP engine (tis, mis, geo_rs, icepop, rais, gmpo_rs,
                 mean_n, mean_n_tis; issue 44): the batch verl's trainer hands the actor (old log-probs recomputed by the
                 engine, or mean_n's scores of n passes in bypass mode; verl's own rollout correction of the translated
                 config against stand-in rollout log-probs with a known mismatch per sequence: IS weights, rejection),
                 then one ``train_mini_batch`` of 2 mini-batches with the translated loss: loss and grad norm finite,
                 grad norm > 0, weights moved; mis and geo_rs rejected some sequences, icepop zeroed the spiked token
* ``router_replay_fsdp`` r2 and r3 on the FSDP preset are refused (verl 0.9.1's FSDP engine has no router replay)
* ``save_reload`` verl's checkpoint manager: save, train a step, load; log-probs after the load bitwise equal
                 to those at the save, and Adam's state equal
* ``memory``     peak memory (CUDA: ``max_memory_allocated``; CPU: the process's max RSS) beside
                 ``harness.backends.verl.memory.plan``'s update peak for the same tiny shape; passes when the
                 plan's parameter count is the engine's (the memory numbers are informative: the plan's 4 GB
                 overhead dominates at this size)

On CPU (``--device cpu``, a gloo group; ``tests/scripts/test_gpu_engine_check.py``) what verl cannot do there is
replaced, named: verl's device lookups answer "cpu" and its GPU-memory logging is a no-op (verl has no CPU
platform). Where ``ray``, ``fastapi`` or ``uvicorn`` is missing (the GPU machine's case: ray's wheel alone is 79 MB) a
stub module stands in for verl's import-time imports of them (``--stub-ray`` stubs all three); nothing here calls
them: they serve verl's Ray single controller and its rollout servers.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import time
import types
import warnings
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

B, P, R = 4, 6, 10  # sequences, prompt length, response length (seq 16)
RESP_LENS = [10, 7, 4, 9]
LR = 1e-2
TOL = {"logprob_cpu": 1e-5, "logprob_cuda": 1e-4, "gamma_one": 1e-6, "gmpo_rel": 1e-5}
# the tiny model and the batch, as harness spec overrides (the model's HF config is made from them)
SPEC = ["backend=verl", "model=qwen3_30b_a3b_fsdp", "verl.experimental_rais=true", "model.d_model=64",
        "model.n_layers=2", "model.n_heads=4", "model.n_experts=4", "model.top_k=2", "model.d_expert=32",
        "verl.arch.vocab_size=128", "verl.arch.n_kv_heads=2", "verl.arch.head_dim=16", "verl.gpus_per_node=1",
        "verl.parallel.cpu_adam=false", "verl.parallel.gradient_checkpointing=false", "verl.parallel.rollout_tp=1",
        "verl.parallel.use_dynamic_bsz=false", "verl.parallel.micro_batch_per_gpu=1",
        f"verl.data.max_prompt_length={P}", f"verl.data.max_response_length={R}",
        "trainer.prompts_per_step=2", "trainer.group_size=2", "trainer.num_minibatches=2",
        "trainer.lr=1e-4"]  # (the spec's limit for verl; the engine's AdamW here uses LR)


# ---------------------------------------------------------------- environment: stubs, CPU stand-ins
class _Anything:
    """What a stub module hands out: callable, usable as a decorator or a base class, any attribute."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # @ray.remote
        return _Anything()

    def __getattr__(self, name):
        return _Anything()

    def __mro_entries__(self, bases):
        return (object,)


def _stub_attr(attr: str):
    if attr.startswith("__"):  # (dunder look-ups, e.g. __file__, must fail as on a real module)
        raise AttributeError(attr)
    return _Anything()


class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The named top-level modules and their submodules as empty modules whose every attribute is an ``_Anything``."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _stub_attr
        mod.HARNESS_STUB = True
        return mod

    def exec_module(self, module):
        pass


#: imported by verl at import time, never called here: Ray (the single controller, 79 MB wheel) and the rollout
#: servers' web stack (verl.workers.rollout, imported by verl.workers.engine_workers)
STUBBED = ("ray", "fastapi", "uvicorn")


def install_stubs(force: bool) -> list[str]:
    """Stubs in front of those of ``STUBBED`` that are missing (all of them with ``force``); the stubbed names."""
    names = []
    for name in STUBBED:
        if not force and importlib.util.find_spec(name) is not None:
            continue
        names.append(name)
        for mod in [n for n in sys.modules if n.split(".")[0] == name]:
            del sys.modules[mod]
    if names:
        sys.meta_path.insert(0, _Stub(names))
    return names


class _CpuDevice:
    """verl's ``get_torch_device()`` on CPU: every call (empty_cache, synchronize, memory stats) a no-op."""

    def __getattr__(self, name):
        return lambda *a, **k: 0

    def is_available(self):
        return False


def patch_verl_for_cpu() -> list[str]:
    """verl has no CPU platform: its device lookups answer "cpu", its GPU-memory logging does nothing."""
    import verl.workers.engine.fsdp.transformer_impl as ti
    import verl.workers.engine_workers  # noqa: F401  (loaded, so its names are patched too)

    done = set()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("verl") or mod is None:
            continue
        for fn, repl in (("get_device_id", lambda: "cpu"), ("get_device_name", lambda: "cpu"),
                         ("get_torch_device", lambda: _CpuDevice()),
                         ("log_gpu_memory_usage", lambda *a, **k: None)):
            if callable(getattr(mod, fn, None)):
                setattr(mod, fn, repl)
                done.add(fn)
    ti.device_name = "cpu"
    return sorted(done)


# ---------------------------------------------------------------- the harness spec, the tiny model, verl's engine
def spec(estimator: str, model_dir: Path | None = None):
    """The validated backend=verl spec of the tiny model (``SPEC``) for one estimator."""
    from harness.backends.verl.config import validate
    from harness.spec import load

    path = [f"model.path={model_dir}"] if model_dir is not None else []
    return validate(load([*SPEC, f"estimator={estimator}", *path]))


def actor_config(estimator: str, model_dir: Path):
    """verl's ActorConfig of the harness's translation (its policy loss, clip, aggregation) and the workers' env."""
    from verl.utils.config import omega_conf_to_dataclass

    from harness.backends.verl import translate

    vc = translate.verl_config(spec(estimator, model_dir), check=False)
    env = {k: v for k, v in vc.ray_kwargs.ray_init.runtime_env.env_vars.items() if k.startswith("HARNESS_")}
    return omega_conf_to_dataclass(vc.actor_rollout_ref.actor), env


def tiny_model(out: Path) -> Path:
    """A random Qwen3-MoE checkpoint of the spec's shape (fp32) with a word-level tokenizer: nothing downloaded."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from harness.backends.verl.tokenizer import write_word_tokenizer

    cfg = spec("tis")
    m, a = cfg.model, cfg.verl.arch
    n_vocab = write_word_tokenizer(out, [f"w{i}" for i in range(a.vocab_size - 8)])
    assert n_vocab <= a.vocab_size, (n_vocab, a.vocab_size)
    hf = Qwen3MoeConfig(vocab_size=a.vocab_size, hidden_size=m.d_model, intermediate_size=2 * m.d_model,
                        moe_intermediate_size=m.d_expert, num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads,
                        num_key_value_heads=a.n_kv_heads, head_dim=a.head_dim, num_experts=m.n_experts,
                        num_experts_per_tok=m.top_k, tie_word_embeddings=a.tie_embeddings, max_position_embeddings=256,
                        architectures=["Qwen3MoeForCausalLM"])
    torch.manual_seed(0)
    Qwen3MoeForCausalLM(hf).float().save_pretrained(out)
    return out


def build_engine(model_dir: Path, strategy: str = "fsdp2"):
    """verl's FSDPEngineWithLMHead, made directly (not through its cuda/npu-only registry) and initialised: HF
    from_pretrained, FSDP2 fully_shard, AdamW, LR scheduler, checkpoint manager. fp32 throughout (sdpa attention:
    no flash-attn wheel needed), so the log-probs can be compared with a plain HF forward."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    mc = HFModelConfig(path=str(model_dir), use_remove_padding=True, enable_gradient_checkpointing=False,
                       override_config={"attn_implementation": "sdpa"})
    ec = FSDPEngineConfig(strategy=strategy, model_dtype="fp32", mixed_precision=fp32, use_torch_compile=False,
                          use_dynamic_bsz=False, micro_batch_size_per_gpu=1, infer_micro_batch_size_per_gpu=2,
                          max_token_len_per_gpu=4 * (P + R), infer_max_token_len_per_gpu=4 * (P + R))
    oc = FSDPOptimizerConfig(lr=LR, total_training_steps=100, weight_decay=0.0)
    cc = CheckpointConfig(save_contents=["model", "optimizer", "extra"], load_contents=["model", "optimizer", "extra"])
    engine = FSDPEngineWithLMHead(mc, ec, oc, cc)
    engine.initialize()
    return engine


class _NoProfiler:
    rank = 0

    def step(self):
        pass

    def check_enable(self):
        return False


def training_worker(engine, loss_fn):
    """verl's TrainingWorker around the engine, made without its Ray ``__init__``: its own ``train_mini_batch``
    (mini-batch iterator, ``train_batch``, optimizer and LR steps) runs, patched by our RAIS plugin if active."""
    from verl.workers.engine_workers import TrainingWorker

    w = object.__new__(TrainingWorker)
    w.engine, w.model_config, w.engine_config = engine, engine.model_config, engine.engine_config
    w.loss_fn, w.flops_counter, w.profiler = loss_fn, None, _NoProfiler()
    from verl.utils.device import get_device_name
    w.device_name = get_device_name()
    return w


def batch(vocab: int, seed: int = 1, response_mask=None, is_weights="tis"):
    """A batch as verl's trainer hands it to the actor: left_right_2_no_padding of a padded DataProto (left-
    padded-free prompts of P tokens, right-padded responses of RESP_LENS tokens), with advantages and IS weights
    (random TIS-like weights, or ``is_weights`` [B, R], or none where None); ``response_mask`` replaces the mask
    (verl's rejection sampling narrows it, the attention mask stays)."""
    import torch
    from verl.protocol import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor(RESP_LENS)
    attn = torch.cat([torch.ones(B, P, dtype=torch.long), (torch.arange(R) < lens[:, None]).long()], 1)
    ids = torch.randint(1, vocab, (B, P + R), generator=g) * attn
    mask = attn[:, P:]
    adv = torch.randn(B, 1, generator=g).expand(B, R) * mask
    is_w = (0.5 + torch.rand(B, R, generator=g)) * mask  # TIS weights (rollout_is_weights), in [0.5, 1.5)
    tensors = {"prompts": ids[:, :P], "responses": ids[:, P:], "input_ids": ids, "attention_mask": attn,
               "position_ids": (attn.cumsum(1) - 1).clamp(min=0),
               "response_mask": mask if response_mask is None else response_mask.to(mask.dtype),
               "advantages": adv.contiguous()}
    if is_weights is not None:
        tensors["rollout_is_weights"] = is_w if isinstance(is_weights, str) else is_weights.float()
    dp = DataProto.from_dict(tensors=tensors)
    td = left_right_2_no_padding(dp.to_tensordict())
    tu.assign_non_tensor(td, temperature=1.0, use_remove_padding=True, calculate_entropy=False,
                         use_dynamic_bsz=False, micro_batch_size_per_gpu=2, max_token_len_per_gpu=4 * (P + R),
                         use_fused_kernels=False)
    return td, ids, attn


def engine_logprobs(engine, td):
    """The engine's log-probs of the response tokens [B, R] (verl's compute_log_prob path: eval mode, infer_batch)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import no_padding_2_padding

    data = td.copy()
    tu.assign_non_tensor(data, compute_loss=False)
    with engine.eval_mode():
        out = engine.infer_batch(data, loss_function=None)
    return no_padding_2_padding(out["model_output"]["log_probs"], data).float().cpu()


# ---------------------------------------------------------------- the checks
class Ctx:
    """What the checks share: the device, the tiny checkpoint, the engine, the batch."""

    def __init__(self, device: str, work: Path):
        self.device, self.work = device, work
        self.model_dir = tiny_model(work / "tiny_qwen3_moe")
        self.engine = build_engine(self.model_dir)
        self.vocab = spec("tis").verl.arch.vocab_size
        self.td, self.ids, self.attn = batch(self.vocab)
        self.mask = self.attn[:, P:].bool()


@contextlib.contextmanager
def worker_env(env: dict):
    """The env vars translate.py gives verl's workers (HARNESS_RAIS, gamma_min, log_clip), for one check."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def train_data(ctx: Ctx, num_mini_batch: int, old_log_probs=None):
    """The update's input as ``_update_actor`` builds it: old log-probs, mini-batch split, global batch size."""
    from verl.utils import tensordict_utils as tu

    data = ctx.td.copy()
    data["old_log_probs"] = engine_logprobs(ctx.engine, ctx.td) if old_log_probs is None else old_log_probs
    tu.assign_non_tensor(data, num_mini_batch=num_mini_batch, epochs=1, seed=0, global_batch_size=B // num_mini_batch,
                         dataloader_kwargs={"shuffle": False})
    return data


def full_params(engine) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().cpu().clone()
            for n, p in engine.module.named_parameters()}


def check_logprob(ctx: Ctx) -> tuple[bool, dict]:
    import torch
    from transformers import Qwen3MoeForCausalLM

    got = engine_logprobs(ctx.engine, ctx.td)
    hf = Qwen3MoeForCausalLM.from_pretrained(ctx.model_dir, dtype=torch.float32, attn_implementation="sdpa")
    hf = hf.to(ctx.device).eval()
    want = torch.zeros(B, R)
    with torch.no_grad():
        for b, n_resp in enumerate(RESP_LENS):  # each sequence alone, unpadded
            x = ctx.ids[b, :P + n_resp].to(ctx.device)
            logp = torch.log_softmax(hf(input_ids=x[None], use_cache=False).logits[0].float(), -1)
            want[b, :n_resp] = logp[P - 1:-1].gather(-1, x[P:, None])[:, 0].cpu()
    diff = float(((got - want).abs() * ctx.mask).max())
    tol = TOL[f"logprob_{ctx.device}"]
    return diff <= tol and bool(torch.isfinite(got).all()), {"max_abs_diff": diff, "tol": tol,
                                                             "mean_logprob": float(want[ctx.mask].mean())}


def train_step(ctx: Ctx, estimator: str, num_mini_batch: int, old_log_probs=None) -> dict:
    """One ``train_mini_batch`` of the estimator's translated loss; verl's metrics (lists per micro-batch)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    actor, env = actor_config(estimator, ctx.model_dir)
    with worker_env(env):
        worker = training_worker(ctx.engine, partial(ppo_loss, config=actor))
        out = worker.train_mini_batch(train_data(ctx, num_mini_batch, old_log_probs))
    metrics = tu.get(out, "metrics")
    metrics["_loss_mode"] = actor.policy_loss.loss_mode
    return metrics


def _values(x) -> list[float]:
    """verl's metric values as floats: a number, a list, a ``Metric`` (its per-micro-batch values), nested."""
    if hasattr(x, "values") and hasattr(x, "aggregation"):  # verl.utils.metric.Metric
        x = x.values
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _values(item)]
    return [float(x)]


def forward_loss(ctx: Ctx, data, actor) -> float:
    """verl's ppo_loss of the batch at the current weights, forward only (summed over the micro-batches)."""
    from verl.workers.utils.losses import ppo_loss

    with ctx.engine.eval_mode():
        out = ctx.engine.infer_batch(data.copy(), loss_function=partial(ppo_loss, config=actor))
    return sum(_values(out["loss"]))


def check_tis_step(ctx: Ctx) -> tuple[bool, dict]:
    """Before the step, on-policy (ratio 1), verl's token-mean vanilla loss is -sum(A w) / tokens with the TIS weights
    w, independently computed here, and differs from the loss with w = 1; then one training mini-batch."""
    import math

    import torch

    actor, env = actor_config("tis", ctx.model_dir)
    data = train_data(ctx, 1)
    w, adv, mask = data["rollout_is_weights"], data["advantages"], ctx.mask.float()
    want = float(-(adv * w * mask).sum() / mask.sum())
    with worker_env(env):
        loss_w = forward_loss(ctx, data, actor)
        unweighted = data.copy()
        unweighted["rollout_is_weights"] = torch.ones_like(w)
        loss_1 = forward_loss(ctx, unweighted, actor)
    before = full_params(ctx.engine)
    m = train_step(ctx, "tis", num_mini_batch=1)
    after = full_params(ctx.engine)
    moved = max(float((after[n] - before[n]).abs().max()) for n in before)
    loss, gn = _values(m["loss"]), _values(m["grad_norm"])
    weighted = abs(loss_w - want) <= 1e-5 * max(1.0, abs(want)) and abs(loss_w - loss_1) > 1e-4
    ok = weighted and all(math.isfinite(v) for v in loss + gn) and min(gn) > 0 and moved > 0
    return ok, {"loss_mode": m["_loss_mode"], "loss_with_is_weights": loss_w, "reference_loss": want,
                "loss_with_w=1": loss_1, "step_loss": loss, "grad_norm": gn, "max_weight_change": moved}


def check_rais_gamma(ctx: Ctx) -> tuple[bool, dict]:
    from harness.backends.verl.plugins import rais_fsdp

    rais_fsdp.install()  # acts only with HARNESS_RAIS=1 (the rais spec's worker env)
    m = train_step(ctx, "rais", num_mini_batch=2)  # the snapshot, then mini-batch 1, optimizer step, mini-batch 2
    gamma = _values(m["actor/rais_gamma_mean"])
    first, last = gamma[0], gamma[-1]
    ok = m["_loss_mode"] == "harness_rais" and abs(first - 1) <= TOL["gamma_one"] and last < 1 - TOL["gamma_one"]
    return ok, {"gamma_per_micro_batch": gamma, "before_first_step": first, "after_first_step": last}


def check_gmpo_rs_micro(ctx: Ctx) -> tuple[bool, dict]:
    """gmpo_rs's gradient of one mini-batch through verl's forward_backward_batch in 1 and in 4 micro-batches."""
    import torch
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from harness.backends.verl.plugins import rais_fsdp

    rais_fsdp.install()
    actor, env = actor_config("gmpo_rs", ctx.model_dir)
    g = torch.Generator().manual_seed(7)
    old = engine_logprobs(ctx.engine, ctx.td)
    old = old + 0.1 * torch.randn(old.shape, generator=g) * ctx.mask  # ratios != 1: the clip matters
    grads, losses = {}, {}
    with worker_env(env):
        data = train_data(ctx, 1, old)
        worker = training_worker(ctx.engine, None)
        rais_fsdp.train_mini_batch(lambda self, d: None, worker, data)  # sample ids + the router snapshot
        for n_micro in (1, 4):
            d = data.copy()
            tu.assign_non_tensor(d, micro_batch_size_per_gpu=B // n_micro, global_batch_size=B)
            ctx.engine.optimizer_zero_grad()
            with ctx.engine.train_mode():  # (which zeroes the gradients on exit)
                out = ctx.engine.forward_backward_batch(d, partial(ppo_loss, config=actor))
                grads[n_micro] = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float().cpu()
                                  for n, p in ctx.engine.module.named_parameters() if p.grad is not None}
            losses[n_micro] = sum(_values(out["loss"]))  # the micro-batch losses verl backpropagated
        ctx.engine.optimizer_zero_grad()
    scale = max(float(v.abs().max()) for v in grads[1].values())
    rel = max(float((grads[1][n] - grads[4][n]).abs().max()) for n in grads[1]) / scale
    ok = actor.policy_loss.loss_mode == "harness_gmpo_rs" and scale > 0 and rel <= TOL["gmpo_rel"] and \
        set(grads[1]) == set(grads[4])
    return ok, {"max_rel_grad_diff": rel, "tol": TOL["gmpo_rel"], "max_grad": scale, "pg_loss_sum": losses}


#: the estimators whose loss runs on verl's FSDP engine, each through one training mini-batch (``step_<name>``)
ENGINE_ESTIMATORS = ("tis", "mis", "geo_rs", "icepop", "rais", "gmpo_rs", "mean_n", "mean_n_tis")
#: the rollout engine's log-probs, a stand-in (named: no vLLM here): the engine's own plus a known mismatch per
#: sequence (0, 0.5 with one token at 2.0, 0.01, -0.8) so that rejection and masking act on some sequences, not all,
#: and each of the two mini-batches keeps a sequence (a mini-batch that rejection empties has a 0/0 token-mean loss)
MISMATCH = ((0.0, None), (0.5, (1, 2.0)), (0.01, None), (-0.8, None))


def rollout_logprobs(old):
    """``old`` [B, R] minus the per-sequence mismatch of ``MISMATCH`` (the rollout engine's log-probs)."""
    import torch

    delta = torch.zeros_like(old)
    for b, (base, spike) in enumerate(MISMATCH):
        delta[b] = base
        if spike is not None:
            delta[b, spike[0]] = spike[1]
    return old - delta


def mean_n_scores(ctx: Ctx, old, n: int):
    """mean_n's old log-probs as its agent loop makes them (plugins/mean_n.mean_n_logprobs of n scoring passes per
    response; the passes here: the rollout stand-in plus a small per-pass jitter, a stand-in for vLLM's prefills)."""
    import torch

    from harness.backends.verl.plugins.mean_n import mean_n_logprobs

    g = torch.Generator().manual_seed(11)
    out = torch.zeros_like(old)
    for b, n_resp in enumerate(RESP_LENS):
        passes = old[b, :n_resp] + 0.05 * torch.randn(n, n_resp, generator=g, dtype=old.dtype)
        out[b, :n_resp] = torch.tensor(mean_n_logprobs(passes.double()), dtype=old.dtype, device=old.device)
    return out


def corrected_batch(ctx: Ctx, estimator: str):
    """What verl's trainer hands the actor for ``estimator``: old log-probs (recomputed, or mean_n's scores in bypass
    mode), verl's own rollout correction of the translated config (IS weights, rejection on the response mask), the
    actor config (bypass mode turns the loss into verl's ``bypass_mode``) and the workers' env."""
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.rollout_corr_helper import apply_bypass_mode, compute_rollout_correction_and_add_to_batch
    from verl.utils.config import omega_conf_to_dataclass

    from harness.backends.verl import translate

    cfg = spec(estimator, ctx.model_dir)
    vc = translate.verl_config(cfg, check=False)
    env = {k: v for k, v in vc.ray_kwargs.ray_init.runtime_env.env_vars.items() if k.startswith("HARNESS_")}
    old = engine_logprobs(ctx.engine, ctx.td)
    rollout = rollout_logprobs(old)
    if estimator.startswith("mean_n"):
        rollout = mean_n_scores(ctx, rollout, int(cfg.estimator.n))
    dp = DataProto.from_dict(tensors={"old_log_probs": old, "rollout_log_probs": rollout * ctx.mask,
                                      "response_mask": ctx.mask.long()})
    rc = vc.algorithm.get("rollout_correction")
    if rc is not None and rc.get("bypass_mode", False):
        apply_bypass_mode(dp, rc, vc.actor_rollout_ref.actor.policy_loss)
    elif rc is not None:
        dp, _ = compute_rollout_correction_and_add_to_batch(dp, rc)
    weights = dp.batch["rollout_is_weights"] if "rollout_is_weights" in dp.batch.keys() else None
    return dp, weights, omega_conf_to_dataclass(vc.actor_rollout_ref.actor), env


def check_estimator_step(ctx: Ctx, estimator: str) -> tuple[bool, dict]:
    """One ``train_mini_batch`` (2 mini-batches) of ``estimator``'s translated loss on the corrected batch: the loss and
    grad norm finite, the grad norm > 0, the weights moved; rejection estimators kept some tokens, not all."""
    import math

    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from harness.backends.verl.plugins import rais_fsdp

    rais_fsdp.install()  # (acts only for rais/gmpo_rs: HARNESS_RAIS=1 in their env)
    dp, weights, actor, env = corrected_batch(ctx, estimator)
    mask = dp.batch["response_mask"]
    td, _, _ = batch(ctx.vocab, response_mask=mask, is_weights=weights)
    data = td.copy()
    data["old_log_probs"] = dp.batch["old_log_probs"]
    tu.assign_non_tensor(data, num_mini_batch=2, epochs=1, seed=0, global_batch_size=B // 2,
                         dataloader_kwargs={"shuffle": False})
    before = full_params(ctx.engine)
    with worker_env(env):
        out = training_worker(ctx.engine, partial(ppo_loss, config=actor)).train_mini_batch(data)
    m = tu.get(out, "metrics")
    after = full_params(ctx.engine)
    moved = max(float((after[n] - before[n]).abs().max()) for n in before)
    loss, gn = _values(m["loss"]), _values(m["grad_norm"])
    kept, total = int(mask.sum()), int(ctx.mask.sum())
    ok = all(math.isfinite(v) for v in loss + gn) and max(gn) > 0 and moved > 0 and kept > 0
    if estimator in ("mis", "geo_rs"):  # sequence rejection: the mismatched sequences leave the mask
        ok = ok and kept < total
    if estimator == "icepop":  # the spiked token is outside the band: weight 0, kept in the mask
        ok = ok and weights is not None and float(weights[1, 1]) == 0.0 and kept == total
    info = {"loss_mode": actor.policy_loss.loss_mode, "tokens_kept": kept, "tokens": total, "step_loss": loss,
            "grad_norm": gn, "max_weight_change": moved}
    if weights is not None:
        w = weights[mask.bool()]
        info["is_weight_min_max"] = [float(w.min()), float(w.max())]
    if "actor/rais_gamma_mean" in m:
        info["rais_gamma_mean"] = _values(m["actor/rais_gamma_mean"])
    return ok, info


def check_router_replay_on_fsdp(ctx: Ctx) -> tuple[bool, dict]:
    """r2 and r3 on the FSDP preset: verl 0.9.1's FSDP engine has no router replay (megatron and veomni only), so the
    spec is refused (one ConfigError naming the megatron engine), never run as plain PPO."""
    from harness.errors import ConfigError

    info = {}
    for name in ("r2", "r3"):
        try:
            spec(name, ctx.model_dir)
            info[name] = "accepted"
        except ConfigError as exc:
            info[name] = f"refused: {exc}"
    return all(v.startswith("refused") and "megatron" in v for v in info.values()), info


def check_save_reload(ctx: Ctx) -> tuple[bool, dict]:
    """verl's checkpoint manager: save, train one step (the weights move), load: log-probs bitwise as saved."""
    import torch

    path = str(ctx.work / "ckpt" / "global_step_1")
    at_save = engine_logprobs(ctx.engine, ctx.td)
    opt_at_save = {k: v.clone() for k, v in _opt_state(ctx.engine).items()}
    ctx.engine.save_checkpoint(path, global_step=1)
    train_step(ctx, "tis", num_mini_batch=1)
    moved = engine_logprobs(ctx.engine, ctx.td)
    ctx.engine.load_checkpoint(path, del_local_after_load=False)
    reloaded = engine_logprobs(ctx.engine, ctx.td)
    opt = _opt_state(ctx.engine)
    opt_equal = set(opt) == set(opt_at_save) and all(torch.equal(opt[k], opt_at_save[k]) for k in opt)
    changed = float((moved - at_save).abs().max())
    equal = torch.equal(reloaded, at_save)
    return equal and opt_equal and changed > 0 and len(opt) > 0, {
        "bitwise_equal": equal, "max_abs_diff_after_reload": float((reloaded - at_save).abs().max()),
        "optimizer_state_equal": opt_equal, "n_optimizer_tensors": len(opt),
        "max_change_by_the_step_in_between": changed, "files": sorted(os.listdir(path))}


def _opt_state(engine) -> dict:
    out = {}
    for i, st in enumerate(engine.optimizer.state.values()):
        for k, v in st.items():
            if hasattr(v, "full_tensor"):
                v = v.full_tensor()
            if hasattr(v, "detach"):
                out[f"{i}.{k}"] = v.detach().float().cpu()
    return out


def check_memory(ctx: Ctx) -> tuple[bool, dict]:
    """Measured peak beside --plan's per-GPU update peak for the same shape (informative: no bound checked)."""
    import resource

    import torch

    from harness.backends.verl.memory import plan

    p = plan(spec("tis", ctx.model_dir))
    model_part = p.weights + p.grads + p.optimizer + p.activations + p.logits + p.fsdp_gathered
    info = {"plan_update_peak_gb": round(p.update_peak, 4), "plan_without_overhead_gb": model_part,
            "plan_params": p.params_total}
    if ctx.device == "cuda":
        info["measured_max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
        info["measured_max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
    else:
        info["measured_max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    n_params = sum(v.numel() for v in full_params(ctx.engine).values())
    info["engine_params"] = n_params
    return n_params == p.params_total, info


CHECKS = [("logprob", check_logprob), ("tis_step", check_tis_step), ("rais_gamma", check_rais_gamma),
          ("gmpo_rs_micro", check_gmpo_rs_micro),
          *[(f"step_{e}", partial(check_estimator_step, estimator=e)) for e in ENGINE_ESTIMATORS],
          ("router_replay_fsdp", check_router_replay_on_fsdp), ("save_reload", check_save_reload),
          ("memory", check_memory)]


# ---------------------------------------------------------------- main
def init_process_group(device: str, work: Path) -> None:
    """torchrun's env:// rendezvous (or a one-process file store when run as plain python); nccl on CUDA."""
    import torch
    import torch.distributed as dist

    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if "RANK" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, init_method=f"file://{work}/pg", rank=0, world_size=1)
    if dist.get_world_size() != 1:
        raise SystemExit("gpu_engine_check runs on one process: torchrun --nproc_per_node=1")


def run(device: str, work: Path, only: list[str] | None) -> list[dict]:
    results = []
    t0 = time.time()
    ctx = Ctx(device, work)
    print(f"# engine {type(ctx.engine).__name__} ({type(ctx.engine.module).__name__}), built in "
          f"{time.time() - t0:.1f} s on {device}", flush=True)
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        t = time.time()
        try:
            ok, info = fn(ctx)
            status = "ok" if ok else "FAIL"
        except Exception as exc:  # noqa: BLE001  (a check that raises fails; the others still run)
            import traceback

            traceback.print_exc()
            status, info = "FAIL", {"error": f"{type(exc).__name__}: {exc}"}
        info["seconds"] = round(time.time() - t, 2)
        results.append({"check": name, "status": status, **info})
        print(f"CHECK {name}: {status} ({json.dumps(info, default=str)})", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if available")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--work", help="folder for the tiny checkpoint and verl's checkpoint (default: a temp dir)")
    ap.add_argument("--checks", help=f"comma-separated subset of {','.join(n for n, _ in CHECKS)}")
    ap.add_argument("--stub-ray", action="store_true",
                    help=f"stub {', '.join(STUBBED)} even where installed (as on a GPU machine without them)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: the checkpoint is written here
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    stubbed = install_stubs(args.stub_ray)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    with contextlib.ExitStack() as stack:
        work = Path(args.work) if args.work else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        work.mkdir(parents=True, exist_ok=True)
        init_process_group(device, work)
        import verl  # noqa: F401  (after the stub)

        patched = patch_verl_for_cpu() if device == "cpu" else []
        stubbed = [n for n in stubbed if getattr(sys.modules.get(n), "HARNESS_STUB", True)]  # (not imported: kept)
        print(f"# verl {verl.__version__}, torch {torch.__version__}, stubbed: {stubbed}, CPU stand-ins: {patched}",
              flush=True)
        results = run(device, work, args.checks.split(",") if args.checks else None)
        import torch.distributed as dist

        dist.destroy_process_group()
    if args.out:
        Path(args.out).write_text(json.dumps({"device": device, "stubbed": stubbed, "cpu_stand_ins": patched,
                                              "checks": results}, indent=1, default=str))
    failed = [r["check"] for r in results if r["status"] == "FAIL"]
    print(f"# {len(results) - len(failed)}/{len(results)} checks ok" + (f"; FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""A spec's identity: which of its keys say *what a run computes*, hashed into its signature (issue 32).

Every rule lives in this one table, applied to the spec as a plain mapping (``signature(spec, defaults)``):

1. **Not identity** (``NON_IDENTITY``): where and how a run is executed or logged (``tracking``, ``launcher``,
   ``out_dir``) and where it can resume (``trainer.checkpoint_every``), what a finished run keeps
   (``verl.keep_checkpoint``).
2. **Read only when another key says so** (``READ_WHEN``): ``inference.kl_gain`` is read by KL-held runs
   (``inference.kl_target`` > 0) only.
3. **A backend's own section** (``harness.backends.sections``: verl's ``verl``) is read only by that backend's runs.
4. **Frozen keys** (``FROZEN``): the keys the spec had when runs were first stored always enter, set or not.
5. **Dora's rule** for every other key: it enters only when its value differs from its default (the schema's,
   ``harness.spec.schema.defaults``; null for an estimator parameter or a key the schema no longer has). Adding a
   key, or an estimator with its parameters, leaves every stored signature where it was.
6. **Markers** a backend adds (``Backend.identity``): the local engines' numerics version and the meaning of keys
   whose computation changed (harness/backends/local/identity.py).

The signature is the first ``length`` hex digits of the SHA-256 of the remaining mapping as sorted JSON.
``tests/test_golden.py`` pins the signatures stored runs carry: nothing stored becomes unreachable.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

from harness import backends

#: keys that describe where/how a run is executed, logged or resumed, not what it computes (section or dotted key)
NON_IDENTITY = ("tracking", "launcher", "out_dir", "trainer.checkpoint_every", "verl.keep_checkpoint")
#: a key read only when a predicate of the spec holds (else it does not enter)
READ_WHEN: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "inference.kl_gain": lambda spec: (spec.get("inference") or {}).get("kl_target", 0.0) > 0,
}
#: the estimator parameters every serialized spec carries (null when unused) since before the estimator registry,
#: in the order ``EstimatorConfig`` declares them
LEGACY_ESTIMATOR_PARAMS = ("n", "clip_c", "level", "alpha", "beta", "gamma_min")
_TRAINER = ("steps", "prompts_per_step", "group_size", "lr", "clip_eps", "num_minibatches", "ppo_epochs",
            "max_grad_norm", "weight_decay", "entropy_coef")
_INFERENCE = ("dtype", "deterministic", "batch_variance", "temperature", "top_k", "logprobs_mode",
              "router_noise_sigma", "logit_noise_sigma", "bias_delta", "bias_threshold")
_MODEL = ("name", "kind", "d_model", "n_layers", "n_heads", "n_experts", "top_k", "d_expert", "d_ff", "rope_theta",
          "norm_eps", "init_std", "path")
_VERL = ("strategy", "trainer", "rollout", "nnodes", "gpus_per_node", "gpu_memory_gb", "dual_clip_c", "val_every",
         "experimental_rais", "chat_template_kwargs", "extra_overrides")
_VERL_PARALLEL = ("tp", "pp", "cp", "ep", "etp", "param_offload", "optimizer_offload", "gradient_checkpointing",
                  "recompute", "recompute_num_layers", "cpu_adam", "use_remove_padding", "micro_batch_per_gpu",
                  "use_dynamic_bsz", "max_token_len_per_gpu", "rollout_tp", "rollout_ep", "gpu_memory_utilization")
_VERL_DATA = ("root", "train_files", "val_files", "max_prompt_length", "max_response_length", "reward")
_VERL_ARCH = ("vocab_size", "n_kv_heads", "head_dim", "tie_embeddings")
#: the keys of the spec when runs were first stored (frozen: never add to it; a new key follows Dora's rule)
FROZEN: frozenset[str] = frozenset(
    ["seed", "estimator.name", *(f"estimator.{k}" for k in LEGACY_ESTIMATOR_PARAMS),
     *(f"model.{k}" for k in _MODEL),
     "task.name", "task.length", "task.reward",
     *(f"task.warmstart.{k}" for k in ("target_reward", "max_steps", "lr", "batch_size", "eval_every")),
     "backend.name", "backend.device", "backend.threads",
     *(f"inference.{k}" for k in _INFERENCE), *(f"trainer.{k}" for k in _TRAINER),
     "diagnostics.noise_passes", "diagnostics.noise_sequences",
     *(f"verl.{k}" for k in _VERL), *(f"verl.parallel.{k}" for k in _VERL_PARALLEL),
     *(f"verl.data.{k}" for k in _VERL_DATA), *(f"verl.arch.{k}" for k in _VERL_ARCH)])


def _is_section(value: Any, default: Any) -> bool:
    """A section of the schema (recursed into): a mapping whose default is a non-empty mapping; a mapping-valued key
    (``verl.chat_template_kwargs``, default ``{}``) is one value."""
    return isinstance(value, Mapping) and isinstance(default, Mapping) and len(default) > 0


def _default(path: str, defaults: Mapping[str, Any]) -> Any:
    node: Any = defaults
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _filter(node: Mapping[str, Any], path: str, spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict:
    out = {}
    for key, value in node.items():
        dotted = f"{path}.{key}" if path else key
        if dotted in NON_IDENTITY or (dotted in READ_WHEN and not READ_WHEN[dotted](spec)):
            continue
        if _is_section(value, _default(dotted, defaults)):
            out[key] = _filter(value, dotted, spec, defaults)
        elif dotted in FROZEN or value != _default(dotted, defaults):
            out[key] = value
    return out


def identity(spec: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """What of ``spec`` is hashed: the rules of this module's docstring applied in order."""
    backend = (spec.get("backend") or {}).get("name", "local")
    foreign = {section for owner, section, _ in backends.sections() if owner != backend}
    out = _filter({k: v for k, v in spec.items() if k not in foreign}, "", spec, defaults)
    if backend in backends.names():
        markers = backends.get(backend).identity
        out.update(markers(spec) if markers else {})
    return out


def signature(spec: Mapping[str, Any], defaults: Mapping[str, Any], length: int = 10) -> str:
    """The first ``length`` hex digits of the SHA-256 of ``identity(spec, defaults)`` as sorted, compact JSON."""
    blob = json.dumps(identity(spec, defaults), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]

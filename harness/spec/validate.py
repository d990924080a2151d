"""Every check of a spec, before anything runs (issue 32): one function per section, then the checks that join
sections. A bad value raises :class:`ConfigError` naming the key and what is allowed; the command-line entry points
turn it into one line and exit status 2. An estimator checks its own parameters (its ``Params``), a backend its own
keys (``Backend.validate``).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from harness import backends, estimators, tasks
from harness.errors import one_of as _one_of, require as _require
from harness.spec.schema import DTYPES, RunConfig, from_dict, perturbations_on

#: Upper bounds where a value can hang a run or exhaust memory (a typo such as ``estimator.n=1e9`` is
#: refused before anything runs; an estimator bounds its own parameters, e.g. mean_n's n). Each is far above
#: what the experiments use (300 steps, 128 sequences per local step, 512 per verl step); raise one here if a
#: study needs more.
LIMITS = {
    "trainer.steps": 100_000,
    "trainer.prompts_per_step": 8192,
    "trainer.group_size": 1024,
    "trainer.ppo_epochs": 100,
    "batch": 65_536,  # prompts_per_step * group_size sequences per step
    "diagnostics.noise_passes": 64,
    "diagnostics.noise_sequences": 65_536,
    "task.warmstart.max_steps": 100_000,
    "task.warmstart.batch_size": 65_536,
    "model.d_model": 65_536, "model.n_layers": 1024, "model.n_heads": 1024, "model.n_experts": 4096,
    "model.d_expert": 262_144,
    "backend.threads": 1024,
}
#: Seed policy: an integer in [0, 2**31) (what every RNG of the stack accepts; negative seeds are refused).
SEED_MAX = 2**31
NAME_MAX = 200  # bytes (UTF-8): a file name is at most 255 bytes on most file systems, and a folder is made of it
#: characters a name may not hold: control characters (a new line in a folder name) and the bidirectional
#: controls that make a name display as another (U+202E shows "exe.txt" for "txt.exe")
UNSAFE_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _at_most(value: int, key: str) -> None:
    _require(value <= LIMITS[key], key, f"must be <= {LIMITS[key]} (harness.spec.validate.LIMITS), got {value}")


def safe_name(value: Optional[str], key: str, required: bool = True) -> None:
    """A name that becomes a path component (``runs/<experiment>/``, a sweep's ``runs/sweeps/<name>/``): not empty,
    no ``/``, ``\\``, control or bidirectional-control character, not ``.``/``..``, no leading/trailing blanks, at
    most NAME_MAX bytes in UTF-8; spaces inside are fine."""
    if value is None:
        _require(not required, key, "must be set")
        return
    bad = [c for c in ("/", "\\") if c in value]
    size = len(value.encode("utf-8", "surrogatepass"))
    _require(bool(value.strip()) and value == value.strip() and not bad and value not in (".", "..")
             and not UNSAFE_CHARS.search(value) and size <= NAME_MAX, key,
             f"must be a plain name (a folder name: no '/', '\\', control or bidirectional characters, '.' or '..', "
             f"no leading/trailing blanks, <= {NAME_MAX} bytes in UTF-8; this one has {size}), got {value!r}")


# ------------------------------------------------------------------------------------ sections
def run_keys(cfg: RunConfig) -> None:
    _require(0 <= cfg.seed < SEED_MAX, "seed", f"must be an integer in [0, 2**31), got {cfg.seed}")
    safe_name(cfg.tracking.experiment, "tracking.experiment")
    safe_name(cfg.tracking.run_name, "tracking.run_name", required=False)


def estimator(cfg: RunConfig) -> None:
    """The name is registered; the estimator's ``Params`` check its own parameters and refuse the others."""
    e = cfg.estimator
    _one_of(e.name, estimators.NAMES, "estimator")
    e.params  # its Params: its own knobs parsed, the others refused, its checks


def model(cfg: RunConfig) -> None:
    m = cfg.model
    _one_of(m.kind, ("moe", "dense"), "model.kind")
    for k in ("d_model", "n_layers", "n_heads", "n_experts", "top_k", "d_expert"):
        _require(getattr(m, k) >= 1, f"model.{k}", f"must be >= 1, got {getattr(m, k)}")
    _require(m.d_model % m.n_heads == 0 and (m.d_model // m.n_heads) % 2 == 0, "model.n_heads",
             f"d_model/n_heads must be an even integer (RoPE), got {m.d_model}/{m.n_heads}")
    _require(m.top_k <= m.n_experts, "model.top_k", f"must be <= n_experts={m.n_experts}, got {m.top_k}")
    for k in ("d_model", "n_layers", "n_heads", "n_experts", "d_expert"):
        _at_most(getattr(m, k), f"model.{k}")


def task(cfg: RunConfig) -> None:
    t, ws = cfg.task, cfg.task.warmstart
    _one_of(t.name, tasks.names(), "task")  # the registered tasks (harness/tasks/); each backend checks its own
    _one_of(t.reward, ("partial", "exact"), "task.reward")
    _require(1 <= t.length <= 12, "task.length", f"must be in [1, 12], got {t.length}")
    _require(0 <= ws.target_reward < 1, "task.warmstart.target_reward", "must be in [0, 1)")
    for k in ("max_steps", "batch_size", "eval_every"):
        least = 0 if k == "max_steps" else 1
        _require(getattr(ws, k) >= least, f"task.warmstart.{k}", f"must be >= {least}, got {getattr(ws, k)}")
    _at_most(ws.max_steps, "task.warmstart.max_steps")
    _at_most(ws.batch_size, "task.warmstart.batch_size")
    _require(ws.lr > 0, "task.warmstart.lr", f"must be > 0, got {ws.lr}")


def backend(cfg: RunConfig) -> None:
    """The name is registered and the backend's own checks pass (harness/backends/<name>/: tasks, model, ...)."""
    b = cfg.backend
    _one_of(b.name, backends.names(), "backend")
    backends.get(b.name).validate(cfg)
    _one_of(b.device, ("cpu", "cuda", "auto"), "backend.device")
    _require(b.threads >= 1, "backend.threads", f"must be >= 1, got {b.threads}")
    _at_most(b.threads, "backend.threads")


def inference(cfg: RunConfig) -> None:
    i = cfg.inference
    _one_of(i.dtype, DTYPES, "inference.dtype")
    _one_of(i.logprobs_mode, ("processed", "raw"), "inference.logprobs_mode")
    _require(i.temperature > 0, "inference.temperature", f"must be > 0, got {i.temperature}")
    _require(0 < i.top_p <= 1, "inference.top_p", f"must be in (0, 1] (1 = off), got {i.top_p}")
    for k in ("router_noise_sigma", "logit_noise_sigma"):
        _require(getattr(i, k) >= 0, f"inference.{k}", f"must be >= 0, got {getattr(i, k)}")
    _require(i.bias_delta > 0, "inference.bias_delta", f"must be > 0, got {i.bias_delta}")
    _require(0 < i.router_noise_rate <= 1, "inference.router_noise_rate",
             f"must be a share of router rows in (0, 1] (1 = dense noise), got {i.router_noise_rate}")
    if i.router_noise_rate < 1:
        _require(i.router_noise_sigma > 0 and not i.deterministic, "inference.router_noise_rate",
                 "a sparse share (< 1) needs fresh router noise: set inference.router_noise_sigma > 0 and "
                 "inference.deterministic=false, or router_noise_rate=1")
    _require(0 <= i.prefix_cache_capacity <= 1, "inference.prefix_cache_capacity",
             f"must be a share of the batch's context tokens in [0, 1] (1 = every turn hits), "
             f"got {i.prefix_cache_capacity}")
    _one_of(i.replay_on_miss, ("recompute", "missing"), "inference.replay_on_miss")
    _require(i.kl_target >= 0, "inference.kl_target", f"must be >= 0 (0 = off), got {i.kl_target}")


def trainer(cfg: RunConfig) -> None:
    tr = cfg.trainer
    _require(tr.lr > 0, "trainer.lr", f"the learning rate must be > 0, got {tr.lr}")
    _require(tr.steps >= 1, "trainer.steps", f"must be >= 1, got {tr.steps}")
    _require(tr.group_size >= 2, "trainer.group_size", f"GRPO needs >= 2 responses per prompt, got {tr.group_size}")
    _require(tr.prompts_per_step >= 1, "trainer.prompts_per_step", f"must be >= 1, got {tr.prompts_per_step}")
    for k in ("steps", "prompts_per_step", "group_size", "ppo_epochs"):
        _at_most(getattr(tr, k), f"trainer.{k}")
    batch = tr.prompts_per_step * tr.group_size
    _require(batch <= LIMITS["batch"], "trainer.prompts_per_step",
             f"prompts_per_step * group_size must be <= {LIMITS['batch']} sequences, got {batch}")
    _require(tr.num_minibatches >= 1 and batch % tr.num_minibatches == 0, "trainer.num_minibatches",
             f"must divide the batch of {batch} sequences, got {tr.num_minibatches}")
    _require(tr.ppo_epochs >= 1, "trainer.ppo_epochs", f"must be >= 1, got {tr.ppo_epochs}")
    _require(0 < tr.clip_eps < 1, "trainer.clip_eps", f"must be in (0, 1), got {tr.clip_eps}")
    if tr.max_grad_norm is not None:
        _require(tr.max_grad_norm > 0, "trainer.max_grad_norm", f"must be > 0 or null, got {tr.max_grad_norm}")
    _require(tr.checkpoint_every >= 0, "trainer.checkpoint_every", "must be >= 0")


def diagnostics(cfg: RunConfig) -> None:
    d = cfg.diagnostics
    _require(d.noise_passes == 0 or d.noise_passes >= 2, "diagnostics.noise_passes", "must be 0 (off) or >= 2")
    _at_most(d.noise_passes, "diagnostics.noise_passes")
    _require(d.noise_sequences >= 1, "diagnostics.noise_sequences", f"must be >= 1, got {d.noise_sequences}")
    _at_most(d.noise_sequences, "diagnostics.noise_sequences")


def router(cfg: RunConfig) -> None:
    """An estimator that reads the router (rais, r3) needs a MoE model."""
    e = cfg.estimator
    if estimators.get(e.name).needs.router:
        _require(cfg.model.kind == "moe", "estimator",
                 f"{e.name} needs a router: use a moe model, not {cfg.model.name} ({cfg.model.kind})")


def kl_held(cfg: RunConfig) -> None:
    """The KL-held perturbation scales exactly one perturbation that is on in the estimator's inference engine (an
    estimator may switch knobs off: deterministic), and needs no overlap."""
    e, i = cfg.estimator, cfg.inference
    if i.kl_target > 0:
        on = [key for _, key, _ in perturbations_on(estimators.build(e).inference(i))]
        _require(len(on) == 1, "inference.kl_target", "holds the KL by scaling the one perturbation that is on "
                 "(router_noise_sigma, logit_noise_sigma or bias_delta, its value the starting level); "
                 f"{'none is' if not on else ', '.join(on) + ' are'} on in the inference engine of estimator {e.name}")
        _require(0 < i.kl_gain <= 1, "inference.kl_gain", f"must be in (0, 1], got {i.kl_gain}")
        _require(not cfg.trainer.overlap, "inference.kl_target", "needs trainer.overlap=false: with overlap, step "
                 "t+1's rollout starts before step t's KL is measured")


#: the checks in the order they run: the first failing key is the one reported
CHECKS = (estimator, run_keys, model, router, task, backend, inference, kl_held, trainer, diagnostics)


def validate(cfg: RunConfig) -> RunConfig:
    """Run every check of ``CHECKS`` on ``cfg``; ``cfg`` itself when all pass."""
    for check in CHECKS:
        check(cfg)
    return cfg


def build(data: dict[str, Any]) -> RunConfig:
    """A validated ``RunConfig`` from a plain mapping (a composed spec, a job's ``to_dict()``)."""
    return validate(from_dict(RunConfig, data))

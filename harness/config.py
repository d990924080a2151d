"""Typed run configuration: YAML spec (Hydra) -> validated dataclasses -> objects.

``load(overrides)`` composes ``experiments/`` with Hydra and turns the result into a
:class:`RunConfig`. Every check happens here, before anything runs: a bad value raises
:class:`ConfigError` naming the key and what is allowed, and the CLI exits with status 2.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from harness import backends, estimators, tasks
from harness.backends.verl.config import LATER_KEYS as VERL_LATER_KEYS, VerlConfig
from harness.errors import ConfigError  # noqa: F401  (re-exported: ``from harness.config import ConfigError``)
from harness.errors import one_of as _one_of, require as _require
from harness.uri import home, redact, resolve_tracking_uri

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "experiments"
GROUPS = ("estimator", "model", "task", "backend")
DTYPES = ("bfloat16", "float16", "float32")
#: keys that describe *where/how* a run is executed or logged, not *what* it computes
NON_IDENTITY_KEYS = ("tracking", "launcher", "out_dir")
#: the local engines' numerics version, part of every local run's signature: bump it whenever a change to
#: the local kernels changes a curve bitwise, so that runs computed by older kernels are never found as
#: "finished" for the new code, nor pooled with its runs (2: grouped expert GEMMs, seed packs, batched mean_n; 3: CPU numerics pinned, harness/numerics.py)
LOCAL_NUMERICS = 3
#: since issue 15 the local training engine applies ``inference.temperature`` to its log-probs (before, logp_rec
#: was at T = 1 whatever the sampler's T): a local spec at T != 1 computes something new, so its signature carries
#: this marker; at T = 1 nothing changed (no division) and the signature stays. verl's actor always applied T.
LOCAL_TRAIN_TEMPERATURE = "sampler"
#: the KL-held controller's rule (harness/backends/local/kl_control.py), signed by every local spec with
#: ``inference.kl_target`` > 0: 2 = the stochastic-approximation rule whose fixed point is E[k3] = K*. Version 1 (commit
#: 2b2a5d3, unsigned) held the geometric mean of k3 at K*; its runs are never found as finished by, nor pooled with,
#: runs of this rule
KL_CONTROL = 2
#: keys added after runs were stored, with their defaults: a key enters the signature only when set to another
#: value, so every spec that leaves it alone keeps the signature it was stored under
LATE_DEFAULTS: dict[str, dict[str, Any]] = {
    "inference": {"prefix_cache_capacity": 1.0, "replay_on_miss": "recompute", "top_p": 1.0, "kl_target": 0.0,
                  "kl_gain": 0.1},
    "trainer": {"overlap": False},
}


def _estimator_config() -> type:
    """``EstimatorConfig``: ``name`` plus every parameter of every registered estimator (``harness.estimators``),
    each optional (null = unset). ``validate`` requires the run's estimator's own and refuses the others."""
    params = estimators.parameters()
    extra = sorted(set(params) - set(estimators.LEGACY_PARAMS))
    cls = dataclasses.make_dataclass(
        "EstimatorConfig", [("name", str, field(default="recompute"))]
        + [(k, Optional[params[k]], field(default=None)) for k in (*estimators.LEGACY_PARAMS, *extra)])
    cls.__module__ = __name__
    cls.__doc__ = _estimator_config.__doc__
    return cls


EstimatorConfig = _estimator_config()


@dataclass
class ModelConfig:
    name: str = "moe_tiny"
    kind: str = "moe"  # moe | dense
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_experts: int = 8
    top_k: int = 4
    d_expert: int = 64  # hidden size of one expert (moe)
    d_ff: Optional[int] = None  # dense hidden size; default top_k * d_expert (equal active params)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    init_std: float = 0.02
    path: Optional[str] = None  # verl backend: HF model path / local checkpoint

    @property
    def ffn_hidden(self) -> int:
        """The dense FFN's hidden size: ``d_ff``, or ``top_k * d_expert`` (the MoE's active size)."""
        return self.d_ff or self.top_k * self.d_expert


@dataclass
class WarmStartConfig:
    target_reward: float = 0.35  # stop the supervised warm start once the sampled reward reaches this
    max_steps: int = 400
    lr: float = 3e-3
    batch_size: int = 64
    eval_every: int = 5


@dataclass
class TaskConfig:
    name: str = "sort"
    length: int = 5  # digits in the input
    reward: str = "partial"  # partial (share of correct answer digits) | exact
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)


@dataclass
class InferenceConfig:
    dtype: str = "bfloat16"
    deterministic: bool = False  # fixed expert-combine order, batch invariant
    batch_variance: bool = True  # split-K of the matmuls varies with batch composition
    temperature: float = 1.0
    top_k: int = 0  # sampler top-k, 0 = off
    top_p: float = 1.0  # sampler nucleus (after temperature and top-k, vLLM's order), 1 = off
    logprobs_mode: str = "processed"  # processed (the sampled distribution) | raw (before the sampler)
    # explicit perturbations (off by default, always logged)
    router_noise_sigma: float = 1.0  # N(0, sigma^2) on router logits before top-k, fresh per call
    logit_noise_sigma: float = 0.0  # N(0, sigma^2) on output logits, fresh per call (unbiased in logit space)
    bias_delta: float = 1.0  # scale the probability of tokens with p < bias_threshold by delta (1 = off)
    bias_threshold: float = 0.05
    # KL-held perturbation (harness/backends/local/kl_control.py): > 0 scales the one perturbation that is on, per
    # seed and step, so that the batch's train-inference k3 (mismatch/rec_k3) is held at this target along training
    kl_target: float = 0.0
    kl_gain: float = 0.1  # the controller's step: log c += kl_gain (1 - k3 / kl_target)
    # multi-turn rollouts (harness/backends/local/prefix_cache.py); in the signature only when not the default
    prefix_cache_capacity: float = 1.0  # share of a batch's context tokens the prefix cache holds between turns
    replay_on_miss: str = "recompute"  # an evicted context's routing: recompute (the refill's) | missing (-1)


#: the explicit inference perturbations: (kind, InferenceConfig key, its "off" value)
PERTURBATIONS = (("router", "router_noise_sigma", 0.0), ("logit", "logit_noise_sigma", 0.0), ("bias", "bias_delta", 1.0))


def perturbations_on(icfg: InferenceConfig) -> list[tuple[str, str, float]]:
    """(kind, key, value) of every explicit perturbation ``icfg`` switches on, in ``PERTURBATIONS`` order."""
    return [(kind, key, getattr(icfg, key)) for kind, key, off in PERTURBATIONS if getattr(icfg, key) != off]


@dataclass
class TrainerConfig:
    steps: int = 300
    prompts_per_step: int = 16
    group_size: int = 8  # responses per prompt (GRPO group)
    lr: float = 3e-4
    clip_eps: float = 0.2
    num_minibatches: int = 4  # optimiser steps per epoch over the rollout batch
    ppo_epochs: int = 1
    max_grad_norm: Optional[float] = None  # null = no clipping
    weight_decay: float = 0.0
    entropy_coef: float = 0.0
    checkpoint_every: int = 10  # steps between checkpoints (0 = none); not part of the signature
    # one-step-off overlap (local backend, harness/backends/local/overlap.py): step t+1's rollout is generated, by a
    # second process with the weights before step t's update, while step t's update runs; in the signature only if true
    overlap: bool = False


@dataclass
class DiagnosticsConfig:
    noise_passes: int = 2  # extra inference scorings for noise/var_rollout (0 = off)
    noise_sequences: int = 16  # on this many sequences of the batch


@dataclass
class BackendConfig:
    name: str = "local"
    device: str = "cpu"  # cpu | cuda | auto
    threads: int = 1  # torch threads per process (timings on 2 cores swing 20-40x with 2)


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # null = $MLFLOW_TRACKING_URI, else sqlite:///<project>/mlruns.db
    experiment: str = "default"
    run_name: Optional[str] = None


@dataclass
class RunConfig:
    seed: int = 0
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    verl: VerlConfig = field(default_factory=VerlConfig)  # only read by backend=verl
    out_dir: Optional[str] = None  # null = runs/<tracking.experiment>/<signature>

    def to_dict(self) -> dict[str, Any]:
        """The whole spec (what a job or a child process is handed: ``tracking.uri`` as given)."""
        return asdict(self)

    def public_dict(self) -> dict[str, Any]:
        """The spec as it may be shown or stored (MLflow params, ``spec.yaml``, ``--print-config``):
        ``tracking.uri`` redacted (``harness.uri.redact``: no password of the store)."""
        data = self.to_dict()
        data["tracking"]["uri"] = redact(data["tracking"]["uri"])
        return data

    @property
    def signature(self) -> str:
        return signature(self.to_dict())

    @property
    def group_signature(self) -> str:
        """The signature of the spec with the seed removed (same hashing as ``signature``): the seeds of one
        spec share it, so analysis groups replicates by it (MLflow tag ``group_sig``)."""
        return group_signature(self.to_dict())

    @property
    def tracking_uri(self) -> str:
        """``tracking.uri`` > ``$MLFLOW_TRACKING_URI`` > ``sqlite:///<home>/mlruns.db`` (``harness/uri.py``)."""
        return resolve_tracking_uri(self.tracking.uri)

    @property
    def run_dir(self) -> Path:
        """``out_dir``, or ``<home>/runs/<experiment>/<signature>`` (``harness.uri.home``): the same spec logged to two
        MLflow experiments is two runs (each experiment holds all of its runs), the same spec in one experiment is one run."""
        return Path(self.out_dir) if self.out_dir else home() / "runs" / self.tracking.experiment / self.signature


def signature(spec: dict[str, Any], length: int = 10) -> str:
    """Short hash of the resolved spec without the keys that do not change what is computed
    (and without the verl section for runs of another backend: its knobs are not read there).

    The ``estimator`` section keeps ``name`` and the six parameters of the original estimators
    (``harness.estimators.LEGACY_PARAMS``: n, clip_c, level, alpha, beta, gamma_min; null when unused), as
    every stored run was signed; a parameter registered later enters the signature only when set (not null),
    so adding an estimator never changes the signature of an existing spec. Likewise a key in ``LATE_DEFAULTS``
    (added after runs were stored) enters it only when set to another value than its default, and a verl key
    added later (``harness.backends.verl.config.LATER_KEYS``, e.g. ``verl.tools``) only when set (not null). A local
    spec at ``inference.temperature`` != 1 also signs ``LOCAL_TRAIN_TEMPERATURE`` (its training log-probs changed)."""
    ident = {k: v for k, v in spec.items() if k not in NON_IDENTITY_KEYS}
    if isinstance(ident.get("estimator"), dict):
        ident["estimator"] = {k: v for k, v in ident["estimator"].items()
                              if v is not None or k == "name" or k in estimators.LEGACY_PARAMS}
    if (spec.get("backend") or {}).get("name") != "verl":
        ident.pop("verl", None)
        ident["local_numerics"] = LOCAL_NUMERICS
        if (ident.get("inference") or {}).get("temperature", 1.0) != 1.0:
            ident["train_temperature"] = LOCAL_TRAIN_TEMPERATURE
        if (ident.get("inference") or {}).get("kl_target", 0.0) > 0:
            ident["kl_control"] = KL_CONTROL
    elif isinstance(ident.get("verl"), dict):  # a verl key added later enters only when set
        ident["verl"] = {k: v for k, v in ident["verl"].items() if v is not None or k not in VERL_LATER_KEYS}
    for section, defaults in LATE_DEFAULTS.items():
        if isinstance(ident.get(section), dict):
            ident[section] = {k: v for k, v in ident[section].items() if k not in defaults or v != defaults[k]}
    inf = ident.get("inference")
    if isinstance(inf, dict) and not inf.get("kl_target", 0.0) > 0:  # the controller's gain is read by held runs only
        inf.pop("kl_gain", None)
    if isinstance(ident.get("trainer"), dict):  # where a run can resume, not what it computes
        ident["trainer"] = {k: v for k, v in ident["trainer"].items() if k != "checkpoint_every"}
    blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def group_signature(spec: dict[str, Any], length: int = 10) -> str:
    """``signature`` of the spec without its ``seed``: one value per group of seed replicates."""
    return signature({k: v for k, v in spec.items() if k != "seed"}, length)


# ----------------------------------------------------------------------------------- building
def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], key)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}")
        return from_dict(tp, value, key)
    if value is None:
        raise ConfigError(key, "must not be null")
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(key, f"unknown key; allowed: {', '.join(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)


# --------------------------------------------------------------------------------- validation
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
NAME_MAX = 200


def _at_most(value: int, key: str) -> None:
    _require(value <= LIMITS[key], key, f"must be <= {LIMITS[key]} (harness.config.LIMITS), got {value}")


def safe_name(value: Optional[str], key: str, required: bool = True) -> None:
    """A name that becomes a path component (``runs/<experiment>/``, a sweep's ``runs/sweeps/<name>/``): not empty,
    no ``/``, ``\\`` or NUL, not ``.``/``..``, no leading/trailing blanks, at most NAME_MAX characters;
    spaces inside are fine."""
    if value is None:
        _require(not required, key, "must be set")
        return
    bad = [c for c in ("/", "\\", "\0") if c in value]
    _require(bool(value.strip()) and value == value.strip() and not bad and value not in (".", "..")
             and len(value) <= NAME_MAX, key,
             f"must be a plain name (a folder name: no '/', '\\', NUL, '.' or '..', no leading/trailing blanks, "
             f"<= {NAME_MAX} characters), got {value!r}")


def validate(cfg: RunConfig) -> RunConfig:
    e = cfg.estimator
    _one_of(e.name, estimators.NAMES, "estimator")
    estimator = estimators.get(e.name)
    estimator.parse(e)  # its parameters: its own required, the others unset, then its own checks
    _require(0 <= cfg.seed < SEED_MAX, "seed", f"must be an integer in [0, 2**31), got {cfg.seed}")
    safe_name(cfg.tracking.experiment, "tracking.experiment")
    safe_name(cfg.tracking.run_name, "tracking.run_name", required=False)

    m = cfg.model
    _one_of(m.kind, ("moe", "dense"), "model.kind")
    if estimator.needs.router:
        _require(m.kind == "moe", "estimator", f"{e.name} needs a router: use a moe model, not {m.name} ({m.kind})")
    for k in ("d_model", "n_layers", "n_heads", "n_experts", "top_k", "d_expert"):
        _require(getattr(m, k) >= 1, f"model.{k}", f"must be >= 1, got {getattr(m, k)}")
    _require(m.d_model % m.n_heads == 0 and (m.d_model // m.n_heads) % 2 == 0, "model.n_heads",
             f"d_model/n_heads must be an even integer (RoPE), got {m.d_model}/{m.n_heads}")
    _require(m.top_k <= m.n_experts, "model.top_k", f"must be <= n_experts={m.n_experts}, got {m.top_k}")
    for k in ("d_model", "n_layers", "n_heads", "n_experts", "d_expert"):
        _at_most(getattr(m, k), f"model.{k}")

    t = cfg.task
    _one_of(t.name, tasks.names(), "task")  # the registered tasks (harness/tasks/); each backend checks its own
    _one_of(t.reward, ("partial", "exact"), "task.reward")
    _require(1 <= t.length <= 12, "task.length", f"must be in [1, 12], got {t.length}")
    _require(0 <= t.warmstart.target_reward < 1, "task.warmstart.target_reward", "must be in [0, 1)")
    ws = t.warmstart
    for k in ("max_steps", "batch_size", "eval_every"):
        _require(getattr(ws, k) >= (0 if k == "max_steps" else 1), f"task.warmstart.{k}",
                 f"must be >= {0 if k == 'max_steps' else 1}, got {getattr(ws, k)}")
    _at_most(ws.max_steps, "task.warmstart.max_steps")
    _at_most(ws.batch_size, "task.warmstart.batch_size")
    _require(ws.lr > 0, "task.warmstart.lr", f"must be > 0, got {ws.lr}")

    b = cfg.backend
    _one_of(b.name, backends.names(), "backend")
    backends.get(b.name).validate(cfg)  # the backend's own checks (harness/backends/<name>/: tasks, model, ...)
    _one_of(b.device, ("cpu", "cuda", "auto"), "backend.device")
    _require(b.threads >= 1, "backend.threads", f"must be >= 1, got {b.threads}")
    _at_most(b.threads, "backend.threads")

    i = cfg.inference
    _one_of(i.dtype, DTYPES, "inference.dtype")
    _one_of(i.logprobs_mode, ("processed", "raw"), "inference.logprobs_mode")
    _require(i.temperature > 0, "inference.temperature", f"must be > 0, got {i.temperature}")
    _require(0 < i.top_p <= 1, "inference.top_p", f"must be in (0, 1] (1 = off), got {i.top_p}")
    for k in ("router_noise_sigma", "logit_noise_sigma"):
        _require(getattr(i, k) >= 0, f"inference.{k}", f"must be >= 0, got {getattr(i, k)}")
    _require(i.bias_delta > 0, "inference.bias_delta", f"must be > 0, got {i.bias_delta}")
    _require(0 <= i.prefix_cache_capacity <= 1, "inference.prefix_cache_capacity",
             f"must be a share of the batch's context tokens in [0, 1] (1 = every turn hits), "
             f"got {i.prefix_cache_capacity}")
    _one_of(i.replay_on_miss, ("recompute", "missing"), "inference.replay_on_miss")
    _require(i.kl_target >= 0, "inference.kl_target", f"must be >= 0 (0 = off), got {i.kl_target}")
    if i.kl_target > 0:  # the perturbation the engine runs: an estimator may switch knobs off (deterministic)
        on = [key for _, key, _ in perturbations_on(estimators.build(e).inference(i))]
        _require(len(on) == 1, "inference.kl_target", "holds the KL by scaling the one perturbation that is on "
                 "(router_noise_sigma, logit_noise_sigma or bias_delta, its value the starting level); "
                 f"{'none is' if not on else ', '.join(on) + ' are'} on in the inference engine of estimator {e.name}")
        _require(0 < i.kl_gain <= 1, "inference.kl_gain", f"must be in (0, 1], got {i.kl_gain}")
        _require(not cfg.trainer.overlap, "inference.kl_target", "needs trainer.overlap=false: with overlap, step "
                 "t+1's rollout starts before step t's KL is measured")

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
    _require(cfg.diagnostics.noise_passes in (0,) or cfg.diagnostics.noise_passes >= 2,
             "diagnostics.noise_passes", "must be 0 (off) or >= 2")
    _at_most(cfg.diagnostics.noise_passes, "diagnostics.noise_passes")
    _require(cfg.diagnostics.noise_sequences >= 1, "diagnostics.noise_sequences",
             f"must be >= 1, got {cfg.diagnostics.noise_sequences}")
    _at_most(cfg.diagnostics.noise_sequences, "diagnostics.noise_sequences")
    return cfg


def build(data: dict[str, Any]) -> RunConfig:
    return validate(from_dict(RunConfig, data))


# ---------------------------------------------------------------------------------- composing
def group_options(group: str, config_dir: Path = EXPERIMENTS) -> list[str]:
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))


def compose(overrides: list[str], config_name: str = "config", config_dir: Path = EXPERIMENTS) -> dict[str, Any]:
    """Hydra composition of ``experiments/<config_name>.yaml`` with command-line overrides."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    for ov in overrides:
        key, sep, value = ov.lstrip("+~").partition("=")
        if sep and key in GROUPS:
            options = group_options(key, config_dir)
            if value not in options:
                raise ConfigError(key, f"unknown value {value!r}; allowed: {', '.join(options)}")
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        msg = str(exc).splitlines()[0]
        named = [k for k in (ov.split("=")[0].lstrip("+~") for ov in overrides) if f"'{k}'" in msg or k in msg]
        key = getattr(exc, "full_key", None) or max(named, key=len, default=None) or "spec"  # the most specific
        if msg.startswith("Could not override") and key != "spec":
            msg = _unknown_key(str(key), overrides, config_name, config_dir) or msg
        if "LexerNoViableAlt" in msg or "token recognition error" in msg:  # Hydra's grammar: unquoted unicode etc.
            bad = next((ov for ov in overrides if ov.split("=")[0].lstrip("+~") == key), None)
            value = bad.partition("=")[2] if bad else "..."
            msg = (f"Hydra cannot parse the value {value!r} unquoted (non-ASCII letters and some symbols need "
                   f"quotes): quote it, \"{key}='{value}'\" on a shell command line")
        raise ConfigError(str(key), msg) from None
    return OmegaConf.to_container(cfg, resolve=True)


def _unknown_key(key: str, overrides: list[str], config_name: str, config_dir: Path) -> str | None:
    """What to say of an override of a key the spec does not have: the keys its section has (an estimator's
    section: its parameters, and which estimators take this one). None when the spec without it fails too."""
    try:
        spec = compose([ov for ov in overrides if ov.split("=")[0].lstrip("+~") != key], config_name, config_dir)
    except ConfigError:
        return None
    parent, _, leaf = key.rpartition(".")
    node: Any = spec
    for part in parent.split(".") if parent else ():
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return f"unknown key: the spec has no section {parent!r}"
    if parent == "estimator":
        name = node.get("name")
        own = [k for k in node if k != "name"]
        takers = [n for n in estimators.NAMES
                  if any(f.name == leaf for f in dataclasses.fields(estimators.get(n).Params))]
        return (f"not a parameter of {name} (its parameters: {', '.join(own) or 'none'})"
                + (f"; {leaf} is a parameter of {', '.join(takers)}" if takers else ""))
    return f"unknown key; {parent or 'the spec'} has: {', '.join(sorted(node))}"


def load(overrides: list[str], config_name: str = "config") -> RunConfig:
    return build(compose(overrides, config_name))

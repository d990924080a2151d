"""The spec's schema: typed dataclasses that hold the only defaults of a run (issue 32).

``RunConfig()`` is the default spec: ``experiments/config.yaml`` lists the groups it composes and changes nothing
else, and ``tests/spec/test_schema.py`` checks that ``RunConfig()`` equals the composed default. A section a backend
contributes (verl's ``verl:``) comes from the backend registry (``harness.backends.sections``): this module imports
no backend. ``from_dict`` builds the typed spec from a plain mapping, refusing unknown keys and wrong types with a
:class:`ConfigError` naming the key.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from harness import backends, estimators
from harness.errors import ConfigError
from harness.spec import identity
from harness.uri import home, redact, resolve_tracking_uri

DTYPES = ("bfloat16", "float16", "float32")


class _EstimatorSection:
    """The behaviour of ``EstimatorConfig``: the run's estimator's unset knobs take their ``Params`` defaults when the
    section is built, and ``params`` is that estimator's ``Params`` (one parser, ``Estimator.parse``; not memoized:
    the section stays a plain dataclass whose ``vars`` are its keys)."""

    def __post_init__(self) -> None:
        if self.name in estimators.REGISTRY:
            for k, v in estimators.get(self.name).defaults().items():
                if getattr(self, k) is None:
                    setattr(self, k, v)

    @property
    def params(self) -> "estimators.Params":
        """The estimator's own ``Params`` (``Estimator.parse``: its knobs, the others refused, its ``validate``)."""
        return estimators.get(self.name).parse(self)


def _estimator_config() -> type:
    """``EstimatorConfig``: ``name`` plus every parameter of every registered estimator (``harness.estimators``),
    each optional (null = unset, the flat layout every stored spec has). The run's estimator's knobs take the
    defaults its ``Params`` declare (their one home), ``params`` parses them once, and the others must stay unset;
    the types and checks are the ``Params``'."""
    params = estimators.parameters()
    legacy = [k for k in identity.LEGACY_ESTIMATOR_PARAMS if k in params]
    extra = sorted(set(params) - set(legacy))
    cls = dataclasses.make_dataclass(
        "EstimatorConfig", [("name", str, field(default="recompute"))]
        + [(k, Optional[params[k]], field(default=None)) for k in (*legacy, *extra)], bases=(_EstimatorSection,))
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
    # explicit perturbations (always logged as params and tags). Calibrated default (issue 6, docs/results.md):
    # router-logit noise of sigma 1.0 before top-k. The natural engine (bf16 + random-order expert sums + split-K)
    # gives the MoE only ~1.5x the dense twin's scoring variance; this knob stands in for the hidden-state noise a
    # 94-layer MoE carries into its routers.
    router_noise_sigma: float = 1.0  # N(0, sigma^2) on router logits before top-k, fresh per call
    # the share of (token, layer) router rows the router noise hits, drawn fresh per call (1 = every row: dense);
    # < 1 with a large sigma: sparse, heavy-tailed deviations (rare routing flips), issue 31's noise model
    router_noise_rate: float = 1.0
    logit_noise_sigma: float = 0.0  # N(0, sigma^2) on output logits, fresh per call (unbiased in logit space)
    bias_delta: float = 1.0  # scale the probability of tokens with p < bias_threshold by delta (1 = off)
    bias_threshold: float = 0.05
    # KL-held perturbation (harness/backends/local/kl_control.py): > 0 scales the one perturbation that is on, per
    # seed and step, so that the batch's train-inference k3 (mismatch/rec_k3) is held at this target along training
    kl_target: float = 0.0
    kl_gain: float = 0.1  # the controller's step: log c += kl_gain (1 - k3 / kl_target)
    # multi-turn rollouts (harness/backends/local/prefix_cache.py): the share of a batch's context tokens the prefix
    # cache holds between turns (LRU; 1 = every turn hits); an evicted context is re-prefilled and its routing is the
    # refill's (recompute) or none (missing: R3 falls back to the training router). docs/engines.md
    prefix_cache_capacity: float = 1.0
    replay_on_miss: str = "recompute"  # recompute | missing


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
    # lr 3e-4: the natural engine's control is stable for every estimator here; at 1e-3 without clipping every run
    # degrades whatever the estimator (docs/science-notes.md)
    lr: float = 3e-4
    clip_eps: float = 0.2
    num_minibatches: int = 4  # optimiser steps per epoch over the rollout batch
    ppo_epochs: int = 1
    max_grad_norm: Optional[float] = None  # null = no clipping (clipping at 1.0 hides the estimators' differences)
    weight_decay: float = 0.0
    entropy_coef: float = 0.0
    # steps between checkpoints (model, optimiser, RNGs; 0 = none): a killed run resumes into the same MLflow run,
    # bit-identical; measured cost 0.6% of training time (benchmarks/checkpoint_cost.py). Not part of the signature
    checkpoint_every: int = 10
    # one-step-off overlap (local backend, harness/backends/local/overlap.py): step t+1's rollout is generated, by a
    # second process with the weights before step t's update, while step t's update runs; no seed packs
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
    # a GPU run reproducible: torch.use_deterministic_algorithms + CUBLAS_WORKSPACE_CONFIG (harness/numerics.py:
    # deterministic); its price on a GPU: docs/speed.md. A CPU run is deterministic anyway (the flag is still set)
    deterministic: bool = False


@dataclass
class TrackingConfig:
    uri: Optional[str] = None  # null = $MLFLOW_TRACKING_URI, else sqlite:///<home>/mlruns.db (harness/uri.py)
    experiment: str = "default"
    run_name: Optional[str] = None


class _RunConfigMethods:
    """What a spec can say of itself (``RunConfig``'s methods; its fields are declared below)."""

    def to_dict(self) -> dict[str, Any]:
        """The whole spec (what a job or a child process is handed: ``tracking.uri`` as given)."""
        return asdict(self)  # type: ignore[call-overload]

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
        return resolve_tracking_uri(self.tracking.uri)  # type: ignore[attr-defined]

    @property
    def run_dir(self) -> Path:
        """``out_dir``, or ``<home>/runs/<experiment>/<signature>`` (``harness.uri.home``): the same spec logged to two
        MLflow experiments is two runs (each experiment holds all of its runs), the same spec in one experiment is one run."""
        out_dir, experiment = self.out_dir, self.tracking.experiment  # type: ignore[attr-defined]
        return Path(out_dir) if out_dir else home() / "runs" / experiment / self.signature


def _run_config() -> type:
    """``RunConfig``: the core sections, then each section a backend contributes (``harness.backends.sections``:
    verl's ``verl``, read only by that backend), then ``out_dir`` (null = ``runs/<experiment>/<signature>``)."""
    core = [("seed", int, field(default=0)),
            ("estimator", EstimatorConfig, field(default_factory=EstimatorConfig)),
            ("model", ModelConfig, field(default_factory=ModelConfig)),
            ("task", TaskConfig, field(default_factory=TaskConfig)),
            ("backend", BackendConfig, field(default_factory=BackendConfig)),
            ("inference", InferenceConfig, field(default_factory=InferenceConfig)),
            ("trainer", TrainerConfig, field(default_factory=TrainerConfig)),
            ("diagnostics", DiagnosticsConfig, field(default_factory=DiagnosticsConfig)),
            ("tracking", TrackingConfig, field(default_factory=TrackingConfig))]
    contributed = [(name, cls, field(default_factory=cls)) for _, name, cls in backends.sections()]
    cls = dataclasses.make_dataclass("RunConfig", [*core, *contributed, ("out_dir", Optional[str], field(default=None))],
                                     bases=(_RunConfigMethods,))
    cls.__module__ = __name__
    cls.__doc__ = "A run's whole spec. " + (_run_config.__doc__ or "")
    return cls


RunConfig = _run_config()


@functools.lru_cache(maxsize=1)
def _defaults() -> dict[str, Any]:
    return RunConfig().to_dict()


def defaults() -> dict[str, Any]:
    """The default spec as a plain mapping (``RunConfig().to_dict()``, a fresh copy)."""
    import copy

    return copy.deepcopy(_defaults())


def signature(spec: dict[str, Any], length: int = 10) -> str:
    """The spec's identity hash (``harness.spec.identity``: its rules, against the schema's defaults)."""
    return identity.signature(spec, _defaults(), length)


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
    """``cls`` (a dataclass of this schema) from a plain mapping: missing keys take their defaults, an unknown key
    or a value of the wrong type is a ConfigError naming the key."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(key, f"unknown key; allowed: {', '.join(names)}")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in data.items()}
    return cls(**kwargs)

"""A tune spec: the ``tune:`` block of a sweep spec (search space, sampler, pruner, objective), parsed and
validated (every parameter at each end of its range builds a valid run) before anything is submitted."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from harness.launch.expand import build_run
from harness.launch.spec import SweepError, SweepSpec, hydra_value, plain_name
from harness.launch.tune.objective import Objective
from harness.launch.tune.algorithms import make_pruner, make_sampler
from harness.uri import redact


PARAM_TYPES = ("float", "int", "categorical")


@dataclass
class ParamSpec:
    key: str
    type: str = "float"
    low: Optional[float] = None
    high: Optional[float] = None
    log: bool = False
    step: Optional[float] = None
    choices: Optional[list] = None

    def suggest(self, trial) -> Any:
        if self.type == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_categorical(self.key, self.choices)

    def extremes(self) -> list[Any]:
        if self.type == "categorical":
            return list(self.choices)
        return [self.low, self.high] if self.type == "float" else [int(self.low), int(self.high)]


@dataclass
class TuneConfig:
    study: str
    storage: str  # a journal file path or an RDB URL
    n_trials: int = 24
    direction: str = "maximize"
    params: list[ParamSpec] = field(default_factory=list)
    sampler: dict = field(default_factory=lambda: {"name": "tpe", "seed": 0})
    pruner: dict = field(default_factory=lambda: {"name": "median"})
    report_every: int = 10
    objective: Objective = field(default_factory=Objective)

    def registration(self, base_signature: str, store: str) -> dict[str, Any]:
        """What the study is pre-registered with: a later call must agree on all of it. ``store``: the MLflow store
        its trials' runs are in, redacted (``harness.uri.redact``): a study against another store would name, as
        its best trial, a run that store does not hold."""
        return {"params": [asdict(p) for p in self.params], "objective": self.objective.to_dict(),
                "direction": self.direction, "base_signature": base_signature, "store": redact(store)}


TUNE_KEYS = ("study", "storage", "n_trials", "direction", "params", "sampler", "pruner", "report_every", "objective")


def parse_tune(spec: SweepSpec) -> TuneConfig:
    t = dict(spec.tune or {})
    unknown = sorted(set(t) - set(TUNE_KEYS))
    if unknown:
        raise SweepError(f"tune.{unknown[0]}: unknown key; allowed: {', '.join(TUNE_KEYS)}", key=f"tune.{unknown[0]}")
    storage = t.get("storage") or str(spec.sweep_dir / "optuna.journal")
    n = t.get("n_trials", 24)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise SweepError(f"tune.n_trials: expected an integer >= 1, got {n!r}", key="tune.n_trials")
    direction = t.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise SweepError(f"tune.direction: expected maximize or minimize, got {direction!r}", key="tune.direction")
    raw_params = t.get("params") or {}
    if not isinstance(raw_params, dict) or not raw_params:
        raise SweepError("tune.params: expected a mapping KEY: {type, low, high, log} with at least one key",
                         key="tune.params")
    params = []
    for key, p in raw_params.items():
        k = f"tune.params.{key}"
        if not isinstance(p, dict):
            raise SweepError(f"{k}: expected a mapping {{type, low, high, log}} or {{type: categorical, choices}}", key=k)
        bad = sorted(set(p) - {"type", "low", "high", "log", "step", "choices"})
        if bad:
            raise SweepError(f"{k}.{bad[0]}: unknown key; allowed: type, low, high, log, step, choices", key=f"{k}.{bad[0]}")
        ps = ParamSpec(key=key, **p)
        if ps.type not in PARAM_TYPES:
            raise SweepError(f"{k}.type: unknown type {ps.type!r}; allowed: {', '.join(PARAM_TYPES)}", key=f"{k}.type")
        if ps.type == "categorical":
            if not isinstance(ps.choices, list) or not ps.choices:
                raise SweepError(f"{k}.choices: expected a non-empty list", key=f"{k}.choices")
        else:
            for b in ("low", "high"):
                v = getattr(ps, b)
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise SweepError(f"{k}.{b}: expected a number, got {v!r}", key=f"{k}.{b}")
            if not ps.low < ps.high:
                raise SweepError(f"{k}: need low < high, got low={ps.low}, high={ps.high}", key=k)
            if ps.log and ps.low <= 0:
                raise SweepError(f"{k}.low: a log scale needs low > 0, got {ps.low}", key=f"{k}.low")
        params.append(ps)
    sampler = dict(t.get("sampler") or {"name": "tpe"})
    if sampler.get("name", "tpe") not in ("tpe", "random"):
        raise SweepError(f"tune.sampler.name: unknown sampler {sampler.get('name')!r}; allowed: tpe, random",
                         key="tune.sampler.name")
    pruner = dict(t.get("pruner") or {"name": "median"})
    if pruner.get("name", "median") not in ("median", "successive_halving", "none"):
        raise SweepError(f"tune.pruner.name: unknown pruner {pruner.get('name')!r}; allowed: median, "
                         "successive_halving, none", key="tune.pruner.name")
    try:
        make_sampler(sampler, 0)
        make_pruner(pruner)
    except TypeError as exc:
        raise SweepError(f"tune.sampler/pruner: {exc}", key="tune.pruner") from None
    every = t.get("report_every", 10)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise SweepError(f"tune.report_every: expected an integer >= 1, got {every!r}", key="tune.report_every")
    return TuneConfig(study=plain_name(t.get("study") or spec.name, "tune.study"), storage=str(storage), n_trials=n, direction=direction,
                      params=params, sampler=sampler, pruner=pruner, report_every=every,
                      objective=Objective.from_dict(t.get("objective")))


def trial_overrides(spec: SweepSpec, values: dict[str, Any]) -> list[str]:
    seed = [f"seed={spec.seeds[0]}"] if spec.seeds else []
    return list(spec.base) + seed + [f"{k}={hydra_value(v)}" for k, v in values.items()]


def store_of(spec: SweepSpec, tc: TuneConfig) -> str:
    """The MLflow store the trials log to (as given: credentials included): the sweep's rule (``build_run``)."""
    from harness.errors import ConfigError

    try:
        return build_run(spec, trial_overrides(spec, {p.key: p.extremes()[0] for p in tc.params})).tracking_uri
    except ConfigError as exc:
        raise SweepError(f"the base run is invalid, nothing submitted: {exc}", key=exc.key) from None


def validate_tune(spec: SweepSpec, tc: TuneConfig) -> str:
    """Build the base run with every parameter at each end of its range; returns the base signature."""
    from harness import backends
    from harness.errors import ConfigError

    if spec.grid or spec.variants:
        raise SweepError("grid: a tune spec searches `tune.params`; put fixed settings in base, not grid/variants",
                         key="grid")
    if spec.seeds is not None and len(spec.seeds) > 1:
        raise SweepError("seeds: a trial is one run with one seed; set one seed (seeds: [0])", key="seeds")
    lows = {p.key: p.extremes()[0] for p in tc.params}
    base_sig = None
    for p in tc.params:
        for v in p.extremes():
            values = {**lows, p.key: v}
            try:
                cfg = build_run(spec, trial_overrides(spec, values))
            except ConfigError as exc:
                raise SweepError(f"tune.params.{p.key}: the run with {p.key}={v} is invalid, nothing submitted: {exc}",
                                 key=exc.key) from None
            if base_sig is None:
                base_sig = cfg.signature
                if not backends.get(cfg.backend.name).prunable:
                    raise SweepError(f"backend: a trial reports every step to the pruner; backend={cfg.backend.name} "
                                     f"cannot (tune runs on: {', '.join(n for n in backends.names() if backends.get(n).prunable)})",
                                     key="backend")
    return base_sig or ""

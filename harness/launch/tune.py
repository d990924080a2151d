"""``python -m harness.tune SPEC.yaml [OVERRIDE ...] [--no-wait] [--report] [--timeout S]``

An Optuna study over scalar knobs of a run (TIS's C first of all), with trials as Slurm jobs (or
local worker processes). The spec is a sweep spec (``harness.launch.sweep``) whose ``base`` fixes
everything but the tuned keys, plus a ``tune:`` block::

    tune:
      study: tis_clip                # default: the spec's name
      storage: null                  # default: Optuna journal file <sweep_dir>/optuna.journal;
                                     # or an RDB URL (sqlite:///..., postgresql://...)
      n_trials: 24                   # trials per call; a second call on the same study adds as many
      direction: maximize
      params:
        estimator.clip_c: {type: float, low: 1.1, high: 20.0, log: true}
      sampler: {name: tpe, seed: 0, n_startup_trials: 6}          # or random
      pruner: {name: median, n_startup_trials: 4, n_warmup_steps: 40, interval_steps: 1}
                                     # or {name: successive_halving, min_resource: 20, reduction_factor: 3}
                                     # or {name: none}
      report_every: 10               # smoothed reward -> trial.report every K steps
      objective: {name: tail_mean, tail_frac: 0.2, window: 10}    # see Objective below
                                     # (what the pruner sees: a trailing mean over `window` steps)

Each trial is one run (its own signature and run folder, its MLflow run tagged ``optuna_study``
and ``optuna_trial``) executed by one job: the job opens the shared storage, asks for a trial
(or, after a requeue, takes back its own RUNNING trial), runs ``harness.run.execute`` with an
``on_step`` that reports the smoothed reward and asks the pruner, and tells the study the
pre-registered objective (or PRUNED). The objective, the search space and the base run are stored
in the study when it is created; a later call with a different one is refused (pre-registration).
"""
from __future__ import annotations

import json
import math
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from submitit.helpers import Checkpointable, DelayedSubmission

from analysis.config import AnalysisConfig
from analysis.measures import collapse_onset_index
from harness import curves
from harness.launch.sweep import (
    JobsDB,
    SweepError,
    SweepSpec,
    build_run,
    cli,
    hydra_value,
    load_spec,
    prepare_tracking,
    split_args,
)

USAGE = """usage: python -m harness.tune SPEC.yaml [OVERRIDE ...] [--no-wait] [--report] [--timeout S]

  SPEC.yaml     a sweep spec with a `tune:` block (sweeps/tis_clip.yaml)
  OVERRIDE      as harness.sweep, plus tune.KEY=VALUE (tune.n_trials=8, tune.study=NAME, ...)
  --no-wait     submit the trials and return at once (harness.status / --report show progress)
  --report      submit nothing: print the trials table and the best value, save the plots
  --timeout S   stop waiting after S seconds (the jobs keep running)
Exit status: 0 done, 2 invalid spec (nothing submitted), 1 submission failed or no trial completed."""

PARAM_TYPES = ("float", "int", "categorical")
_A = AnalysisConfig()


# ------------------------------------------------------------------------------------ objective
@dataclass
class Objective:
    """The pre-registered score of one trial's reward curve, ``tail_mean``: the mean smoothed reward
    (``harness.curves.smooth``, W = ``window``) over the last ``tail_frac`` of the planned steps. A run
    that collapsed (``analysis.measures.collapse_onset_index``: the report's persistent-collapse rule
    v2, with the ``collapse_*`` parameters below) is scored at its post-collapse value (the tail steps at
    or after the onset; if the onset precedes the tail, that is the tail itself). A run stopped by a
    non-finite loss scores ``diverged_score``. What a pruner sees while a trial runs cannot use the
    future: a trailing mean over ``window`` steps (:func:`trailing_mean`)."""

    name: str = "tail_mean"
    tail_frac: float = 0.2
    window: int = _A.smooth_window
    smooth: str = _A.smooth_kind  # centred | ema
    collapse_noise_z: float = _A.collapse_noise_z
    collapse_gain_frac: float = _A.collapse_gain_frac
    collapse_persist: int = _A.collapse_persist
    collapse_gap: int = _A.collapse_gap
    diverged_score: float = 0.0

    @property
    def analysis_config(self) -> AnalysisConfig:
        return AnalysisConfig(smooth_window=self.window, smooth_kind=self.smooth, collapse_noise_z=self.collapse_noise_z,
                              collapse_gain_frac=self.collapse_gain_frac, collapse_persist=self.collapse_persist,
                              collapse_gap=self.collapse_gap)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Optional[dict], key: str = "tune.objective") -> "Objective":
        from dataclasses import fields

        from analysis.config import ConfigError

        data = dict(data or {})
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise SweepError(f"{key}.{unknown[0]}: unknown key; allowed: {', '.join(names)}", key=f"{key}.{unknown[0]}")
        obj = cls(**data)
        if obj.name != "tail_mean":
            raise SweepError(f"{key}.name: unknown objective {obj.name!r}; allowed: tail_mean", key=f"{key}.name")
        if obj.smooth not in curves.SMOOTH_KINDS:
            raise SweepError(f"{key}.smooth: unknown smoothing {obj.smooth!r}; allowed: centred, ema", key=f"{key}.smooth")
        if isinstance(obj.tail_frac, bool) or not isinstance(obj.tail_frac, (int, float)) or not 0 < obj.tail_frac <= 1:
            raise SweepError(f"{key}.tail_frac: must be in (0, 1], got {obj.tail_frac!r}", key=f"{key}.tail_frac")
        for k in ("window", "collapse_persist", "collapse_gap"):
            v = getattr(obj, k)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SweepError(f"{key}.{k}: expected an integer >= 1, got {v!r}", key=f"{key}.{k}")
        try:
            obj.analysis_config
        except (ConfigError, TypeError) as exc:
            raise SweepError(f"{key}: {exc}", key=key) from None
        return obj


def trailing_mean(xs: list[float], window: int) -> float:
    part = [x for x in xs[-window:] if math.isfinite(x)]
    return sum(part) / len(part) if part else math.nan


def score(rewards: list[float], steps_planned: int, objective: Objective = Objective(),
          diverged: bool = False, losses: Optional[list[float]] = None) -> tuple[float, Optional[int]]:
    """``(value, collapse onset index)`` of one run under the pre-registered objective."""
    onset = collapse_onset_index(rewards, objective.analysis_config, losses) if len(rewards) else None
    nonfinite = any(not math.isfinite(v) for v in list(rewards) + list(losses or []))
    if diverged or nonfinite or not len(rewards):
        return float(objective.diverged_score), onset
    s = list(curves.smooth(rewards, objective.window, objective.smooth))
    tail = max(1, math.ceil(objective.tail_frac * steps_planned))
    start = max(0, steps_planned - tail)
    if onset is not None:
        start = max(start, onset)
    part = s[start:] if start < len(s) else s[-1:]
    return sum(part) / len(part), onset


# --------------------------------------------------------------------------------------- config
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

    def registration(self, base_signature: str) -> dict[str, Any]:
        """What the study is pre-registered with: a later call must agree on all of it."""
        return {"params": [asdict(p) for p in self.params], "objective": self.objective.to_dict(),
                "direction": self.direction, "base_signature": base_signature}


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
    return TuneConfig(study=str(t.get("study") or spec.name), storage=str(storage), n_trials=n, direction=direction,
                      params=params, sampler=sampler, pruner=pruner, report_every=every,
                      objective=Objective.from_dict(t.get("objective")))


def make_sampler(cfg: dict, slot: int):
    import optuna

    cfg = dict(cfg)
    name = cfg.pop("name", "tpe")
    seed = cfg.pop("seed", 0)
    seed = None if seed is None else int(seed) + slot  # concurrent jobs must not draw the same startup points
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed, **cfg)
    return optuna.samplers.TPESampler(seed=seed, **cfg)


def make_pruner(cfg: dict):
    import optuna

    cfg = dict(cfg)
    name = cfg.pop("name", "median")
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(**cfg)
    return optuna.pruners.MedianPruner(**cfg)


def open_storage(storage: str):
    """An RDB URL as is; anything else is a journal file that many jobs can share."""
    if "://" in storage:
        return storage
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(storage))


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def trial_overrides(spec: SweepSpec, values: dict[str, Any]) -> list[str]:
    seed = [f"seed={spec.seeds[0]}"] if spec.seeds else []
    return list(spec.base) + seed + [f"{k}={hydra_value(v)}" for k, v in values.items()]


def validate_tune(spec: SweepSpec, tc: TuneConfig) -> str:
    """Build the base run with every parameter at each end of its range; returns the base signature."""
    from harness.config import ConfigError

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
    return base_sig or ""


# ------------------------------------------------------------------------------------ the trial
class TrialJob(Checkpointable):
    """One trial of the study = one run, executed inside a (Slurm or local) job."""

    def __init__(self, spec: SweepSpec, tune: TuneConfig, slot: int):
        self.spec, self.tune, self.slot = spec, tune, slot

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return DelayedSubmission(TrialJob(self.spec, self.tune, self.slot), *args, **kwargs)

    def _own_trial(self, study):
        """The trial this slot already started (requeued job) or finished; None if none."""
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get("slot") == self.slot:
                return t
        return None

    def __call__(self) -> dict[str, Any]:
        import optuna
        from optuna.trial import TrialState

        from harness import metrics as M
        from harness.launch.executors import execute

        _quiet_optuna()
        tc = self.tune
        study = optuna.load_study(study_name=tc.study, storage=open_storage(tc.storage),
                                  sampler=make_sampler(tc.sampler, self.slot), pruner=make_pruner(tc.pruner))
        own = self._own_trial(study)
        if own is not None and own.state != TrialState.RUNNING:
            return {"trial": own.number, "state": own.state.name, "value": own.value, "resumed": False}
        if own is not None:
            trial = optuna.trial.Trial(study, own._trial_id)  # requeued: take our trial back
        else:
            trial = study.ask()
            trial.set_user_attr("slot", self.slot)
        try:
            job_id = _job_id()
            if job_id:
                trial.set_user_attr("job_id", job_id)
            values = {p.key: p.suggest(trial) for p in tc.params}
            shown = " ".join(f"{k}={_short(v)}" for k, v in values.items())
            cfg = build_run(self.spec, trial_overrides(self.spec, values), name=f"trial {trial.number} {shown}")
            sig = cfg.signature
            trial.set_user_attr("spec_sig", sig)
            trial.set_user_attr("run_dir", str(cfg.run_dir))
            dup = next((t for t in study.get_trials(deepcopy=False)
                        if t.number != trial.number and t.user_attrs.get("spec_sig") == sig), None)
            if dup is not None and dup.state in (TrialState.COMPLETE, TrialState.PRUNED):
                trial.set_user_attr("same_run_as", dup.number)
                study.tell(trial, dup.value if dup.state == TrialState.COMPLETE else None, state=dup.state)
                return {"trial": trial.number, "state": dup.state.name, "value": dup.value, "same_run_as": dup.number}
            if dup is not None and dup.state == TrialState.RUNNING:
                trial.set_user_attr("same_run_as", dup.number)
                study.tell(trial, state=TrialState.FAIL)
                return {"trial": trial.number, "state": "FAIL", "same_run_as": dup.number}

            window = tc.objective.window
            rewards: dict[int, float] = {}
            if (cfg.run_dir / "checkpoint.pt").exists():  # resumed: earlier steps come from MLflow
                rewards.update(_logged_rewards(cfg, self.spec.experiment))
            reported = set(own.intermediate_values) if own is not None else set()

            def on_step(step: int, metrics: dict[str, float]) -> bool:
                rewards[step] = float(metrics[M.REWARD_MEAN])
                done = step + 1
                if done % tc.report_every:
                    return False
                value = trailing_mean([rewards[s] for s in range(done - window, done) if s in rewards], window)
                if not math.isfinite(value):
                    return False
                if done not in reported:
                    trial.report(value, done)
                    reported.add(done)
                return trial.should_prune()

            tags = {"optuna_study": tc.study, "optuna_trial": str(trial.number)}
            summary = execute(cfg, on_step=on_step, tags=tags)
            for k, v in (("run_id", summary.run_id), ("status", summary.status), ("steps_done", summary.steps_done)):
                trial.set_user_attr(k, v)
            if summary.status == "pruned":
                study.tell(trial, state=TrialState.PRUNED)
                return {"trial": trial.number, "state": "PRUNED", "steps_done": summary.steps_done, "params": values}
            hist = _history(cfg.tracking_uri, summary.run_id)
            value, onset = score(hist["rewards"], cfg.trainer.steps, tc.objective,
                                 diverged=summary.status == "diverged", losses=hist["losses"])
            trial.set_user_attr("collapse_onset", onset)
            study.tell(trial, value)
            return {"trial": trial.number, "state": "COMPLETE", "value": value, "params": values}
        except Exception as exc:  # noqa: BLE001 - preemption (SystemExit) must leave the trial RUNNING
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:500])
            study.tell(trial, state=TrialState.FAIL)
            raise


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _job_id() -> str:
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # noqa: BLE001 - not inside a submitit job
        return ""


def _history(uri: str, run_id: str) -> dict[str, list[float]]:
    from mlflow.tracking import MlflowClient

    from harness import metrics as M

    from harness import history

    client = MlflowClient(tracking_uri=uri)
    return {"rewards": history.read(client, run_id, M.REWARD_MEAN).values,
            "losses": history.read(client, run_id, M.POLICY_LOSS).values}


def _logged_rewards(cfg, experiment: str) -> dict[int, float]:
    from harness.launch.status import mlflow_progress

    p = mlflow_progress(cfg.tracking_uri, experiment, [cfg.signature]).get(cfg.signature)
    return dict(zip(p["steps"], p["rewards"])) if p else {}


# ------------------------------------------------------------------------------------ the driver
def open_study(spec: SweepSpec, tc: TuneConfig, base_sig: str, create: bool = True):
    import optuna

    _quiet_optuna()
    storage = open_storage(tc.storage)
    if create:
        study = optuna.create_study(study_name=tc.study, storage=storage, direction=tc.direction,
                                    sampler=make_sampler(tc.sampler, 0), pruner=make_pruner(tc.pruner),
                                    load_if_exists=True)
        reg = tc.registration(base_sig)
        have = study.user_attrs.get("registration")
        if have is None:
            study.set_user_attr("registration", reg)
            study.set_user_attr("spec", str(spec.path) if spec.path else "")
        elif have != reg:
            diff = sorted(k for k in reg if reg[k] != have.get(k))
            raise SweepError(f"tune.study: study {tc.study!r} in {tc.storage} was registered with a different "
                             f"{', '.join(diff)} ({_brief(have, diff)}); this spec has ({_brief(reg, diff)}). "
                             "Use a new study name (tune.study=NAME) to change the objective, space or base run.",
                             key="tune.study")
        return study
    try:
        return optuna.load_study(study_name=tc.study, storage=storage)
    except KeyError:
        raise SweepError(f"tune.study: no study {tc.study!r} in {tc.storage} yet", key="tune.study") from None


def _brief(reg: dict, keys: list[str]) -> str:
    return "; ".join(f"{k}={json.dumps(reg.get(k), sort_keys=True)}" for k in keys)


def submit_trials(spec: SweepSpec, tc: TuneConfig, study, n: int, out=None) -> list[int]:
    out = sys.stdout if out is None else out
    from harness.launch import executors

    db = JobsDB(spec.sweep_dir)
    first = max((int(s) for s in db.trials), default=-1) + 1
    slots = list(range(first, first + n))
    tasks = [TrialJob(spec, tc, s) for s in slots]
    job_ids = executors.submit(spec, tasks, [f"trial-slot-{s}" for s in slots])
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    folder = str(executors.submitit_folder(spec))
    db = JobsDB(spec.sweep_dir)  # re-read: another tune may have written meanwhile
    for s, jid in zip(slots, job_ids):
        db.trials[str(s)] = {"job_id": jid, "launcher": spec.launcher.name, "folder": folder, "submitted": now}
    db.save()
    shown = sorted(set(j.split("_")[0] for j in job_ids))
    print(f"submitted {n} trials (slots {slots[0]}-{slots[-1]}) of study {tc.study!r} as {spec.launcher.name} "
          f"job{'s' if len(shown) > 1 else ''} {', '.join(shown)}; storage {tc.storage}", file=out)
    return slots


def wait_trials(spec: SweepSpec, tc: TuneConfig, study, slots: list[int], timeout: float | None = None,
                poll_s: float = 2.0, out=None) -> bool:
    """Wait until every slot's job has ended; print each trial as it finishes. False on timeout."""
    out = sys.stdout if out is None else out
    from harness.launch.executors import job_states

    t0 = time.time()
    seen: set[int] = set()
    wanted = set(slots)
    while True:
        db = JobsDB(spec.sweep_dir)
        recs = [db.trials[str(s)] for s in slots if str(s) in db.trials]
        states = job_states(recs)
        alive = [r for r in recs if states.get(str(r["job_id"])) and states[str(r["job_id"])].alive]
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get("slot") in wanted and t.number not in seen and t.state.is_finished():
                seen.add(t.number)
                params = " ".join(f"{k}={_short(v)}" for k, v in t.params.items())
                val = f"value {t.value:.4f}" if t.value is not None and t.state.name == "COMPLETE" else ""
                step = f"at step {t.last_step}" if t.state.name == "PRUNED" and t.last_step else ""
                print(f"  trial {t.number:3d} {t.state.name:8s} {params} {val}{step} "
                      f"({time.time() - t0:.0f} s)", file=out)
        if not alive:
            mark_lost(spec, study, slots)
            return True
        if timeout is not None and time.time() - t0 > timeout:
            print(f"stopped waiting after {timeout:.0f} s: {len(alive)} jobs still queued/running", file=out)
            return False
        time.sleep(poll_s)


def mark_lost(spec: SweepSpec, study, slots: list[int]) -> None:
    """Trials still RUNNING whose job has ended without telling the study (killed, out of requeues)
    -> FAIL; so are trials that never got a slot (a job killed between ask and set_user_attr) once
    no trial job of this sweep is alive."""
    from optuna.trial import TrialState

    from harness.launch.executors import job_states

    db = JobsDB(spec.sweep_dir)
    recs = {int(s): r for s, r in db.trials.items()}
    states = job_states(list(recs.values()))
    none_alive = not any(st.alive for st in states.values())
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        slot = t.user_attrs.get("slot")
        rec = recs.get(slot) if slot is not None else None
        st = states.get(str(rec["job_id"])) if rec else None
        if (st is not None and not st.alive) or (slot is None and none_alive):
            print(f"  trial {t.number:3d} FAIL     its job ({rec['job_id'] if rec else '?'}) ended without a result",
                  file=sys.stderr)
            study.tell(t.number, state=TrialState.FAIL)


def trials_table(study, tc: TuneConfig) -> tuple[list[str], list[list[str]]]:
    keys = [p.key for p in tc.params]
    header = ["trial", "state", *keys, "value", "steps", "collapsed", "job", "signature"]
    rows = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        ua = t.user_attrs
        onset = ua.get("collapse_onset")
        rows.append([
            str(t.number), t.state.name, *[_short(t.params[k]) if k in t.params else "-" for k in keys],
            f"{t.value:.4f}" if t.value is not None and t.state.name == "COMPLETE" else "-",
            str(ua.get("steps_done", t.last_step if t.last_step is not None else "-")),
            "-" if t.state.name != "COMPLETE" else ("no" if onset is None else f"yes@{onset}"),
            str(ua.get("job_id", "-")), str(ua.get("spec_sig", "-")),
        ])
    return header, rows


def report(spec: SweepSpec, plots: bool = True, as_json: bool = False, out=None) -> Optional[dict]:
    """Print the trials table and the best value; save the optimisation-history and slice plots."""
    out = sys.stdout if out is None else out
    from optuna.trial import TrialState

    from harness.launch.status import format_table

    tc = parse_tune(spec)
    study = open_study(spec, tc, "", create=False)
    trials = study.get_trials(deepcopy=False)
    counts = {s.name: sum(t.state == s for t in trials) for s in TrialState}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = study.best_trial if complete else None
    result = {"study": tc.study, "storage": tc.storage, "n_trials": len(trials),
              "counts": {k: v for k, v in counts.items() if v},
              "best": None if best is None else {"trial": best.number, "value": best.value, "params": best.params,
                                                 "signature": best.user_attrs.get("spec_sig")},
              "plots": []}
    if plots and complete:
        result["plots"] = save_plots(study, spec.sweep_dir, tc.params, tc.objective)
    if as_json:
        header, rows = trials_table(study, tc)
        result["trials"] = [dict(zip(header, r)) for r in rows]
        print(json.dumps(result), file=out)
        return result
    header, rows = trials_table(study, tc)
    print(f"study {tc.study!r} ({tc.storage}): {len(trials)} trials: "
          + ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v), file=out)
    print(format_table(rows, header), file=out)
    if best is None:
        print("no trial completed yet: no best value", file=out)
    else:
        params = ", ".join(f"{k} = {_short(v)}" for k, v in best.params.items())
        print(f"best: {params} (trial {best.number}, objective {tc.objective.name} = {best.value:.4f}, "
              f"run {best.user_attrs.get('spec_sig', '?')})", file=out)
    for p in result["plots"]:
        print(f"plot: {p}", file=out)
    return result


def objective_label(objective: Objective) -> str:
    """The y label of the plots: what the objective value is."""
    return (f"{objective.name}: mean smoothed reward (W={objective.window}) over the last "
            f"{objective.tail_frac:.0%} of steps")


def save_plots(study, folder: Path, params: list[ParamSpec], objective: Optional[Objective] = None) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    _quiet_optuna()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fn in (("optimization_history", lambda: ovm.plot_optimization_history(study)),
                     ("slice", lambda: ovm.plot_slice(study, params=[p.key for p in params]))):
        try:
            ax = fn()
        except Exception as exc:  # noqa: BLE001 - a plot must not lose the report
            print(f"warning: no {name} plot: {exc}", file=sys.stderr)
            continue
        axes = list(ax.flat) if hasattr(ax, "flat") else [ax]
        fig = axes[0].figure
        if objective is not None:  # name the objective (Optuna writes "Objective Value")
            for a in axes:
                if a.get_ylabel() == "Objective Value":
                    a.set_ylabel(objective_label(objective), fontsize=8)
        if name == "slice":  # show the whole search range, not just the sampled span
            for a, p in zip(axes, params):
                if p.type != "categorical":
                    a.set_xlim(p.low / 1.05 if p.log else p.low, p.high * 1.05 if p.log else p.high)
        fig.set_size_inches(7, 4.5)
        fig.tight_layout()
        path = folder / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))
    return paths


def run_tune(spec: SweepSpec, wait: bool = True, timeout: float | None = None, out=None) -> Optional[dict]:
    out = sys.stdout if out is None else out
    tc = parse_tune(spec)
    base_sig = validate_tune(spec, tc)
    study = open_study(spec, tc, base_sig)
    before = len(study.get_trials(deepcopy=False))
    prepare_tracking(spec, build_run(spec, trial_overrides(spec, {p.key: p.extremes()[0] for p in tc.params})))
    print(f"study {tc.study!r}: {before} trials so far; adding {tc.n_trials}; launcher {spec.launcher.name}; "
          f"pruner {tc.pruner.get('name', 'median')}; objective {tc.objective.name}", file=out)
    slots = submit_trials(spec, tc, study, tc.n_trials, out=out)
    if not wait:
        return None
    wait_trials(spec, tc, study, slots, timeout=timeout, out=out)
    return report(spec, out=out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    timeout = None
    if "--timeout" in argv:
        i = argv.index("--timeout")
        try:
            timeout = float(argv[i + 1])
        except (IndexError, ValueError):
            print("error: --timeout needs a number of seconds", file=sys.stderr)
            return 2
        del argv[i:i + 2]
    def body() -> int:
        path, overrides, opts = split_args(argv, ("--no-wait", "--report"), USAGE)
        spec = load_spec(path, overrides)
        if spec.tune is None:
            raise SweepError(f"tune: {path} has no `tune:` block (a plain sweep: python -m harness.sweep {path})",
                             key="tune")
        if "--report" in opts:
            parse_tune(spec)
            res = report(spec)
        else:
            res = run_tune(spec, wait="--no-wait" not in opts, timeout=timeout)
            if res is None and "--no-wait" in opts:
                return 0
        return 0 if res and res.get("best") else 1

    return cli(body)

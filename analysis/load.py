"""Loading: an MLflow experiment -> :class:`Experiment` (runs, group labels, full metric histories).

- Runs come from ``MlflowClient.search_runs`` (all pages, active runs only, optional MLflow filter
  string such as ``"tags.task = 'sort'"``).
- **Groups by identity**: a group is one spec up to the seed, the run tag ``group_sig`` (the spec
  signature without the seed). Runs logged before that tag existed get a key computed from their
  logged params minus ``seed``, ``tracking.*``, ``launcher.*``, ``out_dir``,
  ``trainer.checkpoint_every`` and ``warmstart.*`` (outputs, not spec); runs with neither (foreign
  runs) are keyed by their estimator tags. Runs that differ in anything but the seed are never pooled.
  The label is ``estimator(knobs)`` plus, when several groups would share it, the keys that tell them
  apart (:func:`identity_labels`); ``--group-by KEY`` (a tag or any param, e.g. ``trainer.lr``) adds
  KEY's value to every label and a pooled table.
- **Left out by default** (listed in :attr:`Experiment.notes` and :attr:`Experiment.excluded`): runs
  whose MLflow status is not FINISHED (RUNNING orphans of a killed job, KILLED, FAILED), runs the tuner
  pruned (FINISHED, tag ``status=pruned``: stopped early, their last reward is no final reward), and runs
  superseded by a later run of the same group and seed (a rerun); ``include_unfinished=True``
  keeps the unfinished and pruned ones (the latest run per group and seed still wins).
- Skipped: runs tagged ``analysis_summary=1`` (what ``report`` logs) and runs without an
  ``estimator`` tag. Runs tagged ``probe=1`` go to :attr:`Experiment.probes` (their latest metric
  values and ``model_kind``), not to the training groups.
- Histories are read in full (the MLflow UI samples about 320 points per curve, which hides short
  collapses): on a SQLAlchemy store (sqlite, postgres, mysql) with the store's
  ``get_metric_history_bulk`` (one query per metric for up to 200 runs: the metrics table is keyed by
  metric name first, so a per-run query scans every run's rows of that metric), otherwise with the
  public ``MlflowClient.get_metric_history``, one call per run and metric over a few threads. Each history becomes a ``pandas.Series`` indexed by step (sorted; a step logged twice
  keeps its latest value). Non-finite values are kept: MLflow stores NaN as NaN and +-inf as
  +-1.797e308, which :func:`finite_values` maps back to +-inf. Runs are aligned on step by
  :meth:`Experiment.wide`.
- Two steps: :func:`store_records` fetches the runs as plain :class:`RunRecord` s (run id, status, start
  time, tags, params, latest values), and :func:`assemble` does everything after the fetch (selection,
  groups, labels, notes, the :class:`Experiment`) from those records and a history fetcher. An exported
  histories file (:mod:`analysis.histories`) goes through the same :func:`assemble`, so it gives the same
  Experiment as the store it came from.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from harness import metrics as M
from harness.history import from_metrics
from harness.uri import redact

from .labels import (CONTEXT_TAGS, LEGACY_KNOB_TAGS, arm_text, base_label, context_suffix, estimator_part, knob_columns,
                     sort_key, tag_number, tag_text, tag_value, untagged_knobs)

SUMMARY_TAG = "analysis_summary"
PROBE_TAG = "probe"
PROBE_METRICS = M.PROBE_METRICS
MLFLOW_INF = 1.7e308  # MLflow stores +-inf as +-sys.float_info.max


class AnalysisError(RuntimeError):
    """A problem the user can fix (unknown experiment, no runs, unknown group): exit status 2."""


def require_one_estimator(name: str, labels, what: str) -> None:
    """Refuse (AnalysisError) an experiment whose groups hold more than one estimator configuration: a ``what`` (a
    hazard map, a dose table) is over one."""
    ests = sorted({estimator_part(x) for x in labels})
    if len(ests) > 1:
        raise AnalysisError(f"experiment {name!r} holds {len(ests)} estimator configurations ({', '.join(ests)}); "
                            f"{what} is over one: pick it with --filter, e.g. --filter \"tags.estimator = 'recompute'\"")


def project_root() -> Path:
    """The folder holding the ``analysis`` package (the project root in a source checkout)."""
    return Path(__file__).resolve().parents[1]


def default_tracking_uri() -> str:
    """The harness's store rule (``harness/uri.py``): ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<project root>/mlruns.db``."""
    from harness.uri import resolve_tracking_uri

    return resolve_tracking_uri()


def default_metrics() -> tuple[str, ...]:
    """The histories the report needs (``moe/replay_coverage``: empty for runs that never log it, i.e. every
    single-turn run)."""
    return (M.REWARD_MEAN, M.POLICY_LOSS, M.MISMATCH_K3, M.TIME_STEP, M.MOE_REPLAY_COVERAGE)


@dataclass
class Experiment:
    """One experiment's runs and histories.

    ``runs``: one row per training run, columns run_id, run_name, status, label, estimator, n,
    clip_c, level, seed, model, model_kind, task, backend, spec_sig, git_commit, start_time (+ any
    group-by tag); sorted by canonical group order, then seed.
    ``histories[metric][run_id]``: the run's logged values, a Series indexed by step.
    ``probes``: one row per probe run: run_id, model_kind, model, and the ``probe/*`` metrics.
    """

    name: str
    experiment_id: str
    tracking_uri: str
    runs: pd.DataFrame
    histories: dict[str, dict[str, pd.Series]]
    probes: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    excluded: pd.DataFrame = field(default_factory=pd.DataFrame)  # run_id, label, seed, status, why
    groups: pd.DataFrame = field(default_factory=pd.DataFrame)  # label, group_key, runs, seeds, apart
    # group_key -> the identity params its first run logged (empty for runs that logged none)
    group_params: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The experiment's own tags when read from a histories file (None: read them from the store, ``tracking_uri``).
    tags: dict[str, str] | None = None

    @property
    def labels(self) -> list[str]:
        """Group labels in canonical order."""
        return list(dict.fromkeys(self.runs["label"])) if len(self.runs) else []

    def group_runs(self, label: str) -> list[str]:
        return self.runs.loc[self.runs["label"] == label, "run_id"].tolist()

    def series(self, metric: str, run_id: str) -> pd.Series:
        """The run's history of ``metric`` (empty Series when never logged)."""
        return self.histories.get(metric, {}).get(run_id, pd.Series(dtype=float))

    def has_metric(self, metric: str) -> bool:
        """True when at least one training run logged ``metric``."""
        return any(len(s) for s in self.histories.get(metric, {}).values())

    def runs_missing(self, metric: str) -> list[str]:
        return [r for r in self.runs["run_id"] if not len(self.series(metric, r))]

    def wide(self, metric: str, run_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """Runs aligned on step: index = union of steps, one column per run, NaN where not logged."""
        run_ids = list(self.runs["run_id"]) if run_ids is None else list(run_ids)
        cols = {r: self.series(metric, r) for r in run_ids}
        cols = {r: s for r, s in cols.items() if len(s)}
        if not cols:
            return pd.DataFrame(index=pd.Index([], name="step", dtype=np.int64))
        frame = pd.concat(cols, axis=1).sort_index()
        frame.index.name = "step"
        return frame


def finite_values(values: np.ndarray) -> np.ndarray:
    """MLflow's stored +-1.797e308 back to +-inf (NaN stays NaN)."""
    values = np.asarray(values, dtype=float).copy()
    values[values >= MLFLOW_INF] = np.inf
    values[values <= -MLFLOW_INF] = -np.inf
    return values


def history_series(history: Iterable) -> pd.Series:
    """``get_metric_history`` output -> Series indexed by step (latest value of a repeated step)."""
    h = from_metrics(history)
    if not h.steps:
        return pd.Series(dtype=float)
    return pd.Series(finite_values(np.asarray(h.values, dtype=float)),
                     index=pd.Index(np.asarray(h.steps, dtype=np.int64), name="step"))


def client_for(tracking_uri: str):
    """An MLflow client, the store's credentials passed as MLflow recommends (``harness.uri.mlflow_uri``). An http
    store is asked ``/health`` first, within seconds, as ``run`` does (:func:`harness.store.check`): on d747b32 an
    unreachable one took 4 min and 5 tracebacks of MLflow's retries; now one line, exit 2 (:class:`AnalysisError`)."""
    from mlflow.tracking import MlflowClient

    from harness.uri import mlflow_uri

    from harness.http_store import bound_http_retries, health, is_http

    if is_http(tracking_uri):
        bound_http_retries()
        why = health(tracking_uri, 5.0)
        if why is not None:
            raise AnalysisError(f"cannot reach the MLflow tracking store at {redact(tracking_uri)!r}: {why} "
                                "(--tracking-uri, else $MLFLOW_TRACKING_URI)")
    return MlflowClient(tracking_uri=mlflow_uri(tracking_uri))


def list_experiments(tracking_uri: str) -> list[str]:
    """Names of the active experiments in the store."""
    client = client_for(tracking_uri)
    return sorted(e.name for e in client.search_experiments())


def _search_all(client, experiment_id: str, filter_string: str | None) -> list:
    from mlflow.entities import ViewType

    runs, token = [], None
    while True:
        page = client.search_runs(
            [experiment_id], filter_string=filter_string or "", run_view_type=ViewType.ACTIVE_ONLY,
            max_results=1000, page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            return runs


@dataclass(frozen=True)
class RunRecord:
    """One run as a store holds it, in plain data: what selection, grouping and labels read (no MLflow type).

    ``latest``: each metric's latest value as MLflow reports it (``run.data.metrics``: +-inf still
    stored as +-1.797e308); the probe table reads these.
    """

    run_id: str
    run_name: str | None
    status: str
    start_time: int | None
    tags: Mapping[str, str]
    params: Mapping[str, str]
    latest: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_mlflow(cls, run) -> "RunRecord":
        return cls(run_id=run.info.run_id, run_name=run.info.run_name, status=run.info.status,
                   start_time=run.info.start_time, tags=dict(run.data.tags), params=dict(run.data.params),
                   latest=dict(run.data.metrics))


# (run ids, metrics) -> {metric: {run_id: Series by step}}: where the histories come from
HistoryFetch = Callable[[list, tuple], dict]


def _level(run: RunRecord) -> str:
    tags, params = run.tags, run.params
    return tag_text(tags.get("level")) or tag_text(params.get("estimator.level")) or tag_text(params.get("level"))


def store_records(name: str, tracking_uri: str, filter_string: str | None = None):
    """``(client, experiment, [RunRecord])``: every active run of ``name`` in the store (matching the filter).

    Raises :class:`AnalysisError` when the experiment does not exist, listing the ones that do.
    """
    client = client_for(tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is None or exp.lifecycle_stage != "active":
        known = sorted(e.name for e in client.search_experiments())
        listing = "\n  ".join(known) if known else "(none)"
        raise AnalysisError(f"no experiment named {name!r} in {redact(tracking_uri)}; experiments there:\n  {listing}")
    return client, exp, [RunRecord.from_mlflow(r) for r in _search_all(client, exp.experiment_id, filter_string)]


def load_experiment(
    name: str,
    tracking_uri: str | None = None,
    metrics: Sequence[str] | None = None,
    filter_string: str | None = None,
    group_by: Sequence[str] = (),
    threads: int = 4,
    include_unfinished: bool = False,
) -> Experiment:
    """Load ``name`` from ``tracking_uri`` (default :func:`default_tracking_uri`).

    Raises :class:`AnalysisError` when the experiment does not exist (listing the ones that do)
    or holds no training run.
    """
    tracking_uri = tracking_uri or default_tracking_uri()
    client, exp, records = store_records(name, tracking_uri, filter_string)
    return assemble(name, exp.experiment_id, tracking_uri, records,
                    lambda ids, ms: _load_histories(client, ids, ms, threads), metrics=metrics,
                    filter_string=filter_string, group_by=group_by, include_unfinished=include_unfinished)


def assemble(
    name: str,
    experiment_id: str,
    tracking_uri: str,
    records: Sequence[RunRecord],
    fetch: HistoryFetch,
    metrics: Sequence[str] | None = None,
    filter_string: str | None = None,
    group_by: Sequence[str] = (),
    include_unfinished: bool = False,
) -> Experiment:
    """The :class:`Experiment` of an experiment's run records (in the store's search order): runs sorted into
    training and probe runs, selected (:func:`select_runs`), grouped and labelled, notes written, and the
    histories of ``metrics`` of the kept runs got from ``fetch``. A function of plain data, so an MLflow store
    (:func:`load_experiment`) and an exported file (:mod:`analysis.histories`) give the same Experiment.
    """
    metrics = tuple(dict.fromkeys(metrics or default_metrics()))
    notes: list[str] = []
    training, probes, skipped_no_est = [], [], 0
    for run in records:
        tags = run.tags
        if tag_text(tags.get(SUMMARY_TAG)) in ("1", "true", "True"):
            continue
        if tag_text(tags.get(PROBE_TAG)) in ("1", "true", "True"):
            probes.append(run)
        elif tag_text(tags.get("estimator")):
            training.append(run)
        else:
            skipped_no_est += 1
    if skipped_no_est:
        notes.append(f"{skipped_no_est} run(s) without an `estimator` tag were skipped.")
    if not training and not probes:
        where = f" matching filter {filter_string!r}" if filter_string else ""
        raise AnalysisError(f"experiment {name!r} in {redact(tracking_uri)} holds no training or probe runs{where}")

    runs, excluded = select_runs(_runs_frame(training, group_by), include_unfinished)
    kept = set(runs["run_id"])
    training = [r for r in training if r.run_id in kept]
    runs = _runs_frame(training, group_by)  # labels from the kept runs only
    if len(excluded):
        why = excluded["why"].value_counts()
        counts = "; ".join(f"{n} {w}" for w, n in why.items())
        listing = ", ".join(f"`{r.run_id[:8]}` ({r.label} seed {r.seed}: {r.why})" for r in excluded.itertuples())
        notes.append(f"{len(excluded)} run(s) left out ({counts}): {listing}.")
    if len(runs):
        unfinished = runs.loc[runs["status"] != "FINISHED", "run_id"].tolist()
        if unfinished:
            notes.append(f"{len(unfinished)} run(s) did not finish (kept by include_unfinished): their curves are partial.")
    groups = groups_frame(runs, training)
    logged = {r.run_id: identity_params(r.params) for r in training}
    group_params = {g: logged.get(ids.iloc[0], {}) for g, ids in runs.groupby("group_key", sort=False)["run_id"]}

    histories = fetch(list(runs["run_id"]), metrics)
    for metric in metrics:
        if metric in M.MULTI_TURN_ONLY or metric in M.KL_HELD_ONLY:  # logged by some runs only, by design
            continue
        missing = [r for r in runs["run_id"] if not len(histories[metric].get(r, ()))]
        if len(runs) and missing:
            which = "any run" if len(missing) == len(runs) else f"{len(missing)} of {len(runs)} runs"
            notes.append(f"metric `{metric}` is missing in {which}.")
    return Experiment(
        name=name, experiment_id=experiment_id, tracking_uri=tracking_uri, runs=runs,
        histories=histories, probes=_probes_frame(probes), notes=notes, excluded=excluded, groups=groups,
        group_params=group_params,
    )


RUN_COLUMNS = (
    "run_id", "run_name", "status", "stopped", "label", "estimator", *LEGACY_KNOB_TAGS, "seed", "model", "model_kind",
    "task", "backend", "perturbation", "spec_sig", "group_key", "git_commit", "start_time", "marks_only",
)
MARKS_TAG = "restored_histories"  # "none": a run restored as a mark only (analysis restore --marks), no histories


# params that are not the spec, or not what a run computes (harness/spec/ NON_IDENTITY_KEYS + outputs)
NON_IDENTITY_PREFIXES = ("tracking.", "launcher.", "warmstart.")
NON_IDENTITY_PARAMS = ("seed", "out_dir", "trainer.checkpoint_every")
KNOB_PARAMS = ("estimator.name", "estimator.n", "estimator.clip_c", "estimator.level")  # in the base label


def identity_params(params: Mapping[str, str]) -> dict[str, str]:
    """A run's logged params that define its group: all but the seed and the non-identity keys."""
    return {k: v for k, v in params.items()
            if k not in NON_IDENTITY_PARAMS and not k.startswith(NON_IDENTITY_PREFIXES)}


def group_key(tags: Mapping[str, str], params: Mapping[str, str]) -> str:
    """``group_sig`` tag; else a hash of :func:`identity_params` (``p:`` prefix); else the estimator tags
    (``t:`` prefix: runs logged by something other than the harness)."""
    sig = tag_text(tags.get("group_sig"))
    if sig:
        return sig
    ident = identity_params(params)
    if ident:
        blob = json.dumps(sorted(ident.items()), separators=(",", ":"))
        return "p:" + hashlib.sha256(blob.encode()).hexdigest()[:10]
    knobs = [tag_text(tags.get(k)) for k in ("estimator", *LEGACY_KNOB_TAGS, *CONTEXT_TAGS)]
    return "t:" + hashlib.sha256("|".join(knobs).encode()).hexdigest()[:10]


def _param_value(run: RunRecord, key: str) -> str:
    """A ``--group-by`` key: the run tag of that name (an explicit "none", a control arm, stays "none"), else
    the logged param (``trainer.lr``)."""
    return arm_text(run.tags.get(key)) or tag_text(run.params.get(key))


def identity_labels(base: Mapping[str, str], params: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """``{group_key: label}``: the base label (``estimator(knobs)[context]``) where it is unique, else the
    base label plus ``[key=value,...]`` for the identity params that differ among the groups sharing it
    (``rollout[trainer.lr=0.0001]``); ``[group=KEY]`` when no logged param tells them apart. A param one group
    logs as null (``None``) and another does not log at all is the same value: a key added to the schema later
    (a new estimator's parameter, unset) does not split the labels of runs made before and after it."""
    out, apart = {}, identity_apart(base, params)
    for g, label in base.items():
        extra = ",".join(f"{k}={v}" for k, v in apart[g])
        out[g] = label if not extra else label[:-1] + "," + extra + "]" if label.endswith("]") else f"{label}[{extra}]"
    return out


def identity_apart(base: Mapping[str, str], params: Mapping[str, Mapping[str, str]]) -> dict[str, tuple]:
    """``{group_key: ((key, value), ...)}``: what :func:`identity_labels` adds to each base label (nothing where it
    is unique)."""
    by_base: dict[str, list[str]] = {}
    for key, label in base.items():
        by_base.setdefault(label, []).append(key)
    out = {}
    for label, keys in by_base.items():
        if len(keys) == 1:
            out[keys[0]] = ()
            continue
        names = sorted({k for g in keys for k in params.get(g, {})})
        value = lambda g, k: tag_text(params.get(g, {}).get(k)) or None  # noqa: E731  absent = null = unset
        differ = [k for k in names if len({value(g, k) for g in keys}) > 1 and k not in KNOB_PARAMS]
        for g in keys:
            p = params.get(g, {})
            out[g] = tuple((k, p.get(k, "na")) for k in differ) if differ else (("group", g),)
    return out


def select_runs(runs: pd.DataFrame, include_unfinished: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(kept, left out)``: runs not FINISHED out (unless ``include_unfinished``), then per (group, seed)
    the latest run by start time kept and the others out as superseded; column ``why`` says which."""
    cols = ["run_id", "label", "seed", "status"]
    if runs.empty:
        return runs, pd.DataFrame(columns=cols + ["why"])
    out = []
    keep = runs
    marks = keep["marks_only"].astype(bool) if "marks_only" in keep else pd.Series(False, index=keep.index)
    out += [{**r, "why": "restored as a mark only, without histories (analysis restore --marks): read its parts with "
             "--from DIR"} for r in keep.loc[marks, cols].to_dict("records")]
    keep = keep[~marks]
    if not include_unfinished:
        bad = keep["status"] != "FINISHED"
        out += [{**r, "why": f"status {r['status']}"} for r in keep.loc[bad, cols].to_dict("records")]
        keep = keep[~bad]
        pruned = keep["stopped"] == "pruned" if "stopped" in keep else pd.Series(False, index=keep.index)
        out += [{**r, "why": "pruned by the tuner (a truncated run)"} for r in keep.loc[pruned, cols].to_dict("records")]
        keep = keep[~pruned]
    latest = keep.sort_values("start_time", kind="stable").groupby(["group_key", "seed"], sort=False).tail(1).index
    sup = keep[~keep.index.isin(latest)]
    out += [{**r, "why": "superseded by a later run of the same spec and seed"} for r in sup[cols].to_dict("records")]
    keep = keep[keep.index.isin(latest)]
    return keep.reset_index(drop=True), pd.DataFrame(out, columns=cols + ["why"])


def groups_frame(runs: pd.DataFrame, training: Sequence[RunRecord]) -> pd.DataFrame:
    """One row per group: label, group key, runs, seeds, and ``apart``: the identity params that vary
    across the experiment's groups, with this group's values (what sets it apart); for runs that
    logged no params, their estimator and context tags."""
    cols = ["label", "group_key", "runs", "seeds", "apart"]
    if runs.empty:
        return pd.DataFrame(columns=cols)
    tag_keys = ("estimator", *LEGACY_KNOB_TAGS, *CONTEXT_TAGS)  # runs without params: their tags
    params = {r.run_id: identity_params(r.params)
              or {k: tag_text(r.tags.get(k)) for k in tag_keys if tag_text(r.tags.get(k))}
              for r in training}
    per_group = {g: params.get(ids.iloc[0], {}) for g, ids in runs.groupby("group_key", sort=False)["run_id"]}
    names = sorted({k for p in per_group.values() for k in p})
    varying = [k for k in names if len({p.get(k) for p in per_group.values()}) > 1]
    rows = []
    for label, g in runs.groupby("label", sort=False):
        p = per_group.get(g["group_key"].iloc[0], {})
        apart = ", ".join(f"{k}={p[k]}" for k in varying if tag_text(p.get(k)))
        rows.append({"label": label, "group_key": g["group_key"].iloc[0], "runs": len(g),
                     "seeds": int(g["seed"].nunique()), "apart": apart or "-"})
    return pd.DataFrame(rows, columns=cols)


def _runs_frame(training: Sequence[RunRecord], group_by: Sequence[str]) -> pd.DataFrame:
    if not training:
        return pd.DataFrame(columns=list(RUN_COLUMNS) + list(group_by))
    context = [t for t in CONTEXT_TAGS if t not in group_by]
    varying = [t for t in context if len({tag_text(r.tags.get(t)) for r in training}) > 1]
    varying += [t for t in group_by if t not in varying]
    knobs = [k for k in knob_columns() if k not in LEGACY_KNOB_TAGS]
    swept = _swept_params(training)
    rows, base, params, context = [], {}, {}, {}
    for run in training:
        tags = run.tags
        level = _level(run)
        label_tags = {**untagged_knobs(run.params), **tags, "level": level,
                      **{t: _param_value(run, t) for t in group_by}}
        suffix = context_suffix(label_tags, varying)
        seed = tag_number(tags.get("seed"))
        key = group_key(tags, run.params)
        base.setdefault(key, base_label(label_tags) + suffix)
        params.setdefault(key, identity_params(run.params))
        context.setdefault(key, tuple((t, arm_text(label_tags.get(t)) or "na") for t in varying))
        row = {
            "run_id": run.run_id,
            "run_name": run.run_name,
            "status": run.status,
            "stopped": tag_text(tags.get("status")),  # the harness's own end: finished, diverged, pruned
            "marks_only": str(tags.get(MARKS_TAG, "")) == "none",  # (tag_text reads "none" as absent)
            "label": "",
            "estimator": tag_text(tags.get("estimator")),
            "n": tag_number(tags.get("n")),
            "clip_c": tag_number(tags.get("clip_c")),
            "level": level,
            "seed": -1 if math.isnan(seed) else int(seed),
            "model": tag_text(tags.get("model")),
            "model_kind": tag_text(tags.get("model_kind")),
            "task": tag_text(tags.get("task")),
            "backend": tag_text(tags.get("backend")),
            "perturbation": arm_text(tags.get("perturbation")),
            "spec_sig": tag_text(tags.get("spec_sig")),
            "group_key": key,
            "git_commit": tag_text(tags.get("git_commit")),
            "start_time": run.start_time,
        }
        for t in group_by:
            row.setdefault(t, label_tags[t])
        for k in knobs:  # a knob's tag, else its logged param (``estimator.gamma_min``): a sweep axis
            row.setdefault(k, tag_value(tags.get(k)) if tag_text(tags.get(k)) else tag_value(run.params.get(f"estimator.{k}")))
        for k in swept:  # every other spec key the runs differ in (``trainer.lr``): a sweep axis too
            row.setdefault(k, tag_value(run.params.get(k)))
        rows.append(row)
    labels, apart = identity_labels(base, params), identity_apart(base, params)
    for row in rows:
        row["label"] = labels[row["group_key"]]
        row["label_parts"] = (context[row["group_key"]], apart[row["group_key"]])
        row["_key"] = sort_key(row["estimator"], row["n"], row["clip_c"], row["level"], row["label"])
    rows.sort(key=lambda r: (r["_key"], r["seed"], r["start_time"] or 0))
    frame = pd.DataFrame(rows).drop(columns="_key")
    return frame.reset_index(drop=True)


def _swept_params(training: Sequence[RunRecord]) -> list[str]:
    """The identity params, but the estimator's (knob columns), whose values differ among the runs (absent = null)."""
    logged = [identity_params(run.params) for run in training]
    names = sorted({k for p in logged for k in p if not k.startswith("estimator.")})
    return [k for k in names if len({tag_text(p.get(k)) for p in logged}) > 1]


def _probes_frame(probes: Sequence[RunRecord]) -> pd.DataFrame:
    rows = []
    for run in probes:
        tags, values = run.tags, run.latest
        row = {"run_id": run.run_id, "model_kind": tag_text(tags.get("model_kind")) or "?",
               "model": tag_text(tags.get("model")), "model_shape": tag_text(tags.get("model_shape")) or "",
               "perturbation": arm_text(tags.get("perturbation")) or "none", "seed": tag_text(tags.get("seed"))}
        for m in PROBE_METRICS:
            v = values.get(m)
            row[m] = float(finite_values(np.array([v]))[0]) if v is not None else math.nan
        rows.append(row)
    return pd.DataFrame(rows, columns=["run_id", "model_kind", "model", "model_shape", "perturbation", "seed",
                                       *PROBE_METRICS])


BULK_CHUNK = 200  # run ids per bulk query (well under SQLite's bound-parameter limit)
BULK_MAX = 50_000_000


def _bulk_store(client):
    """The client's SQLAlchemy store when it offers ``get_metric_history_bulk`` (sqlite, postgres, ...)."""
    store = getattr(getattr(client, "_tracking_client", None), "store", None)
    if store is not None and type(store).__name__ == "SqlAlchemyStore" and hasattr(store, "get_metric_history_bulk"):
        return store
    return None


def _load_histories(client, run_ids: list[str], metrics: Sequence[str], threads: int) -> dict[str, dict[str, pd.Series]]:
    """Full histories: one bulk query per metric and chunk of runs on a SQLAlchemy store (one scan of
    the metric instead of one per run), ``get_metric_history`` per run and metric otherwise."""
    out: dict[str, dict[str, pd.Series]] = {m: {} for m in metrics}
    if not run_ids or not metrics:
        return out
    store = _bulk_store(client)
    if store is not None:
        try:
            for metric in metrics:
                for i in range(0, len(run_ids), BULK_CHUNK):
                    rows = store.get_metric_history_bulk(run_ids[i:i + BULK_CHUNK], metric, BULK_MAX)
                    if len(rows) >= BULK_MAX:
                        raise OverflowError
                    by_run: dict[str, list] = {}
                    for m in rows:
                        by_run.setdefault(m.run_id, []).append(m)
                    for run_id, hist in by_run.items():
                        out[metric][run_id] = history_series(hist)
            return out
        except Exception:  # noqa: BLE001 - any surprise: the public per-run path below
            out = {m: {} for m in metrics}

    jobs = [(r, m) for r in run_ids for m in metrics]

    def fetch(job):
        run_id, metric = job
        return history_series(client.get_metric_history(run_id, metric))

    if threads > 1 and len(jobs) > 8:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            results = list(pool.map(fetch, jobs))
    else:
        results = [fetch(j) for j in jobs]
    for (run_id, metric), series in zip(jobs, results):
        if len(series):
            out[metric][run_id] = series
    return out


def warn(msg: str) -> None:
    print(f"analysis: {msg}", file=sys.stderr)

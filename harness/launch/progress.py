"""The sweep's MLflow store, as launch reads it (one reader, ``harness.history`` underneath).

``prepare_tracking``: the store and experiment exist before jobs race to create them;
``finished_in_store``: which runs are done; ``mlflow_progress``: each run's reward and loss curves so far
(the latest run with the signature's ``spec_sig`` tag); ``run_history``: one run's curves by run id.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness import backends
from harness.launch.spec import SweepError, SweepSpec
from harness.launch.submit import SubmissionError

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig


def prepare_tracking(spec: SweepSpec, cfg: RunConfig) -> None:
    """Create the MLflow store and the sweep's experiment once, before jobs race to do it."""
    from harness.tracking import ExperimentDeleted, StoreError, client_for, experiment_id

    uri = cfg.tracking_uri
    try:
        experiment_id(client_for(uri), spec.experiment, uri)
    except ExperimentDeleted as exc:  # exit 2: restore it or choose another
        raise SweepError(str(ExperimentDeleted(exc.name, exc.experiment_id, uri, key="experiment")),
                         key="experiment") from None
    except StoreError as exc:  # locked past the deadline, disk full: its own line
        raise SubmissionError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001
        from harness.uri import redact

        raise SweepError(f"tracking_uri: cannot reach the MLflow store {redact(uri)!r}: {exc}",
                         key="tracking_uri") from None


def finished_in_store(spec: SweepSpec, runs: list, after_ms: int = 0) -> set[str]:
    """Signatures finished in the sweep's store. A run of a backend whose runs the store finishes
    (``store_finishes``: local): a FINISHED run of its signature in the sweep's experiment (one query). A verl
    run: its backend's own test (``Backend.finished``; verl: the folder's ``summary.json``, written after verl
    exited 0, names a run FINISHED in this store with its ``spec_sig``: verl ends its MLflow run itself,
    FINISHED also after a crash or a preemption, so a FINISHED run alone is not a result).
    ``after_ms``: only a FINISHED run started then or later counts (a --rerun's new runs, not the ones it
    supersedes)."""
    from harness import store
    from harness.tracking import TrackingError, client_for

    if not runs:
        return set()
    uri = runs[0].cfg.tracking_uri
    try:
        store.check(uri)
        done = store.finished_signatures(uri, spec.experiment, after_ms)
    except TrackingError as exc:
        raise SubmissionError(str(exc)) from None
    client = client_for(uri)

    def is_done(r) -> bool:
        own = backends.get(r.cfg.backend.name).finished
        return r.signature in done if own is None else own(client, r.cfg, after_ms) is not None

    return {r.signature for r in runs if is_done(r)}


def mlflow_progress(uri: str, experiment: str, sigs: list[str]) -> dict[str, dict[str, Any]]:
    """``signature -> {run_id, rewards, losses, status}`` from the latest MLflow run with that spec_sig."""
    from harness import history, metrics as M, store
    from harness.tracking import client_for

    client = client_for(uri)
    wanted, latest = set(sigs), {}
    for r in store.runs_of(client, experiment):  # newest first, every page
        sig = r.data.tags.get("spec_sig")
        if sig in wanted and sig not in latest:
            latest[sig] = r
    out = {}
    for sig, r in latest.items():
        rew = history.read(client, r.info.run_id, M.REWARD_MEAN)
        loss = history.read(client, r.info.run_id, M.POLICY_LOSS)
        out[sig] = {"run_id": r.info.run_id, "rewards": rew.values, "steps": rew.steps, "losses": loss.values,
                    "status": r.data.tags.get("status", r.info.status), "tags": dict(r.data.tags)}
    return out


def run_history(uri: str, run_id: str) -> dict[str, list[float]]:
    """``{rewards, losses}`` of one MLflow run."""
    from harness import history, metrics as M
    from harness.tracking import client_for

    client = client_for(uri)
    return {"rewards": history.read(client, run_id, M.REWARD_MEAN).values,
            "losses": history.read(client, run_id, M.POLICY_LOSS).values}


def logged_rewards(cfg, experiment: str) -> dict[int, float]:
    """``step -> reward`` logged so far by the latest run of ``cfg``'s signature (a resumed trial's past)."""
    p = mlflow_progress(cfg.tracking_uri, experiment, [cfg.signature]).get(cfg.signature)
    return dict(zip(p["steps"], p["rewards"])) if p else {}

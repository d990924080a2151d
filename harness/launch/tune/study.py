"""The Optuna side of a tune study: storage (a journal file many jobs share, or an RDB URL), sampler,
pruner, and the study itself, registered with its objective, space, base run and MLflow store when created.

A study is bound to its store: its trials' runs (and so its best trial's) are in that store, so a call whose runs
would go to another store is refused (exit 2), as is a change of objective, space or base run. A study registered
before stores were recorded is bound to this call's store if every run its trials name is in it."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from harness.launch.spec import SweepError, SweepSpec
from harness.launch.tune.algorithms import make_pruner, make_sampler
from harness.uri import redact

if TYPE_CHECKING:  # pragma: no cover
    from harness.launch.tune.spec import TuneConfig


def open_storage(storage: str):
    """An RDB URL as is; anything else is a journal file that many jobs can share."""
    if "://" in storage:
        return storage
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    Path(storage).parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(storage))


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def open_study(spec: SweepSpec, tc: "TuneConfig", base_sig: str, store: str, create: bool = True):
    """The study ``tc.study``: created and registered (``create``), or loaded (the report). ``store``: the MLflow
    store this call's runs go to (``tune.spec.store_of``); a study bound to another is refused (module doc)."""
    import optuna

    quiet_optuna()
    storage = open_storage(tc.storage)
    if create:
        study = optuna.create_study(study_name=tc.study, storage=storage, direction=tc.direction,
                                    sampler=make_sampler(tc.sampler, 0), pruner=make_pruner(tc.pruner),
                                    load_if_exists=True)
        reg = tc.registration(base_sig, store)
        if study.user_attrs.get("registration") is None:
            study.set_user_attr("registration", reg)
            study.set_user_attr("spec", str(spec.path) if spec.path else "")
            return study
        _bind(study, tc, store, write=True)
        have = study.user_attrs["registration"]
        if have != reg:
            diff = sorted(k for k in reg if reg[k] != have.get(k))
            raise SweepError(f"tune.study: study {tc.study!r} in {redact(tc.storage)} was registered with a different "
                             f"{', '.join(diff)} ({_brief(have, diff)}); this spec has ({_brief(reg, diff)}). "
                             "Use a new study name (tune.study=NAME) to change the objective, space or base run.",
                             key="tune.study")
        return study
    try:
        study = optuna.load_study(study_name=tc.study, storage=storage)
    except KeyError:
        raise SweepError(f"tune.study: no study {tc.study!r} in {redact(tc.storage)} yet", key="tune.study") from None
    if study.user_attrs.get("registration"):
        _bind(study, tc, store, write=False)
    return study


def _bind(study, tc: "TuneConfig", store: str, write: bool) -> None:
    """The registered study is bound to ``store`` (compared redacted), else SweepError (exit 2) with both ways out.
    One registered before stores were is bound to it (``write``: recorded) when every run its trials name is in it."""
    have, mine = study.user_attrs["registration"], redact(store)
    way_out = (f"tune against the store of its runs (tracking_uri=...; credentials in MLFLOW_TRACKING_USERNAME/"
               f"PASSWORD), or start a study of {mine!r} under a new name (tune.study=NAME)")
    if "store" not in have:
        if not _runs_in(study, store):
            raise SweepError(f"tune.study: study {tc.study!r} in {redact(tc.storage)} names MLflow runs that are not "
                             f"in {mine!r} (it predates the store's registration): {way_out}", key="tune.study")
        if write:
            study.set_user_attr("registration", {**have, "store": mine})
        return
    if have["store"] != mine:
        raise SweepError(f"tune.study: study {tc.study!r} in {redact(tc.storage)} is bound to the MLflow store "
                         f"{have['store']!r}, which holds its trials' runs; this spec's runs go to {mine!r}: "
                         f"{way_out}", key="tune.study")


def _runs_in(study, store: str) -> bool:
    """Every MLflow run the study's trials name is in ``store`` (a study with no run yet: trivially)."""
    ids = [t.user_attrs["run_id"] for t in study.get_trials(deepcopy=False) if t.user_attrs.get("run_id")]
    if not ids:
        return True
    from harness.record import active_run
    from harness.tracking import client_for

    try:
        client = client_for(store)
    except Exception:  # noqa: BLE001 - an unreachable store holds none of them
        return False
    return all(active_run(client, i) is not None for i in ids)


def _brief(reg: dict, keys: list[str]) -> str:
    return "; ".join(f"{k}={json.dumps(reg.get(k), sort_keys=True)}" for k in keys)

"""The Optuna side of a tune study: storage (a journal file many jobs share, or an RDB URL), sampler,
pruner, and the study itself, registered with its objective, space and base run when created."""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from harness.launch.spec import SweepError, SweepSpec

if TYPE_CHECKING:  # pragma: no cover
    from harness.launch.tune.spec import TuneConfig


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


def quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def open_study(spec: SweepSpec, tc: "TuneConfig", base_sig: str, create: bool = True):
    import optuna

    quiet_optuna()
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

"""A tune study's Optuna algorithms from its spec's ``sampler`` and ``pruner`` blocks: what ``tune.spec`` checks a
spec with and ``tune.study`` / ``tune.trial`` open a study with (below both: no import circle)."""
from __future__ import annotations


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

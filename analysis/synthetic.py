"""Synthetic reward curves with known answers, and synthetic experiments logged to MLflow with the
harness's real tags and metric names (for tests, the load benchmark and demos of the report).

Curve model (:func:`curve`), steps 0..T-1::

    clean[t] = r0 + (plateau - r0) * min(t / ramp, 1)          linear ramp, then plateau
             = plateau - (plateau - r0) * exp(-t / tau)          with ``tau`` (slow convergence) instead
    after a collapse at ``drop_at``: clean[t] = drop_to        (a step down that stays down)
    reward[t] = clip(clean[t] + N(0, noise^2), 0, 1)

``loss_nan_at``: ``policy/loss`` is NaN from that step on (the reward keeps being logged), the
non-finite-loss collapse. Every random draw comes from ``numpy.random.default_rng(seed)``.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from harness import metrics as M


def curve(T: int = 300, r0: float = 0.2, plateau: float = 0.8, ramp: int = 60, tau: float | None = None,
          drop_at: int | None = None, drop_to: float = 0.3, noise: float = 0.03, seed: int = 0) -> np.ndarray:
    """A noisy reward curve (see the module docstring)."""
    rng = np.random.default_rng(seed)
    t = np.arange(T, dtype=float)
    if tau is not None:
        clean = plateau - (plateau - r0) * np.exp(-t / tau)
    else:
        clean = r0 + (plateau - r0) * np.minimum(t / max(ramp, 1), 1.0)
    if drop_at is not None:
        clean[drop_at:] = drop_to
    return np.clip(clean + rng.normal(0.0, noise, T), 0.0, 1.0)


@dataclass
class SyntheticRun:
    """One run to log: tags (the harness's run tags) and per-step metric arrays."""

    estimator: str
    seed: int
    reward: np.ndarray
    n: float | None = None
    clip_c: float | None = None
    level: str | None = None
    loss_nan_at: int | None = None
    k3_scale: float = 1e-3
    k3: np.ndarray | None = None  # the mismatch/k3 curve itself (else k3_scale x lognormal noise)
    extra_tags: dict[str, str] = field(default_factory=dict)
    extra_metrics: dict[str, np.ndarray] = field(default_factory=dict)  # more per-step curves, logged as given
    drop_metrics: Sequence[str] = ()
    all_metrics: bool = False  # also log the rest of the catalogue (constant filler), as a real run does
    params: dict[str, str] = field(default_factory=dict)  # logged as the run's params (a real run logs its spec)

    def tags(self) -> dict[str, str]:
        na = lambda v: "na" if v is None else str(v)  # noqa: E731
        ident = repr((self.estimator, self.n, self.clip_c, self.level, sorted(self.extra_tags.items())))
        return {
            "estimator": self.estimator, "n": na(self.n), "clip_c": na(self.clip_c), "level": na(self.level),
            "seed": str(self.seed), "backend": "local", "model": "moe_tiny", "model_kind": "moe", "task": "sort",
            "spec_sig": hashlib.sha1((ident + str(self.seed)).encode()).hexdigest()[:8],
            "group_sig": hashlib.sha1(ident.encode()).hexdigest()[:8],
            "git_commit": "synthetic", **self.extra_tags,
        }

    def metrics(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(10_000 + self.seed)
        T = len(self.reward)
        loss = rng.normal(0.0, 0.05, T)
        if self.loss_nan_at is not None:
            loss[self.loss_nan_at:] = np.nan
        k3 = self.k3_scale * np.exp(rng.normal(0.0, 0.5, T)) if self.k3 is None else np.asarray(self.k3, float)
        if self.estimator == "rollout" and self.k3 is None:
            k3 = np.zeros(T)  # the sampling log-prob is its own denominator
        out = {
            M.REWARD_MEAN: self.reward,
            M.POLICY_LOSS: loss,
            M.MISMATCH_K3: k3,
            M.TIME_STEP: 0.5 + 0.01 * rng.random(T),
            **{k: np.asarray(v, float) for k, v in self.extra_metrics.items()},
        }
        if self.all_metrics:
            for k in M.CATALOGUE:
                out.setdefault(k, np.full(T, 0.1))
        return {k: v for k, v in out.items() if k not in self.drop_metrics}


def log_runs(tracking_uri: str, experiment: str, runs: Iterable[SyntheticRun],
             artifact_location: str | None = None) -> str:
    """Log ``runs`` into ``experiment`` (created if needed); returns the experiment id."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment, artifact_location=artifact_location)
    ts = int(time.time() * 1000)
    for run in runs:
        tags = run.tags()
        name = f"{tags['estimator']}-s{run.seed}"
        mlrun = client.create_run(exp_id, run_name=name, tags=tags)
        if run.params:
            client.log_batch(mlrun.info.run_id, params=[Param(k, str(v)) for k, v in run.params.items()])
        batch = [Metric(k, float(v), ts + i, i) for k, arr in run.metrics().items() for i, v in enumerate(arr)]
        for i in range(0, len(batch), 1000):
            client.log_batch(mlrun.info.run_id, metrics=batch[i:i + 1000])
        client.set_terminated(mlrun.info.run_id)
    return exp_id


def log_probe_run(tracking_uri: str, experiment: str, model_kind: str, diff: float, var_rollout: float,
                  var_train: float, seed: int = 0, perturbation: str = "none", layers: int = 2) -> str:
    """A noise-probe run (tag ``probe=1``) with its three metrics."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    run = client.create_run(exp_id, run_name=f"probe-{model_kind}", tags={
        "probe": "1", "model_kind": model_kind, "model": f"{model_kind}_tiny", "seed": str(seed),
        "estimator": "na", "backend": "local", "task": "sort", "perturbation": perturbation,
        "model_shape": f"L{layers}-E8-k4-d64" if model_kind == "moe" else f"L{layers}-ff256-d64"})
    for key, value in (("probe/diff", diff), ("probe/var_rollout", var_rollout), ("probe/var_train", var_train)):
        client.log_metric(run.info.run_id, key, value, step=0)
    client.set_terminated(run.info.run_id)
    return run.info.run_id


def demo_runs(seeds: int = 3, T: int = 160, seed0: int = 0) -> list[SyntheticRun]:
    """A small ablation-plus-sweeps experiment with known behaviour.

    - ``rollout``: every seed collapses (drop at step 90 + 5 * seed);
    - ``recompute``: non-finite loss at step 100 in seed 0 only;
    - ``tis`` at C in {2, 8}, token and sequence: stable, sequence-level slightly better;
    - ``mean_n`` at n in {1, 4, 16}: n=1 collapses in every seed, n=4 in the first seed, n=16 never.
    """
    runs: list[SyntheticRun] = []
    for s in range(seed0, seed0 + seeds):
        k = s - seed0
        runs.append(SyntheticRun("rollout", s, curve(T, drop_at=90 + 5 * k, seed=100 + s)))
        runs.append(SyntheticRun("recompute", s, curve(T, plateau=0.75, seed=200 + s),
                                 loss_nan_at=100 if k == 0 else None))
        for c in (2.0, 8.0):
            for level, plateau in (("token", 0.78), ("sequence", 0.82)):
                runs.append(SyntheticRun("tis", s, curve(T, plateau=plateau - (0.04 if c == 8.0 else 0), seed=300 + s
                                                         + int(c) * 7 + len(level)), clip_c=c, level=level))
        for n in (1, 4, 16):
            drop = 80 + 10 * k if (n == 1 or (n == 4 and k == 0)) else None
            runs.append(SyntheticRun("mean_n", s, curve(T, plateau=0.8 + 0.01 * math.log2(n), drop_at=drop,
                                                        seed=400 + s + 31 * n), n=n))
    return runs

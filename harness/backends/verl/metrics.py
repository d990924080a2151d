"""verl's metric names -> the harness catalogue (``harness.metrics``, docs/design.md section 4).

verl's own names are always kept; the mapped names are added beside them, so ``analysis`` reads a
verl run exactly like a local one. A name is mapped only where verl computes the same quantity:

==================================  ===============================  ================================
verl                                harness                          when
==================================  ===============================  ================================
critic/score/mean                   reward/mean                      always
critic/score/mean                   reward/accuracy                  exact-match rewards (0/1)
actor/pg_loss                       policy/loss                      always
actor/entropy                       policy/entropy                   decoupled estimators
actor/grad_norm                     policy/grad_norm                 always
rollout_corr/kl                     mismatch/k1 (and rec_k1)         decoupled estimators (old=rec)
rollout_corr/k3_kl                  mismatch/k3 (and rec_k3)         decoupled estimators (old=rec)
training/rollout_probs_diff_max     mismatch/prob_diff_max           decoupled estimators
training/rollout_probs_diff_mean    mismatch/prob_diff_mean          decoupled estimators
rollout_corr/rollout_is_mean        is/weight_mean                   tis, mis, icepop
rollout_corr/rollout_is_max         is/weight_max                    token-level weights only
rollout_corr/rollout_is_eff_sample_size  is/ess                      tis, mis, icepop
rollout_corr/rollout_rs_masked_fraction  is/masked_frac              mis, geo_rs
rollout_corr/rollout_is_oob_ratio   is/masked_frac                   icepop
timing_s/gen                        time/rollout_s                   always (mean_n's re-scoring too)
timing_s/old_log_prob               time/old_logprob_s               always
timing_s/update_actor               time/update_s                    always
timing_s/step                       time/step_s                      always
1000 / timing_per_token_ms/gen      tokens/per_s                     always
==================================  ===============================  ================================

Not mapped, because verl's quantity differs from the catalogue's definition: ``actor/pg_clipfrac``
(share of tokens where the clip *binds*, not where |r-1| > eps), ``actor/ppo_kl`` (a k1, not a k3,
estimate), sequence-level ``rollout_is_max`` (the untruncated ratio). Not computed by verl:
``reward/std``, ``moe/*`` (``moe/routing_flip_rate`` is ours with ``verl.routing_metrics``: routing.py and
plugins/routing.py), ``noise/var_rollout``; bypass estimators (rollout, deterministic,
mean_n) have no ``rollout_corr/*`` since verl skips the training forward for them.

The "when" column follows each estimator's declaration (``harness.estimators``): decoupled = not
``verl.bypass`` (r3 too); "old=rec" rows and the prob_diff rows = decoupled without ``needs.replay``;
tis, mis, icepop = ``verl.weighted``; the mis, geo_rs and icepop rows are their own ``verl.metrics``.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from harness import estimators
from harness import metrics as M

#: the metric verl's trainer logs at every training step (``ray_trainer.fit``: the step number itself); its history
#: is which steps reached the MLflow run
STEP_KEY = "training/global_step"

ALWAYS = {
    "critic/score/mean": M.REWARD_MEAN,
    "actor/pg_loss": M.POLICY_LOSS,
    "actor/grad_norm": M.POLICY_GRAD_NORM,
    "timing_s/gen": M.TIME_ROLLOUT,
    "timing_s/old_log_prob": M.TIME_OLD_LOGPROB,
    "timing_s/update_actor": M.TIME_UPDATE,
    "timing_s/step": M.TIME_STEP,
}
DECOUPLED = {
    "actor/entropy": M.POLICY_ENTROPY,
    "rollout_corr/kl": M.MISMATCH_K1,
    "rollout_corr/k3_kl": M.MISMATCH_K3,
}
REC_ONLY = {  # the training engine's plain recompute vs the rollout (r3's recompute replays routing)
    "rollout_corr/kl": M.MISMATCH_REC_K1,
    "rollout_corr/k3_kl": M.MISMATCH_REC_K3,
    "training/rollout_probs_diff_max": M.MISMATCH_PROB_DIFF_MAX,
    "training/rollout_probs_diff_mean": M.MISMATCH_PROB_DIFF_MEAN,
}
IS_WEIGHTS = {
    "rollout_corr/rollout_is_mean": M.IS_WEIGHT_MEAN,
    "rollout_corr/rollout_is_eff_sample_size": M.IS_ESS,
}


def mapping(estimator: str, level: str | None = None, exact_reward: bool = False) -> dict[str, list[str]]:
    """verl name -> the harness names it is logged under, for one run's estimator (only the always-mapped
    names for an estimator that is not registered or has no verl mapping). ``level``: the run's ``level``
    parameter, for an estimator that has one (tis, mis; None = unknown, so no ``is/weight_max``); an
    estimator without one weights tokens (icepop)."""
    out: dict[str, list[str]] = {}

    def add(table: Mapping[str, str]) -> None:
        for src, dst in table.items():
            out.setdefault(src, []).append(dst)

    add(ALWAYS)
    if exact_reward:
        add({"critic/score/mean": M.REWARD_ACCURACY})
    spec = estimators.REGISTRY.get(estimator)
    verl = spec.verl if spec is not None else None
    if verl is None:
        return out
    if not verl.bypass:  # decoupled: pi_old from the actor's forward (r3's replays the routing)
        add(DECOUPLED)
        if not spec.needs.replay:
            add(REC_ONLY)
    if verl.weighted:
        add(IS_WEIGHTS)
        token_level = level == "token" if "level" in spec.param_names() else True
        if token_level:  # verl's sequence-level max is the untruncated ratio, not the weight's
            add({"rollout_corr/rollout_is_max": M.IS_WEIGHT_MAX})
    add(verl.metrics)
    return out


def _number(value: Any) -> float | None:
    try:
        x = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        return None
    return x


def map_metrics(data: Mapping[str, Any], estimator: str, level: str | None = None,
                exact_reward: bool = False) -> dict[str, float]:
    """The harness-named metrics derivable from one step of verl metrics (verl's names not included)."""
    out: dict[str, float] = {}
    for src, dsts in mapping(estimator, level, exact_reward).items():
        if src in data:
            x = _number(data[src])
            if x is not None:
                for dst in dsts:
                    out[dst] = x
    per_token_ms = _number(data.get("timing_per_token_ms/gen"))
    if per_token_ms is not None and per_token_ms > 0 and math.isfinite(per_token_ms):
        out[M.TOKENS_PER_S] = 1000.0 / per_token_ms
    return out


def backfill(tracking_uri: str, run_id: str, estimator: str, level: str | None = None,
             exact_reward: bool = False) -> int:
    """Add the harness names to a finished verl MLflow run logged without our plugin.

    Idempotent: a (name, step) already present is not logged again. Returns the number of points
    written. Used for verl runs made elsewhere (plain ``main_ppo`` with ``trainer.logger=mlflow``).
    """
    import time

    from mlflow.entities import Metric

    from harness import history
    from harness.tracking import client_for

    client = client_for(tracking_uri)
    keys = set(client.get_run(run_id).data.metrics)
    by_step: dict[int, dict[str, float]] = {}
    needed = set(mapping(estimator, level, exact_reward)) | {"timing_per_token_ms/gen"}
    for key in sorted(keys & needed):
        for step, value in zip(*history.read(client, run_id, key)):
            by_step.setdefault(step, {})[key] = value
    have: dict[str, set[int]] = {}
    points: list[Metric] = []
    ts = int(time.time() * 1000)
    for step, data in sorted(by_step.items()):
        for name, value in map_metrics(data, estimator, level, exact_reward).items():
            if name not in have:
                have[name] = set(history.read(client, run_id, name).steps) if name in keys else set()
            if step not in have[name]:
                points.append(Metric(name, value, ts, step))
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i:i + 1000])
    return len(points)

"""MLflow with our names inside verl: tags, harness metric names, no step logged twice.

verl's ``Tracking`` (verl/utils/tracking.py) starts the MLflow run itself: experiment =
``trainer.project_name``, run name = ``trainer.experiment_name``, store = ``MLFLOW_TRACKING_URI``,
and it continues the run ``MLFLOW_RUN_ID`` when that is set (how harness resumes one run across
Slurm requeues). ``install()`` wraps two of its methods, only for configs carrying our ``harness``
block:

* ``__init__``: sets the run's tags (``harness.tags``: estimator, n, clip_c, seed, backend, model,
  task, spec_sig, git_commit) and reads the last step already in the run;
* ``log``: drops steps already logged (a job resumed from an older checkpoint replays them) and adds
  the harness names of ``harness.backends.verl.metrics`` beside verl's, and the step's routing metrics
  (``plugins/routing.py``, with ``verl.routing_metrics``).
"""
from __future__ import annotations

from typing import Any

from harness.backends.verl.metrics import STEP_KEY, map_metrics
from harness.backends.verl.plugins import routing


def last_logged_step(run_id: str) -> int:
    from mlflow.tracking import MlflowClient

    hist = MlflowClient().get_metric_history(run_id, STEP_KEY)
    return max((m.step for m in hist), default=-1)


def harness_metrics(data: dict[str, Any], h: dict[str, Any]) -> dict[str, float]:
    """Our names for one step of verl's metrics (``map_metrics``, by the run's ``harness`` block ``h``) and the
    routing metrics the routing plugin computed during the step (``routing.take_pending``)."""
    tags = h.get("tags") or {}
    level = tags.get("level") if tags.get("level") not in (None, "na") else None
    extra = map_metrics(data, h.get("estimator", ""), level, bool(h.get("exact_reward", False)))
    return {**extra, **routing.take_pending()}


def install() -> None:
    from verl.utils import tracking as T

    if getattr(T.Tracking, "_harness_installed", False):
        return
    orig_init, orig_log = T.Tracking.__init__, T.Tracking.log

    def __init__(self, project_name, experiment_name, default_backend="console", config=None, *args, **kwargs):
        orig_init(self, project_name, experiment_name, default_backend, config, *args, **kwargs)
        h = (config or {}).get("harness") if isinstance(config, dict) else None
        self._harness: dict[str, Any] | None = dict(h) if h else None
        self._harness_skip_until = -1
        if self._harness and "mlflow" in self.logger:
            import mlflow

            run = mlflow.active_run()
            if run is not None:
                mlflow.set_tags({k: str(v) for k, v in (self._harness.get("tags") or {}).items()})
                self._harness_skip_until = last_logged_step(run.info.run_id)

    def log(self, data, step, backend=None):
        h = getattr(self, "_harness", None)
        if not h:
            return orig_log(self, data, step, backend)
        if step <= self._harness_skip_until:
            return None  # already in the MLflow run (resumed from an older checkpoint)
        return orig_log(self, {**data, **harness_metrics(data, h)}, step, backend)

    T.Tracking.__init__ = __init__
    T.Tracking.log = log
    T.Tracking._harness_installed = True

"""A run's result: :class:`RunSummary` (what ``summary.json``, the ``summary/*`` metrics and the run line
hold), the final/peak reward rule it uses, and ``flat`` (a spec as the MLflow params it logs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness import estimators

if TYPE_CHECKING:  # pragma: no cover
    from harness.config import RunConfig


@dataclass
class RunSummary:
    run_id: str
    signature: str
    status: str  # finished | diverged | pruned
    steps_done: int
    final_reward: float
    peak_reward: float
    time_per_step_s: float

    @classmethod
    def of(cls, run_id: str, cfg: "RunConfig", status: str, steps_done: int, rewards: list[float],
           step_times: list[float]) -> "RunSummary":
        """The summary of a run's reward curve and step times (final/peak: ``summary_rewards``)."""
        final, peak = summary_rewards(rewards)
        return cls(run_id=run_id, signature=cfg.signature, status=status, steps_done=steps_done,
                   final_reward=final, peak_reward=peak,
                   time_per_step_s=sum(step_times) / len(step_times) if step_times else float("nan"))

    def metrics(self) -> dict[str, float]:
        """What the summary logs to its MLflow run (``summary/*``)."""
        return {"summary/final_reward": self.final_reward, "summary/peak_reward": self.peak_reward,
                "summary/time_per_step_s": self.time_per_step_s}

    def line(self, cfg: "RunConfig") -> str:
        label = estimators.label(cfg.estimator.name, vars(cfg.estimator))  # the estimator's own, as analysis's
        return (f"{label} seed={cfg.seed} {cfg.task.name}/{cfg.model.name}: {self.status} after {self.steps_done} steps, "
                f"final reward {self.final_reward:.3f} (peak {self.peak_reward:.3f}), {self.time_per_step_s:.2f} s/step, "
                f"mlflow run {self.run_id[:8]} sig {self.signature}")


def flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        else:
            out[key] = v
    return out


def summary_rewards(xs: list[float]) -> tuple[float, float]:
    """``(final, peak)`` reward of a run: the report's definitions (``harness.curves``: final = mean of the
    last 10 rewards, peak = max of the centred 10-step moving average)."""
    from harness import curves

    return curves.final(xs), curves.peak(xs)[0]

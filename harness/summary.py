"""A run's result: :class:`RunSummary` (what ``summary.json``, the ``summary/*`` metrics and the run line
hold), the final/peak reward rule it uses, and ``flat`` (a spec as the MLflow params it logs)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from harness import estimators

if TYPE_CHECKING:  # pragma: no cover
    from harness.spec import RunConfig


@dataclass
class RunSummary:
    run_id: str
    signature: str
    status: str  # finished | diverged | pruned
    steps_done: int
    final_reward: float
    peak_reward: float
    time_per_step_s: float
    #: the store (redacted URI) that already held this run FINISHED, so nothing was trained; None: trained now.
    #: Not stored (``summary.json`` and its artifact hold the fields above: :meth:`stored`), not compared (the same
    #: result, found or made)
    found_in: str | None = field(default=None, compare=False)

    @classmethod
    def stored_fields(cls) -> list[str]:
        """The fields ``summary.json`` holds."""
        return [f.name for f in fields(cls) if f.name != "found_in"]

    def stored(self) -> dict[str, Any]:
        """What ``summary.json`` and the run's ``summary.json`` artifact hold."""
        data = asdict(self)
        return {k: data[k] for k in self.stored_fields()}

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
        """The run's one line; a result found finished in the store says so first: ``already finished in <store>
        (run <id>), not retrained``."""
        label = estimators.label(cfg.estimator.name, vars(cfg.estimator))  # the estimator's own, as analysis's
        what = f"{label} seed={cfg.seed} {cfg.task.name}/{cfg.model.name}"
        result = (f"{self.status} after {self.steps_done} steps, final reward {self.final_reward:.3f} "
                  f"(peak {self.peak_reward:.3f}), {self.time_per_step_s:.2f} s/step")
        if self.found_in is not None:
            return (f"{what}: already finished in {self.found_in} (run {self.run_id}), not retrained (--rerun trains "
                    f"it again): {result}, sig {self.signature}")
        return f"{what}: {result}, mlflow run {self.run_id[:8]} sig {self.signature}"


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

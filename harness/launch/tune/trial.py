"""One trial of a tune study = one run, executed inside a (Slurm or local) job: it asks the study for a
trial (or takes back its own after a requeue), reports the trailing reward to the pruner while it trains,
and tells the study the pre-registered objective (or PRUNED / FAIL)."""
from __future__ import annotations

import math
from typing import Any

from submitit.helpers import Checkpointable, DelayedSubmission

from harness.launch.expand import build_run
from harness.launch.progress import logged_rewards, run_history
from harness.launch.spec import SweepSpec
from harness.launch.tune.objective import score, trailing_mean
from harness.launch.tune.spec import TuneConfig, trial_overrides
from harness.launch.tune.algorithms import make_pruner, make_sampler
from harness.launch.tune.study import open_storage, quiet_optuna
from harness.record import CHECKPOINT_FILE


class TrialJob(Checkpointable):
    """One trial of the study = one run, executed inside a (Slurm or local) job."""

    def __init__(self, spec: SweepSpec, tune: TuneConfig, slot: int):
        self.spec, self.tune, self.slot = spec, tune, slot

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        return DelayedSubmission(TrialJob(self.spec, self.tune, self.slot), *args, **kwargs)

    def _own_trial(self, study):
        """The trial this slot already started (requeued job) or finished; None if none."""
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get("slot") == self.slot:
                return t
        return None

    def __call__(self) -> dict[str, Any]:
        import optuna
        from optuna.trial import TrialState

        from harness import backends, metrics as M

        quiet_optuna()
        tc = self.tune
        study = optuna.load_study(study_name=tc.study, storage=open_storage(tc.storage),
                                  sampler=make_sampler(tc.sampler, self.slot), pruner=make_pruner(tc.pruner))
        own = self._own_trial(study)
        if own is not None and own.state != TrialState.RUNNING:
            return {"trial": own.number, "state": own.state.name, "value": own.value, "resumed": False}
        if own is not None:
            trial = optuna.trial.Trial(study, own._trial_id)  # requeued: take our trial back
        else:
            trial = study.ask()
            trial.set_user_attr("slot", self.slot)
        try:
            job_id = job_id_here()
            if job_id:
                trial.set_user_attr("job_id", job_id)
            values = {p.key: p.suggest(trial) for p in tc.params}
            shown = " ".join(f"{k}={short(v)}" for k, v in values.items())
            cfg = build_run(self.spec, trial_overrides(self.spec, values), name=f"trial {trial.number} {shown}")
            sig = cfg.signature
            trial.set_user_attr("spec_sig", sig)
            trial.set_user_attr("run_dir", str(cfg.run_dir))
            dup = next((t for t in study.get_trials(deepcopy=False)
                        if t.number != trial.number and t.user_attrs.get("spec_sig") == sig), None)
            if dup is not None and dup.state in (TrialState.COMPLETE, TrialState.PRUNED):
                trial.set_user_attr("same_run_as", dup.number)
                study.tell(trial, dup.value if dup.state == TrialState.COMPLETE else None, state=dup.state)
                return {"trial": trial.number, "state": dup.state.name, "value": dup.value, "same_run_as": dup.number}
            if dup is not None and dup.state == TrialState.RUNNING:
                trial.set_user_attr("same_run_as", dup.number)
                study.tell(trial, state=TrialState.FAIL)
                return {"trial": trial.number, "state": "FAIL", "same_run_as": dup.number}

            window = tc.objective.window
            rewards: dict[int, float] = {}
            if (cfg.run_dir / CHECKPOINT_FILE).exists():  # resumed: earlier steps come from MLflow
                rewards.update(logged_rewards(cfg, self.spec.experiment))
            reported = set(own.intermediate_values) if own is not None else set()

            def on_step(step: int, metrics: dict[str, float]) -> bool:
                rewards[step] = float(metrics[M.REWARD_MEAN])
                done = step + 1
                if done % tc.report_every:
                    return False
                value = trailing_mean([rewards[s] for s in range(done - window, done) if s in rewards], window)
                if not math.isfinite(value):
                    return False
                if done not in reported:
                    trial.report(value, done)
                    reported.add(done)
                return trial.should_prune()

            tags = {"optuna_study": tc.study, "optuna_trial": str(trial.number)}
            summary = backends.get(cfg.backend.name).run(cfg, on_step=on_step, tags=tags, progress=False)
            for k, v in (("run_id", summary.run_id), ("status", summary.status), ("steps_done", summary.steps_done)):
                trial.set_user_attr(k, v)
            if summary.status == "pruned":
                study.tell(trial, state=TrialState.PRUNED)
                return {"trial": trial.number, "state": "PRUNED", "steps_done": summary.steps_done, "params": values}
            hist = run_history(cfg.tracking_uri, summary.run_id)
            value, onset = score(hist["rewards"], cfg.trainer.steps, tc.objective,
                                 diverged=summary.status == "diverged", losses=hist["losses"])
            trial.set_user_attr("collapse_onset", onset)
            study.tell(trial, value)
            return {"trial": trial.number, "state": "COMPLETE", "value": value, "params": values}
        except Exception as exc:  # noqa: BLE001 - preemption (SystemExit) must leave the trial RUNNING
            trial.set_user_attr("error", f"{type(exc).__name__}: {exc}"[:500])
            study.tell(trial, state=TrialState.FAIL)
            raise


def short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def job_id_here() -> str:
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # noqa: BLE001 - not inside a submitit job
        return ""

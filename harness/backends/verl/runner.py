"""Running verl for one spec: preflight checks, the MLflow run, the ``main_ppo`` subprocess.

The run folder follows ``harness.record``'s rules (:class:`VerlRecord`): ``run.json`` and ``summary.json``
carry the run's identity; verl's own files there (``mlflow_run_id``, ``git_commit``, ``verl_checkpoints/``)
belong to the MLflow run ``mlflow_run_id`` names and are resumed only when that run is this spec's in this
store. Finished (:func:`finished`) = ``summary.json`` is this spec's in this store and names an MLflow run
FINISHED in this store with this ``spec_sig`` whose logged steps are the planned run's (1..``trainer.steps``):
verl ends its MLflow run itself, FINISHED also after a crash (``Tracking.finish``/``__del__``), and carries on
without MLflow (or drops a step's metrics) when logging fails, so neither the store's status nor verl's exit
status alone is the harness's verdict. verl exiting 0 with steps missing ends the run FAILED (:func:`train`).
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from harness import store
from harness.spec import ConfigError, RunConfig
from harness.backends.verl import data, translate
from harness.provenance import git_commit
from harness.record import (SUMMARY_FILE, Identity, IdentityError, RunFolderError, RunRecord, active_run,
                            read_json)
from harness.tags import run_tags
from harness.uri import scrub
from harness.backends.verl.config import validate
from harness.backends.verl.signals import run_shielded
from harness.backends.verl.requirements import (PACKAGES_ALWAYS, PACKAGES_BY_STRATEGY, REQUIRED_VERSIONS,  # noqa: F401
                                                 importable, install_problems, verl_requirement_problems,
                                                 version_problems)

if TYPE_CHECKING:  # pragma: no cover
    from harness.tracking import Tracker

RUN_ID_FILE = "mlflow_run_id"
COMMIT_FILE = "git_commit"
#: verl's files of the folder's MLflow run: set aside (*.prev-<time>) with its summary by --rerun, or when the
#: summary was another store's result
RUN_FILES = (RUN_ID_FILE, COMMIT_FILE, translate.CHECKPOINT_DIR)


class VerlUnavailable(ConfigError):
    """This machine cannot run verl (no GPU, no vLLM, missing data): raised before anything starts."""

    def __init__(self, message: str):
        super().__init__("backend", message)


def command(cfg: RunConfig) -> list[str]:
    """The exact command ``train`` runs (less the MLflow run id it only knows at run time).

    Validates first: an invalid combination (R3 on FSDP, ...) raises ConfigError, whoever calls."""
    validate(cfg)
    return translate.command(cfg)


def required_packages(cfg: RunConfig) -> list[tuple[str, str, str]]:
    """(module, distribution, why) of every package the spec's verl path imports (not vLLM's own deps)."""
    return [*PACKAGES_ALWAYS, *PACKAGES_BY_STRATEGY[cfg.verl.strategy]]


def missing_packages(cfg: RunConfig) -> list[str]:
    return [f"{dist} ({why})" for module, dist, why in required_packages(cfg) if not importable(module)]


#: Hugging Face's switches for "no network": set on (or inherited by) nodes that cannot download
OFFLINE_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline_reason() -> str | None:
    """``HF_HUB_OFFLINE=1`` (or TRANSFORMERS_OFFLINE) where set to a true value here, else None."""
    for key in OFFLINE_ENV:
        if os.environ.get(key, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{key}={os.environ[key]}"
    return None


def offline_model_problem(path: str, key: str = "model.path") -> str | None:
    """Why ``path`` cannot be loaded on an offline node (not a local folder while HF_HUB_OFFLINE /
    TRANSFORMERS_OFFLINE is set), with the fix; None when online or when it is a local folder. A Hub id found
    in this machine's Hugging Face cache is named with its snapshot folder, the value to set."""
    reason = offline_reason()
    expanded = os.path.expanduser(path)
    if reason is None or os.path.isdir(expanded):
        return None
    hint = ""
    if not path.startswith(("/", ".", "~")) and path.count("/") == 1:
        try:
            from huggingface_hub import try_to_load_from_cache

            hit = try_to_load_from_cache(path, "config.json")
        except Exception:  # noqa: BLE001  (no hub library, a malformed id: no hint)
            hit = None
        if isinstance(hit, str):
            hint = f" (this machine's Hugging Face cache has it: {key}={os.path.dirname(hit)})"
    return (f"{path!r} is not a local folder and {reason} is set: the nodes cannot download it; set {key} to the "
            f"checkpoint's folder on a filesystem the nodes share{hint}, e.g. after `hf download {path} --local-dir "
            f"<shared>/{os.path.basename(path.rstrip('/'))}` on a machine with network")


def preflight(cfg: RunConfig) -> None:
    """Everything a verl run needs on this machine, checked before an MLflow run or a job exists.

    A model that an offline node cannot load is bad input (ConfigError naming ``model.path``, exit 2) and is
    reported first; the rest (packages, GPUs, data) is this machine's (VerlUnavailable)."""
    model_problem = offline_model_problem(cfg.model.path or "")
    if model_problem:
        raise ConfigError("model.path", model_problem)
    problems = []
    missing = missing_packages(cfg)
    if missing:
        problems.append(f"verl's {cfg.verl.trainer} trainer with verl.strategy={cfg.verl.strategy} needs "
                        f"{', '.join(missing)}: pip install -e '.[cluster]', or verl's image (docs/verl.md, "
                        "'Container route')")
    versions = version_problems()
    if versions:
        problems.append("; ".join(versions) + " (docs/verl.md, 'Container route')")
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or a CUDA/driver error at import)
        problems.append(f"vLLM is not importable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        gpus = 0
    if gpus == 0:
        problems.append("no CUDA GPU is visible (torch.cuda.is_available() is False)")
    elif gpus < cfg.verl.gpus_per_node:
        problems.append(f"{gpus} GPUs visible, the spec asks for verl.gpus_per_node={cfg.verl.gpus_per_node}")
    if cfg.verl.nnodes > 1 and not os.environ.get("RAY_ADDRESS"):
        problems.append(f"verl.nnodes={cfg.verl.nnodes}: a multi-node run starts inside a Slurm allocation "
                        "(python -m harness.sweep ... launcher=slurm, or the script of "
                        "harness.backends.verl.launch.sbatch_script)")
    train_files, val_files = translate.data_files(cfg)
    for f in (train_files, val_files):
        if not os.path.exists(os.path.expanduser(f)):
            problems.append(f"data file {f} is missing: prepare it with "
                            f"`{data.command(cfg.task.name, cfg.task.length, cfg.verl.data.root)}` (see docs/verl.md)")
    tools = translate.tools_file(cfg)
    if tools is not None and not os.path.exists(tools):
        problems.append(f"verl.tools file {tools} is missing")
    path = cfg.model.path or ""
    if path.startswith(("/", ".", "~")) and not os.path.exists(os.path.expanduser(path)):
        problems.append(f"model.path {path} does not exist")  # a Hub id (org/name) is fetched by verl
    if problems:
        raise VerlUnavailable("cannot run verl on this machine: " + "; ".join(problems) +
                              ". verl runs need GPU nodes with vLLM; `--dry-run` prints the command")


class VerlRecord(RunRecord):
    """A verl run's folder under :class:`~harness.record.RunRecord`'s rules (module docstring)."""

    run_id: str | None = None  # the folder's MLflow run, to resume

    def _archive(self, *names: str) -> None:
        """The run folder's files (RunRecord), and the checkpoints kept outside it (``verl.checkpoint_dir``, $SCRATCH) with
        them: a run set aside never resumes from its checkpoints."""
        super()._archive(*names)
        root = translate.checkpoint_root(self.cfg)
        if translate.CHECKPOINT_DIR in names and root != self.cfg.run_dir / translate.CHECKPOINT_DIR and root.exists():
            from harness.record import RunFolderError, _stamp

            try:
                root.replace(root.with_name(f"{root.name}.prev-{_stamp()}"))
            except OSError as exc:
                raise RunFolderError(f"cannot move {root} aside: {exc.strerror or exc}") from None

    def prepare(self) -> dict[str, Any] | None:
        """The store is reachable; the folder holds nothing of another spec (IdentityError); returns the
        folder's result if it answers this spec (:func:`finished`), else None (train; resume ``run_id`` if set)."""
        from harness.tracking import client_for

        store.check(self.cfg.tracking_uri)  # the identity's is redacted
        if self.rerun:
            self._archive(*RUN_FILES)
        had_summary = self.summary_path.exists()
        self._check_folder()  # --rerun, or another store's summary.json: set aside
        if had_summary and not self.summary_path.exists():
            self._archive(*RUN_FILES)  # that store's run: this one starts from scratch in this store
        client = client_for(self.cfg.tracking_uri)
        done = finished(client, self.cfg, self.finished_after_ms)
        if done is not None:
            self.attach(done["run_id"])
            return done
        self.run_id = self._resumable(client)
        return None

    def _resumable(self, client) -> str | None:
        """The MLflow run ``mlflow_run_id`` names, if it is this spec's in this store (else IdentityError)."""
        path = self.dir / RUN_ID_FILE
        if not path.exists():
            return None
        run_id, uri = path.read_text().strip(), self.identity.tracking_uri
        run = active_run(client, run_id)
        if run is None:
            raise IdentityError(f"{path} names MLflow run {run_id}, which is not in the store {uri!r} (another store, "
                                f"or a deleted run): set tracking.uri to its store to resume it, or --rerun to start "
                                f"over in this one")
        sig, exp = _spec_of(client, run)
        if (sig, exp) != (self.identity.signature, self.identity.experiment):
            raise IdentityError(f"{path} names MLflow run {run_id} of another run (spec_sig={sig!r}, experiment="
                                f"{exp!r}); use another out_dir for this one, or --rerun to set the old files aside "
                                f"(*.prev-<time>) and start this run there")
        return run_id

    def attach(self, run_id: str) -> None:
        """The folder's MLflow run is ``run_id``: ``run.json`` and ``mlflow_run_id`` name it."""
        self.identity = replace(self.identity, run_id=run_id)
        self._write_identity()
        (self.dir / RUN_ID_FILE).write_text(run_id + "\n")

    def write_summary(self) -> dict[str, Any]:
        """``summary.json`` (with the identity), written atomically: the folder's result."""
        data = {"run_id": self.identity.run_id, "signature": self.identity.signature, "status": "finished",
                "identity": asdict(self.identity)}
        tmp = self.summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data) + "\n")
        tmp.replace(self.summary_path)
        return data


def shown(cfg: RunConfig, argv: list[str]) -> str:
    """The verl command as it may be printed or logged: the store's URI in it redacted (a database URL's password;
    an http store's credentials are in the environment, not in the command: ``harness.uri.mlflow_uri``)."""
    return scrub(shlex.join(argv), cfg.tracking_uri)


def _spec_of(client, run) -> tuple[str | None, str]:
    """(spec_sig, experiment name) of an MLflow run: whose run it is."""
    return run.data.tags.get("spec_sig"), client.get_experiment(run.info.experiment_id).name


def summary(cfg: RunConfig) -> dict[str, Any] | None:
    """The folder's ``summary.json`` if it is this spec's in this store (its identity), else None."""
    data = read_json(cfg.run_dir / SUMMARY_FILE)
    ident = (data or {}).get("identity") or {}
    mine = Identity.of(cfg)  # its tracking_uri redacted, as the folder's files record it
    if data is None or ident.get("tracking_uri") != mine.tracking_uri or mine.differences(ident):
        return None
    return data


def logged_steps(client, run_id: str) -> list[int]:
    """The training steps verl logged into the MLflow run (its ``training/global_step`` metric), sorted, once each."""
    from harness.backends.verl.metrics import STEP_KEY

    return sorted({int(m.step) for m in client.get_metric_history(run_id, STEP_KEY)})


def steps_problem(client, run_id: str, planned: int) -> str | None:
    """Why the MLflow run's logged steps are not verl's whole planned run (steps 1..planned, each logged, the last
    being ``planned``), else None. verl carries on without MLflow after three failed initialisations and drops a
    step's metrics after three failed ``log_metrics`` (``verl/utils/tracking.py``): its exit status does not say."""
    steps = logged_steps(client, run_id)
    missing = sorted(set(range(1, planned + 1)) - set(steps))
    last = steps[-1] if steps else None
    if last == planned and not missing:
        return None
    if not steps:
        got = "no training step"
    else:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        got = f"steps up to {last}" + (f", {len(missing)} missing ({shown})" if missing else "")
    return (f"MLflow run {run_id} has {got} of the {planned} planned (trainer.steps): verl's MLflow logging "
            "failed (its log says 'MLflow initialization attempt' or 'mlflow.log_metrics failed'), or verl stopped "
            "early")


def finished(client, cfg: RunConfig, after_ms: int = 0) -> dict[str, Any] | None:
    """The folder's result if it answers this spec: :func:`summary` names an MLflow run FINISHED in this store
    (``client``'s) and experiment with this ``spec_sig``, started at or after ``after_ms``, whose logged steps are
    the planned run's (:func:`steps_problem`: the last is ``trainer.steps``, none missing); else None."""
    try:
        data = summary(cfg)
    except RunFolderError:  # unreadable: no answer (train() names the file)
        return None
    run = active_run(client, (data or {}).get("run_id"))
    if run is None or run.info.status != "FINISHED" or run.info.start_time < after_ms:
        return None
    if _spec_of(client, run) != (cfg.signature, cfg.tracking.experiment):
        return None
    return data if steps_problem(client, run.info.run_id, cfg.trainer.steps) is None else None


#: verl's checkpoint tracker in ``trainer.default_local_dir`` (``get_checkpoint_tracker_filename``): the step it resumes
CKPT_TRACKER = "latest_checkpointed_iteration.txt"


def prune_checkpoints(run_dir, root=None) -> list:
    """Delete the superseded ``global_step_*`` folders of ``<run_dir>/verl_checkpoints``: every one but the step
    verl's tracker names (the one ``resume_mode=auto`` resumes). verl's ``max_actor_ckpt_to_keep=1`` only knows the
    checkpoints its own process saved (``previous_saved_paths`` starts empty), so each requeue leaves the checkpoint
    it resumed from behind (~400 GB for Qwen3-30B-A3B with Adam states); a folder newer than the tracker is a save
    cut short. Nothing is deleted without a tracker naming an existing folder. Returns the deleted folders.
    ``root``: the checkpoint folder when it is not the run folder's (``verl.checkpoint_dir``)."""
    import re
    import shutil
    from pathlib import Path

    root = Path(root) if root is not None else Path(run_dir) / translate.CHECKPOINT_DIR
    try:
        keep = root / f"global_step_{int((root / CKPT_TRACKER).read_text().strip())}"
    except (OSError, ValueError):
        return []
    if not keep.is_dir():
        return []
    gone = []
    for path in sorted(root.iterdir()):
        if path.is_dir() and re.fullmatch(r"global_step_\d+", path.name) and path != keep:
            shutil.rmtree(path)
            gone.append(path)
    if gone:
        print(f"[harness] deleted superseded verl checkpoints {', '.join(p.name for p in gone)} (kept {keep.name})",
              flush=True)
    return gone


def _tracker(cfg: RunConfig, commit: str, run_id: str | None = None) -> "Tracker":
    """This run's MLflow run: re-attached (``run_id``, the folder's, checked by VerlRecord), else created
    (tags, spec, command)."""
    import yaml

    from harness.tracking import Tracker

    if run_id is not None:
        return Tracker(cfg.tracking_uri, cfg.tracking.experiment, run_id=run_id)
    tracker = Tracker(cfg.tracking_uri, cfg.tracking.experiment, run_name=translate.run_name(cfg),
                      tags=run_tags(cfg, commit))
    spec = yaml.safe_dump(cfg.public_dict(), sort_keys=False)
    tracker.log_text(spec, "spec.yaml")
    tracker.log_text(shown(cfg, translate.command(cfg, commit=commit)), "verl_command.txt")
    return tracker


def train(cfg: RunConfig, tracker: "Tracker | None" = None, rerun: bool = False,
          finished_after_ms: int = 0) -> dict[str, Any]:
    """Run verl for this spec (resuming the folder's run of this spec in this store); returns its summary.

    Raises VerlUnavailable off a GPU node (before the store is touched, unless the folder may hold the
    result), IdentityError for a folder of another run. ``rerun``: the folder's run is set aside, a new
    MLflow run starts from scratch. A non-zero exit of verl ends the MLflow run FAILED."""
    validate(cfg)
    record = VerlRecord(cfg, rerun=rerun, finished_after_ms=finished_after_ms)
    answerable = not rerun and record.summary_path.exists()
    if not answerable:
        preflight(cfg)
    done = record.prepare()
    if done is not None:
        print(f"[harness] finished: MLflow run {done['run_id']} ({record.summary_path}); nothing to do", flush=True)
        return done
    if answerable:
        preflight(cfg)
    # verl logs its whole config as MLflow params, and MLflow refuses a param whose value changes:
    # a requeued job must send the same config, so the commit is pinned at the MLflow run's first launch
    commit_file = cfg.run_dir / COMMIT_FILE
    if record.run_id is None or not commit_file.exists():
        commit_file.write_text(git_commit() + "\n")
    commit = commit_file.read_text().strip()
    tracker = tracker or _tracker(cfg, commit, record.run_id)
    record.attach(tracker.run_id)  # requeued jobs find it
    record.tracker = tracker
    env = {**translate.environment(cfg), "MLFLOW_RUN_ID": tracker.run_id}
    argv = translate.command(cfg, commit=commit, env=env)
    if os.environ.get("SLURM_CPUS_PER_TASK") and not os.environ.get("RAY_ADDRESS"):
        # a single-node job starts Ray itself: give it the CPUs Slurm allotted, not the node's count
        argv.append(f"ray_kwargs.ray_init.num_cpus={int(os.environ['SLURM_CPUS_PER_TASK'])}")
    print(f"[harness] MLflow run {tracker.run_id}; running: {shown(cfg, argv)}", flush=True)
    prune_checkpoints(cfg.run_dir, translate.checkpoint_root(cfg))  # what earlier attempts left beside the one verl resumes
    try:
        proc = run_shielded(argv, env={**os.environ, **env})  # USR2 ignored in verl's tree (signals.py)
    except BaseException as exc:  # an interrupt: the run ends KILLED (RunRecord.end), verl resumes it
        record.end(exc)
        raise
    finally:
        prune_checkpoints(cfg.run_dir, translate.checkpoint_root(cfg))  # the one verl resumed from, now superseded by its later saves
    # set after verl has exited: its MLflow adapter may have ended the run FINISHED in its teardown
    if proc.returncode != 0:
        tracker.set_tags({"status": "failed"})
        tracker.finish("FAILED")
        raise RuntimeError(f"verl exited with status {proc.returncode} (MLflow run {tracker.run_id})")
    from harness.tracking import client_for

    problem = steps_problem(client_for(cfg.tracking_uri), tracker.run_id, cfg.trainer.steps)
    if problem:  # exit 0, but the store does not hold the run: not a result
        tracker.set_tags({"status": "failed", "failure": "incomplete metrics"})
        tracker.finish("FAILED")
        raise RuntimeError(f"verl exited 0 but {problem}; the run ends FAILED. The lost steps cannot be logged "
                           "again from verl's checkpoints: --rerun trains the run again from scratch")
    tracker.set_tags({"status": "finished"})
    tracker.finish("FINISHED")  # before summary.json names it as this folder's result
    result = record.write_summary()
    from harness.backends.verl.retention import retain

    # every step's metrics are in the store: keep of the checkpoints only what the spec asks for
    print(f"[harness] {retain(translate.checkpoint_root(cfg), cfg.verl.keep_checkpoint, cfg.verl.strategy)}",
          flush=True)
    return result

"""One verl run on a Slurm allocation: a Ray head on the first node, Ray workers on the others, and
the verl driver on the head. Two ways in, both ending in :func:`node_main` on every node:

* sbatch:   ``sbatch_script(cfg, SlurmResources(...))`` -> a script whose ``srun`` starts one
            ``python -m harness.backends.verl.launch node --spec <run_dir>/spec.json`` per node;
            ``sbatch_command(path)`` submits it.
* submitit: ``executor.update_parameters(**slurm_parameters(cfg, res))`` then
            ``executor.submit(VerlJob(cfg.to_dict()))``; ``VerlJob.checkpoint`` requeues it.

GPUs and nodes come from the spec (``verl.nnodes``, ``verl.gpus_per_node``), time, partition and
account from :class:`SlurmResources` (launcher settings, not part of the run's signature).
Preemption or the time limit requeues the job (``--requeue`` and a USR1 trap / submitit's
checkpoint); the requeued job continues the same MLflow run (``<run_dir>/mlflow_run_id``) and verl
resumes from its last checkpoint (``trainer.resume_mode=auto`` in ``<run_dir>/verl_checkpoints`` or
``verl.checkpoint_dir``). Before the time limit verl saves early: the job's end time (Slurm) minus the
USR1 lead and the save budget (``memory.save_budget_s``) is exported to verl's early-save hook
(``should_save_ckpt_esi`` reads ``ESI_ENV``), and the USR1 handler requeues only once no save is under way
(:func:`wait_for_save`).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from submitit.helpers import Checkpointable, DelayedSubmission

from harness.backends.verl.config import validate
from harness import container
from harness.backends.verl.signals import run_shielded, write_speed_env
from harness.uri import ROOT
from harness.spec import RunConfig

SPEC_FILE = "spec.json"
DONE_FILE = "verl_done"  # {"job": ..., "ok": bool}: the head's last word to the workers of this job
HEAD_FILE = "ray_head.json"  # {"job": ..., "address": "ip:port"}: where this job's Ray head listens
RAY_PORT = 6379
NODES_TIMEOUT_S = 900
#: a worker retries joining the head (``ray start --address``) until this long after its own start
JOIN_TIMEOUT_S = NODES_TIMEOUT_S
JOIN_BACKOFF_S = (2.0, 30.0)  # first wait between tries, doubling up to the second
POLL_S = 10.0  # a joined worker checks for the head's last word / the head's health this often
HEAD_LOST_AFTER = 3  # failed health checks in a row: the head is gone
#: the expiry (Unix seconds) verl's early-save hook reads (verl.utils.checkpoint.checkpoint_manager.
#: should_save_ckpt_esi): after each step, verl saves when expiry - now <= 60 s + its longest step + esi_redundant_time
ESI_ENV = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
SIGNAL_ENV = "HARNESS_SIGNAL_BEFORE_S"  # the USR1 lead (s) the node process plans the early save for
REQUEUE_MARGIN_S = 30.0  # the USR1 handler requeues at the latest this long before the end time
SAVE_POLL_S = 5.0


@dataclass
class SlurmResources:
    """Where and how long: launcher settings (they do not change what a run computes)."""

    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    time_min: int = 24 * 60
    cpus_per_node: int = 64
    mem: str = "0"  # all of the node's memory
    exclusive: bool = True
    signal_before_s: int = 300  # USR1 this long before the time limit -> requeue
    setup: list[str] = field(default_factory=list)  # shell lines run first (module load, venv activation)
    extra_sbatch: list[str] = field(default_factory=list)  # e.g. ["--reservation=rl"]
    container: dict = field(default_factory=dict)  # launcher.container: the steps run in the image


def resources_from_launcher(launcher: Any) -> SlurmResources:
    """SlurmResources from a sweep's launcher settings (harness.launch.spec.LauncherConfig or a dict)."""
    get = (lambda k, d=None: launcher.get(k, d)) if isinstance(launcher, dict) else \
        (lambda k, d=None: getattr(launcher, k, d))
    additional = dict(get("additional") or {})
    extra = [f"--{k}" if v is True else f"--{k}={v}" for k, v in additional.items() if k != "exclusive"]
    mem_gb = get("mem_gb")
    return SlurmResources(partition=get("partition"), account=get("account"), qos=get("qos"),
                          constraint=get("constraint"), time_min=int(get("time_min", 24 * 60)),
                          cpus_per_node=int(get("cpus_per_task", 64)),
                          mem="0" if mem_gb in (None, 0) else f"{int(mem_gb)}G",
                          exclusive=bool(additional.get("exclusive", True)),
                          signal_before_s=int(get("signal_delay_s", 300)), setup=list(get("setup") or []),
                          extra_sbatch=extra, container=dict(get("container") or {}))


def job_name(cfg: RunConfig) -> str:
    return f"verl-{cfg.estimator.name}-{cfg.signature}"


def write_spec(cfg: RunConfig) -> Path:
    """The resolved spec the nodes read (``<run_dir>/spec.json``)."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    path = cfg.run_dir / SPEC_FILE
    path.write_text(json.dumps(cfg.to_dict(), indent=1, sort_keys=True))
    return path


def read_spec(path: str | Path) -> RunConfig:
    from harness.spec import build

    return build(json.loads(Path(path).read_text()))


def slurm_parameters(cfg: RunConfig, res: SlurmResources | None = None) -> dict[str, Any]:
    """Parameters for ``submitit.AutoExecutor.update_parameters`` (one task per node)."""
    validate(cfg)
    res = res or SlurmResources()
    params: dict[str, Any] = {
        "name": job_name(cfg), "nodes": cfg.verl.nnodes, "tasks_per_node": 1,
        "gpus_per_node": cfg.verl.gpus_per_node, "cpus_per_task": res.cpus_per_node, "timeout_min": res.time_min,
        "slurm_mem": res.mem, "slurm_signal_delay_s": res.signal_before_s,
    }
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(res, key):
            params[f"slurm_{key}"] = getattr(res, key)
    if res.exclusive:
        params["slurm_exclusive"] = True
    if res.setup:
        params["slurm_setup"] = list(res.setup)
    return params


def sbatch_script(cfg: RunConfig, res: SlurmResources | None = None, python: str | None = None) -> str:
    """A self-contained sbatch script for the run (writes ``<run_dir>/spec.json`` as a side effect)."""
    validate(cfg)
    res = res or SlurmResources()
    spec = write_spec(cfg)
    v, run_dir = cfg.verl, cfg.run_dir
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name(cfg)}",
             f"#SBATCH --nodes={v.nnodes}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gpus-per-node={v.gpus_per_node}",
             f"#SBATCH --cpus-per-task={res.cpus_per_node}",
             f"#SBATCH --mem={res.mem}",
             f"#SBATCH --time={res.time_min}",  # minutes
             f"#SBATCH --output={run_dir}/slurm-%j.out",
             "#SBATCH --requeue",
             f"#SBATCH --signal=B:USR1@{res.signal_before_s}"]
    lines += [f"#SBATCH --{k}={getattr(res, k)}" for k in ("partition", "account", "qos", "constraint") if getattr(res, k)]
    if res.exclusive:
        lines.append("#SBATCH --exclusive")
    lines += [f"#SBATCH {x}" for x in res.extra_sbatch]
    c = container.parse(res.container)
    host_python = python or sys.executable
    node = f"{container.python_command(c, host_python)} -m harness.backends.verl.launch node --spec {shlex.quote(str(spec))}"
    requeue = (f"{container.one_off(c, host_python)} -m harness.backends.verl.launch requeue "
               f"--spec {shlex.quote(str(spec))}")
    srun = shlex.join(["srun", "--kill-on-bad-exit=1", f"--nodes={v.nnodes}", "--ntasks-per-node=1",
                       *container.srun_args(c)])
    lines += ["set -euo pipefail",
              # (in the image the harness is the image's: no cd into this machine's checkout)
              *([] if c is not None else [f"cd {shlex.quote(str(ROOT))}"]),
              *res.setup,
              f"export {SIGNAL_ENV}={res.signal_before_s}",
              "# near the time limit: verl has saved early (its ESI hook, fed the end time); requeue once no save is",
              "# under way; the job resumes from verl's last checkpoint, same MLflow run",
              f'on_usr1() {{ {requeue} || scontrol requeue "$SLURM_JOB_ID"; }}',
              "trap on_usr1 USR1",
              f"{srun} {node} &",
              "wait $!"]
    return "\n".join(lines) + "\n"


def sbatch_command(script_path: str | Path) -> list[str]:
    return ["sbatch", "--parsable", str(script_path)]


class VerlJob(Checkpointable):
    """A submitit callable run on every node of the allocation (``tasks_per_node=1``); on timeout or
    preemption submitit calls ``checkpoint`` and requeues it, and verl resumes from its checkpoint."""

    def __init__(self, spec: dict[str, Any], signal_before_s: int = SlurmResources.signal_before_s):
        self.spec = spec
        self.signal_before_s = signal_before_s  # slurm_parameters' slurm_signal_delay_s

    def __call__(self) -> dict[str, Any]:
        from harness.spec import build

        os.environ.setdefault(SIGNAL_ENV, str(self.signal_before_s))  # the job's environment wins
        return node_main(build(self.spec))

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission:
        from harness.backends.verl.translate import checkpoint_root
        from harness.spec import build

        cfg = build(self.spec)
        if _node_rank() == 0:  # the head's verl saves: requeue once its save is complete
            wait_for_save(checkpoint_root(cfg), _requeue_deadline(self.signal_before_s))
        return DelayedSubmission(VerlJob(self.spec, self.signal_before_s), *args, **kwargs)


# ------------------------------------------------------------------------------ saving before the time limit
def slurm_end_time(env: dict[str, str] | None = None) -> float | None:
    """This Slurm job's end time (Unix seconds): ``SLURM_JOB_END_TIME`` if set, else ``squeue -o %e`` (local time);
    None outside a job or when Slurm does not say."""
    import datetime

    env = os.environ if env is None else env
    if env.get("SLURM_JOB_END_TIME", "").isdigit():
        return float(env["SLURM_JOB_END_TIME"])
    job = env.get("SLURM_JOB_ID")
    if not job:
        return None
    try:
        out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    try:
        return datetime.datetime.fromisoformat(out.stdout.strip()).timestamp() if out.returncode == 0 else None
    except ValueError:  # N/A, Unknown, NONE: no time limit
        return None


def esi_environment(cfg: RunConfig, signal_before_s: float | None = None, end: float | None = None) -> dict[str, str]:
    """``{ESI_ENV: expiry}`` for verl's early-save hook: the job's end time minus the USR1 lead and the save budget
    (``memory.save_budget_s``, from the checkpoint's size), so verl's last save completes before the USR1 handler
    requeues. Empty when verl saves no checkpoints (``trainer.checkpoint_every <= 0``) or the end time is unknown."""
    from harness.backends.verl.memory import save_budget_s

    if cfg.trainer.checkpoint_every <= 0:
        return {}
    end = slurm_end_time() if end is None else end
    if end is None:
        return {}
    return {ESI_ENV: f"{end - _lead(signal_before_s) - save_budget_s(cfg):.0f}"}


def _lead(signal_before_s: float | None = None) -> float:
    """How long before the end time USR1 comes: the argument, else ``HARNESS_SIGNAL_BEFORE_S``, else 300 s."""
    return float(os.environ.get(SIGNAL_ENV, SlurmResources.signal_before_s)) if signal_before_s is None else signal_before_s


def _requeue_deadline(signal_before_s: float | None = None) -> float:
    end = slurm_end_time()
    if end is None:
        end = time.time() + _lead(signal_before_s)
    return end - REQUEUE_MARGIN_S


def save_in_progress(root: Path) -> str | None:
    """The ``global_step_*`` folder verl is writing (newer than the step its tracker names), else None."""
    import re

    from harness.backends.verl.runner import CKPT_TRACKER

    try:
        latest = int((root / CKPT_TRACKER).read_text().strip())
    except (OSError, ValueError):
        latest = -1
    try:
        steps = [int(m.group(1)) for p in root.iterdir() if (m := re.fullmatch(r"global_step_(\d+)", p.name))]
    except OSError:
        return None
    newer = [n for n in steps if n > latest]
    return f"global_step_{max(newer)}" if newer else None


def wait_for_save(root: Path, deadline: float, poll_s: float = SAVE_POLL_S, sleep=time.sleep,
                  clock=time.time) -> bool:
    """Wait while verl writes a checkpoint under ``root`` (:func:`save_in_progress`), at most until ``deadline``
    (Unix seconds). True when no save is under way (any more), False when the deadline cut the wait short."""
    while True:
        busy = save_in_progress(root)
        if busy is None:
            return True
        if clock() >= deadline:
            print(f"[harness] the save of {busy} is not complete at the deadline: requeue anyway "
                  "(the job resumes from the checkpoint before it)", flush=True)
            return False
        print(f"[harness] waiting for verl's save of {busy} before requeueing", flush=True)
        sleep(min(poll_s, max(0.0, deadline - clock())))


def requeue(cfg: RunConfig) -> int:
    """The USR1 handler of the sbatch script: wait for verl's save (:func:`wait_for_save`), then
    ``scontrol requeue`` this job."""
    from harness.backends.verl.translate import checkpoint_root

    root = checkpoint_root(cfg)
    wait_for_save(root, _requeue_deadline())
    job = os.environ.get("SLURM_JOB_ID")
    print(f"[harness] time limit near: requeue job {job} (checkpoints: {root})", flush=True)
    return subprocess.run(["scontrol", "requeue", str(job)], check=False).returncode


# ------------------------------------------------------------------------------ inside the job
def _hostnames() -> list[str]:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nodelist:
        return [socket.gethostname()]
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def _node_rank() -> int:
    for key in ("SLURM_NODEID", "SLURM_PROCID"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


def _job_key() -> str:
    """This job attempt: the Slurm job id and its restart count (a requeued job is a new attempt)."""
    return f"{os.environ.get('SLURM_JOB_ID', 'local')}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"


def _usable(address: str) -> bool:
    import ipaddress

    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.version == 4 and not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


def routable_ip() -> str:
    """This node's first routable IPv4 address, as ``slurm/ray_multinode.sbatch`` finds it (``hostname -I``): not
    ``socket.gethostbyname(hostname)``, which is 127.0.1.1 on Debian-style ``/etc/hosts``. Fallbacks: the
    addresses the hostname resolves to, minus loopback; then the source address of a route (a UDP socket's
    ``connect`` sends nothing)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    try:
        out += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    for address in out:
        if _usable(address):
            return address
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        if _usable(address):
            return address
    except OSError:
        pass
    raise RuntimeError(f"no routable IPv4 address on {socket.gethostname()} (hostname -I: {' '.join(out) or 'nothing'}): "
                       "the other nodes could not reach a Ray head here")


def _read_marker(path: Path, job: str) -> dict[str, Any] | None:
    """A marker file of this job attempt (``HEAD_FILE``, ``DONE_FILE``), else None (absent, partial, stale)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("job") == job else None


def _write_marker(path: Path, **data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(path)  # atomic: a worker never reads half of it


def join_cluster(run_dir: Path, job: str, res: list[str], timeout_s: float | None = None,
                 backoff_s: tuple[float, float] | None = None, sleep=time.sleep, clock=time.monotonic) -> str:
    """A worker node: wait for this job's head to announce its address (``HEAD_FILE``) and join it with ``ray
    start --address`` (not blocking), trying again with a doubling wait until ``timeout_s`` after the call: a
    worker may start before the head, or before the head's GCS answers. Returns the head's address."""
    timeout_s = float(os.environ.get("HARNESS_RAY_JOIN_TIMEOUT_S", JOIN_TIMEOUT_S)) if timeout_s is None else timeout_s
    wait, most = backoff_s or (float(os.environ.get("HARNESS_RAY_JOIN_BACKOFF_S", JOIN_BACKOFF_S[0])), JOIN_BACKOFF_S[1])
    deadline, tries, last = clock() + timeout_s, 0, "the head has not announced its address yet"
    print(f"[harness] waiting for the Ray head of job {job} ({run_dir / HEAD_FILE}), up to {timeout_s:.0f} s",
          flush=True)
    while True:
        head = _read_marker(run_dir / HEAD_FILE, job)
        if head is not None:
            tries += 1
            try:
                proc = run_shielded(["ray", "start", f"--address={head['address']}", *res], capture_output=True,
                                    text=True, timeout=max(60.0, min(300.0, deadline - clock())))
                if proc.returncode == 0:
                    print(f"[harness] joined the Ray head at {head['address']} (try {tries})", flush=True)
                    return head["address"]
                tail = (proc.stderr or proc.stdout or "").strip().splitlines()
                last = f"ray start --address={head['address']} exited {proc.returncode}: {tail[-1] if tail else ''}"
            except subprocess.TimeoutExpired:
                last = f"ray start --address={head['address']} did not return"
            subprocess.run(["ray", "stop", "--force"], capture_output=True, check=False)  # a half-started raylet
        if clock() + wait > deadline:
            raise RuntimeError(f"this worker could not join the Ray head within {timeout_s:.0f} s ({tries} tries; "
                               f"last: {last}); HARNESS_RAY_JOIN_TIMEOUT_S sets the limit")
        sleep(wait)
        wait = min(2 * wait, most)


def _head_alive(address: str) -> bool:
    try:
        return subprocess.run(["ray", "health-check", f"--address={address}"], capture_output=True,
                              timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def serve_until_done(run_dir: Path, job: str, address: str, poll_s: float | None = None, sleep=time.sleep) -> bool:
    """A joined worker: wait for the head's last word (``DONE_FILE``); True when the run succeeded. Raises when
    the head stops answering ``HEAD_LOST_AFTER`` health checks in a row without a word (it was killed)."""
    poll_s = float(os.environ.get("HARNESS_RAY_POLL_S", POLL_S)) if poll_s is None else poll_s
    lost = 0
    while True:
        done = _read_marker(run_dir / DONE_FILE, job)
        if done is not None:
            return bool(done.get("ok"))
        lost = 0 if _head_alive(address) else lost + 1
        if lost >= HEAD_LOST_AFTER:
            raise RuntimeError(f"the Ray head at {address} stopped answering before the verl run finished "
                               "(see the head node's log)")
        sleep(poll_s)


def _wait_for_nodes(address: str, n: int, timeout_s: float = NODES_TIMEOUT_S) -> None:
    import ray

    ray.init(address=address, logging_level="ERROR")
    try:
        deadline = time.time() + timeout_s
        while True:
            alive = [x for x in ray.nodes() if x.get("Alive")]
            if len(alive) >= n:
                return
            if time.time() > deadline:
                raise RuntimeError(f"only {len(alive)} of {n} Ray nodes joined within {timeout_s:.0f} s")
            time.sleep(5)
    finally:
        ray.shutdown()


def node_main(cfg: RunConfig, port: int | None = None) -> dict[str, Any]:
    """Run on each node of the allocation: head (rank 0) starts Ray and the verl driver, others join.
    Returns the run's summary on the head node, ``{"node": rank}`` on the others.

    The head listens on its routable address (:func:`routable_ip`) and announces it in ``<run_dir>/HEAD_FILE``
    (the run folder is on the filesystem every node reads the spec from); workers, which may start first, join
    it with retries (:func:`join_cluster`) and leave when the head writes its last word (``DONE_FILE``). Both
    files carry the job attempt (:func:`_job_key`), so a requeued job never reads the previous attempt's."""
    from harness.backends.verl import train
    from harness.backends.verl.runner import summary

    v = cfg.verl
    if cfg.trainer.checkpoint_every > 0 and _node_rank() == 0:  # the head's verl saves: its budget, measured
        from harness.backends.verl.translate import checkpoint_root

        os.environ.update(write_speed_env(checkpoint_root(cfg)))
    esi = esi_environment(cfg)
    if esi:  # inherited by main_ppo (one node) or the raylets (several): verl's trainer reads it
        os.environ.update(esi)
        print(f"[harness] verl saves early from {time.strftime('%H:%M:%S', time.localtime(float(esi[ESI_ENV])))} "
              f"on ({ESI_ENV}={esi[ESI_ENV]})", flush=True)
    if v.nnodes == 1:
        train(cfg)
        return summary(cfg) or {}
    port = port or int(os.environ.get("HARNESS_RAY_PORT", RAY_PORT))
    hosts = _hostnames()
    if len(hosts) < v.nnodes:
        raise RuntimeError(f"the allocation has {len(hosts)} nodes, the spec asks for verl.nnodes={v.nnodes}")
    from harness.backends.verl.translate import environment

    os.environ.update(environment(cfg))  # inherited by the raylets, hence by every Ray worker
    res = ["--num-gpus", str(v.gpus_per_node), "--disable-usage-stats"]
    job, run_dir, rank = _job_key(), cfg.run_dir, _node_rank()
    if rank == 0:
        head_ip = routable_ip()
        address = f"{head_ip}:{port}"
        ok = False
        try:
            run_shielded(["ray", "start", "--head", f"--node-ip-address={head_ip}", f"--port={port}",
                          "--include-dashboard=false", *res], check=True)  # the raylets ignore USR2 (signals.py)
            _write_marker(run_dir / HEAD_FILE, job=job, address=address, host=hosts[0])
            _wait_for_nodes(address, v.nnodes)
            os.environ["RAY_ADDRESS"] = address  # main_ppo's ray.init() joins this cluster
            train(cfg)
            ok = True
        finally:
            _write_marker(run_dir / DONE_FILE, job=job, ok=ok)
            subprocess.run(["ray", "stop", "--force"], check=False)
        return summary(cfg) or {}
    address = join_cluster(run_dir, job, res)
    try:
        ok = serve_until_done(run_dir, job, address)
    finally:
        subprocess.run(["ray", "stop", "--force"], check=False)
    if not ok:
        raise RuntimeError("the verl run on the head node failed (see the head node's log)")
    return {"node": rank}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.backends.verl.launch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    node = sub.add_parser("node", help="run on each node of the allocation (called by the sbatch script)")
    node.add_argument("--spec", required=True)
    script = sub.add_parser("sbatch", help="print the sbatch script of a spec (Hydra overrides after --)")
    script.add_argument("--partition")
    script.add_argument("--account")
    script.add_argument("--time-min", type=int, default=24 * 60)
    script.add_argument("overrides", nargs="*")
    again = sub.add_parser("requeue", help="the USR1 handler: requeue this job once verl's save is complete")
    again.add_argument("--spec", required=True)
    args = ap.parse_args(argv)
    if args.cmd == "node":
        node_main(read_spec(args.spec))
        return 0
    if args.cmd == "requeue":
        return requeue(read_spec(args.spec))
    from harness.spec import load

    cfg = load(list(args.overrides))
    print(sbatch_script(cfg, SlurmResources(partition=args.partition, account=args.account, time_min=args.time_min)),
          end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Multi-node start (issue 30, item 2): the Ray head's routable address, workers that join with retries.

No Slurm allocation and no Ray cluster here: ``ray``, ``scontrol`` and ``hostname`` are replaced on PATH by the
FAKE scripts below (named as such). ``node_main`` runs for real: the worker node as its own process through the
entry point the sbatch script calls (``python -m harness.backends.verl.launch node --spec ...``), started
*before* the head; the head in this process, with verl's driver (``train``) and the head's wait for the nodes
(``_wait_for_nodes``, which needs Ray's Python client against a live GCS) replaced by fakes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.backends.verl import launch
from harness.uri import ROOT

#: FAKE of Ray's CLI: the cluster is files in $FAKE_RAY_STATE. ``start --head`` records the head's address, whose
#: GCS answers $FAKE_RAY_HEAD_DELAY_S later; ``start --address=A`` joins (file worker-<node>) only if A is the
#: head's and its GCS answers, else exits 1 as Ray does ("Unable to connect to GCS"); ``health-check`` likewise;
#: ``stop`` removes this node ($FAKE_RAY_NODE). Every call is appended to calls.log, with its USR2 disposition (the
#: raylets it stands for inherit it: issue 44, signals.py).
FAKE_RAY = r'''
import json, os, signal, sys, time
from pathlib import Path
state, node, args = Path(os.environ["FAKE_RAY_STATE"]), os.environ.get("FAKE_RAY_NODE", "?"), sys.argv[1:]
opt = lambda name: next((a.split("=", 1)[1] for a in args if a.startswith(name + "=")), None)
def read_head():  # the head's "stop" may unlink the file (or its "start" be writing it) while another node reads it
    try:
        return json.loads((state / "head").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
head = read_head()
up = head is not None and time.time() >= head["up_at"]
def log(rc):
    with open(state / "calls.log", "a") as f:
        usr2 = "ignored" if signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN else "default"
        f.write(json.dumps({"t": time.time(), "node": node, "args": args, "rc": rc, "usr2": usr2}) + "\n")
    sys.exit(rc)
if args[0] == "start" and "--head" in args:
    (state / "head").write_text(json.dumps({"address": f"{opt('--node-ip-address')}:{opt('--port')}",
                                            "up_at": time.time() + float(os.environ.get("FAKE_RAY_HEAD_DELAY_S", "0"))}))
    log(0)
if args[0] == "start":
    if not (up and head["address"] == opt("--address")):
        print(f"Unable to connect to GCS at {opt('--address')}", file=sys.stderr)
        log(1)
    (state / f"worker-{node}").write_text(opt("--address"))
    log(0)
if args[0] == "health-check":
    log(0 if up and head["address"] == opt("--address") else 1)
if args[0] == "stop":
    for f in ([state / "head"] if node == "head" else []) + [state / f"worker-{node}"]:
        f.unlink(missing_ok=True)
    log(0)
log(2)
'''
#: FAKE of ``hostname``: ``-I`` lists a Debian-style loopback alias first, then the routable address
FAKE_HOSTNAME = "import sys; print('127.0.1.1 10.0.0.7 fe80::1' if '-I' in sys.argv else 'node-a')"
#: FAKE of ``scontrol show hostnames``: a two-node allocation
FAKE_SCONTROL = "print('node-a'); print('node-b')"


@pytest.fixture
def fake_cluster(tmp_path, monkeypatch):
    """FAKE ray/hostname/scontrol first on PATH; returns (state folder, environment for a node process)."""
    bin_dir, state = tmp_path / "bin", tmp_path / "ray_state"
    bin_dir.mkdir()
    state.mkdir()
    for name, code in (("ray", FAKE_RAY), ("hostname", FAKE_HOSTNAME), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{code}\n")
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_RAY_STATE": str(state),
           "SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "SLURM_JOB_NODELIST": "node-[a-b]",
           "HARNESS_RAY_PORT": "6390", "HARNESS_RAY_JOIN_TIMEOUT_S": "120", "HARNESS_RAY_JOIN_BACKOFF_S": "0.2",
           "HARNESS_RAY_POLL_S": "0.2", "FAKE_RAY_HEAD_DELAY_S": "5",  # a loaded machine still sees a refusal
           "HARNESS_CKPT_WRITE_GBPS": "", "HARNESS_CKPT_PROBE_GB": "0.02"}  # the head measures (20 MB here)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return state, env


def _calls(state: Path) -> list[dict]:
    path = state / "calls.log"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _wait(predicate, what: str, timeout_s: float = 120.0):
    deadline = time.time() + timeout_s
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_routable_ip_skips_the_debian_loopback_alias(fake_cluster):
    assert launch.routable_ip() == "10.0.0.7"  # hostname -I: 127.0.1.1 10.0.0.7 fe80::1


def test_a_worker_started_before_the_head_joins_it(spec, tmp_path, fake_cluster, monkeypatch):
    state, env = fake_cluster
    cfg = spec("estimator=tis", "model=qwen3_30b_a3b", "verl.nnodes=2", tmp=tmp_path)
    spec_file = launch.write_spec(cfg)
    # the previous attempt of this job (restart 0) left its markers: this attempt (restart 1) must ignore them
    (cfg.run_dir / launch.HEAD_FILE).write_text(json.dumps({"job": "77.0", "address": "10.9.9.9:6390"}))
    (cfg.run_dir / launch.DONE_FILE).write_text(json.dumps({"job": "77.0", "ok": True}))

    out = tmp_path / "worker.out"
    worker = subprocess.Popen(  # node 1, through the entry point the sbatch script runs on every node
        [sys.executable, "-m", "harness.backends.verl.launch", "node", "--spec", str(spec_file)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "SLURM_NODEID": "1", "FAKE_RAY_NODE": "worker1"},
        stdout=out.open("w"), stderr=subprocess.STDOUT)
    try:
        _wait(lambda: "waiting for the Ray head of job 77.1" in out.read_text(), "the worker to wait for the head")
        time.sleep(1.0)  # still waiting: neither the stale head address nor the stale last word were taken
        assert worker.poll() is None and _calls(state) == []

        # the head, in this process: verl's driver and Ray's Python client faked
        ran = {}

        def fake_wait_for_nodes(address, n, timeout_s=launch.NODES_TIMEOUT_S):  # FAKE: counts the fake's workers
            _wait(lambda: len(list(state.glob("worker-*"))) >= n - 1, f"{n - 1} worker(s) to join")

        def fake_train(c):  # FAKE verl driver: records the cluster it would join
            ran["RAY_ADDRESS"] = os.environ["RAY_ADDRESS"]

        monkeypatch.setattr(launch, "_wait_for_nodes", fake_wait_for_nodes)
        monkeypatch.setattr("harness.backends.verl.train", fake_train)
        monkeypatch.setenv("SLURM_NODEID", "0")
        monkeypatch.setenv("FAKE_RAY_NODE", "head")
        for k in ("RAY_ADDRESS", "VERL_USE_EXTERNAL_MODULES", "MLFLOW_TRACKING_URI"):
            monkeypatch.setenv(k, "")  # node_main sets them: restored afterwards
        assert launch.node_main(cfg) == {}
        assert worker.wait(timeout=120) == 0, out.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
    calls = _calls(state)
    head_start = next(c for c in calls if c["node"] == "head" and c["args"][:1] == ["start"])
    assert "--node-ip-address=10.0.0.7" in head_start["args"] and "--port=6390" in head_start["args"]
    joins = [c for c in calls if c["node"] == "worker1" and c["args"][:1] == ["start"]]
    assert all(c["args"][1] == "--address=10.0.0.7:6390" for c in joins)  # the announced address, never the stale one
    assert [c["rc"] for c in joins][-1] == 0 and 1 in [c["rc"] for c in joins]  # refused while the GCS came up
    assert ran["RAY_ADDRESS"] == "10.0.0.7:6390"
    assert json.loads((cfg.run_dir / launch.DONE_FILE).read_text()) == {"job": "77.1", "ok": True}
    assert [c["args"] for c in calls if c["node"] == "worker1"][-1] == ["stop", "--force"]
    assert "joined the Ray head at 10.0.0.7:6390" in out.read_text()
    # Slurm's USR2 (submitit: --signal=USR2@..., no B:) reaches every process of the step: the raylets ignore it
    assert {c["usr2"] for c in calls if c["args"][:1] == ["start"]} == {"ignored"}
    assert float(os.environ["HARNESS_CKPT_WRITE_GBPS"]) > 0  # the head measured its checkpoint folder's write speed


def test_a_worker_gives_up_at_its_deadline_with_the_reason(tmp_path, fake_cluster):
    """No head ever: the worker waits with a doubling backoff and stops at the deadline, naming why."""
    t, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        t[0] += s

    with pytest.raises(RuntimeError, match=r"could not join the Ray head within 100 s \(0 tries; last: the head "
                                           r"has not announced its address yet\).*HARNESS_RAY_JOIN_TIMEOUT_S"):
        launch.join_cluster(tmp_path, "77.1", [], timeout_s=100, backoff_s=(2.0, 30.0), sleep=sleep,
                            clock=lambda: t[0])
    assert slept[:5] == [2.0, 4.0, 8.0, 16.0, 30.0] and sum(slept) <= 100


def test_a_joined_worker_notices_a_head_that_died_without_a_word(tmp_path, fake_cluster):
    state, _ = fake_cluster
    with pytest.raises(RuntimeError, match="stopped answering before the verl run finished"):
        launch.serve_until_done(tmp_path, "77.1", "10.0.0.7:6390", poll_s=0, sleep=lambda s: None)
    assert [c["args"][0] for c in _calls(state)] == ["health-check"] * launch.HEAD_LOST_AFTER
    launch._write_marker(tmp_path / launch.DONE_FILE, job="77.1", ok=False)
    assert launch.serve_until_done(tmp_path, "77.1", "10.0.0.7:6390", poll_s=0) is False

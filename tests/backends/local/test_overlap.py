"""One-step-off overlap (trainer.overlap, harness/backends/local/overlap.py): the batch of step t was sampled
with the weights before step t-1's update; the curve is deterministic whatever the timing; a checkpoint
resumes bitwise; the rollout process never outlives the run."""
import io
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from mlflow.tracking import MlflowClient

from harness.backends.local.inference_engine import InferenceEngine
from harness.backends.local.model import PolicyPack
from harness.backends.local.overlap import OverlapTrainer
from harness.backends.local.trainer import LocalTrainer
from harness import torchfile
from harness.uri import ROOT
from harness.spec import load
from harness.errors import ConfigError

TINY = ["trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2", "diagnostics.noise_sequences=4"]
OVERLAP = [*TINY, "trainer.overlap=true"]
TIMES = ("time/", "tokens/")
CPU = torch.device("cpu")


def _values(d):
    return {k: v for k, v in d.items() if not k.startswith(TIMES)}


def _curve(trainer, steps, pause=0.0):
    out = []
    for _ in range(steps):
        time.sleep(pause)
        out.append(_values(trainer.run_step()))
    return out


@pytest.mark.parametrize("spec", [["estimator=recompute"], ["estimator=mean_n", "estimator.n=3"],
                                  ["task=lookup", "estimator=mean_n", "estimator.n=3"]])  # multi-turn, prefix cache
def test_the_curve_is_the_same_whatever_the_timing_and_one_step_off_the_synchronous_one(spec):
    cfg = load([*OVERLAP, "trainer.steps=4", *spec])
    runs = []
    for pause in (0.0, 0.3):  # the trainer waits for the rollout / the rollout is done before it is asked for
        tr = OverlapTrainer(cfg, CPU)
        try:
            runs.append((_curve(tr, 4, pause), {k: v.clone() for k, v in tr.policy.weights().items()}))
        finally:
            tr.close()
    (a, wa), (b, wb) = runs
    assert a == b  # bitwise: floats compared with ==
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    sync = LocalTrainer(load([*TINY, "trainer.steps=4", *spec]), CPU)
    plain = _curve(sync, 2)
    assert a[0] == plain[0]  # step 0: the same batch (W_0), the same per-seed streams on each side
    assert a[1] != plain[1]  # step 1: sampled with W_0 instead of W_1


def _score_gap(cfg, batch, weights, vocab_size):
    """max |logp_roll - score(tokens)| of a batch under the given weights (deterministic float32 engine)."""
    pack = PolicyPack(cfg.model, 1, vocab_size)
    with torch.no_grad():
        for k, v in pack.weights().items():
            v.copy_(weights[k])
    s = InferenceEngine(pack, cfg.inference, [cfg.seed]).score(batch.roll.tokens[None], batch.prompt_len, 1)[0, 0]
    return (s - batch.roll.logp).abs().max().item()


def test_the_batch_of_step_t_was_sampled_with_the_weights_before_step_t_minus_1s_update():
    # a deterministic float32 engine without noise scores a batch as it sampled it (to ~1e-6) under the same
    # weights; a large learning rate moves the weights far enough that other weights score it visibly worse
    cfg = load([*OVERLAP, "trainer.steps=4", "inference.dtype=float32", "inference.deterministic=true",
                "inference.router_noise_sigma=0", "trainer.lr=1e-2"])
    tr = OverlapTrainer(cfg, CPU)
    seen, learn = [], tr.learn

    def spy(batch, t_step=None):  # the batch each step trains on, and the weights before its update (W_t)
        seen.append((batch, {k: v.detach().clone() for k, v in tr.policy.weights().items()}))
        return learn(batch, t_step)

    tr.learn = spy
    try:
        _curve(tr, 4)
    finally:
        tr.close()
    vocab = tr.policy.vocab_size
    for t, (batch, _) in enumerate(seen):
        sampled_with = max(t - 1, 0)  # B_0 with W_0, then B_t with W_{t-1}
        gaps = [_score_gap(cfg, batch, w, vocab) for _, w in seen]
        assert gaps[sampled_with] < 1e-4, (t, gaps)
        others = [g for j, g in enumerate(gaps) if j != sampled_with]
        assert min(others) > 1e-2, (t, gaps)


def test_a_checkpoint_holds_the_batch_in_flight_and_resumes_bitwise():
    cfg = load([*OVERLAP, "trainer.steps=5", "estimator=mean_n", "estimator.n=3"])
    straight = OverlapTrainer(cfg, CPU)
    try:
        want = _curve(straight, 5)
    finally:
        straight.close()
    first = OverlapTrainer(cfg, CPU)
    try:
        head = _curve(first, 2)
        buf = io.BytesIO()
        torch.save(first.state_dict(), buf)  # as harness.record writes checkpoint.pt (harness.torchfile.save)
        assert first.pending is not None  # the batch of step 2, made during step 1's update
        head += _curve(first, 1)  # checkpointing (a drain) does not change the run
    finally:
        first.close()
    resumed = OverlapTrainer(cfg, CPU)
    try:
        resumed.load_state_dict(torchfile.load(io.BytesIO(buf.getvalue())))  # tensors and plain values only
        tail = _curve(resumed, 3)
    finally:
        resumed.close()
    assert head == want[:3]
    assert head[:2] + tail == want


def test_a_resumed_batch_in_flight_moves_to_the_trainers_device():
    """harness.record loads a checkpoint with map_location="cpu": the stored batch in flight must join the
    trainer's device (on cuda it would otherwise meet the model on another device). No second real device
    here: the resumed trainer's device is set to ``meta`` after construction, and the CPU batch must follow."""
    cfg = load([*OVERLAP, "trainer.steps=3"])
    first = OverlapTrainer(cfg, CPU)
    try:
        first.run_step()
        state = first.state_dict()
    finally:
        first.close()
    assert state["pending"] is not None and state["pending"]["adv"].device == CPU  # a plain dict (torchfile)
    resumed = OverlapTrainer(cfg, CPU)
    try:
        resumed.device = torch.device("meta")
        resumed.load_state_dict(state)
        batch = resumed.pending
        tensors = [v for v in vars(batch).values() if isinstance(v, torch.Tensor)]
        tensors += [v for v in (batch.roll.tokens, batch.roll.logp, batch.roll.routed_experts) if v is not None]
        assert len(tensors) >= 7 and all(v.device.type == "meta" for v in tensors)
    finally:
        resumed.close()


def test_the_worker_reports_its_failure_and_close_leaves_no_process():
    cfg = load([*OVERLAP, "trainer.steps=3"])
    tr = OverlapTrainer(cfg, CPU)
    tr.worker.send("no such message")
    with pytest.raises(RuntimeError, match="rollout worker failed"):
        tr.worker.reply()
    tr.close()
    assert not tr.worker.proc.is_alive()


# ------------------------------------------------------------------------------- real runs and signals
def _start(over):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "harness.run", *over], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _worker_of(proc, timeout=120.0):
    """The rollout worker (the run's child process) once the run has logged a step."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        kids = psutil.Process(proc.pid).children()
        if kids:
            return kids[0]
        time.sleep(0.2)
    proc.kill()
    pytest.fail("no rollout worker")


def _gone(proc: psutil.Process, timeout=15.0) -> bool:
    """The process exited (gone, or a zombie waiting for a reaper: it runs nothing any more)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def _logged(uri):
    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return runs, client


def _rewards(uri, run_id):
    hist = MlflowClient(uri).get_metric_history(run_id, "reward/mean")
    return [m.value for m in sorted(hist, key=lambda m: m.step)], sorted(m.step for m in hist)


def _wait_steps(uri, n, proc, timeout=120.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        runs, _ = _logged(uri)
        if runs and len(_rewards(uri, runs[0].info.run_id)[1]) >= n:
            return runs[0].info.run_id
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {n} steps logged")


def test_sigterm_checkpoints_leaves_no_orphan_and_the_resumed_run_has_the_straight_curve(tiny_overrides):
    over = tiny_overrides("trainer.overlap=true", "trainer.checkpoint_every=2", steps=40, name="sig")
    cfg = load(over)
    proc = _start(over)
    worker = _worker_of(proc)
    run_id = _wait_steps(cfg.tracking_uri, 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "ended KILLED" in err
    assert _gone(worker)  # the run closed it before exiting

    proc = _start(over)  # resumes from the checkpoint: the batch in flight and the rollout side's streams
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    resumed, steps = _rewards(cfg.tracking_uri, run_id)
    assert steps == list(range(40))  # each step once

    straight = tiny_overrides("trainer.overlap=true", "tracking.experiment=straight", steps=40, name="straight")
    proc = _start(straight)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    s_cfg = load(straight)
    client = MlflowClient(s_cfg.tracking_uri)
    (run,) = client.search_runs([client.get_experiment_by_name("straight").experiment_id])
    assert _rewards(s_cfg.tracking_uri, run.info.run_id)[0] == resumed  # bitwise


def test_kill_9_of_the_run_takes_its_rollout_worker_with_it(tiny_overrides):
    over = tiny_overrides("trainer.overlap=true", steps=200, name="k9")
    proc = _start(over)
    worker = _worker_of(proc)
    _wait_steps(load(over).tracking_uri, 1, proc)
    proc.kill()
    proc.wait(timeout=30)
    assert _gone(worker)  # PR_SET_PDEATHSIG: the kernel kills it with its parent


# ------------------------------------------------------------------------------------- configuration
def test_overlap_enters_the_signature_only_when_set():
    plain = load(TINY)
    assert "overlap" in plain.to_dict()["trainer"] and plain.trainer.overlap is False
    assert load([*TINY, "trainer.overlap=false"]).signature == plain.signature
    assert load(OVERLAP).signature != plain.signature


def test_overlap_is_refused_where_it_cannot_run(tiny_overrides):
    from types import SimpleNamespace

    from harness.backends import get
    from harness.backends.local.run import execute_pack

    cfgs = [load(tiny_overrides("trainer.overlap=true", f"seed={s}", name=f"p{s}")) for s in (0, 1)]
    with pytest.raises(ConfigError, match="seeds_per_job") as exc:
        execute_pack(cfgs)
    assert exc.value.key == "trainer.overlap"
    lc = SimpleNamespace(name="local", nodes=1, tasks_per_node=1, cpus_per_task=2, seeds_per_job=4, gpus_per_node=0)
    key, message = get("local").launcher_problem(cfgs[0], lc, "run")
    assert key == "launcher.seeds_per_job" and "overlap" in message
    with pytest.raises(ConfigError) as exc:
        load(["backend=verl", "model=qwen3_4b", "trainer.lr=1e-6", "trainer.overlap=true"])
    assert exc.value.key == "trainer.overlap"

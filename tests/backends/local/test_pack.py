"""Seed packs: a seed's curve is bitwise the same alone or in a pack of several seeds."""
import pytest
import torch

from harness.backends.local.trainer import LocalTrainer, PackTrainer
from harness.spec import load

TINY = ["trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2", "diagnostics.noise_sequences=4"]
TIMES = ("time/", "tokens/")


def _curves(trainer, steps):
    return [[{k: v for k, v in d.items() if not k.startswith(TIMES)} for d in trainer.step_seeds()] for _ in range(steps)]


@pytest.mark.parametrize("spec", [["estimator=tis"], ["estimator=mean_n", "estimator.n=3"],
                                  ["estimator=r3", "trainer.max_grad_norm=0.5"], ["estimator=deterministic"],
                                  ["estimator=deterministic", "estimator.noise=frozen"],
                                  ["estimator=mean_n", "estimator.n=3", "inference.kl_target=0.01"],
                                  ["estimator=tis", "inference.logit_noise_sigma=0.3", "inference.batch_variance=false"]])
def test_a_seed_trains_identically_alone_and_in_a_pack(spec):
    cfgs = [load([*TINY, *spec, f"seed={s}"]) for s in (0, 1, 2)]
    pack = PackTrainer(cfgs, torch.device("cpu"))
    packed = _curves(pack, 3)
    alone = LocalTrainer(cfgs[1], torch.device("cpu"))
    single = [[d] for d in (alone.run_step() for _ in range(3))]
    for step in range(3):
        expect = {k: v for k, v in single[step][0].items() if not k.startswith(TIMES)}
        assert packed[step][1] == expect, step  # bitwise: floats compared with ==
    assert packed[0][0] != packed[0][1]  # the seeds differ
    for name, p in alone.policy.weights().items():
        assert torch.equal(p[0], pack.policy.weights()[name][1]), name


def test_a_seed_resumes_from_its_own_state_inside_another_pack():
    cfgs = [load([*TINY, f"seed={s}"]) for s in (0, 1)]
    straight = PackTrainer(cfgs, torch.device("cpu"))
    curve = _curves(straight, 3)
    first = PackTrainer(cfgs, torch.device("cpu"))
    first.step_seeds()
    state = first.seed_state(1)
    resumed = LocalTrainer(cfgs[1], torch.device("cpu"))  # seed 1 alone, from its pack checkpoint
    resumed.load_state_dict(state)
    rest = _curves(resumed, 2)
    assert [c[0] for c in rest] == [c[1] for c in curve[1:]]


def test_a_pack_refuses_different_specs():
    with pytest.raises(ValueError, match="one spec"):
        PackTrainer([load([*TINY, "seed=0"]), load([*TINY, "seed=1", "estimator=tis"])], torch.device("cpu"))


def test_execute_pack_logs_each_seed_as_an_ordinary_run_with_the_curve_of_the_seed_alone(tiny_overrides):
    from mlflow.tracking import MlflowClient

    from harness.backends.local.run import execute_pack
    from harness.run import execute

    cfgs = [load(tiny_overrides(f"seed={s}", "trainer.checkpoint_every=2", steps=4, name=f"p{s}")) for s in (0, 1)]
    packed = execute_pack(cfgs)
    alone_cfg = load(tiny_overrides("seed=1", "tracking.experiment=alone", steps=4, name="alone"))
    alone = execute(alone_cfg, progress=False)
    client = MlflowClient(cfgs[0].tracking_uri)

    def curve(run_id, key="reward/mean"):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

    assert [s.status for s in packed] == ["finished", "finished"] and packed[0].run_id != packed[1].run_id
    assert curve(packed[1].run_id) == curve(alone.run_id) and len(curve(alone.run_id)) == 4
    assert curve(packed[1].run_id, "policy/loss") == curve(alone.run_id, "policy/loss")
    run = client.get_run(packed[0].run_id)
    assert run.data.tags["seed"] == "0" and run.info.status == "FINISHED"
    assert not (cfgs[0].run_dir / "checkpoint.pt").exists() and (cfgs[0].run_dir / "summary.json").exists()
    assert execute_pack(cfgs) == packed  # finished: returned, not retrained


def test_an_interrupted_pack_resumes_each_seed_into_its_own_run_with_each_step_once(tiny_overrides, monkeypatch):
    from mlflow.tracking import MlflowClient

    from harness.backends.local.run import execute_pack

    def cfgs(tag):
        return [load(tiny_overrides(f"seed={s}", "trainer.checkpoint_every=2", f"tracking.experiment={tag}", steps=5,
                                    name=f"{tag}{s}")) for s in (0, 1)]

    straight = execute_pack(cfgs("straight"))
    real_step = PackTrainer.step_seeds

    class Preempted(Exception):
        pass

    def step_then_fail(self):
        if self.step == 3:
            raise Preempted
        return real_step(self)

    monkeypatch.setattr(PackTrainer, "step_seeds", step_then_fail)
    with pytest.raises(Preempted):
        execute_pack(cfgs("cut"))
    monkeypatch.setattr(PackTrainer, "step_seeds", real_step)
    first_ids = [torch.load(c.run_dir / "checkpoint.pt", weights_only=True)["run_id"] for c in cfgs("cut")]
    resumed = execute_pack(cfgs("cut"))
    client = MlflowClient(cfgs("cut")[0].tracking_uri)

    def curve(run_id, key):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]

    for a, b in zip(straight, resumed):
        for key in ("reward/mean", "policy/loss", "mismatch/k3"):
            assert curve(b.run_id, key) == curve(a.run_id, key), key
    assert [s.run_id for s in resumed] == first_ids  # each seed continued its own MLflow run


def test_a_pack_stops_before_training_when_one_seeds_run_is_in_progress_and_lets_the_other_folders_go(
        tiny_overrides):
    import os

    from mlflow.tracking import MlflowClient

    from harness.backends.local.run import execute_pack
    from harness.runlock import RunInProgress, RunLock

    cfgs = [load(tiny_overrides(f"seed={s}", steps=2, name=f"busy{s}")) for s in (0, 1)]
    cfgs[1].run_dir.mkdir(parents=True)
    held = RunLock(cfgs[1].run_dir)  # seed 1 training in another process
    held.acquire()
    try:
        with pytest.raises(RunInProgress, match=f"pid {os.getpid()}"):
            execute_pack(cfgs)
    finally:
        held.release()
    free = RunLock(cfgs[0].run_dir)  # seed 0's folder was prepared (locked) first, then let go
    free.acquire()
    free.release()
    client = MlflowClient(cfgs[0].tracking_uri)
    exp = client.get_experiment_by_name("test")
    assert exp is None or client.search_runs([exp.experiment_id]) == []  # nothing trained


def test_on_a_gpus_path_a_step_is_one_sequence_of_operators_whatever_the_pack(monkeypatch):
    """The path a GPU takes (dense expert GEMMs, batched scorings, no split-K read-back), forced on the CPU: a
    whole training step's operator count is flat in the pack size (issue 29's check; the CPU's own path adds a
    weight-gradient bmm per seed), and its metrics are the CPU path's to float32 rounding."""
    from harness.backends.local import grouped
    from harness.backends.local.opcount import OpCount

    def step(size, dense):
        monkeypatch.setattr(grouped, "DENSE", dense)
        trainer = PackTrainer([load([*TINY, f"seed={s}"]) for s in range(size)], torch.device("cpu"))
        trainer.infer.host_splits, trainer.infer.score_rows = False, None
        with OpCount() as count:
            metrics = _curves(trainer, 1)[0]
        return count.ops, metrics

    ops_1, _ = step(1, True)
    ops_6, dense = step(6, True)
    _, per_seed = step(6, False)
    assert ops_6 <= 1.01 * ops_1, (ops_1, ops_6)
    for got, want in zip(dense, per_seed):
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6), k

"""The warm-start cache (harness/backends/local/warmstart.py): a file there is read as tensors and plain values
only (a crafted one is refused, not run); one that cannot be read is named in a warning and made again; one that
cannot be written is a warning and the run goes on (issue 27, items 1 and 6)."""
import errno
import pathlib

import pytest
import torch

from harness import torchfile
from harness.backends.local import warmstart
from harness.spec import load

QUICK = ["task.warmstart.max_steps=5", "task.warmstart.eval_every=5"]


class Crafted:
    """Unpickled by ``torch.load(weights_only=False)``, it creates the file ``marker``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The warm-start cache moved under tmp_path; returns (cfg, the cache file of its (model, task, seed))."""
    monkeypatch.setattr(warmstart, "CACHE", tmp_path / "cache")
    cfg = load(QUICK)
    return cfg, warmstart.cache_path(cfg.model, cfg.task, cfg.seed)


def _weights(policy):
    return {k: v.clone() for k, v in policy.state_dict().items()}


def _spoil(path, how, marker):
    """Replace the cache file at ``path`` with a ``how`` one (crafted: its plain load would create ``marker``)."""
    good = path.read_bytes()
    if how == "crafted":
        torch.save({"state": {}, "record": Crafted(marker)}, path)
        torch.load(path, weights_only=False)  # the file is live: the old loader ran it
        assert marker.exists()
        marker.unlink()
    elif how == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif how == "no record":
        torch.save({"state": torch.load(path, weights_only=True)["state"], "steps": 5}, path)
    else:  # other weights (another model's layout)
        torch.save({"state": {"w": torch.zeros(2)}, "record": {"steps": 5, "reward": 0.5}}, path)


@pytest.mark.parametrize("how", ["crafted", "truncated", "no record", "other weights"])
def test_a_bad_cache_file_is_named_and_made_again_never_run(cache, tmp_path, capfd, how):
    cfg, path = cache
    first, _ = warmstart.warm_start(cfg.model, cfg.task, cfg.seed, progress=False)
    want = _weights(first)
    marker = tmp_path / "MARKER"
    _spoil(path, how, marker)
    capfd.readouterr()
    policy, record = warmstart.warm_start(cfg.model, cfg.task, cfg.seed, progress=False)
    err = capfd.readouterr().err
    assert not marker.exists()  # the crafted cache ran its command on 56d12ff
    assert f"warning: warm-start cache {path} cannot be read" in err and "Traceback" not in err
    assert record["steps"] == 5 and all(torch.equal(v, want[k]) for k, v in _weights(policy).items())
    assert torchfile.load(path)["record"] == record  # made again: the next run reads it
    assert not list(path.parent.glob("*.tmp"))


def test_a_cache_that_cannot_be_written_is_a_warning_and_the_warm_start_goes_on(cache, monkeypatch, capfd):
    cfg, path = cache

    def disk_full(obj, f, *args, **kwargs):
        pathlib.Path(f).write_bytes(b"half a cache file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    _, record = warmstart.warm_start(cfg.model, cfg.task, cfg.seed, progress=False)
    err = capfd.readouterr().err
    assert record["steps"] == 5
    assert f"warning: warm start not cached (cannot write {path}: No space left on device)" in err
    assert not path.exists() and not list(path.parent.glob("*.tmp"))  # no half file left to break the next run


# ---------------------------------------------------------------- set-up in bulk (issue 41, item 2)
BULK = ["task.warmstart.max_steps=4", "task.warmstart.eval_every=2", "task.warmstart.batch_size=8",
        "task.warmstart.target_reward=0.07"]


def test_a_pack_of_64_warms_up_together_and_each_seed_is_bitwise_its_warm_start_alone(tmp_path, monkeypatch):
    """64 seeds warmed up as one pack (one forward/backward per step for all of them; seeds leave the pack as they
    reach the target) give each seed bitwise the weights and record of its warm start alone, and the cache files
    they write are the ones a seed alone reads."""
    monkeypatch.setattr(warmstart, "CACHE", tmp_path / "cache")
    cfg = load(BULK)
    seeds = list(range(64))
    calls = []
    real = warmstart.train_engine.forward
    monkeypatch.setattr(warmstart.train_engine, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    pack, records = warmstart.warm_start_pack(cfg.model, cfg.task, seeds, progress=False)
    together = len(calls)
    steps = {r["steps"] for r in records}
    assert len(steps) >= 2 and 4 in steps, "the budget must make seeds leave the pack at different steps"
    for i, s in enumerate(seeds):
        alone, record = warmstart.warm_start(cfg.model, cfg.task, s, use_cache=False, progress=False)
        assert record == records[i]
        for name, w in alone.state_dict().items():
            assert torch.equal(pack.weights()[name][i], w), (s, name)
    # no per-seed loop of model calls: 3 reward checks (one call per sampled token) and 4 supervised steps, each
    # one call for all the seeds still warming up (64 seeds alone: 64 times as many)
    assert together == 3 * warmstart.Task(cfg.task).answer_len + 4
    # the cache: a seed alone now reads what the pack wrote
    cached, record = warmstart.warm_start(cfg.model, cfg.task, 5, progress=False)
    assert record == records[5] and torch.equal(cached.state_dict()["embed"], pack.weights()["embed"][5])


def test_a_cached_pack_is_read_without_building_initial_weights(tmp_path, monkeypatch):
    monkeypatch.setattr(warmstart, "CACHE", tmp_path / "cache")
    cfg = load(BULK)
    first, _ = warmstart.warm_start_pack(cfg.model, cfg.task, [3, 1, 2], progress=False)
    monkeypatch.setattr(warmstart, "build_policy", lambda *a: pytest.fail("built initial weights for a cached seed"))
    again, _ = warmstart.warm_start_pack(cfg.model, cfg.task, [2, 3, 1], progress=False)
    for name in first.names:
        assert torch.equal(again.weights()[name], first.weights()[name][[2, 0, 1]])


def test_a_warm_start_made_on_another_device_has_its_own_cache_file():
    cfg = load([])
    cpu = warmstart.cache_path(cfg.model, cfg.task, 0)
    assert warmstart.cache_path(cfg.model, cfg.task, 0, torch.device("cpu")) == cpu  # the CPU's files stay valid
    assert warmstart.cache_path(cfg.model, cfg.task, 0, torch.device("meta")) != cpu

"""Spec -> typed config: composition, validation and signatures."""
import pytest

from harness.config import ConfigError, load


def test_defaults_compose_into_a_typed_config():
    cfg = load([])
    assert cfg.estimator.name == "recompute" and cfg.model.kind == "moe" and cfg.task.name == "sort"
    assert cfg.model.top_k >= 4 and cfg.model.n_experts >= 8


def test_group_overrides_and_estimator_knobs():
    cfg = load(["estimator=tis", "estimator.clip_c=2", "estimator.level=sequence", "task=addition"])
    assert (cfg.estimator.name, cfg.estimator.clip_c, cfg.estimator.level) == ("tis", 2.0, "sequence")
    assert cfg.task.name == "addition"
    assert load(["estimator=mean_n", "estimator.n=16"]).estimator.n == 16


@pytest.mark.parametrize("overrides, key, text", [
    (["estimator=mean_n", "estimator.n=0"], "estimator.n", ">= 1"),
    (["estimator=tis", "estimator.clip_c=0.5"], "estimator.clip_c", "> 1"),
    (["estimator=tis", "estimator.level=word"], "estimator.level", "allowed: token, sequence"),
    (["trainer.lr=-1"], "trainer.lr", "> 0"),
    (["trainer.num_minibatches=3"], "trainer.num_minibatches", "divide"),
    (["model=dense_tiny", "estimator=r3"], "estimator", "router"),
    (["inference.dtype=int8"], "inference.dtype", "bfloat16"),
    (["model=nope"], "model", "moe_tiny"),
])
def test_bad_values_name_the_key(overrides, key, text):
    with pytest.raises(ConfigError) as err:
        load(overrides)
    assert err.value.key == key and text in str(err.value)


def test_signature_ignores_tracking_and_output_but_not_the_science():
    a = load([])
    assert load(["tracking.experiment=other", "out_dir=/tmp/x"]).signature == a.signature
    assert load(["trainer.checkpoint_every=7"]).signature == a.signature
    assert load(["seed=1"]).signature != a.signature
    assert load(["inference.router_noise_sigma=0.1"]).signature != a.signature
    assert len(a.signature) == 10


def test_group_signature_is_the_signature_without_the_seed():
    a, b, c = load(["seed=0"]), load(["seed=7"]), load(["seed=0", "trainer.lr=1e-4"])
    assert a.signature != b.signature and a.group_signature == b.group_signature
    assert a.group_signature != c.group_signature
    assert load(["seed=0", "tracking.experiment=other"]).group_signature == a.group_signature

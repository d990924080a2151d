"""The spec layer: every check of a spec names its key (harness/spec/validate.py)."""
import pytest

from harness.spec import ConfigError, load


def test_config_error_is_the_leaf_one():
    from harness import errors

    assert ConfigError is errors.ConfigError  # ``from harness.spec import ConfigError`` works too

@pytest.mark.parametrize("overrides, key, text", [
    (["estimator=mean_n", "estimator.n=0"], "estimator.n", ">= 1"),
    (["estimator=tis", "estimator.clip_c=0.5"], "estimator.clip_c", "> 1"),
    (["estimator=tis", "estimator.level=word"], "estimator.level", "allowed: token, sequence"),
    (["trainer.lr=-1"], "trainer.lr", "> 0"),
    (["trainer.num_minibatches=3"], "trainer.num_minibatches", "divide"),
    (["model=dense_tiny", "estimator=r3"], "estimator", "router"),
    (["inference.dtype=int8"], "inference.dtype", "bfloat16"),
    (["model=nope"], "model", "moe_tiny"),
    (["inference.top_p=0"], "inference.top_p", "(0, 1]"),
    (["inference.top_p=1.5"], "inference.top_p", "(0, 1]"),
])
def test_bad_values_name_the_key(overrides, key, text):
    with pytest.raises(ConfigError) as err:
        load(overrides)
    assert err.value.key == key and text in str(err.value)

@pytest.mark.parametrize("overrides, key, text", [
    (["estimator=mean_n", "estimator.n=1e9"], "estimator.n", "<= "),  # hung at step 0 on 56d12ff
    (["trainer.lr=inf"], "trainer.lr", "finite"),
    (["inference.temperature=nan"], "inference.temperature", "finite"),
    (["tracking.experiment=../../x"], "tracking.experiment", "plain name"),  # wrote outside the project
    (["tracking.experiment=a/b"], "tracking.experiment", "plain name"),
    (["tracking.run_name=.."], "tracking.run_name", "plain name"),
    (["seed=-1"], "seed", "[0, 2**31)"),
    (["seed=2147483648"], "seed", "[0, 2**31)"),
    (["trainer.steps=1000000"], "trainer.steps", "<= "),
    (["trainer.prompts_per_step=8192", "trainer.group_size=1024"], "trainer.prompts_per_step", "sequences"),
    (["diagnostics.noise_passes=1000"], "diagnostics.noise_passes", "<= "),
    (["task.warmstart.batch_size=0"], "task.warmstart.batch_size", ">= 1"),
])
def test_values_that_hang_escape_or_are_not_finite_are_refused(overrides, key, text):
    with pytest.raises(ConfigError) as err:
        load(overrides)
    assert err.value.key == key and text in str(err.value), str(err.value)

def test_limits_and_names_accept_what_the_experiments_use():
    cfg = load(["estimator=mean_n", "estimator.n=16", "seed=2147483647", "tracking.experiment=my study 2"])
    assert cfg.run_dir.parent.name == "my study 2" and cfg.seed == 2**31 - 1

@pytest.mark.parametrize("overrides, key, text", [
    (["task=lookup", "inference.prefix_cache_capacity=1.5"], "inference.prefix_cache_capacity", "[0, 1]"),
    (["task=lookup", "inference.prefix_cache_capacity=-0.1"], "inference.prefix_cache_capacity", "[0, 1]"),
    (["task=lookup", "inference.replay_on_miss=drop"], "inference.replay_on_miss", "allowed: recompute, missing"),
    (["inference.prefix_cache_capacity=0.5"], "inference.prefix_cache_capacity", "multi-turn task (lookup)"),
    (["inference.replay_on_miss=missing"], "inference.replay_on_miss", "single-turn"),
    (["task=lookup", "inference.replay_on_miss=missing"], "inference.replay_on_miss", "never evicts"),
    (["backend=verl", "model=qwen3_30b_a3b", "trainer.lr=1e-6", "inference.prefix_cache_capacity=0.5"],
     "inference.prefix_cache_capacity", "only by the local inference engine"),
])
def test_prefix_cache_knobs_are_checked(overrides, key, text):
    with pytest.raises(ConfigError) as err:
        load(overrides)
    assert err.value.key == key and text in str(err.value)


@pytest.mark.parametrize("overrides, key", [
    (["inference.router_noise_rate=0"], "inference.router_noise_rate"),
    (["inference.router_noise_rate=1.5"], "inference.router_noise_rate"),
    (["inference.router_noise_rate=0.1", "inference.router_noise_sigma=0"], "inference.router_noise_rate"),
    (["inference.router_noise_rate=0.1", "inference.deterministic=true"], "inference.router_noise_rate"),
])
def test_sparse_router_noise_is_refused_where_it_cannot_hold(overrides, key):
    with pytest.raises(ConfigError) as err:
        load(overrides)
    assert err.value.key == key


def test_the_default_rate_leaves_every_signature_as_it_was():
    """router_noise_rate = 1 (dense) is the default: Dora's rule keeps it out of the signature."""
    assert load([]).signature == load(["inference.router_noise_rate=1.0"]).signature
    assert load([]).signature != load(["inference.router_noise_rate=0.5"]).signature


@pytest.mark.parametrize("name, why", [
    ("実" * 67, "201 bytes"),  # 67 characters: on d747b32 the limit counted characters, and 200 x 実 (600 bytes) failed
    ("a\nb", "a new line"),   # at mkdir with "File name too long"; a quoted new line became a folder name
    ("txt\u202eexe", "a bidirectional override"),
    ("a\x1bb", "an escape character"),
])
def test_names_are_limited_in_bytes_and_hold_no_control_or_bidi_characters(name, why):
    with pytest.raises(ConfigError) as err:
        load([f"tracking.experiment='{name}'"])
    assert err.value.key == "tracking.experiment" and "plain name" in str(err.value), why
    assert "bytes in UTF-8" in str(err.value)


def test_a_name_of_200_bytes_is_accepted():
    assert load([f"tracking.experiment='{'é' * 100}'"]).tracking.experiment == "é" * 100

"""Spec -> typed config: composition, validation and signatures."""
import pytest

from harness.spec import ConfigError, load


def test_config_error_is_the_leaf_one():
    from harness import errors

    assert ConfigError is errors.ConfigError  # ``from harness.spec import ConfigError`` works too


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
    (["inference.top_p=0"], "inference.top_p", "(0, 1]"),
    (["inference.top_p=1.5"], "inference.top_p", "(0, 1]"),
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


def test_local_numerics_version_is_part_of_the_signature(monkeypatch):
    """Runs computed by older local kernels (another numerics version) never share a signature with new ones."""
    import harness.backends.local.identity as local

    before = (load([]).signature, load([]).group_signature)
    monkeypatch.setattr(local, "LOCAL_NUMERICS", local.LOCAL_NUMERICS + 1)
    after = (load([]).signature, load([]).group_signature)
    assert before[0] != after[0] and before[1] != after[1]


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


def test_prefix_cache_knobs_enter_the_signature_only_when_set():
    base = load(["task=lookup"])
    spec = base.to_dict()
    del spec["inference"]["prefix_cache_capacity"], spec["inference"]["replay_on_miss"]  # a spec from before them
    from harness.spec import signature

    assert signature(spec) == base.signature
    assert load(["task=lookup", "inference.prefix_cache_capacity=1.0"]).signature == base.signature
    sigs = {load(["task=lookup", *o]).signature for o in (["inference.prefix_cache_capacity=0.5"],
                                                          ["inference.prefix_cache_capacity=0.3"],
                                                          ["inference.prefix_cache_capacity=0.5",
                                                           "inference.replay_on_miss=missing"])}
    assert len(sigs) == 3 and base.signature not in sigs


def test_a_late_key_enters_the_signature_only_off_its_old_default():
    """``inference.top_p`` came after runs were stored: at 1.0 (what they computed with) the signature is the one
    the stores know, another value is another spec (Dora's rule, harness.spec.identity)."""
    import harness.spec as C

    a = load([])
    assert load(["inference.top_p=1.0"]).signature == a.signature
    assert load(["inference.top_p=0.9"]).signature != a.signature
    spec = a.to_dict()
    del spec["inference"]["top_p"]  # the spec of a run stored before the key existed
    assert C.signature(spec) == a.signature


def test_a_local_spec_off_temperature_1_is_not_signed_as_before_the_trainer_applied_the_temperature():
    """Until issue 15 the local training engine ignored ``inference.temperature`` (logp_rec at T = 1); now it
    applies it (train_engine.response_view): a spec at T != 1 computes something new, so it must not answer with a
    run stored under its old signature. b5b8724e5b is what commit 4954f41 signed ``inference.temperature=0.7``
    with (train at T = 1). T = 1 (every stored curve) and verl (whose actor always applied T) keep theirs."""
    import harness.spec as C

    assert load(["inference.temperature=0.7"]).signature != "b5b8724e5b"
    spec = load([]).to_dict()
    assert C.signature(spec) == load(["inference.temperature=1.0"]).signature
    # verl at T = 0.7: the signature 4954f41 gave it (its meaning did not change)
    assert load(["backend=verl", "model=qwen3_30b_a3b", "trainer.lr=1e-6",
                 "inference.temperature=0.7"]).signature == "fab6b12b65"


@pytest.mark.parametrize("overrides, key, text", [
    (["estimator=recompute", "estimator.clip_c=2"], "estimator.clip_c",
     "not a parameter of recompute (its parameters: none); clip_c is a parameter of tis, mis, mean_n_tis"),
    (["estimator=tis", "estimator.n=2"], "estimator.n", "not a parameter of tis (its parameters: clip_c, level)"),
    (["trainer.lrr=2"], "trainer.lrr", "unknown key; trainer has: checkpoint_every, clip_eps,"),
    (["foo=1"], "foo", "unknown key; the spec has: backend, diagnostics, estimator,"),
])
def test_an_unknown_key_names_what_the_section_has(overrides, key, text):
    """Not Hydra's "Could not override 'x'. To append to your config use +x" (which would then fail), but the
    keys the section has; for an estimator, its parameters and the estimators that take the one given."""
    with pytest.raises(ConfigError) as exc:
        load(overrides)
    assert exc.value.key == key and text in str(exc.value)


def test_the_dataclass_defaults_are_the_composed_default_spec():
    """Code that builds RunConfig() directly (benchmarks) trains the CLI's default spec (issue 32): the dataclass
    defaults and experiments/config.yaml agree on every key."""
    from harness.spec import RunConfig

    assert RunConfig().to_dict() == load([]).to_dict()


def test_an_unquoted_unicode_value_gets_the_quote_hint():
    with pytest.raises(ConfigError) as err:
        load(["tracking.experiment=héllo"])
    assert err.value.key == "tracking.experiment" and "quote it" in str(err.value)
    assert "\"tracking.experiment='héllo'\"" in str(err.value)

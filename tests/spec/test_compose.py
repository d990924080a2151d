"""The spec layer: composing a spec with Hydra: groups, overrides, errors (harness/spec/compose.py)."""
import pytest

from harness.spec import ConfigError, load


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
    (["estimator=recompute", "estimator.clip_c=2"], "estimator.clip_c",
     "not a parameter of estimator recompute (its parameters: none); clip_c is a parameter of tis, mis, mean_n_tis"),
    (["estimator=tis", "estimator.n=2"], "estimator.n", "not a parameter of estimator tis (its parameters: clip_c, level); n is a parameter of mean_n, mean_n_tis"),
    (["trainer.lrr=2"], "trainer.lrr", "unknown key; trainer has: checkpoint_every, clip_eps,"),
    (["foo=1"], "foo", "unknown key; the spec has: backend, diagnostics, estimator,"),
])
def test_an_unknown_key_names_what_the_section_has(overrides, key, text):
    """Not Hydra's "Could not override 'x'. To append to your config use +x" (which would then fail), but the
    keys the section has; for an estimator, its parameters and the estimators that take the one given."""
    with pytest.raises(ConfigError) as exc:
        load(overrides)
    assert exc.value.key == key and text in str(exc.value)

def test_an_unquoted_unicode_value_gets_the_quote_hint():
    with pytest.raises(ConfigError) as err:
        load(["tracking.experiment=héllo"])
    assert err.value.key == "tracking.experiment" and "quote it" in str(err.value)
    assert "\"tracking.experiment='héllo'\"" in str(err.value)


@pytest.mark.parametrize("key, value", [
    ("tracking.experiment", "it's"),  # d747b32 suggested 'it's', which fails again
    ("tracking.uri", "sqlite:////tmp/x.db?mode=ro"),  # '=' in a value: no key, no hint on d747b32
    ("tracking.experiment", "héllo"),
    ("tracking.experiment", 'say "hi"'),
])
def test_the_quote_hint_is_a_shell_word_that_hydra_reads_back_as_the_value(key, value):
    import re
    import shlex

    with pytest.raises(ConfigError) as err:
        load([f"{key}={value}"])
    assert err.value.key == key, str(err.value)
    hint = re.search(r"quote it, (.*) on a shell command line", str(err.value)).group(1)
    (word,) = shlex.split(hint)  # as the shell hands it to the program
    cfg = load([word])
    assert (cfg.tracking.experiment if key == "tracking.experiment" else cfg.tracking.uri) == value


def test_the_quote_hint_never_echoes_a_password():
    with pytest.raises(ConfigError) as err:
        load(["tracking.uri=mysql://u@h/db?password=s3cret"])
    assert "s3cret" not in str(err.value) and "quote it" in str(err.value)


def test_a_missing_equals_sign_says_overrides_are_key_value():
    """``trainer.lr 3e-4`` (a space for the '='): Hydra said "Error parsing override 'trainer.lr'"; now the fix."""
    with pytest.raises(ConfigError) as exc:
        load(["trainer.lr", "3e-4"])
    assert exc.value.key == "trainer.lr" and "an override is key=value" in str(exc.value)
    assert str(exc.value).endswith("write trainer.lr=3e-4")


def _compose_module():
    import importlib

    return importlib.import_module("harness.spec.compose")  # the module (``harness.spec.compose`` is the function)


@pytest.mark.parametrize("overrides", [
    ["estimator=tis", "estimator.clip_c=3", "estimator.level=sequence", "seed=4"],
    ["estimator=mean_n", "model=dense_tiny", "task=addition", "trainer.lr=1.5e-4", "trainer.max_grad_norm=null"],
    ["inference.kl_target=0.001", "inference.router_noise_sigma=4.0", "trainer.lr=-0.0", "trainer.overlap=true"],
    ["tracking.experiment='two words'", "tracking.run_name=x", "trainer.steps=7", "estimator=deterministic",
     "estimator.noise=frozen"],
    ["backend=verl", "model=qwen3_30b_a3b", "verl.parallel.tp=2", "verl.data.train_files=[a.parquet,b.parquet]"],
])
def test_composing_the_groups_once_then_setting_values_is_hydras_composition(overrides):
    """Issue 43 item 5: a sweep composes once per choice of config groups, then sets each run's values on a copy;
    the spec is exactly Hydra's (the golden signature test checks every shipped sweep's runs the same way)."""
    mod = _compose_module()
    dirs = mod.config_dirs()
    fast = mod._compose_fast(overrides, "config", dirs)
    assert fast is not None and fast == mod._hydra_compose(overrides, "config", dirs)


@pytest.mark.parametrize("overrides", [["+trainer.extra=1"], ["~trainer.lr"], ["trainer.lrr=1"],
                                       ["verl.chat_template_kwargs={a:1}"], ["trainer.lr=${trainer.clip_eps}"]])
def test_what_it_cannot_mimic_goes_to_hydra(overrides):
    mod = _compose_module()
    assert mod._compose_fast(overrides, "config", mod.config_dirs()) is None


def test_a_sweep_composes_once_per_choice_of_groups():
    mod = _compose_module()
    mod._composed.cache_clear()
    specs = [load(["estimator=tis", f"trainer.lr={lr}", f"seed={seed}"]) for seed in range(5) for lr in (1e-4, 3e-4)]
    specs.append(load(["estimator=mean_n", "seed=1"]))
    assert mod._composed.cache_info().misses == 2  # tis, mean_n: 2 Hydra compositions for 11 specs
    assert specs[1].trainer.lr == 3e-4 and specs[2].seed == 1 and specs[-1].estimator.n == 8
    specs[0].trainer.lr = 1.0  # a built spec is its own: the cached composition is not shared
    assert load(["estimator=tis", "trainer.lr=1e-4", "seed=0"]).trainer.lr == 1e-4


def test_an_edited_config_file_is_composed_anew(tmp_path, monkeypatch):
    mine = tmp_path / "experiments"
    (mine / "estimator").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # ./experiments: a user's own presets
    (mine / "estimator" / "my_tis.yaml").write_text("name: tis\nclip_c: 3.0\n")
    assert load(["estimator=my_tis"]).estimator.clip_c == 3.0
    (mine / "estimator" / "my_tis.yaml").write_text("name: tis\nclip_c: 5.0\n")
    assert load(["estimator=my_tis"]).estimator.clip_c == 5.0

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

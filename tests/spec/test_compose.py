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


def test_a_missing_equals_sign_says_overrides_are_key_value():
    """``trainer.lr 3e-4`` (a space for the '='): Hydra said "Error parsing override 'trainer.lr'"; now the fix."""
    with pytest.raises(ConfigError) as exc:
        load(["trainer.lr", "3e-4"])
    assert exc.value.key == "trainer.lr" and "an override is key=value" in str(exc.value)
    assert str(exc.value).endswith("write trainer.lr=3e-4")

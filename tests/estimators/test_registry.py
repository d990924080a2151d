"""The estimator registry (harness/estimators/): one declaration per estimator, read by config, labels, palette."""
import dataclasses
import subprocess
import sys

import pytest
import yaml

from analysis.palette import BASE_COLOUR, COLOURS
from harness import estimators
from harness.spec.identity import LEGACY_ESTIMATOR_PARAMS
from harness.spec import EXPERIMENTS, EstimatorConfig, load, signature
from harness.uri import ROOT
from harness.errors import ConfigError


def test_the_package_is_discovered_and_imports_no_torch():
    code = ("import sys, pkgutil, harness.estimators as E; "
            "mods = {m.name for m in pkgutil.iter_modules(E.__path__)} - {'base', 'weights', 'losses'}; "
            "assert mods == set(E.NAMES), (mods, E.NAMES); assert 'torch' not in sys.modules; print(E.NAMES)")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name", estimators.NAMES)
def test_each_estimator_has_its_yaml_and_its_default_spec_validates(name):
    """Its ``Params`` hold its defaults (their one home): the preset restates none of them, and a section naming only
    the estimator, built in code or composed, carries them and parses to the ``Params`` defaults."""
    est = estimators.get(name)
    preset = yaml.safe_load((EXPERIMENTS / "estimator" / f"{name}.yaml").read_text())
    assert preset == {"name": name}
    cfg = load([f"estimator={name}"])
    assert cfg.estimator.params == est.Params() == EstimatorConfig(name=name).params
    assert cfg.estimator == EstimatorConfig(name=name)
    assert {k: getattr(cfg.estimator, k) for k in est.param_names()} == est.defaults() == dataclasses.asdict(est.Params())
    assert est.label(est.defaults()).startswith(name)


def test_estimator_config_is_the_union_of_the_registered_parameters():
    fields = [f.name for f in dataclasses.fields(EstimatorConfig)]
    assert fields[0] == "name" and set(fields[1:]) == set(estimators.parameters())
    assert fields[1:7] == list(LEGACY_ESTIMATOR_PARAMS)  # the serialized spec's order of old
    # built by make_dataclass, yet importable by name: pickle (submitit, multiprocessing) and copy round-trip
    import copy
    import pickle

    cfg = load(["estimator=tis"])
    assert EstimatorConfig.__module__ == "harness.spec.schema" and EstimatorConfig.__qualname__ == "EstimatorConfig"
    assert pickle.loads(pickle.dumps(cfg)) == cfg == copy.deepcopy(cfg)
    assert type(pickle.loads(pickle.dumps(cfg.estimator))) is EstimatorConfig


def test_a_parameter_registered_later_enters_the_signature_only_when_set():
    spec = load(["estimator=tis"]).to_dict()
    unset = {**spec, "estimator": {**spec["estimator"], "scale": None}}
    assert signature(unset) == signature(spec)
    assert signature({**spec, "estimator": {**spec["estimator"], "scale": 2.0}}) != signature(spec)
    dropped = {**spec, "estimator": {k: v for k, v in spec["estimator"].items() if k != "gamma_min"}}
    assert signature(dropped) != signature(spec)  # the six of old always count, even when null


@pytest.mark.parametrize("overrides, key, text", [
    (["estimator=rollout", "+estimator.extra=1"], "estimator.extra", "unknown key"),
    (["estimator=tis", "estimator.level=blob"], "estimator.level", "token, sequence"),
    (["estimator=icepop", "estimator.beta=0.9"], "estimator.alpha", "0 < alpha < 1 < beta"),
    (["estimator=rais", "estimator.gamma_min=0"], "estimator.gamma_min", "(0, 1]"),
    (["estimator=mean_n", "estimator.n=65"], "estimator.n", "<= 64"),
    (["estimator=geo_rs", "estimator.lower=1.01"], "estimator.lower", "0 < lower <= 1 <= upper"),
    (["estimator=geo_rs", "estimator.upper=0.99"], "estimator.upper", "0 < lower <= 1 <= upper"),
    (["estimator=geo_rs", "estimator.lower=0"], "estimator.lower", "0 < lower <= 1 <= upper"),
    (["estimator=geo_rs", "estimator.upper=inf"], "estimator.upper", "finite"),
])
def test_each_estimator_validates_its_own_parameters(overrides, key, text):
    with pytest.raises(ConfigError) as exc:
        load(overrides)
    assert exc.value.key == key and text in str(exc.value)


def test_a_parameter_of_another_estimator_is_refused():
    cfg = load(["estimator=tis"])
    cfg.estimator.n = 4
    with pytest.raises(ConfigError, match=r"estimator.n: not a parameter of estimator tis \(its parameters: clip_c, level\)"):
        estimators.get("tis").parse(cfg.estimator)


def test_labels_ranks_and_styles():
    assert estimators.label("tis", {"clip_c": 2.0, "level": "sequence", "n": None}) == "tis(C=2,sequence)"
    assert estimators.label("mean_n", {"n": 8.0}) == "mean_n(n=8)"
    assert estimators.label("icepop", {"alpha": 0.5, "beta": 5.0}) == "icepop"
    assert estimators.label("gone", {"n": 4, "level": "token"}) == "gone(n=4,token)"  # not registered (old store)
    assert estimators.rank("gone") == len(estimators.NAMES)
    assert [estimators.rank(n) for n in estimators.NAMES] == list(range(len(estimators.NAMES)))
    assert all(estimators.get(n).style and estimators.get(n).style.colour in COLOURS for n in estimators.NAMES)
    assert len({BASE_COLOUR[n] for n in estimators.NAMES}) == len(estimators.NAMES)  # one colour per estimator


def test_needs_are_declared_where_the_formula_uses_them():
    by_need = {k: {n for n in estimators.NAMES if getattr(estimators.get(n).needs, k)}
               for k in ("router", "replay", "deterministic")}
    assert by_need["replay"] <= by_need["router"]
    passes = {n: estimators.build(EstimatorConfig(name=n, n=3) if "n" in estimators.get(n).param_names()
                                  else EstimatorConfig(name=n)).passes() for n in estimators.NAMES}
    assert {n for n, k in passes.items() if k} == {"mean_n", "mean_n_tis"} and set(passes.values()) == {0, 3}
    with pytest.raises(ConfigError, match="needs a router"):
        load(["model=dense_tiny", f"estimator={sorted(by_need['router'])[0]}"])

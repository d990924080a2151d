"""The spec layer: the schema holds the only defaults (harness/spec/schema.py)."""
from harness.spec import load


def test_the_dataclass_defaults_are_the_composed_default_spec():
    """Code that builds RunConfig() directly (benchmarks) trains the CLI's default spec (issue 32): the dataclass
    defaults and experiments/config.yaml agree on every key."""
    from harness.spec import RunConfig

    assert RunConfig().to_dict() == load([]).to_dict()


def test_config_yaml_changes_no_default():
    """experiments/config.yaml lists the groups it composes and changes nothing else: every default has one home,
    the schema (issue 32). A key set there must differ from the schema's default (a deliberate change)."""
    import yaml

    from harness.spec import EXPERIMENTS, defaults

    data = yaml.safe_load((EXPERIMENTS / "config.yaml").read_text())
    schema = defaults()

    def same_as_default(node, base, path=""):
        for k, v in node.items():
            if isinstance(v, dict) and isinstance(base.get(k), dict):
                yield from same_as_default(v, base[k], f"{path}{k}.")
            elif k in base and base[k] == v:
                yield f"{path}{k}"

    assert data["defaults"][:2] == ["schema", "_self_"]
    assert list(same_as_default({k: v for k, v in data.items() if k != "defaults"}, schema)) == []


def test_a_backend_contributes_its_section_through_the_registry():
    """``RunConfig`` has verl's section because the verl backend declares it (``Backend.section``), not because
    the spec imports verl; its default is the backend's dataclass."""
    from harness import backends
    from harness.backends.verl.config import VerlConfig
    from harness.spec import RunConfig

    assert [(o, n) for o, n, _ in backends.sections()] == [("verl", "verl")]
    assert isinstance(RunConfig().verl, VerlConfig)
    assert list(RunConfig().to_dict())[-2:] == ["verl", "out_dir"]

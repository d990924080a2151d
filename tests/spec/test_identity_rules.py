"""The identity table's rules, each on its own (harness/spec/identity.py); test_identity.py checks them on specs."""
from harness.spec import defaults, identity, load, signature
from harness.spec.identity import FROZEN, NON_IDENTITY


def _leaves(node, path=""):
    for k, v in node.items():
        if isinstance(v, dict) and v:
            yield from _leaves(v, f"{path}{k}.")
        else:
            yield f"{path}{k}"


def test_every_frozen_key_is_a_key_of_the_schema():
    """A misspelt frozen key would silently drop a stored key from its signature when at its default."""
    schema = set(_leaves(defaults()))
    assert FROZEN <= schema, sorted(FROZEN - schema)


def test_a_new_key_enters_only_off_its_default_and_a_frozen_key_always():
    base = {"seed": 1, "backend": {"name": "verl"}, "trainer": {"steps": 3, "new_knob": 0.5}}
    schema = {"seed": 0, "backend": {"name": "local"}, "trainer": {"steps": 300, "new_knob": 0.5}}
    kept = identity.identity(base, schema)
    assert kept["trainer"] == {"steps": 3}  # new_knob at its default: out; steps (frozen): in
    base["trainer"]["new_knob"] = 0.7
    assert identity.identity(base, schema)["trainer"] == {"steps": 3, "new_knob": 0.7}
    base["trainer"]["steps"] = 300  # a frozen key at its default still enters (as every stored run signed it)
    assert identity.identity(base, schema)["trainer"]["steps"] == 300


def test_keys_that_are_not_identity_or_not_read_never_enter():
    spec = load([]).to_dict()
    ident = identity.identity(spec, defaults())
    assert not {"tracking", "out_dir"} & set(ident) and "checkpoint_every" not in ident["trainer"]
    assert "trainer.checkpoint_every" in NON_IDENTITY
    spec["inference"]["kl_gain"] = 0.5  # read by KL-held runs only
    assert signature(spec) == load([]).signature
    spec["inference"]["kl_target"] = 0.003
    assert "kl_gain" in identity.identity(spec, defaults())["inference"]


def test_a_backend_section_is_read_by_its_backend_only_and_markers_come_from_the_backend():
    local = identity.identity(load([]).to_dict(), defaults())
    assert "verl" not in local and local["local_numerics"] >= 3
    verl = identity.identity(load(["backend=verl", "model=qwen3_30b_a3b", "trainer.lr=1e-6"]).to_dict(), defaults())
    assert "verl" in verl and "local_numerics" not in verl

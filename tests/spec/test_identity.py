"""The spec layer: a spec's signature: what enters it and what does not (harness/spec/identity.py)."""
from harness.spec import load


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

def test_local_numerics_version_is_part_of_the_signature(monkeypatch):
    """Runs computed by older local kernels (another numerics version) never share a signature with new ones."""
    import harness.backends.local.identity as local

    before = (load([]).signature, load([]).group_signature)
    monkeypatch.setattr(local, "LOCAL_NUMERICS", local.LOCAL_NUMERICS + 1)
    after = (load([]).signature, load([]).group_signature)
    assert before[0] != after[0] and before[1] != after[1]

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

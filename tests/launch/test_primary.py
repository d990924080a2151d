"""Primary contrasts declared in a sweep spec (harness/launch/primary.py): parsed, recorded before the runs in the
sweep folder and as the experiment's tag, read back by the report, which calls them pre-registered only when the
declaration is older than the experiment's first run."""
import json

import pytest
from mlflow.tracking import MlflowClient

from harness.launch import primary
from harness.launch.spec import SweepError, parse_spec


def _spec(tmp_path, prim):
    return parse_spec({"name": "p", "experiment": "prim", "grid": {"estimator": ["recompute", "mean_n"]},
                       "primary": prim, "sweep_dir": str(tmp_path / "sweep")})


def test_the_spec_takes_pairs_and_trends_and_refuses_anything_else(tmp_path):
    spec = _spec(tmp_path, [["recompute", "mean_n(n=8)"], {"trend": "mean_n over n"}])
    assert spec.primary == [["recompute", "mean_n(n=8)"], ["trend", "mean_n over n"]]
    for bad in ([["recompute"]], [["a", "a"]], [{"trend": ""}], "recompute|mean_n", [{"pair": ["a", "b"]}]):
        with pytest.raises(SweepError) as err:
            _spec(tmp_path, bad)
        assert err.value.key.startswith("primary")


def test_a_new_checkout_keeps_the_declaration_its_restored_store_holds(tmp_path):
    """A study that outlives its store (analysis restore): the experiment comes back with its primary_contrasts tag but
    the new checkout has no primary.json; submitting again keeps the original declaration time (before the restored
    runs' start), not a new one (after them: the contrasts would read as not pre-registered)."""
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    old = {"contrasts": [["recompute", "mean_n(n=8)"]], "declared_at_ms": 1_000, "history": []}
    client.create_experiment("prim", tags={primary.TAG: json.dumps(old, sort_keys=True)})
    record = primary.declare(_spec(tmp_path, [["recompute", "mean_n(n=8)"]]), uri)
    assert record["declared_at_ms"] == 1_000
    assert json.loads(client.get_experiment_by_name("prim").tags[primary.TAG])["declared_at_ms"] == 1_000


def test_declare_records_once_and_keeps_the_history_of_a_change(tmp_path):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    client.create_experiment("prim")
    spec = _spec(tmp_path, [["recompute", "mean_n(n=8)"]])
    first = primary.declare(spec, uri)
    again = primary.declare(spec, uri)
    assert again["declared_at_ms"] == first["declared_at_ms"] and not again["history"]
    changed = primary.declare(_spec(tmp_path, [["recompute", "rollout"]]), uri)
    assert changed["history"] == [{"contrasts": [["recompute", "mean_n(n=8)"]], "declared_at_ms": first["declared_at_ms"]}]
    exp = client.get_experiment_by_name("prim")
    assert json.loads(exp.tags[primary.TAG]) == changed == json.loads((tmp_path / "sweep" / primary.FILE).read_text())
    assert primary.as_contrasts(changed) == [("recompute", "rollout")]

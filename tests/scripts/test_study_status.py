"""scripts/study_status.py counts finished runs and complete seeds, never outcomes (the pre-registered stopping rule)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "study_status.py"


def _module():
    spec = importlib.util.spec_from_file_location("study_status", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_seed_is_complete_only_when_every_arm_of_it_finished():
    rows = [{"run": "estimator=recompute seed=100", "state": "finished", "reward": 0.9},
            {"run": "estimator=rollout seed=100", "state": "finished", "reward": 0.1},
            {"run": "estimator=recompute seed=101", "state": "finished", "reward": 0.9},
            {"run": "estimator=rollout seed=101", "state": "running", "reward": 0.5}]
    assert _module().summary(rows) == (3, 4, [100])


def test_the_table_shows_no_outcome(monkeypatch, capsys):
    mod = _module()
    monkeypatch.setattr(mod, "status", lambda sweep: [{"run": "estimator=r3 seed=7", "state": "finished",
                                                      "reward": 0.123456, "collapsed": True}])
    assert mod.main() == 0
    out = capsys.readouterr().out
    assert "1 / 1" in out and "0.123" not in out and "True" not in out

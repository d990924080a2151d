"""harness.history on a real MLflow store: sorted by step, the latest value of a step logged twice."""
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from harness import history


def test_read_sorts_and_keeps_latest(tmp_path):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    exp = client.create_experiment("h")
    run_id = client.create_run(exp).info.run_id
    client.log_batch(run_id, metrics=[Metric("reward/mean", 0.3, 1000, 2), Metric("reward/mean", 0.1, 1000, 0),
                                      Metric("reward/mean", 0.2, 1000, 1), Metric("reward/mean", 0.9, 2000, 1)])
    h = history.read(client, run_id, "reward/mean")
    assert h.steps == [0, 1, 2] and h.values == [0.1, 0.9, 0.3]
    assert h.as_dict() == {0: 0.1, 1: 0.9, 2: 0.3}
    assert history.read(client, run_id, "never/logged") == history.History([], [])

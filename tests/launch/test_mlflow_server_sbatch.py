"""slurm/mlflow_server.sbatch (issue 30, item 5): the script run by bash as Slurm would run its batch step, on
127.0.0.1 (no allocation needed: it starts one `mlflow server`). It publishes its URL once healthy, a run logged
through that URL lands in the sqlite store under MLFLOW_DIR, and scancel's SIGTERM stops the server and removes
the URL file."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from harness.uri import ROOT

SCRIPT = ROOT / "slurm" / "mlflow_server.sbatch"


def test_the_script_parses_and_requires_its_folder(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_DIR"}
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode != 0 and "set MLFLOW_DIR" in proc.stderr


def test_the_server_publishes_its_url_serves_runs_and_stops_on_scancel(tmp_path):
    from mlflow.tracking import MlflowClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tmp_path / "mlflow"
    env = {**os.environ, "MLFLOW_DIR": str(folder), "MLFLOW_HOST": "127.0.0.1", "MLFLOW_PORT": str(port),
           "MLFLOW_WORKERS": "1", "PYTHON": sys.executable}
    log = open(tmp_path / "job.out", "w")
    proc = subprocess.Popen(["bash", str(SCRIPT)], env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url_file = folder / "server_url"
    try:
        t0 = time.monotonic()
        while not url_file.exists():
            if proc.poll() is not None or time.monotonic() - t0 > 240:
                pytest.fail(f"no server_url: {(tmp_path / 'job.out').read_text()[-3000:]}")
            time.sleep(0.5)
        url = url_file.read_text().strip()
        assert url == f"http://127.0.0.1:{port}"
        client = MlflowClient(tracking_uri=url)
        exp = client.create_experiment("server_check")
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "loss", 0.5, step=1)
        client.log_text(run.info.run_id, "hello", "note.txt")  # through the server's artifact proxy
        client.set_terminated(run.info.run_id)
        # the run is in the sqlite store the script chose, the artifact in its artifacts folder
        local = MlflowClient(tracking_uri=f"sqlite:///{folder}/mlflow.db")
        assert local.get_run(run.info.run_id).data.metrics == {"loss": 0.5}
        assert list((folder / "artifacts").rglob("note.txt"))
        proc.send_signal(signal.SIGTERM)  # scancel / the time limit
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:  # a failure above: the script's own stop ends the server (its own session)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
    assert not url_file.exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    out = (tmp_path / "job.out").read_text()
    assert f"healthy at http://127.0.0.1:{port}" in out, out

"""Credentials of the tracking store (issue 27 item 4): accepted as MLflow accepts them, never shown or stored.

On 56d12ff ``tracking.uri=http://user:pw@host:port`` (which MLflow's client accepts) was refused with "Name or
service not known" and the password printed, and any URI that got through was stored verbatim (param
``tracking.uri``, the ``spec.yaml`` artifact, ``run.json``, ``summary.json``). A stub server checks what is sent;
a real ``mlflow server`` checks that no file, table or line of output of a run holds the password.
"""
from __future__ import annotations

import base64
import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from harness import store
from harness.tracking import TrackingError, client_for
from harness.uri import PASSWORD_ENV, ROOT, USERNAME_ENV, mlflow_uri, redact, split_userinfo

SECRET = "s3cret"
TINY = ["trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
        "diagnostics.noise_sequences=4"]  # tests/conftest.py's tiny budget


@pytest.fixture(autouse=True)
def no_credentials_in_env(monkeypatch):
    """Each test starts without MLflow credentials in the environment, and leaves none behind."""
    for var in (USERNAME_ENV, PASSWORD_ENV, "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(var, raising=False)


def test_redact_drops_userinfo_and_query_secrets():
    assert redact(f"http://alice:{SECRET}@127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert redact(f"postgresql://u:{SECRET}@db:5432/m?sslmode=require&password={SECRET}") == \
        "postgresql://db:5432/m?sslmode=require&password=***"
    assert redact("sqlite:////tmp/m.db") == "sqlite:////tmp/m.db" and redact(None) is None
    assert split_userinfo("http://a:p%40ss@w@h:1/x?y") == ("http://h:1/x?y", "a", "p@ss@w")  # the last '@' ends it


def test_mlflow_uri_moves_an_http_password_into_mlflows_variables():
    assert mlflow_uri(f"https://alice:{SECRET}@h:1/") == "https://h:1/"
    assert (os.environ[USERNAME_ENV], os.environ[PASSWORD_ENV]) == ("alice", SECRET)
    db = f"postgresql://u:{SECRET}@db/m"
    assert mlflow_uri(db) == db and mlflow_uri("http://onlyuser@h:1") == "http://onlyuser@h:1"  # nothing to move


class Stub(http.server.BaseHTTPRequestHandler):
    """A tracking server that wants basic auth alice:s3cret on every path; records what it was sent."""

    seen: list[tuple[str, str | None]] = []
    want = "Basic " + base64.b64encode(f"alice:{SECRET}".encode()).decode()

    def do_GET(self):  # noqa: N802 - http.server's name
        auth = self.headers.get("Authorization")
        Stub.seen.append((self.path, auth))
        ok = auth == self.want
        body = (b"OK" if self.path == "/health" else b"{}") if ok else b"unauthorized"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Stub.seen = []
    yield server.server_address[1]
    server.shutdown()


def test_the_store_check_and_mlflows_client_send_the_uris_userinfo_as_basic_auth(stub, capsys):
    with pytest.raises(TrackingError) as e:
        store.check(f"http://127.0.0.1:{stub}")
    assert "401" in str(e.value) and "MLFLOW_TRACKING_USERNAME" in str(e.value)
    uri = f"http://alice:{SECRET}@127.0.0.1:{stub}"
    store.check(uri)  # on 56d12ff: "Name or service not known", the password in the message
    client_for(uri).search_experiments(max_results=1)
    assert Stub.seen[-1][0].startswith("/api/") and Stub.seen[-1][1] == Stub.want  # MLflow's request: the same auth
    assert SECRET not in capsys.readouterr().out


def test_credentials_from_mlflows_variables_are_used(stub, monkeypatch):
    monkeypatch.setenv(USERNAME_ENV, "alice")
    monkeypatch.setenv(PASSWORD_ENV, SECRET)
    store.check(f"http://127.0.0.1:{stub}")
    assert Stub.seen[-1] == ("/health", Stub.want)


def test_an_unreachable_store_is_named_without_its_password():
    with pytest.raises(TrackingError) as e:
        store.check(f"http://alice:{SECRET}@127.0.0.1:9")
    assert SECRET not in str(e.value) and "'http://127.0.0.1:9'" in str(e.value)


@pytest.mark.parametrize("uri", [f"postgresql://u:{SECRET}@db:5432/m", f"http://alice:{SECRET}@h:5000"])
def test_printed_specs_and_commands_hold_no_password(uri, capsys, tmp_path):
    from harness.run import main

    over = [f"tracking.uri={uri}", f"out_dir={tmp_path}/run"]
    verl = ["backend=verl", "model=qwen3_30b_a3b", "trainer.lr=1e-6", "trainer.prompts_per_step=16",
            "trainer.num_minibatches=4"]
    for argv in ([*over, "--print-config"], [*verl, *over, "--dry-run"]):
        assert main(argv) == 0
        out = capsys.readouterr()
        assert SECRET not in out.out + out.err and redact(uri) in out.out


# --------------------------------------------------------------- a real MLflow server, a real run
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on 127.0.0.1 with an sqlite store and served artifacts (healthy in ~20-25 s)."""
    root = tmp_path_factory.mktemp("server")
    port = _free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                             f"sqlite:///{root}/server.db", "--artifacts-destination", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            cwd=root, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    while True:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                break
        except requests.RequestException:
            pass
        if proc.poll() is not None or time.monotonic() - t0 > 180:
            proc.kill()
            pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        time.sleep(0.5)
    yield root, port
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def _run(over: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (USERNAME_ENV, PASSWORD_ENV)}
    return subprocess.run([sys.executable, "-m", "harness.run", *over], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=600)


def test_no_artifact_of_a_run_holds_the_password(mlflow_server, tmp_path):
    root, port = mlflow_server
    over = [*TINY, "trainer.steps=2", "tracking.experiment=creds", f"out_dir={tmp_path}/run"]
    first = _run([*over, f"tracking.uri=http://alice:{SECRET}@127.0.0.1:{port}"])
    assert first.returncode == 0, first.stderr[-2000:]
    # the same store with other credentials is the same store: the run is found finished there
    again = _run([*over, f"tracking.uri=http://bob:other@127.0.0.1:{port}"])
    assert again.returncode == 0, again.stderr[-2000:]
    files = [p for p in [*tmp_path.rglob("*"), *root.rglob("*")] if p.is_file() and p.name != "server.log"]
    assert {"run.json", "summary.json", "spec.yaml", "server.db"} <= {p.name for p in files}
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []  # run folder, store tables, artifacts
    for proc in (first, again):
        assert SECRET not in proc.stdout + proc.stderr
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"http://127.0.0.1:{port}")
    (run,) = client.search_runs([client.get_experiment_by_name("creds").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["tracking.uri"] == f"http://127.0.0.1:{port}"
    # answered by the one run, not trained again, the store named without credentials
    assert f"already finished in http://127.0.0.1:{port} (run {run.info.run_id}), not retrained" in again.stdout


def test_an_export_over_http_holds_no_password(mlflow_server, tmp_path):
    """Issue 45 (wrong case 2): on d747b32 ``analysis export --tracking-uri http://alice:<pw>@...`` wrote the URI,
    password included, into the histories file (the file the docs say to commit)."""
    import gzip

    from mlflow.tracking import MlflowClient

    root, port = mlflow_server
    client = MlflowClient(f"http://127.0.0.1:{port}")
    exp_id = client.create_experiment("creds_export")
    client.set_terminated(client.create_run(exp_id, tags={"estimator": "rollout", "seed": "0"}).info.run_id)
    out = tmp_path / "x.json.gz"
    proc = subprocess.run([sys.executable, "-m", "analysis", "export", "-e", "creds_export", "--tracking-uri",
                           f"http://alice:{SECRET}@127.0.0.1:{port}", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = gzip.decompress(out.read_bytes()).decode()
    assert SECRET not in text and SECRET not in proc.stdout + proc.stderr
    assert f'"tracking_uri": "http://127.0.0.1:{port}"' in text

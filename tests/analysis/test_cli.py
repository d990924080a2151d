"""`python -m analysis`: fast --help, exit status 2 with a useful message, compare output."""
from __future__ import annotations

import subprocess
import sys

from analysis.__main__ import main


def test_help_imports_nothing_heavy():
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "analysis", "report", "--help"],
                          capture_output=True, text=True, check=True)
    assert "--experiment" in proc.stdout and "--x" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not imported & {"mlflow", "matplotlib", "pandas", "numpy", "torch", "scipy"}, imported


def test_unknown_experiment_exits_2_listing_experiments(store, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--experiment", "nope", "--tracking-uri", store.uri, "--no-log"]) == 2
    err = capsys.readouterr().err
    assert "no experiment named 'nope'" in err and "demo" in err and "single" in err
    assert not (tmp_path / "figures").exists()  # no empty figures/nope/ left behind


def test_the_default_output_folder_is_under_the_project_with_the_name_sanitised(fresh_store, tmp_path, monkeypatch,
                                                                                  capsys):
    """Issue 27 item 3: on 56d12ff ``report`` wrote ``figures/<experiment>`` relative to the working directory with
    the name as is, so an experiment named ``../../esc`` escaped; now ``<project>/figures/.._.._esc``."""
    from analysis import paths
    from analysis.synthetic import SyntheticRun, curve, log_runs

    log_runs(fresh_store.uri, "../../esc", [SyntheticRun("rollout", s, curve(40, seed=s)) for s in range(2)])
    project = tmp_path / "project"
    monkeypatch.setenv("MOE_RL_HOME", str(project))
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    monkeypatch.chdir(cwd)
    before = set(tmp_path.rglob("*"))
    assert main(["report", "--experiment", "../../esc", "--tracking-uri", fresh_store.uri, "--no-log",
                 "--set", "bootstrap_reps=200", "--set", "curve_reps=50"]) == 0, capsys.readouterr().err
    assert (project / "figures" / ".._.._esc" / "report.md").is_file()
    assert {p for p in set(tmp_path.rglob("*")) - before if project not in p.parents and p != project} == set()
    assert paths.folder_name("..") == "_.." and paths.folder_name(" a/b\\c ") == "a_b_c"
    assert paths.out_folder("../x", tmp_path / "mine") == tmp_path / "mine"  # an explicit --out is the user's


def test_the_default_output_folder_follows_the_home_rule(tmp_path, monkeypatch):
    """Issue 45 (wrong case 4): on d747b32 it was ``harness.uri.ROOT / "figures"`` whatever the home, which for an
    installed wheel is ``site-packages/figures`` (the wheel itself: tests/test_install.py)."""
    from analysis import paths

    monkeypatch.setenv("MOE_RL_HOME", str(tmp_path / "home"))
    assert paths.out_folder("x") == (tmp_path / "home").resolve() / "figures" / "x"


def test_compare_prints_probability_of_improvement(store, capsys):
    rc = main(["compare", "-e", "demo", "--a", "mean_n(n=16)", "--b", "rollout", "--tracking-uri", store.uri,
               "--set", "bootstrap_reps=500"])
    out = capsys.readouterr().out
    assert rc == 0
    line = next(ln for ln in out.splitlines() if ln.startswith("| final reward"))
    assert line.rstrip().endswith("| 1.00 [1.00, 1.00] |"), line  # every n=16 run beats every collapsed rollout run
    assert "P(A > B)" in out and "collapse v2" in out


def test_compare_errors(store, capsys):
    assert main(["compare", "-e", "demo", "--a", "mean_n", "--b", "rollout", "--tracking-uri", store.uri]) == 2
    err = capsys.readouterr().err
    assert "matches several groups" in err and "mean_n(n=4)" in err
    assert main(["compare", "-e", "demo", "--a", "icepop", "--b", "rollout", "--tracking-uri", store.uri]) == 2
    assert "no group 'icepop'" in capsys.readouterr().err
    assert main(["compare", "-e", "single", "--a", "mean_n", "--b", "rollout", "--tracking-uri", store.uri,
                 "--set", "bogus=1"]) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err


def test_list_and_params(store, capsys):
    assert main(["list", "--tracking-uri", store.uri]) == 0
    assert "demo" in capsys.readouterr().out.split()
    assert main(["list", "-e", "demo", "--tracking-uri", store.uri]) == 0
    assert "mean_n(n=16)\t3 runs" in capsys.readouterr().out
    assert main(["params"]) == 0
    assert "collapse_noise_z = 7" in capsys.readouterr().out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_http_store_is_one_line_in_seconds(tmp_path, capsys, monkeypatch):
    """Issue 45: on d747b32 ``report`` against a store with nothing listening took 4 min 13 s and 5 tracebacks of
    MLflow's retries; now the store is asked /health first (as ``run`` does): exit 2, one line, each command."""
    import time

    monkeypatch.chdir(tmp_path)
    uri = f"http://alice:pw@127.0.0.1:{_free_port()}"
    for argv in (["report", "-e", "x", "--no-log"], ["list"], ["export", "-e", "x", "--out", "x.json.gz"]):
        t0 = time.monotonic()
        assert main([*argv, "--tracking-uri", uri]) == 2
        err = capsys.readouterr().err
        assert time.monotonic() - t0 < 15, argv
        assert err.startswith("error: cannot reach the MLflow tracking store at 'http://127.0.0.1:") and "pw" not in err
        assert len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_cannot_be_written_is_one_line_and_leaves_no_tmp(store, tmp_path, capsys):
    """Issue 45: on d747b32 ``export --out`` a folder left a ``.tmp`` and a traceback, ``report --out`` a file a
    traceback (a full disk the same: any OSError)."""
    folder = tmp_path / "taken.json.gz"
    folder.mkdir()
    assert main(["export", "-e", "demo", "--tracking-uri", store.uri, "--out", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write or read") and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.json.gz"]  # no taken.json.gz.tmp
    (tmp_path / "file").write_text("")
    assert main(["report", "-e", "demo", "--tracking-uri", store.uri, "--out", str(tmp_path / "file"),
                 "--no-log", "--set", "bootstrap_reps=200", "--set", "curve_reps=50"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write or read") and len(err.strip().splitlines()) == 1, err

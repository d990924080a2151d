"""Installable as a package (issue 32 item 5): a wheel, installed (not editable) into a fresh venv, runs
``python -m harness.run`` from an empty folder: the configs come from the wheel (``experiments`` is package data),
and the store, ``runs/`` and the warm-start cache go to that folder (``harness.uri.home``), none to the source tree.

The scratch venv sees this interpreter's packages (torch, mlflow, hydra...) through a ``.pth`` line, so nothing is
downloaded; the wheel is installed with ``--no-deps``. About 10 s on a CPU.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from harness.uri import ROOT, home, is_checkout

STEPS = ["trainer.steps=3", "trainer.prompts_per_step=4", "trainer.group_size=4", "trainer.num_minibatches=2",
         "diagnostics.noise_sequences=4", "task.warmstart.max_steps=3"]


def _snapshot(root: Path) -> tuple:
    db = root / "mlruns.db"
    runs = root / "runs"
    return (db.stat().st_mtime_ns if db.exists() else None,
            sorted(p.name for p in runs.iterdir()) if runs.is_dir() else None)


def test_home_rule(tmp_path, monkeypatch):
    """``$MOE_RL_HOME`` > the project root of a source checkout > the working directory."""
    monkeypatch.delenv("MOE_RL_HOME", raising=False)
    assert is_checkout(ROOT) and home() == ROOT
    assert not is_checkout(tmp_path)
    monkeypatch.setenv("MOE_RL_HOME", str(tmp_path))
    assert home() == tmp_path.resolve()


def test_wheel_runs_from_an_empty_folder(tmp_path):
    if not (ROOT / "pyproject.toml").exists():
        pytest.skip("needs the source tree")
    src = tmp_path / "src"  # a copy, so that the build's build/ and *.egg-info stay out of the source tree
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "mlruns*", "mlartifacts", ".cache",
                                                             "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, text=True, cwd=tmp_path)
    wheel = next(wheels.glob("moe_rl_harness-*.whl"))

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, system_site_packages=True)
    py = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    # this interpreter's packages (a venv's site-packages are not the base's), after the venv's own
    (purelib / "_host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, text=True, cwd=tmp_path)

    work = tmp_path / "empty"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_RL_HOME", "MLFLOW_TRACKING_URI", "PYTHONPATH")}
    where = subprocess.run([str(py), "-c", "from harness import spec; print(spec.__file__, spec.EXPERIMENTS)"],
                           capture_output=True, text=True, cwd=work, env=env)
    assert where.returncode == 0, where.stderr[-3000:]
    assert str(ROOT) not in where.stdout and str(env_dir) in where.stdout, where.stdout  # the installed copy

    before = _snapshot(ROOT)
    res = subprocess.run([str(py), "-m", "harness.run", *STEPS], capture_output=True, text=True, cwd=work, env=env,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (work / "mlruns.db").is_file()
    assert any((work / "runs").rglob("*")), "no run folder under runs/"
    assert any((work / ".cache" / "warmstart").glob("*.pt"))
    assert _snapshot(ROOT) == before  # nothing written to the source tree's store or runs/
    # the analysis follows the same home rule: on d747b32 the report went to <venv>/.../site-packages/figures/
    rep = subprocess.run([str(py), "-m", "analysis", "report", "-e", "default", "--no-log", "--set", "bootstrap_reps=200",
                          "--set", "curve_reps=50"], capture_output=True, text=True, cwd=work, env=env, timeout=300)
    assert rep.returncode == 0, rep.stderr[-3000:]
    assert (work / "figures" / "default" / "report.md").is_file()
    assert not list(env_dir.rglob("report.md"))  # no report under site-packages (analysis/figures/ is code)


def test_the_image_copy_refuses_to_write_inside_itself_and_names_its_commit(tmp_path):
    """The container image's copy (containers/install_in_image.sh wrote BUILD_COMMIT; no .git, issue 44): a run
    without MOE_RL_HOME exits 2 naming it, before anything is written; git_commit is the baked commit."""
    image = tmp_path / "opt-moe-rl-harness"
    for src in ("harness", "experiments"):
        shutil.copytree(ROOT / src, image / src, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", image / "pyproject.toml")
    (image / "BUILD_COMMIT").write_text("0123abc\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MOE_RL_HOME", "MLFLOW_TRACKING_URI", "PYTHONPATH")}
    res = subprocess.run([sys.executable, "-m", "harness.run", *STEPS], capture_output=True, text=True, cwd=image,
                         env=env, timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.startswith("error: MOE_RL_HOME: not set") and len(res.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in image.iterdir()) == ["BUILD_COMMIT", "experiments", "harness", "pyproject.toml"]
    probe = ("from harness.provenance import git_commit; from harness.uri import home; "
             "print(git_commit()); print(home())")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=image,
                         env={**env, "MOE_RL_HOME": str(tmp_path / "shared")}, check=True).stdout.split()
    assert out == ["0123abc", str((tmp_path / "shared").resolve())]

"""The cluster install (issue 30 item 1), checked without network: the container route's files
(``containers/Dockerfile``, ``containers/harness.def``, ``containers/install_in_image.sh``) and the ``cluster``
extra against verl 0.9.1's own requirements (the installed verl's metadata is the reference).

What stays unchecked here: that the pins exist on the package index and resolve for Python 3.12 (that needs the
index), and that the image builds (that needs docker/apptainer and the image).
"""
from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CONTAINERS = ROOT / "containers"
IMAGE = "verlai/verl:vllm024.dev2"


def _dockerfile_image() -> str:
    text = (CONTAINERS / "Dockerfile").read_text()
    m = re.search(r"^ARG VERL_IMAGE=(\S+)$", text, re.M)
    assert m and re.search(r"^FROM \$\{VERL_IMAGE\}$", text, re.M), "the Dockerfile's base is ARG VERL_IMAGE"
    return m.group(1)


def _copied(kind: str) -> set[str]:
    if kind == "docker":
        lines = re.findall(r"^COPY (.+)$", (CONTAINERS / "Dockerfile").read_text(), re.M)
        return {src for line in lines for src in line.split()[:-1]}
    files = (CONTAINERS / "harness.def").read_text().split("%files", 1)[1].split("%post", 1)[0]
    return {line.split()[0] for line in files.splitlines() if line.strip()}


def test_both_container_definitions_build_on_the_documented_pinned_image():
    """One image, pinned by tag (not latest), the same in the Dockerfile, the Apptainer file and docs/verl.md, with
    the driver it needs stated; both copy what the editable install needs and run the same install script."""
    assert _dockerfile_image() == IMAGE
    assert re.search(r"^From: (\S+)$", (CONTAINERS / "harness.def").read_text(), re.M).group(1) == IMAGE
    assert ":" in IMAGE and not IMAGE.endswith(":latest")
    doc = (ROOT / "docs" / "verl.md").read_text()
    assert f"`{IMAGE}`" in doc and "driver >= 580" in doc
    for name in ("Dockerfile", "harness.def"):
        text = (CONTAINERS / name).read_text()
        assert "bash containers/install_in_image.sh" in text and "driver >= 580" in text, name
    docker, apptainer = _copied("docker"), _copied("apptainer")
    assert docker == apptainer
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert {"pyproject.toml", project["project"]["readme"], "containers"} | packages <= docker
    assert all((ROOT / src).exists() for src in docker), sorted(s for s in docker if not (ROOT / s).exists())


FAKE_PY = """#!/usr/bin/env bash
# pip is faked (every call logged, `pip list` answers $FAKE_LIST); everything else is the real interpreter
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  shift 2
  printf '%s\\n' "$*" >> "$PIP_LOG"
  prev=""
  for a in "$@"; do [ "$prev" = "-c" ] && cp "$a" "$PIP_LOG.constraints"; prev=$a; done
  [ "$1" = "list" ] && cat "$FAKE_LIST"
  exit 0
fi
exec {real} "$@"
"""


def _install(tmp_path: Path, image: list[str]) -> tuple[subprocess.CompletedProcess, list[list[str]], str]:
    fake = tmp_path / "python"
    fake.write_text(FAKE_PY.replace("{real}", shlex.quote(sys.executable)))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "list.txt").write_text("".join(f"{line}\n" for line in image))
    log = tmp_path / "pip.log"
    env = {**os.environ, "PYTHON": str(fake), "PIP_LOG": str(log), "FAKE_LIST": str(tmp_path / "list.txt")}
    env.pop("PYTHONPATH", None)  # the check imports the harness from the project root (the script's cwd)
    res = subprocess.run(["bash", str(CONTAINERS / "install_in_image.sh")], capture_output=True, text=True,
                         env=env, timeout=300)
    calls = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    pins = (tmp_path / "pip.log.constraints").read_text() if (tmp_path / "pip.log.constraints").exists() else ""
    return res, calls, pins


IMAGE_LIST = ["torch==2.11.0+cu130", "vllm==0.24.0", "numpy==2.2.6", "transformers==5.5.3", "verl==0.6.0"]


def test_install_in_image_pins_the_image_and_installs_only_what_pip_may(tmp_path):
    """The image's versions are frozen first (verl aside) and constrain every install; verl 0.9.1 replaces the
    image's other release; the harness goes in with --no-deps, then its dependencies except torch; the last step is
    the install check, which on a machine without the image's stack (CI: torch 2.13 CPU, no vLLM, no Megatron) fails
    naming each gap."""
    import tomllib

    res, calls, pins = _install(tmp_path, IMAGE_LIST)
    assert [c[0] for c in calls] == ["list", "install", "install", "install"], calls
    assert "--format=freeze" in calls[0] and "--exclude-editable" in calls[0]
    verl, harness, deps = calls[1], calls[2], calls[3]
    assert verl[-1] == "verl==0.9.1" and "-c" in verl and "--no-deps" not in verl
    assert harness[-2:] == ["-e", "."] and "--no-deps" in harness
    want = [d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
            if not d.startswith("torch")]
    assert deps[deps.index("-c") + 2:] == want and len(want) >= 10  # pyproject's dependencies but torch
    assert pins.split() == [p for p in IMAGE_LIST if not p.startswith("verl==")]  # verl is not held back
    from harness.backends.verl.runner import install_problems

    here = install_problems()  # CI's CPU venv: torch 2.13, no vLLM, no Megatron stack
    assert res.returncode == (1 if here else 0), res.stdout + res.stderr
    assert all(f"[install_in_image] {p}" in res.stderr for p in here), res.stderr


def test_install_in_image_keeps_the_images_verl_when_it_is_0_9_1(tmp_path):
    res, calls, _ = _install(tmp_path, [*IMAGE_LIST[:-1], "verl==0.9.1"])
    assert [c[0] for c in calls] == ["list", "install", "install"], calls
    assert not any("verl==0.9.1" in c for c in calls)
    assert "its verl: 0.9.1" in res.stdout


def test_install_problems_is_empty_for_a_complete_image_and_names_each_gap(monkeypatch):
    """``runner.install_problems``: what the script's last step checks (both strategies' packages, the releases)."""
    import importlib.util
    from importlib import metadata

    from harness.backends.verl import runner

    installed = {"verl": "0.9.1", "vllm": "0.24.0", "torch": "2.11.0+cu130"}

    def version(dist):
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]

    absent = set()
    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in absent else object())
    assert runner.install_problems() == []
    del installed["vllm"]
    installed["torch"] = "2.9.1"
    absent.add("megatron.bridge")
    assert runner.install_problems() == [
        "vllm is not installed, the harness needs vllm==0.24.0 (what verl 0.9.1 pins)",
        "torch 2.9.1 is installed, the harness needs torch==2.11.0 (what vLLM 0.24.0's compiled extensions are "
        "built for)",
        "megatron-bridge is not importable (module megatron.bridge: verl's megatron model providers)"]


def _closure(extras: set[str]):
    """verl's requirements for ``verl[extras]``, its self-references (``verl[verl-core]``) followed."""
    from importlib import metadata

    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in metadata.requires("verl")]
    todo, done, out = set(extras), set(), []
    while todo:
        extra = todo.pop()
        done.add(extra)
        for r in reqs:
            if r.marker is None or not r.marker.evaluate({"extra": extra}):
                continue
            if r.name == "verl":
                todo |= set(r.extras) - done
            else:
                out.append(r)
    return out + [r for r in reqs if r.marker is None]


def test_the_cluster_extra_agrees_with_verls_own_requirements():
    """Offline consistency of ``.[cluster]`` (the index resolution for Python 3.12 needs network): it names extras
    verl 0.9.1 declares; their closure pins the vLLM and torch the preflight requires, leaves out the Megatron
    stack (verl[megatron] pins megatron-bridge==0.5.2, which the index lacks: it comes from the image), admits
    Python 3.12, and every exact pin in it satisfies every other specifier on the same distribution."""
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    from harness.backends.verl.runner import REQUIRED_VERSIONS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (cluster,) = [Requirement(r) for r in project["optional-dependencies"]["cluster"]]
    assert cluster.name == "verl" and str(cluster.specifier) == "==0.9.1" == f"=={metadata.version('verl')}"
    meta = metadata.metadata("verl")
    assert cluster.extras <= set(meta.get_all("Provides-Extra"))
    assert SpecifierSet(meta["Requires-Python"]).contains("3.12")
    closure = _closure(set(cluster.extras))
    by_name: dict[str, list] = {}
    for r in closure:
        by_name.setdefault(canonicalize_name(r.name), []).append(r.specifier)
    pins = {n: next(str(s)[2:] for s in specs if str(s).startswith("==") and "," not in str(s))
            for n, specs in by_name.items() if any(str(s).startswith("==") and "," not in str(s) for s in specs)}
    required = {d: v for d, v, _ in REQUIRED_VERSIONS}
    assert pins["vllm"] == required["vllm"] and pins["torch"] == required["torch"]
    assert {"megatron-bridge", "megatron-core", "transformer-engine", "apex"}.isdisjoint(by_name)
    for name, version in pins.items():
        for spec in by_name[name]:
            assert spec.contains(version, prereleases=True), f"{name}=={version} against {spec}"
    # the test extra's transformers range meets the cluster's pin (CI tests what the cluster runs)
    (tf,) = [Requirement(r) for r in project["optional-dependencies"]["test"] if r.startswith("transformers")]
    assert tf.specifier.contains(pins["transformers"])


def test_the_preflight_holds_installed_packages_to_verls_own_requirements(spec, monkeypatch):
    """An image (or a --no-deps install) with a transformers newer than verl 0.9.1 allows is named, by the install
    check and by the preflight, with verl's own specifier; within verl's ranges nothing is said."""
    from importlib import metadata

    from harness.backends.verl import runner

    installed = {"verl": "0.9.1", "vllm": "0.24.0", "torch": "2.11.0+cu130", "transformers": "5.10.4",
                 "tensordict": "0.10.0", "numpy": "2.2.6"}
    requires = ["transformers!=5.6.0,<5.11,>=5.5.3", "tensordict!=0.9.0,<=0.10.0,>=0.8.0", "numpy>=2.0.0", "wandb",
                "mbridge; extra == \"mcore\"", "absent-dist>=1"]

    def version(dist):
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.setattr(metadata, "requires", lambda dist: requires if dist == "verl" else [])
    assert runner.version_problems() == []
    installed.update(transformers="5.17.0", numpy="1.26.4")
    assert runner.verl_requirement_problems() == [
        "transformers 5.17.0 is installed, verl 0.9.1 requires transformers!=5.6.0,<5.11,>=5.5.3",
        "numpy 1.26.4 is installed, verl 0.9.1 requires numpy>=2.0.0"]
    assert runner.verl_requirement_problems()[0] in runner.install_problems()
    with pytest.raises(runner.VerlUnavailable, match=r"transformers 5\.17\.0 is installed, verl 0\.9\.1 requires"):
        runner.preflight(spec("estimator=tis", "model=qwen3_4b"))

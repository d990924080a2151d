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
    files = (CONTAINERS / "harness.def").read_text().split("%files", 1)[1].split("%", 1)[0]
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


# ---------------------------------------------------------------- the image install, with the real pip (issue 44)
# The "image" is a venv holding FAKE distributions (tiny wheels built here: metadata and an empty module, no code of
# the real projects) with verlai/verl:vllm024.dev2's known inconsistencies: nvidia-nccl-cu13 2.29.7 above torch
# 2.11.0's ==2.28.9 pin (verl's Dockerfile upgrades it --no-deps), hydra-core 1.3.2 (older than the harness's pin),
# transformers 5.3.0 (below verl 0.9.1's >= 5.5.3). The "index" is a folder of FAKE wheels that pip reads with
# --no-index --find-links: no network. pip, setuptools (the editable build) and the script are real.
IMAGE_DISTS = {  # name: (version, requirements, modules)
    "torch": ("2.11.0", ["nvidia-nccl-cu13==2.28.9"], ["torch"]),
    "nvidia-nccl-cu13": ("2.29.7", [], ["nvidia_nccl_fake"]),
    "vllm": ("0.24.0", ["torch==2.11.0", "transformers>=5.5.3"], ["vllm"]),
    "flash-attn": ("2.8.3", ["torch"], ["flash_attn"]),
    "megatron-core": ("0.18.0", ["torch"], ["megatron.core"]),
    "megatron-bridge": ("0.5.0", ["megatron-core"], ["megatron.bridge"]),
    "mbridge": ("0.15.1", [], ["mbridge"]),
    "transformer-engine": ("2.16.1", [], ["transformer_engine"]),
    "ray": ("2.60.0", [], ["ray"]),
    "transformers": ("5.3.0", ["huggingface-hub>=1.3,<2"], ["transformers"]),
    "huggingface-hub": ("1.4.0", [], ["huggingface_hub"]),
    "hydra-core": ("1.3.2", ["omegaconf>=2.2,<2.4", "antlr4-python3-runtime==4.9.*"], ["hydra"]),
    "omegaconf": ("2.3.0", ["antlr4-python3-runtime==4.9.*"], ["omegaconf"]),
    "antlr4-python3-runtime": ("4.9.3", [], ["antlr4"]),
    "numpy": ("2.2.6", [], ["numpy"]), "pandas": ("2.3.3", ["numpy>=1.26"], ["pandas"]),
    "scipy": ("1.16.3", ["numpy>=1.25"], ["scipy"]), "matplotlib": ("3.10.7", ["numpy>=1.23"], ["matplotlib"]),
    "mlflow": ("3.5.1", [], ["mlflow"]), "optuna": ("4.5.0", [], ["optuna"]), "tqdm": ("4.67.1", [], ["tqdm"]),
    "filelock": ("3.20.0", [], ["filelock"]),
}
VERL_REQUIRES = ["codetiming", "torch", "transformers!=5.6.0,<5.11,>=5.5.3", "hydra-core", "numpy>=2.0.0",
                 "tensordict!=0.9.0,<=0.10.0,>=0.8.0", "ray>=2.41", 'vllm==0.24.0; extra == "vllm"']
INDEX_DISTS = {  # what the package index offers (older and newer releases beside the ones that fit)
    "verl": [("0.9.1", VERL_REQUIRES, ["verl"])],
    "transformers": [("5.9.0", ["huggingface-hub>=1.5,<2", "tokenizers>=0.22,<=0.23"], ["transformers"]),
                     ("5.10.4", ["huggingface-hub>=1.5,<2", "tokenizers>=0.22,<=0.23"], ["transformers"])],
    "huggingface-hub": [("1.6.0", [], ["huggingface_hub"])], "tokenizers": [("0.22.2", [], ["tokenizers"])],
    "tensordict": [("0.10.0", ["torch", "orjson"], ["tensordict"])], "orjson": [("3.13.0", [], ["orjson"])],
    "codetiming": [("1.4.0", [], ["codetiming"])],
    "hydra-core": [("1.3.8", ["omegaconf>=2.2,<2.4", "antlr4-python3-runtime==4.9.*"], ["hydra"])],
    "submitit": [("1.5.3", ["cloudpickle>=1.2.1"], ["submitit"])], "cloudpickle": [("3.1.1", [], ["cloudpickle"])],
    "ruptures": [("1.1.10", ["numpy", "scipy"], ["ruptures"])],
    "seaborn": [("0.13.2", ["numpy>=1.20", "pandas>=1.2", "matplotlib>=3.4"], ["seaborn"])],
    "statsmodels": [("0.14.5", ["numpy", "scipy", "pandas", "patsy"], ["statsmodels"])],
    "patsy": [("1.0.1", ["numpy"], ["patsy"])],
    # what a resolver would "repair" the image with (the script must never ask for them)
    "nvidia-nccl-cu13": [("2.28.9", [], ["nvidia_nccl_fake"])], "torch": [("2.11.0", ["nvidia-nccl-cu13==2.28.9"],
                                                                            ["torch"])],
}


def _fake_wheel(folder: Path, name: str, version: str, requires: list[str], modules: list[str]) -> Path:
    """A FAKE distribution as a wheel: METADATA (name, version, Requires-Dist) and empty top-level modules."""
    import zipfile

    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    files = {}
    for module in modules:
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            files["/".join(parts[:i]) + "/__init__.py"] = "FAKE = True  # a stand-in built by test_verl_install.py\n"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 f"Summary: FAKE {name} for the image install test\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires))
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    return path


def _repacked_wheel(folder: Path, name: str) -> Path:
    """The REAL installed distribution ``name`` of this venv (setuptools: the image's build backend) as a wheel."""
    import zipfile
    from importlib import metadata

    d = metadata.distribution(name)
    path = folder / f"{name}-{d.version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f in d.files:
            src = Path(d.locate_file(f))
            if src.is_file() and "__pycache__" not in f.parts and not str(f).startswith(".."):
                z.write(src, str(f))
    return path


def _image(tmp: Path, index_without: tuple[str, ...] = ()) -> tuple[Path, Path, Path]:
    """(the fake image's python, the index folder, the project copy): a venv (pip copied from this one, as the
    image's own), the FAKE image distributions installed --no-deps (so the image's inconsistencies are real), the
    project's files as containers/Dockerfile copies them (no .git)."""
    import shutil

    import pip

    venv = tmp / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    here = Path(pip.__file__).resolve().parent
    shutil.copytree(here, site / "pip")
    from importlib import metadata

    shutil.copytree(Path(metadata.distribution("pip")._path), site / Path(metadata.distribution("pip")._path).name)
    image_whl, index = tmp / "image_wheels", tmp / "index"
    image_whl.mkdir()
    index.mkdir()
    for name, (version, requires, modules) in IMAGE_DISTS.items():
        _fake_wheel(image_whl, name, version, requires, modules)
    _repacked_wheel(image_whl, "setuptools")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check",
                    *map(str, image_whl.iterdir())], check=True, timeout=300)
    for name, releases in INDEX_DISTS.items():
        if name not in index_without:
            for version, requires, modules in releases:
                _fake_wheel(index, name, version, requires, modules)
    project = tmp / "opt-moe-rl-harness"
    project.mkdir()
    for src in sorted(_copied("docker")):
        (shutil.copytree if (ROOT / src).is_dir() else shutil.copy2)(
            ROOT / src, project / src, **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / src).is_dir()
                                          else {}))
    return py, index, project


def _run_install(py: Path, index: Path, project: Path, **env) -> subprocess.CompletedProcess:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}, "PYTHON": str(py),
            "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), **env}
    return subprocess.run(["bash", str(project / "containers" / "install_in_image.sh")], capture_output=True,
                          text=True, env=full, timeout=600)


def _versions(py: Path) -> dict[str, str]:
    out = subprocess.run([str(py), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
                         capture_output=True, text=True, check=True).stdout
    return {line.split("==")[0].lower(): line.split("==")[1] for line in out.splitlines() if "==" in line}


def test_install_in_image_builds_on_the_images_inconsistencies_with_the_real_pip(tmp_path):
    """verl and what is missing go in --no-deps, one at a time; the image's NCCL (above torch's pin) and torch stay;
    transformers 5.3.0 becomes the pinned 5.9.0 (not the index's newest, 5.10.4), hydra-core the harness's 1.3.8;
    pip check's NCCL line is on the allow-list; the commit is baked in; the install check passes."""
    py, index, project = _image(tmp_path)
    before = _versions(py)
    res = _run_install(py, index, project, HARNESS_COMMIT="0123abc")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    after = _versions(py)
    assert after["verl"] == "0.9.1" and after["transformers"] == "5.9.0" and after["hydra-core"] == "1.3.8"
    assert after["huggingface-hub"] == "1.6.0"  # transformers 5.9.0's requirement, followed
    assert {after[n] for n in ("codetiming", "tensordict", "orjson", "tokenizers", "submitit", "cloudpickle",
                               "ruptures", "seaborn", "statsmodels")} and after["moe-rl-harness"]
    untouched = ("torch", "nvidia-nccl-cu13", "vllm", "flash-attn", "megatron-core", "numpy", "omegaconf", "mlflow")
    assert {n: after[n] for n in untouched} == {n: before[n] for n in untouched}
    assert after["nvidia-nccl-cu13"] == "2.29.7"  # verl's override kept (pip's resolver would "repair" it)
    assert "torch 2.11.0 has requirement nvidia-nccl-cu13==2.28.9" in res.stdout  # reported, allowed
    assert (project / "BUILD_COMMIT").read_text().strip() == "0123abc"
    assert "[install_in_image] installing transformers==5.9.0" in res.stdout


def test_install_in_image_fails_naming_a_requirement_the_index_lacks(tmp_path):
    py, index, project = _image(tmp_path, index_without=("codetiming",))
    res = _run_install(py, index, project, HARNESS_COMMIT="0123abc")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "[install_in_image] cannot install codetiming: codetiming (verl 0.9.1: not installed)" in res.stderr
    assert not (project / "BUILD_COMMIT").exists()


def test_install_in_image_refuses_a_copy_without_git_and_without_a_commit(tmp_path):
    import shutil

    project = tmp_path / "p"
    shutil.copytree(CONTAINERS, project / "containers")
    log = tmp_path / "called"
    fake = tmp_path / "python"  # any pip call would be logged: none may happen
    fake.write_text(f"#!/usr/bin/env bash\n[ \"$1\" = -m ] && echo \"$*\" >> {log}\nexec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    res = subprocess.run(["bash", str(project / "containers" / "install_in_image.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": str(fake), "HARNESS_COMMIT": ""}, timeout=60)
    assert res.returncode == 2 and "HARNESS_COMMIT is not set" in res.stderr and "--build-arg" in res.stderr
    assert not log.exists()


def test_pip_checks_lines_pass_only_when_allowed():
    import importlib.util

    spec = importlib.util.spec_from_file_location("image_deps", CONTAINERS / "image_deps.py")
    deps = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(deps)
    nccl = "torch 2.11.0 has requirement nvidia-nccl-cu13==2.28.9, but you have nvidia-nccl-cu13 2.29.7."
    other = "vllm 0.24.0 has requirement transformers>=5.5.3, but you have transformers 5.3.0."
    gone = "mbridge 0.15.1 requires megatron-core, which is not installed."
    assert deps.check(nccl) == [] and deps.check("No broken requirements found.") == []
    assert deps.check("\n".join([nccl, other, gone])) == [other, gone]


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

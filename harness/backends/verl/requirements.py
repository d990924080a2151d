"""What an install for the cluster must hold (the preflight's and ``containers/install_in_image.sh``'s check).

A leaf: the standard library and ``packaging`` (pip's vendored copy where the distribution is absent), no import of
the harness, so that the image build runs it by path (``python harness/backends/verl/requirements.py``) before
the harness's own dependencies are known to import; the exit status is 1 and each problem one line on stderr
when the install is incomplete. ``harness.backends.verl.runner`` re-exports these names.
"""
from __future__ import annotations

import importlib


def _packaging(module: str, *names: str):
    """``packaging.<module>``'s ``names`` (pip's vendored ``packaging`` where the distribution is not installed)."""
    try:
        mod = importlib.import_module(f"packaging.{module}")
    except ImportError:  # pragma: no cover  (an image with pip but without packaging)
        mod = importlib.import_module(f"pip._vendor.packaging.{module}")
    return tuple(getattr(mod, n) for n in names)


#: packages the chosen verl path imports on the GPU nodes: (module, distribution, why). The legacy
#: trainer (``trainer.use_v1=false``, the only one we run) needs no TransferQueue; ``pip install
#: -e .[cluster]`` (pyproject.toml) installs all of them with the versions verl 0.9.1 pins.
#: (vLLM itself is imported, not just found: a broken CUDA install fails at import)
PACKAGES_ALWAYS = (("ray", "ray", "verl's single controller"),)
PACKAGES_BY_STRATEGY = {
    "megatron": (("megatron.core", "megatron-core", "the megatron engine"),
                 ("mbridge", "mbridge", "verl's HF <-> megatron weight bridge (use_mbridge)"),
                 ("megatron.bridge", "megatron-bridge", "verl's megatron model providers"),
                 ("transformer_engine", "transformer-engine", "megatron's fused layers")),
    "fsdp": (("flash_attn", "flash-attn", "attn_implementation=flash_attention_2 (verl's default)"),),
    "fsdp2": (("flash_attn", "flash-attn", "attn_implementation=flash_attention_2 (verl's default)"),),
}


#: distributions whose version the harness is built against (docs/verl.md, "Container route"): (distribution,
#: version, why). Compared on the release (2.11.0+cu130 is 2.11.0): verl's config keys, trainer steps and loss
#: signatures (translate.py, plugins/) are 0.9.1's; vLLM's prompt-logprob layout and AsyncLLM are 0.24.0's (verl 0.9.1
#: pins it); torch is the one vLLM 0.24.0's compiled extensions are built for.
REQUIRED_VERSIONS = (("verl", "0.9.1", "translate.py and plugins/ target its config and code"),
                     ("vllm", "0.24.0", "what verl 0.9.1 pins"),
                     ("torch", "2.11.0", "what vLLM 0.24.0's compiled extensions are built for"))


def version_problems() -> list[str]:
    """``<dist> <found> is installed, the harness needs <dist>==<want> (why)`` for every distribution of
    ``REQUIRED_VERSIONS`` present at another release (an absent one is named by the package checks)."""
    from importlib import metadata

    InvalidVersion, Version = _packaging("version", "InvalidVersion", "Version")

    out = []
    for dist, want, why in REQUIRED_VERSIONS:
        try:
            found = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        try:
            same = Version(found).release == Version(want).release
        except InvalidVersion:
            same = False
        if not same:
            out.append(f"{dist} {found} is installed, the harness needs {dist}=={want} ({why})")
    return out + verl_requirement_problems()


def verl_requirement_problems() -> list[str]:
    """``<dist> <found> is installed, verl <v> requires <dist><specifier>`` for every unconditional requirement of
    the installed verl (its own Requires-Dist) that an installed distribution does not meet: an image, or an
    install with ``--no-deps``, can carry e.g. a transformers newer than verl 0.9.1 allows (< 5.11). An absent
    distribution is left to the package checks."""
    from importlib import metadata

    InvalidRequirement, Requirement = _packaging("requirements", "InvalidRequirement", "Requirement")
    InvalidVersion, Version = _packaging("version", "InvalidVersion", "Version")

    try:
        verl, requires = metadata.version("verl"), metadata.requires("verl") or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None or not req.specifier:  # an extra's, or any version
            continue
        try:
            found = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue
        try:
            ok = req.specifier.contains(Version(found), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            out.append(f"{req.name} {found} is installed, verl {verl} requires {req.name}{req.specifier}")
    return out


def install_problems() -> list[str]:
    """What an install for the cluster lacks (``containers/install_in_image.sh`` ends with it): every distribution
    of ``REQUIRED_VERSIONS`` present at its release, and every package of every strategy's path importable (the
    image serves both strategies). Empty when the install is complete; needs no GPU."""
    from importlib import metadata

    out = []
    for dist, want, why in REQUIRED_VERSIONS:
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            out.append(f"{dist} is not installed, the harness needs {dist}=={want} ({why})")
    out += version_problems()
    packages = {module: (dist, why) for module, dist, why in
                (*PACKAGES_ALWAYS, *(p for ps in PACKAGES_BY_STRATEGY.values() for p in ps))}
    return out + [f"{dist} is not importable (module {module}: {why})" for module, (dist, why) in packages.items()
                  if not importable(module)]


def importable(module: str) -> bool:
    """Whether ``module`` can be found (not imported: a CUDA package's import may need a GPU)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing
        return False


def main() -> int:
    import sys

    problems = install_problems()
    for p in problems:
        print(f"[install_in_image] {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What ``install_in_image.sh`` installs into verl's image, and which ``pip check`` lines it accepts (issue 44).

verl's own CI on its image installs verl and transformers with ``--no-deps`` and constrains nothing: the image
carries deliberate inconsistencies (its last layer force-upgrades NCCL past torch's exact pin), which pip's resolver
would otherwise try to "repair" or refuse. This helper does the resolving itself, one requirement at a time:

    python containers/image_deps.py plan OURS_FILE     # lines "<name>\t<requirement>\t<why>": pip install --no-deps
    pip check | python containers/image_deps.py check  # exit 1 naming each line not on the allow-list

``plan``: the requirements of the roots (verl's unconditional requirements, the harness's dependencies from
pyproject.toml but torch) and of every distribution the script installed (``OURS_FILE``, one name a
line) that the environment does not meet: absent, or at a version outside the specifier. The image's own packages'
requirements are left to ``pip check``. A requirement on a distribution of the image's compiled family (``FAMILY``:
torch, NVIDIA, vLLM, flash-attn, the Megatron stack) is never installed or replaced: it is printed as
``IMAGE\t<message>`` and the script stops. ``PINS``: the exact version installed where a requirement on that
distribution is unmet (and the pin meets it).

``check``: pip check's lines, each ``<dist> <version> has requirement <req>, but you have ...`` or ``<dist> <version>
requires <name>, which is not installed.``, against ``pip_check_allowed.txt`` beside this file (``<dist>
<requirement name>`` and why, one pair a line). Standard library and ``packaging`` (pip's copy where absent) only.
"""
from __future__ import annotations

import importlib
import re
import sys
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ALLOWED = HERE / "pip_check_allowed.txt"
#: the image's compiled stack: built against its CUDA, never installed or replaced here
FAMILY = re.compile(r"^(torch|torchvision|torchaudio|triton|vllm|flash-attn|flashinfer-python|xformers|apex|deep-ep|"
                    r"megatron-core|megatron-bridge|mbridge|transformer-engine(-cu\d+)?|cupy-cuda\d+x|nvidia-.+)$")
#: exact versions for what the image may lack or carry outside verl's range (verl's CI pins transformers the same way)
PINS = {"transformers": "5.9.0"}  # what `.[cluster]` resolves for Python 3.12; verl 0.9.1 needs >=5.5.3,<5.11
#: the harness's dependencies that come from the image (pyproject.toml's others: pip)
IMAGE_PROVIDES = {"torch"}


def _packaging(module: str, *names: str):
    try:
        mod = importlib.import_module(f"packaging.{module}")
    except ImportError:  # pragma: no cover
        mod = importlib.import_module(f"pip._vendor.packaging.{module}")
    return tuple(getattr(mod, n) for n in names)


Requirement, = _packaging("requirements", "Requirement")
canonicalize_name, = _packaging("utils", "canonicalize_name")
Version, InvalidVersion = _packaging("version", "Version", "InvalidVersion")


def _unconditional(lines) -> list:
    """The requirements without a marker that excludes them here (extras are the image's business)."""
    out = []
    for line in lines or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req)
    return out


def roots() -> list[tuple[object, str]]:
    """(requirement, who needs it): verl's, the harness's (pyproject.toml, less ``IMAGE_PROVIDES``)."""
    import tomllib

    out = []
    try:
        verl = metadata.version("verl")
        out += [(r, f"verl {verl}") for r in _unconditional(metadata.requires("verl"))]
    except metadata.PackageNotFoundError:
        pass
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out += [(r, "the harness (pyproject.toml)") for r in map(Requirement, deps)
            if canonicalize_name(r.name) not in IMAGE_PROVIDES]
    return out


def _unmet(req) -> str | None:
    """Why the environment does not meet ``req`` (None: it does)."""
    try:
        found = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        return "not installed"
    try:
        ok = not req.specifier or req.specifier.contains(Version(found), prereleases=True)
    except InvalidVersion:
        ok = False
    return None if ok else f"{found} installed"


def plan(ours: list[str]) -> list[str]:
    """The lines of ``plan`` (module docstring): one per distribution, its first unmet requirement."""
    todo = list(roots())
    for name in ours:
        try:
            dist = f"{name} {metadata.version(name)}"
            todo += [(r, dist) for r in _unconditional(metadata.requires(name))]
        except metadata.PackageNotFoundError:
            continue
    lines, seen = [], set()
    for req, who in todo:
        key = canonicalize_name(req.name)
        if key in seen:
            continue
        why = _unmet(req)
        if why is None:
            continue
        seen.add(key)
        if key in PINS and req.specifier.contains(PINS[key], prereleases=True):
            req = Requirement(f"{req.name}=={PINS[key]}")  # the pinned version of what is missing
        if FAMILY.match(key):
            lines.append(f"IMAGE\t{req} (required by {who}): {why}; the image's compiled stack provides it, this "
                         "script never installs or replaces it: use an image that has it")
        else:
            lines.append(f"{key}\t{req}\t{who}: {why}")
    return lines


def allowed() -> set[tuple[str, str]]:
    out = set()
    for line in ALLOWED.read_text().splitlines():
        parts = line.split("#", 1)[0].split()
        if len(parts) >= 2:
            out.add((canonicalize_name(parts[0]), canonicalize_name(parts[1])))
    return out


_HAS = re.compile(r"^(\S+) \S+ has requirement ([A-Za-z0-9_.\-]+)")
_REQUIRES = re.compile(r"^(\S+) \S+ requires ([A-Za-z0-9_.\-]+), which is not installed")


def check(pip_check_output: str) -> list[str]:
    """pip check's lines that the allow-list does not name (a line pip check prints that matches no known form
    counts as not allowed)."""
    ok = allowed()
    bad = []
    for line in pip_check_output.splitlines():
        line = line.strip()
        if not line or line.startswith("No broken requirements"):
            continue
        m = _HAS.match(line) or _REQUIRES.match(line)
        if m is None or (canonicalize_name(m.group(1)), canonicalize_name(m.group(2))) not in ok:
            bad.append(line)
    return bad


def main(argv: list[str]) -> int:
    if argv[:1] == ["plan"] and len(argv) == 2:
        path = Path(argv[1])
        ours = [n.strip() for n in path.read_text().splitlines() if n.strip()] if path.exists() else []
        print("\n".join(plan(ours)))
        return 0
    if argv == ["check"]:
        bad = check(sys.stdin.read())
        for line in bad:
            print(f"[install_in_image] pip check: {line} (not on containers/pip_check_allowed.txt)", file=sys.stderr)
        return 1 if bad else 0
    print("usage: image_deps.py plan OURS_FILE | image_deps.py check < pip-check-output", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

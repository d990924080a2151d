#!/usr/bin/env bash
# Install the harness inside verl's image without touching what the image ships (docs/verl.md, "Container route").
# Run from the project root of a copy of the repository, as the image's Python (containers/Dockerfile and
# containers/harness.def run it at build time, passing the commit; on a running container, run it the same way):
#   HARNESS_COMMIT=$(git rev-parse HEAD) bash containers/install_in_image.sh
# As verl's own CI does on this image (issue 44): every install is `pip install --no-deps`, nothing is constrained,
# and only what is missing is installed:
#   the image:  torch (CUDA build), NVIDIA libraries, vLLM, flash-attn, the Megatron stack (containers/image_deps.py
#               FAMILY): compiled against the image's CUDA, never installed or replaced here (a requirement on one of
#               them that the image does not meet stops the build, naming it);
#   pip:        verl==0.9.1 when the image's verl is another release (verl's images uninstall theirs); then, one at a
#               time, each requirement of verl (unconditional), of the harness (pyproject.toml, less torch) and of what
#               this script installed that the image does not meet (absent, or outside the range: e.g. the image's
#               transformers 5.3.0 < verl's 5.5.3 -> transformers 5.9.0, its pin; hydra-core -> the harness's 1.3.8);
#               the harness itself (--no-deps, editable, built with the image's setuptools);
#   pip check:  every inconsistency pip reports must be on containers/pip_check_allowed.txt (the image's NCCL above
#               torch's pin is); anything else fails the build, naming the line.
# Then the commit is written to BUILD_COMMIT (the copy has no .git: harness.provenance reads it, and harness.uri
# refuses to put runs or the store inside the image without MOE_RL_HOME), and the install check
# (harness/backends/verl/requirements.py): verl/vLLM/torch at the harness's releases and every package of both
# strategies importable; exit 1 naming what is wrong otherwise. PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERL=0.9.1
# verl's image installs into its system Python (Ubuntu's PEP 668 marker may be there): installing into it is the point
export PIP_BREAK_SYSTEM_PACKAGES=${PIP_BREAK_SYSTEM_PACKAGES:-1}
say() { echo "[install_in_image] $*"; }
die() { echo "[install_in_image] $*" >&2; exit "${2:-1}"; }
pip_() { "$PY" -m pip install --disable-pip-version-check --no-cache-dir --no-deps "$@"; }

# bad input first (exit 2, nothing installed): the interpreter, the commit
"$PY" -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 12) else
"python %d.%d: verl 0.9.1 needs >= 3.10, < 3.13" % v)' || exit 2
commit=${HARNESS_COMMIT:-}
if [ -z "$commit" ] && [ -e .git ]; then
  commit=$(git rev-parse HEAD 2>/dev/null || true)
fi
if [ -z "$commit" ] && [ ! -e .git ]; then
  die "HARNESS_COMMIT is not set and this copy has no .git: build with --build-arg HARNESS_COMMIT=\$(git rev-parse HEAD) (docs/verl.md, \"Container route\")" 2
fi

ours=$(mktemp)
trap 'rm -f "$ours"' EXIT
found=$("$PY" -c 'from importlib import metadata
try: print(metadata.version("verl"))
except metadata.PackageNotFoundError: print("none")')
say "the image's verl: $found"
if [ "$found" != "$VERL" ]; then
  pip_ "verl==$VERL"
  echo verl >> "$ours"
fi
# what is missing, one requirement at a time (a requirement pip cannot find fails here, named)
for round in $(seq 1 20); do
  plan=$("$PY" containers/image_deps.py plan "$ours")
  [ -z "$plan" ] && break
  if grep -q '^IMAGE' <<< "$plan"; then
    grep '^IMAGE' <<< "$plan" | cut -f2- | sed 's/^/[install_in_image] /' >&2
    exit 1
  fi
  while IFS=$'\t' read -r name req why; do
    say "installing $req ($why)"
    pip_ "$req" < /dev/null || die "cannot install $name: $req ($why) is missing and pip cannot install it (pip's error above)"
    echo "$name" >> "$ours"
  done <<< "$plan"
  [ "$round" = 20 ] && die "requirements still unmet after 20 rounds: $plan"
done
pip_ --no-build-isolation -e .
checked=$("$PY" -m pip check --disable-pip-version-check 2>&1 || true)
[ -n "$checked" ] && say "pip check: $checked"
"$PY" containers/image_deps.py check <<< "$checked"
if [ ! -e .git ]; then
  echo "$commit" > BUILD_COMMIT
  say "commit $commit written to BUILD_COMMIT"
fi
# (by path: a leaf of the standard library and packaging; run_path keeps the verl package's folder off sys.path)
"$PY" -c 'import runpy; runpy.run_path("harness/backends/verl/requirements.py", run_name="__main__")'
say "done: verl $VERL, the harness (editable) and what was missing, the image's stack untouched"

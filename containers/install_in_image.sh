#!/usr/bin/env bash
# Install the harness inside verl's image without touching what the image ships (docs/verl.md, "Container route").
# Run from the project root of a copy of the repository, as the image's Python (containers/Dockerfile and
# containers/harness.def run it at build time; on a running container, run it the same way):
#   bash containers/install_in_image.sh
# What comes from where:
#   the image:  torch (CUDA build), vLLM, flash-attn, the Megatron stack (megatron-core, megatron-bridge, mbridge,
#               transformer-engine, apex): compiled against the image's CUDA, never installed or upgraded here;
#   pip:        verl==0.9.1 when the image's verl is another release (verl's images uninstall verl), with those of its
#               own requirements the image lacks; the harness itself (--no-deps, editable); the harness's
#               dependencies except torch. Every pip install is constrained to the versions the image already has
#               (pip list, frozen before the first install), so a clash fails the build instead of replacing a
#               compiled package.
# Then the preflight's install check (harness.backends.verl.runner.install_problems): verl/vLLM/torch at the
# releases the harness is built against and every package of both strategies importable; exit 1 naming what is
# wrong otherwise. PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VERL=0.9.1
IMAGE_PROVIDES="torch"  # harness dependencies that must come from the image (pyproject.toml's other ones: pip)
# verl's image installs into its system Python (Ubuntu's PEP 668 marker may be there): installing into it is the point
export PIP_BREAK_SYSTEM_PACKAGES=${PIP_BREAK_SYSTEM_PACKAGES:-1}
pip_() { "$PY" -m pip install --disable-pip-version-check --no-cache-dir "$@"; }

"$PY" -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 12) else
"python %d.%d: verl 0.9.1 needs >= 3.10, < 3.13" % v)'
pins=$(mktemp)
trap 'rm -f "$pins"' EXIT
# the image's versions, verl aside (name==version for every distribution, also those installed from a URL)
"$PY" -m pip list --disable-pip-version-check --format=freeze --exclude-editable > "$pins.all"
grep -iv '^verl==' "$pins.all" > "$pins" || true
found=$(grep -i '^verl==' "$pins.all" | cut -d= -f3 || true)
rm -f "$pins.all"
echo "[install_in_image] $(grep -ic . "$pins") distributions pinned from the image; its verl: ${found:-none}"
if [ "$found" != "$VERL" ]; then
  pip_ -c "$pins" "verl==$VERL"
fi
pip_ --no-deps -e .
deps=$("$PY" - "$IMAGE_PROVIDES" <<'PY'
import re, sys, tomllib
image = set(sys.argv[1].split())
for dep in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    if re.split(r"[\s<>=!~;\[]", dep, maxsplit=1)[0].lower() not in image:
        print(dep)
PY
)
mapfile -t deps_ <<< "$deps"
pip_ -c "$pins" "${deps_[@]}"
"$PY" - <<'PY'
import sys
from harness.backends.verl.runner import install_problems
problems = install_problems()
for p in problems:
    print(f"[install_in_image] {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
echo "[install_in_image] done: verl $VERL, the harness (editable) and its dependencies, the image's stack untouched"

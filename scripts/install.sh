#!/usr/bin/env bash
# One install step for the demo, the tests and CI.
#   scripts/install.sh            -> .venv with the harness (editable)
#   scripts/install.sh test       -> the same plus what the tests need (pytest, transformers, verl)
# On a machine with no torch it installs torch==2.13.0 (the CPU build) *first*, then pins whatever
# torch is there through a constraints file, so no later package can pull a CUDA torch from the index.
# A machine that already has torch (a GPU box) keeps it: the venv then sees the system site-packages.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
extra=${1:-}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[install] torch found in $PY ($("$PY" -c 'import torch;print(torch.__version__)')): keeping it"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
VPY="$VENV/bin/python"
pip_() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$VPY" -c "import torch" >/dev/null 2>&1; then
  echo "[install] installing torch==2.13.0 (CPU build)"
  pip_ "torch==2.13.0"
fi
TORCH_VERSION=$("$VPY" -c 'import torch;print(torch.__version__)')
mkdir -p .cache
echo "torch==${TORCH_VERSION}" > .cache/constraints.txt

stamp=".cache/install-${extra:-base}.stamp"
want=$(cat pyproject.toml scripts/install.sh | sha1sum | cut -c1-12)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[install] up to date ($VENV, torch ${TORCH_VERSION})"
  exit 0
fi
target="."
[ -n "$extra" ] && target=".[$extra]"
echo "[install] installing moe-rl-harness${extra:+[$extra]} into $VENV (torch pinned to ${TORCH_VERSION})"
pip_ -c .cache/constraints.txt -e "$target"
echo "$want" > "$stamp"
echo "[install] done"

#!/usr/bin/env bash
# Install Slurm (slurmctld, slurmd, client tools) and munge from Debian's archive when missing.
# Idempotent and quiet: a machine that already has them prints one line and exits 0.
#   bash slurm/install.sh            # as root (CI), or with passwordless sudo
# Exit status: 0 installed/present, 1 could not install (no root, no apt, no network).
set -euo pipefail

need=()
command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || [ -x /usr/sbin/slurmd ] || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || [ -x /usr/sbin/munged ] || need+=(munge)
if [ ${#need[@]} -eq 0 ]; then
  echo "[slurm/install] slurm $(dpkg-query -W -f='${Version}' slurm-client 2>/dev/null || echo '?') and munge already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO="sudo -n"
  else
    echo "[slurm/install] missing: ${need[*]}; installing needs root (or passwordless sudo)" >&2
    exit 1
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "[slurm/install] missing: ${need[*]}; this script knows only Debian/Ubuntu (apt-get)" >&2
  exit 1
fi

echo "[slurm/install] installing slurm-wlm + munge (missing: ${need[*]})"
t0=$(date +%s)
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
# Package scripts try to start services; with no init system that must not fail the install.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod +x "$policy"
  made_policy=1
fi
cleanup() { [ "$made_policy" = 1 ] && $SUDO rm -f "$policy"; rm -f "$log"; }
trap cleanup EXIT
if ! { $SUDO apt-get update -qq >"$log" 2>&1 \
       && $SUDO apt-get install -y -qq --no-install-recommends slurm-wlm slurm-client munge >>"$log" 2>&1; }; then
  echo "[slurm/install] apt-get failed:" >&2
  tail -n 20 "$log" >&2
  exit 1
fi
echo "[slurm/install] done in $(( $(date +%s) - t0 )) s: slurm $(dpkg-query -W -f='${Version}' slurm-client)"

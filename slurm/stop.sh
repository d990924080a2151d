#!/usr/bin/env bash
# Stop the single-node cluster started by slurm/start.sh: cancel its jobs, then stop slurmd,
# slurmctld and munged by the PIDs in STATE_DIR (never by name). STATE_DIR is kept unless --rm.
#   bash slurm/stop.sh STATE_DIR [--rm]
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
log() { echo "[slurm/stop] $*" >&2; }
STATE=${1:?usage: slurm/stop.sh STATE_DIR [--rm]}
RM=${2:-}
[ -d "$STATE" ] || { log "no such folder: $STATE"; exit 0; }
STATE=$(cd "$STATE" && pwd)
export SLURM_CONF="$STATE/slurm.conf"

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pid_of() { [ -f "$1" ] && cat "$1" 2>/dev/null || true; }

ctld=$(pid_of "$STATE/slurmctld.pid")
if alive "$ctld" && command -v scancel >/dev/null 2>&1; then
  # cancel every job of this cluster (SLURM_CONF points at it) and give them a moment to end
  if [ -n "$(squeue -h -o %i 2>/dev/null)" ]; then
    scancel --full --signal=KILL $(squeue -h -o %i 2>/dev/null) 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(squeue -h -t all -o '%i %T' 2>/dev/null | grep -E 'RUNNING|COMPLETING|PENDING|CONFIGURING|SUSPENDED|REQUEUED' || true)" ] && break
      sleep 0.2
    done
  fi
fi

stop_pid() {  # name pidfile
  local pid; pid=$(pid_of "$2")
  if ! alive "$pid"; then rm -f "$2"; return 0; fi
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
  if alive "$pid"; then log "$1 ($pid) did not stop on TERM: KILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$2"
}
stop_pid slurmd "$STATE/slurmd.pid"
stop_pid slurmctld "$STATE/slurmctld.pid"
stop_pid munged "$STATE/munge/munged.pid"
log "stopped cluster in $STATE"
if [ "$RM" = "--rm" ]; then rm -rf "$STATE"; fi

#!/usr/bin/env bash
# Start a single-node Slurm cluster on this machine: munged, slurmctld and slurmd, each with its
# own PID file, all state (config, spool, logs, munge key and socket) under one folder.
#
#   eval "$(bash slurm/start.sh [STATE_DIR])"   # starts it, exports SLURM_CONF for the clients
#   sbatch/squeue/... (or python -m harness.sweep ... launcher=slurm)
#   bash slurm/stop.sh STATE_DIR                  # cancels its jobs, stops the daemons by PID
#
# STATE_DIR defaults to a new temp folder. stdout carries only `export SLURM_CONF=...`
# (so that `eval` works); progress goes to stderr. The same line is in STATE_DIR/env.sh.
#
# Knobs (environment): SLURM_LOCAL_CPUS (CPUs the node offers; default all that slurmd -C sees),
# SLURM_LOCAL_MEM_MB (default 90% of what slurmd -C sees), SLURM_LOCAL_PORT (slurmctld port;
# slurmd uses PORT+1; default two free ports), SLURM_LOCAL_PARTITION (default: debug),
# SLURM_LOCAL_TIMEOUT_S (how long to wait for the node to come up; default 60), SLURM_LOCAL_KILLWAIT
# (seconds between SIGTERM and SIGKILL when a job is requeued or cancelled; default 1).
# Runs as root (SlurmUser=root, munged as the munge user). Requires `bash slurm/install.sh` first.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
log() { echo "[slurm/start] $*" >&2; }
die() { echo "[slurm/start] error: $*" >&2; exit 1; }

for tool in munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found: run 'bash slurm/install.sh' first"
done
[ "$(id -u)" -eq 0 ] || die "run as root (slurmd must start job processes; munged runs as 'munge')"
id munge >/dev/null 2>&1 || die "no 'munge' user: reinstall the munge package (bash slurm/install.sh)"

t0=$(date +%s.%N)
STATE=${1:-${SLURM_LOCAL_STATE:-}}
if [ -z "$STATE" ]; then
  STATE=$(mktemp -d "${TMPDIR:-/tmp}/slurm-local.XXXXXX")
fi
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
if [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
  die "a cluster is already running from $STATE (stop it: bash slurm/stop.sh $STATE)"
fi
chmod 755 "$STATE"
mkdir -p "$STATE/ctld" "$STATE/d" "$STATE/log" "$STATE/munge"

# ------------------------------------------------------------------ munge (own key and socket)
MUNGE="$STATE/munge"
chown munge:munge "$MUNGE"
chmod 711 "$MUNGE"  # the socket must be reachable by clients (root); the key stays 0400
if [ ! -f "$MUNGE/munge.key" ]; then
  if command -v mungekey >/dev/null 2>&1; then
    runuser -u munge -- mungekey --create --keyfile="$MUNGE/munge.key" --force
  else
    dd if=/dev/urandom bs=1 count=1024 of="$MUNGE/munge.key" status=none
    chown munge:munge "$MUNGE/munge.key"
  fi
  chmod 400 "$MUNGE/munge.key"
fi
SOCKET="$MUNGE/munge.socket.2"
runuser -u munge -- munged --socket="$SOCKET" --key-file="$MUNGE/munge.key" \
  --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed" \
  --num-threads=2 || die "munged did not start (see $MUNGE/munged.log)"
for _ in $(seq 50); do [ -S "$SOCKET" ] && break; sleep 0.1; done
[ -S "$SOCKET" ] || die "munged socket $SOCKET did not appear (see $MUNGE/munged.log)"

# ------------------------------------------------------------------ slurm.conf
HOST=$(hostname -s)
read -r CPUS SOCKETS CORES THREADS MEM < <(slurmd -C | awk '
  /^NodeName/ { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
  END { print v["CPUs"], v["SocketsPerBoard"] * (v["Boards"] ? v["Boards"] : 1), v["CoresPerSocket"], v["ThreadsPerCore"], v["RealMemory"] }')
if [ -n "${SLURM_LOCAL_CPUS:-}" ] && [ "$SLURM_LOCAL_CPUS" -lt "$CPUS" ]; then
  # offer fewer CPUs: one socket, one thread per core
  CPUS=$SLURM_LOCAL_CPUS; SOCKETS=1; CORES=$SLURM_LOCAL_CPUS; THREADS=1
fi
MEM_MB=${SLURM_LOCAL_MEM_MB:-$(( MEM * 9 / 10 ))}

free_port() {
  python3 - "$@" <<'EOF'
import socket, sys
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p + 1)); t.close(); print(p); break
    except OSError:
        t.close()
EOF
}
PORT=${SLURM_LOCAL_PORT:-$(free_port)}
PARTITION=${SLURM_LOCAL_PARTITION:-debug}

GRES_LINE=""
NODE_GRES=""
ngpu=$(ls /dev/nvidia[0-9]* 2>/dev/null | wc -l || true)
if [ "${ngpu:-0}" -gt 0 ]; then
  GRES_LINE="GresTypes=gpu"
  NODE_GRES="Gres=gpu:$ngpu"
  : > "$STATE/gres.conf"
  for dev in /dev/nvidia[0-9]*; do echo "NodeName=$HOST Name=gpu File=$dev" >> "$STATE/gres.conf"; done
fi

cat > "$STATE/slurm.conf" <<EOF
# single-node cluster written by slurm/start.sh ($(date -u +%FT%TZ))
ClusterName=harness
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire s before it may start again (default 120)
AuthInfo=socket=$SOCKET,cred_expire=10
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$STATE/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
# SIGTERM -> SIGKILL after KillWait s (submitit ignores SIGTERM: runs resume from their last checkpoint)
KillWait=${SLURM_LOCAL_KILLWAIT:-1}
MinJobAge=3600
MaxArraySize=10001
JobRequeue=1
$GRES_LINE
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS Sockets=$SOCKETS CoresPerSocket=$CORES ThreadsPerCore=$THREADS RealMemory=$MEM_MB $NODE_GRES State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
: > "$STATE/plugstack.conf"
[ -n "$GRES_LINE" ] || rm -f "$STATE/gres.conf"
export SLURM_CONF="$STATE/slurm.conf"
echo "export SLURM_CONF=$SLURM_CONF" > "$STATE/env.sh"

# ------------------------------------------------------------------ daemons
slurmctld -f "$SLURM_CONF" -i || die "slurmctld did not start (see $STATE/log/slurmctld.log)"
slurmd -f "$SLURM_CONF" || die "slurmd did not start (see $STATE/log/slurmd.log)"

deadline=$(( $(date +%s) + ${SLURM_LOCAL_TIMEOUT_S:-60} ))
state=""
while [ "$(date +%s)" -lt "$deadline" ]; do
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -n1 || true)
  case "$state" in idle|mixed|allocated) break ;; esac
  sleep 0.3
done
case "$state" in
  idle|mixed|allocated) ;;
  *) log "node state '${state:-none}' after ${SLURM_LOCAL_TIMEOUT_S:-60} s; last log lines:"
     tail -n 5 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
     bash "$(dirname "$0")/stop.sh" "$STATE" >&2 || true
     exit 1 ;;
esac
log "up in $(python3 -c "import time;print(f'{time.time()-$t0:.1f}')") s: node $HOST ($CPUS CPUs, ${MEM_MB} MB${NODE_GRES:+, $NODE_GRES}), partition $PARTITION, port $PORT, state $STATE"
echo "export SLURM_CONF=$SLURM_CONF"

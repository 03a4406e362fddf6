#!/usr/bin/env bash
# Runs a multi-process (multi-host style) maelm_jax job on THIS machine.
#
#   launch/local.sh --num_processes=N --devices_per_process=D [--port=P]
#                   [--platform=cpu|gpu] [--no_jemalloc] [--dry_run]
#                   -- <arguments of maelm_jax.main>
#
# Starts N processes of `python -m maelm_jax.main <arguments>`, process i with
#   MAELM_COORDINATOR_ADDRESS=127.0.0.1:P  MAELM_NUM_PROCESSES=N  MAELM_PROCESS_ID=i
# (read by maelm_jax/run/distributed.py) and
#   cpu (default): JAX_NUM_CPU_DEVICES=D (and JAX_PLATFORMS=cpu unless set), so
#                  N x D fake CPU devices behave like N hosts of D chips;
#   gpu:           MAELM_LOCAL_DEVICE_IDS = GPUs i*D .. i*D+D-1 of this machine.
# P is a free port unless --port is given. Each process logs to
# <workdir>/logs/process_<i>.log (appended to; <workdir> from --workdir in the arguments, else,
# or for a gs:// workdir, a new temporary directory); process 0 also streams to this terminal.
#
# The launcher waits for all processes. If one fails it stops the others and
# exits with that process's status, naming it. SIGTERM and SIGINT are forwarded
# to every process (on SIGTERM a run checkpoints at the next step boundary and
# exits 0, so the launcher then exits 0 too); a second SIGINT kills them.
#
# jemalloc is preloaded into every process where it is installed (LD_PRELOAD;
# $MAELM_JEMALLOC names the library if it is elsewhere): under glibc's malloc a
# run's memory creeps up over hours of checkpointing (launch/jemalloc.sh).
# --no_jemalloc leaves glibc's malloc.
#
# Python: $PYTHON, else <repo>/.venv/bin/python if present, else python3.
# --dry_run prints the exact commands (with their environment) and runs nothing.
#
# Example (2 "hosts" x 4 CPU devices, then the same again to resume):
#   launch/local.sh --num_processes=2 --devices_per_process=4 -- \
#       --config=configs/pretrain.py:objective=maelm,size=tiny --workdir=runs/run \
#       --config.data.num_streams=8
set -uo pipefail

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
}

die() {
  echo "local.sh: $*" >&2
  exit 2
}

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
num_processes=""
devices_per_process=""
port=""
platform="cpu"
dry_run=0
use_jemalloc=1

while (($#)); do
  case "$1" in
    --num_processes=*) num_processes="${1#*=}" ;;
    --devices_per_process=*) devices_per_process="${1#*=}" ;;
    --port=*) port="${1#*=}" ;;
    --platform=*) platform="${1#*=}" ;;
    --num_processes | --devices_per_process | --port | --platform)
      (($# >= 2)) || die "$1 needs a value"
      declare "${1#--}=$2"
      shift
      ;;
    --dry_run | --dry-run) dry_run=1 ;;
    --no_jemalloc | --no-jemalloc) use_jemalloc=0 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1'. Launcher options go before '--', the arguments of maelm_jax.main after it (--help for usage)" ;;
  esac
  shift
done
main_args=("$@")

is_positive_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
is_positive_int "$num_processes" ||
  die "--num_processes='$num_processes' must be a positive integer (it is required)"
is_positive_int "$devices_per_process" ||
  die "--devices_per_process='$devices_per_process' must be a positive integer (it is required)"
[[ "$platform" == cpu || "$platform" == gpu ]] ||
  die "--platform='$platform' must be cpu or gpu"
# A JAX_PLATFORMS exported in this shell reaches every process: without cuda in
# it, a GPU launch would train on the CPU, said only in each process's device list.
if [[ "$platform" == gpu && -n "${JAX_PLATFORMS:-}" && "${JAX_PLATFORMS,,}" != *cuda* && "${JAX_PLATFORMS,,}" != *gpu* ]]; then
  die "JAX_PLATFORMS=$JAX_PLATFORMS in this shell would keep the processes off the GPUs (--platform=gpu): unset it, or name cuda in it"
fi
if [[ -n "$port" ]]; then
  is_positive_int "$port" && ((port < 65536)) || die "--port='$port' must be in 1..65535"
fi
((${#main_args[@]})) || die "no arguments for maelm_jax.main after '--' (at least --config and --workdir)"

# shellcheck source=launch/jemalloc.sh
source "$REPO/launch/jemalloc.sh"
jemalloc_choose local.sh "$use_jemalloc" || exit 2

if [[ -n "${PYTHON:-}" ]]; then
  py="$PYTHON"
elif [[ -x "$REPO/.venv/bin/python" ]]; then
  py="$REPO/.venv/bin/python"
else
  py="python3"
fi

# The workdir, from --workdir=X / --workdir X (absl also takes one dash).
workdir=""
for ((k = 0; k < ${#main_args[@]}; k++)); do
  case "${main_args[k]}" in
    --workdir=* | -workdir=*) workdir="${main_args[k]#*=}" ;;
    --workdir | -workdir) workdir="${main_args[k + 1]:-}" ;;
  esac
done

if [[ -n "$workdir" && "$workdir" != *://* ]]; then  # A bucket: logs stay here.
  log_dir="$workdir/logs"
elif ((dry_run)); then
  log_dir="${TMPDIR:-/tmp}/maelm-local.XXXXXX"
else
  log_dir="$(mktemp -d "${TMPDIR:-/tmp}/maelm-local.XXXXXX")" || die "cannot create a log directory"
fi

if [[ -z "$port" ]]; then  # A free port: the OS's pick for a socket bound to 0.
  for picker in python3 "$py"; do
    port="$("$picker" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2> /dev/null)" && break
  done
  is_positive_int "$port" || die "could not pick a free port (no python3?); pass --port"
fi

# The command and environment of process $1, into the arrays env_of / cmd_of.
build() {
  local i="$1" first
  env_of=(
    "MAELM_COORDINATOR_ADDRESS=127.0.0.1:$port"
    "MAELM_NUM_PROCESSES=$num_processes"
    "MAELM_PROCESS_ID=$i"
  )
  if [[ "$platform" == cpu ]]; then
    env_of+=("JAX_NUM_CPU_DEVICES=$devices_per_process" "JAX_PLATFORMS=${JAX_PLATFORMS:-cpu}")
  else
    first=$((i * devices_per_process))
    env_of+=("MAELM_LOCAL_DEVICE_IDS=$(seq -s, "$first" $((first + devices_per_process - 1)))")
  fi
  env_of+=("PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}")
  if [[ -n "$jemalloc_env" ]]; then
    env_of+=("$jemalloc_env")
  fi
  cmd_of=("$py" -m maelm_jax.main "${main_args[@]}")
}

quote() { printf '%q ' "$@"; }

if ((dry_run)); then
  echo "# $num_processes processes x $devices_per_process $platform devices, coordinator 127.0.0.1:$port, run in $(pwd)"
  for ((i = 0; i < num_processes; i++)); do
    build "$i"
    if ((i == 0)); then
      echo "env $(quote "${env_of[@]}" "${cmd_of[@]}")2>&1 < /dev/null | tee -a $(quote "$log_dir/process_$i.log")&"
    else
      echo "env $(quote "${env_of[@]}" "${cmd_of[@]}")>> $(quote "$log_dir/process_$i.log")2>&1 < /dev/null &"
    fi
  done
  exit 0
fi

mkdir -p "$log_dir" || die "cannot create $log_dir"

pids=()
status_of=()
# Signal handling first: a Ctrl-C or SIGTERM that arrives while the processes are
# being started is forwarded to those already running, never lost.
alive() {
  local i
  for i in "${!pids[@]}"; do
    [[ -z "${status_of[$i]:-}" ]] && kill -0 "${pids[$i]}" 2>/dev/null && echo "${pids[$i]}"
  done
}

signal_all() {  # signal_all SIG: to every process still running.
  local pid
  for pid in $(alive); do kill -s "$1" "$pid" 2>/dev/null; done
}

interrupts=0
forwarded=""
on_signal() {
  local sig="$1"
  forwarded="SIG$sig"
  if [[ "$sig" == INT ]] && ((++interrupts > 1)); then
    echo "local.sh: second SIGINT: killing all processes" >&2
    signal_all KILL
    return
  fi
  echo "local.sh: forwarding SIG$sig to all processes" >&2
  signal_all "$sig"
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'signal_all KILL' EXIT  # Should the launcher itself fail: no orphans.

# Job control while starting them: every process gets its own process group
# and default signal dispositions (without it, bash starts background jobs with
# SIGINT ignored, and a forwarded Ctrl-C would do nothing). Off again afterwards,
# so that the terminal's Ctrl-C reaches this script, which forwards it.
set -m

for ((i = 0; i < num_processes; i++)); do
  build "$i"
  log="$log_dir/process_$i.log"
  # Logs are appended to: a resumed run keeps the history of the earlier ones.
  echo "===== local.sh $(date '+%Y-%m-%d %H:%M:%S'): process $i of $num_processes: $(quote "${cmd_of[@]}")" >> "$log"
  if ((i == 0)); then
    # tee ignores INT/TERM so that process 0's last words still reach the log.
    env "${env_of[@]}" "${cmd_of[@]}" < /dev/null > >(trap '' INT TERM; exec tee -a "$log") 2>&1 &
  else
    env "${env_of[@]}" "${cmd_of[@]}" < /dev/null >> "$log" 2>&1 &
  fi
  pids+=("$!")
done
set +m
echo "local.sh: started $num_processes processes (pids ${pids[*]}), coordinator 127.0.0.1:$port, logs in $log_dir/process_<i>.log" >&2


failed=""
stop_deadline=""
while :; do
  running=0
  for i in "${!pids[@]}"; do
    [[ -n "${status_of[$i]:-}" ]] && continue
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      running=1
      continue
    fi
    wait "${pids[$i]}"
    status_of[$i]=$?
    if ((status_of[$i] != 0)) && [[ -z "$failed" ]]; then
      failed="$i"
      echo "local.sh: process $i (pid ${pids[$i]}) failed with exit status ${status_of[$i]}; stopping the others. Its log: $log_dir/process_$i.log" >&2
      if ((i != 0)); then
        echo "----- last lines of $log_dir/process_$i.log -----" >&2
        tail -n 30 "$log_dir/process_$i.log" >&2
        echo "-----" >&2
      fi
      signal_all TERM
      stop_deadline=$((SECONDS + 10))
    fi
  done
  ((running)) || break
  if [[ -n "$stop_deadline" ]] && ((SECONDS >= stop_deadline)); then
    signal_all KILL  # They wait for the failed one in a collective: no use waiting.
    stop_deadline=""
  fi
  # Not a foreground `sleep`: bash drops a SIGINT sent to this script alone
  # (kill -INT, not a terminal's Ctrl-C) while it waits for a foreground child
  # that did not die of it, so the trap would never run. `wait` is interrupted.
  sleep 0.2 &
  wait $! 2>/dev/null
done
wait  # The tee of process 0.

if [[ -n "$failed" ]]; then
  code="${status_of[$failed]}"
  echo "local.sh: FAILED: process $failed of $num_processes exited with status $code${forwarded:+ after $forwarded} (log: $log_dir/process_$failed.log)" >&2
  exit "$code"
fi
echo "local.sh: all $num_processes processes finished; logs in $log_dir" >&2
exit 0

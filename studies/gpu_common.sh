# Sourced by the device-call scripts of issue 40 (studies/gpu_call.sh,
# studies/gpu_grow.sh): the call's clock, its timeline, the carried wheels, and one
# throughput invocation. Each call has at most 10 minutes, 64 MiB in, 8 files of
# 16 MiB out (../.library/device/README.md), so every phase writes under $OUT as it
# ends and a call cut short keeps what it measured.
set -u
START=$SECONDS
CALL_S=${CALL_S:-570}; PY=${PY:-python3}; OUT=${OUT:-/tmp/gpu_out}
mkdir -p $OUT/p1 $OUT/logs
export PYTHONUNBUFFERED=1
left() { echo $((CALL_S - (SECONDS - START))); }
stamp() { echo "$(date +%T) +$((SECONDS - START))s $*" | tee -a $OUT/logs/timeline.txt; }
stamp "start; $(nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader 2>/dev/null)"
nvidia-smi > $OUT/logs/nvidia-smi.txt 2>&1
if [ -d .whl ] && [ "${SMOKE:-0}${CPU:-0}" = 00 ]; then  # (wheels for the device's Python 3.12)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi

tp() {  # tp NAME SECONDS [SCRIPT] ARGS...: one throughput invocation (default
  # benchmarks/train_throughput.py) with $P1, its JSON rewritten per cell.
  local name=$1 limit=$2 script=benchmarks/train_throughput.py; shift 2
  case ${1:-} in *.py) script=$1; shift ;; esac
  timeout -s INT $limit $PY $script $P1 --json=$OUT/p1/$name.json \
      --out=$OUT/logs/$name.md "$@" > $OUT/logs/$name.log 2>&1
  stamp "$name rc=$? $(grep -c '|' $OUT/logs/$name.md 2>/dev/null) table lines"
}

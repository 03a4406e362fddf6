# Sourced by the time-limited GPU scripts (studies/gpu_call.sh,
# studies/gpu_grow.sh): the run's clock (TIME_LIMIT_S), its timeline, the wheels
# copied in beside the checkout (.whl), and one throughput invocation. Each run had
# at most 10 minutes, 64 MiB of inputs and 8 files of 16 MiB of results, so every
# phase writes under $OUT_DIR as it ends and a run cut short keeps what it measured.
set -u
START=$SECONDS
TIME_LIMIT_S=${TIME_LIMIT_S:-570}; PY=${PY:-python3}; OUT_DIR=${OUT_DIR:-/tmp/gpu_out}
mkdir -p $OUT_DIR/p1 $OUT_DIR/logs
export PYTHONUNBUFFERED=1
left() { echo $((TIME_LIMIT_S - (SECONDS - START))); }
stamp() { echo "$(date +%T) +$((SECONDS - START))s $*" | tee -a $OUT_DIR/logs/timeline.txt; }
stamp "start; $(nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader 2>/dev/null)"
nvidia-smi > $OUT_DIR/logs/nvidia-smi.txt 2>&1
if [ -d .whl ] && [ "${SMOKE:-0}${CPU:-0}" = 00 ]; then  # (wheels for the device's Python 3.12)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi

tp() {  # tp NAME SECONDS [SCRIPT] ARGS...: one throughput invocation (default
  # benchmarks/train_throughput.py) with $P1, its JSON rewritten per cell.
  local name=$1 limit=$2 script=benchmarks/train_throughput.py; shift 2
  case ${1:-} in *.py) script=$1; shift ;; esac
  timeout -s INT $limit $PY $script $P1 --json=$OUT_DIR/p1/$name.json \
      --out=$OUT_DIR/logs/$name.md "$@" > $OUT_DIR/logs/$name.log 2>&1
  stamp "$name rc=$? $(grep -c '|' $OUT_DIR/logs/$name.md 2>/dev/null) table lines"
}

#!/bin/bash
# The lever on one GPU (studies/gpu-encoders.md, "8 x 128"): the
# 8-layer tiny encoder of each objective in OBJECTIVES (names of configs/compare.py)
# pretrained side by side on one GPU at one FLOP budget, sized by a probe of all of
# them running together so that each finishes its schedule in about SAFETY * RUN_S
# seconds; a run still going at RUN_S + RUN_GRACE seconds is stopped by SIGTERM (which
# saves). With PREPARE=1 the text is first turned into a token-id corpus (prepare_data
# --tokenizer), so that no grain worker tokenizes during training. Then BLiMP
# (BLIMP_PAIRS per paradigm) of each newest checkpoint and of the kept one nearest half
# way, and the newest params come back as tar parts under $OUT_DIR (studies/slim_workdir.py)
# with the logs, for fine-tuning on any machine with studies/score_encoders.py.
# DTYPE is bfloat16 here: configs/compare.py keeps tiny in float32 for 2 CPU cores, and
# both measurements below ran so on the GPU, at ~9-13 TFLOP/s per run (about 1% MFU).
# Run from the repository root:
#   DATA='/data/imdb/*.jsonl.xz,/data/wiki/*.jsonl.xz' TOKENIZER=/work/study/tokenizer/tokenizer.model \
#     OBJECTIVES="mlm maelmx 3mlx" BATCH=256 PREPARE=1 BLIMP=/data/blimp RUN_S=360 \
#     OUT_DIR=/tmp/out bash studies/gpu_pretrain.sh
# The measurements in studies/gpu-encoders.md ran with DTYPE=float32 and the earlier probe (see below):
#   first: OBJECTIVES="mlm maelmx" BATCH=128 PREPARE=0 RUN_S=300 SAFETY=1 RUN_GRACE=120
#   second: OBJECTIVES="mlm maelmx 3mlx" BATCH=256 PREPARE=1 WORKERS=4 RUN_S=360 SAFETY=0.8
set -u
RUN_S=${RUN_S:-300}; RUN_GRACE=${RUN_GRACE:-30}; SAFETY=${SAFETY:-0.6}
PROBE_S=${PROBE_S:-150}; PY=${PY:-python3}; BATCH=${BATCH:-128}; DTYPE=${DTYPE:-bfloat16}
OBJECTIVES=${OBJECTIVES:-"mlm maelmx"}; PREPARE=${PREPARE:-0}; WORKERS=${WORKERS:-6}
DATA=${DATA:-.gpu/data/*.jsonl.xz}; TOKENIZER=${TOKENIZER:-.gpu/tokenizer.model}
BLIMP=${BLIMP:-}; BLIMP_PAIRS=${BLIMP_PAIRS:-200}; BLIMP_S=${BLIMP_S:-240}
OUT_DIR=${OUT_DIR:-/tmp/gpu_out}; mkdir -p $OUT_DIR $OUT_DIR/logs
export PYTHONUNBUFFERED=1
# Every run's share of GPU memory, so that all of them fit side by side.
N=$(echo $OBJECTIVES | wc -w)
export XLA_PYTHON_CLIENT_MEM_FRACTION=$($PY -c "print(round(0.9 / $N, 2))")
for o in $OBJECTIVES; do
  case $o in mlm|maelm|maelmx|3ml|3mlx) ;; *) echo "OBJECTIVES: unknown $o (mlm maelm maelmx 3ml 3mlx)"; exit 2 ;; esac
done
stamp() { echo "$(date +%T) $*" | tee -a $OUT_DIR/logs/timeline.txt; }

stamp start
SOURCE="text:$DATA"
if [ "$PREPARE" = 1 ]; then
  $PY -m maelm_jax.data.prepare_data --source="text:$DATA" --out=/tmp/ids --tokenizer=$TOKENIZER \
    --workers=$(nproc) > $OUT_DIR/logs/prepare.log 2>&1 || { stamp "prepare failed"; tail $OUT_DIR/logs/prepare.log; exit 1; }
  SOURCE="arrayrecord:/tmp/ids"
  stamp prepared
fi
C="$PY -m maelm_jax.main --config=configs/compare.py:size=tiny --config.model.num_layers=8 --config.learning_rate=1e-3 --config.tokenizer.path=$TOKENIZER --config.data.source=$SOURCE --config.batch_size=$BATCH --config.model.dtype=$DTYPE --config.data.num_workers=$WORKERS --config.eval_every=1000 --config.log_every=100"
args() {  # The keys that make each objective, as configs/compare.py's OBJECTIVES.
  case $1 in
    mlm) echo "--config.model.objective=mlm" ;;
    maelm) echo "--config.model.objective=maelm" ;;
    maelmx) echo "--config.model.objective=maelm --config.model.decoder_type=cross" ;;
    3ml) echo "--config.model.objective=3ml --config.model.decoder_type=self" ;;
    3mlx) echo "--config.model.objective=3ml --config.model.decoder_type=cross" ;;
  esac
}

# ---------------------------------------------------------------- probe
# All probes run together until killed together at PROBE_S, so each rate is measured
# while the GPU is shared as it will be (an earlier probe ran to a FLOP budget; the
# last to finish then ran alone and its rate came out 1.5-2x the shared one). Even so
# the runs were 0.65x their probe (evaluation, checkpoints, a longer input pipeline):
# hence SAFETY. BUDGET_TFLOPS skips the probe.
if [ -z "${BUDGET_TFLOPS:-}" ]; then
  for o in $OBJECTIVES; do
    ( timeout -s TERM $PROBE_S $C $(args $o) --workdir=/tmp/probe_$o --config.total_flops=1e18 \
        --config.checkpoint_every=100000 --config.log_every=${PROBE_LOG_EVERY:-50} > $OUT_DIR/logs/probe_$o.log 2>&1 ) &
  done
  wait; stamp probed
  BUDGET_TFLOPS=$($PY - $OBJECTIVES <<PYEOF
import json, statistics, sys
rates = []
for o in sys.argv[1:]:
    w = f"/tmp/probe_{o}"
    c = json.load(open(f"{w}/config.json"))
    tps = [json.loads(l).get("tokens_per_sec") for l in open(f"{w}/metrics.jsonl")]
    tps = [t for t in tps if t][1:]  # The first window holds the compilation's tail.
    sps = statistics.median(tps) / (c["batch_size"] * c["seq_len"])
    fps = c["total_flops"] / c["total_steps"]
    rates.append(fps * sps)
    print(o, len(tps), "windows; steps/s", round(sps, 1), "TFLOP/s",
          round(fps * sps / 1e12, 2), file=open("$OUT_DIR/logs/probe.txt", "a"))
print(round(min(rates) * $SAFETY * $RUN_S / 1e12, 1))
PYEOF
)
fi
stamp "budget ${BUDGET_TFLOPS} TFLOP per objective" | tee -a $OUT_DIR/logs/probe.txt

# ---------------------------------------------------------------- pretraining
for o in $OBJECTIVES; do
  ( timeout -s TERM $((RUN_S + RUN_GRACE)) $C $(args $o) --workdir=/tmp/gpu_$o \
      --config.total_flops=${BUDGET_TFLOPS}e12 --config.checkpoint_every=1000 \
      --config.keep_checkpoints=1 --config.checkpoint_keep_period=2000 \
      > $OUT_DIR/logs/run_$o.log 2>&1 ) &
done
wait; stamp pretrained

# ---------------------------------------------------------------- BLiMP, newest and half way
if [ -n "$BLIMP" ]; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false; unset XLA_PYTHON_CLIENT_MEM_FRACTION
  for o in $OBJECTIVES; do
    HALF=$($PY -c "
from maelm_jax import checkpoints
s = checkpoints.committed_steps('/tmp/gpu_$o'); print(min(s, key=lambda k: abs(k - s[-1] / 2)))")
    for which in newest half; do
      STEP=""; [ $which = half ] && STEP="--step=$HALF"
      ( timeout $BLIMP_S $PY -m maelm_jax.evaluate.blimp --workdir=/tmp/gpu_$o --data=$BLIMP $STEP \
          --max_pairs=$BLIMP_PAIRS --ngram_tokens=0 --out=/tmp/blimp_${o}_$which \
          > $OUT_DIR/logs/blimp_${o}_$which.log 2>&1 ) &
    done
  done
  wait; stamp "BLiMP scored"
  for d in /tmp/blimp_*; do [ -f $d/blimp.json ] && cp $d/blimp.json $OUT_DIR/logs/$(basename $d).json; done
fi

# ---------------------------------------------------------------- bring back
for o in $OBJECTIVES; do
  $PY studies/slim_workdir.py /tmp/gpu_$o /tmp/slim_$o >> $OUT_DIR/logs/slim.log 2>&1 &&
    tar -C /tmp/slim_$o -cf - . | split -b 15M -d - $OUT_DIR/ckpt_$o.tar.part
done
stamp done
tar -C $OUT_DIR -cJf $OUT_DIR/logs.tar.xz logs && rm -r $OUT_DIR/logs; ls -la $OUT_DIR

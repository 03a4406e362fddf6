#!/bin/bash
# One GPU run with a time limit (TIME_LIMIT_S, 10 minutes at most
# there; 64 MiB of inputs, 8 files of 16 MiB of results). Phases, each writing
# under $OUT_DIR as it ends, so that a run cut short keeps what it measured:
#   1a. the measured ceiling (an 8192^3 bf16 matrix product) and the pretraining
#       shape SHAPE's train step (MLM and MAE-LM cross, length 128, batch
#       TOKENS/128), whose FLOP rate sizes the pretraining budget below;
#   1b. `base` at length 512, MLM / MAE-LM / 3ML (cross), bf16, scanned, dropout 0,
#       the fastest attention, and a profile of 3 steps of each;
#   2.  MLM and MAE-LM (cross) at SHAPE pretrained one after the other, each with the
#       whole GPU, at one FLOP budget: the slower objective's measured rate x SAFETY x
#       the seconds each run gets for training; each stopped by SIGTERM (which saves)
#       at its share of the run; the newest params come back as bfloat16 tar parts
#       (studies/slim_workdir.py) with the run's metrics and config;
#   1c. with whatever time is left, `small` at 128 and 512 and `base` at 128, then the
#       input pipeline (tokenizing text) on the host's cores.
# Needs, in ignored folders beside the checkout: .whl (grain, array_record, ml_collections,
# portpicker, tensorboardX wheels for Python 3.12), .gpu/data/*.jsonl.xz (the text),
# .gpu/tokenizer.model. Run from the repository root on the GPU machine:
#   OUT_DIR=$OUT_DIR TIME_LIMIT_S=570 bash studies/gpu_call.sh
# A smoke test of the plumbing on a CPU (tiny shapes, seconds per phase):
#   SMOKE=1 OUT_DIR=/tmp/smoke PY=.venv/bin/python bash studies/gpu_call.sh
SHAPE=${SHAPE:-8x256}; TOKENS=${TOKENS:-65536}; SAFETY=${SAFETY:-0.75}
STARTUP_S=${STARTUP_S:-45}; BRING_BACK_S=${BRING_BACK_S:-40}; LR=${LR:-1e-3}
OBJECTIVES=${OBJECTIVES:-"mlm maelmx"}; WORKERS=${WORKERS:-10}; ATTN=auto
DATA=${DATA:-.gpu/data/*.jsonl.xz}; TOKENIZER=${TOKENIZER:-.gpu/tokenizer.model}
P1="--dtype=bfloat16 --attention_impls=auto --scan_layers --dropout=0 --steps=10 --repeats=3"
BASE=base; SMALL=small; LONG=512
if [ "${SMOKE:-0}" = 1 ]; then  # The same phases at toy sizes, on any machine.
  SHAPE=2x64; TOKENS=1024; BASE=tiny; SMALL=tiny; LONG=64; STARTUP_S=60
  P1="$P1 --steps=2 --repeats=1"; CEIL=256
else
  CEIL=8192
fi
P1="$P1 --ceiling=$CEIL"
source studies/gpu_common.sh

# Token ids first, on the CPU cores, while the GPU runs phase 1.
( $PY -m maelm_jax.data.prepare_data --source="text:$DATA" --out=/tmp/ids \
    --tokenizer=$TOKENIZER --workers=8 > $OUT_DIR/logs/prepare.log 2>&1
  echo $? > /tmp/prepare.rc ) &
PREPARE=$!

# ---------------------------------------------------------------- 1a, 1b
tp shape 120 --sizes=$SHAPE --seq_lens=128 --objectives=mlm,maelm-cross \
    --tokens_per_batch=$TOKENS
if [ ! -s $OUT_DIR/p1/shape.json ]; then  # The fused attention failed: the einsum instead.
  ATTN=xla; tp shape_xla 120 --sizes=$SHAPE --seq_lens=128 --objectives=mlm,maelm-cross \
      --tokens_per_batch=$TOKENS --attention_impls=xla
  cp $OUT_DIR/p1/shape_xla.json $OUT_DIR/p1/shape.json
fi
tp base$LONG 150 --sizes=$BASE --seq_lens=$LONG --objectives=mlm,maelm,3ml-cross \
    --tokens_per_batch=$TOKENS --profile_dir=/tmp/profile --attention_impls=$ATTN
for d in /tmp/profile/*; do
  [ -d "$d" ] && $PY -m maelm_jax.tools.profiling $d --top=10 >> $OUT_DIR/logs/profile.txt 2>&1
done

# ---------------------------------------------------------------- 2. pretraining
wait $PREPARE; stamp "prepared rc=$(cat /tmp/prepare.rc)"
N=$(echo $OBJECTIVES | wc -w)
RUN_S=$(( ($(left) - BRING_BACK_S - 60) / N ))
BUDGET_TFLOPS=$($PY - $OUT_DIR/p1/shape.json $SAFETY $((RUN_S - STARTUP_S)) <<'PYEOF'
import json, sys
rows = json.load(open(sys.argv[1]))["tables"]["bfloat16"]
rates = [r["model_flops"] / r["step_s"] for r in rows]
print(round(min(rates) * float(sys.argv[2]) * int(sys.argv[3]) / 1e12, 1))
PYEOF
)
stamp "pretraining: $N runs of ${RUN_S}s, ${BUDGET_TFLOPS} TFLOP each"
L=${SHAPE%x*}; H=${SHAPE#*x}
C="$PY -m maelm_jax.main --config=configs/compare.py:size=small \
  --config.model.num_layers=$L --config.model.hidden=$H --config.model.num_heads=$((H / 64)) \
  --config.model.mlp=$((4 * H)) --config.model.dtype=bfloat16 --config.model.scan_layers=True \
  --config.model.dropout=0 --config.model.attention_dropout=0 --config.learning_rate=$LR \
  --config.model.attention_impl=$ATTN \
  --config.batch_size=$((TOKENS / 128)) --config.seq_len=128 \
  --config.tokenizer.path=$TOKENIZER --config.data.source=arrayrecord:/tmp/ids \
  --config.data.num_workers=$WORKERS --config.eval_every=500 --config.eval_batches=20 \
  --config.log_every=50 --config.checkpoint_every=1000 --config.keep_checkpoints=1 \
  --config.total_flops=${BUDGET_TFLOPS}e12"
for o in $OBJECTIVES; do
  case $o in
    mlm) A="--config.model.objective=mlm" ;;
    maelmx) A="--config.model.objective=maelm --config.model.decoder_type=cross" ;;
    3mlx) A="--config.model.objective=3ml --config.model.decoder_type=cross" ;;
    *) echo "OBJECTIVES: unknown $o"; exit 2 ;;
  esac
  timeout -s TERM $RUN_S $C $A --workdir=/tmp/run_$o > $OUT_DIR/logs/run_$o.log 2>&1
  stamp "run $o rc=$?"
  cp /tmp/run_$o/metrics.jsonl $OUT_DIR/logs/metrics_$o.jsonl 2>/dev/null
  cp /tmp/run_$o/config.json $OUT_DIR/logs/config_$o.json 2>/dev/null
done

# ---------------------------------------------------------------- bring back
for o in $OBJECTIVES; do
  $PY studies/slim_workdir.py /tmp/run_$o /tmp/slim_$o --dtype=bfloat16 >> $OUT_DIR/logs/slim.log 2>&1 &&
    tar -C /tmp/slim_$o -cf - . | split -b 15M -d - $OUT_DIR/ckpt_$o.tar.part
done
stamp "brought back"

# ---------------------------------------------------------------- 1c, with what is left
T=$(( $(left) - 20 ))
[ $T -gt 40 ] && tp small $T --sizes=$SMALL --seq_lens=128,$LONG \
    --objectives=mlm,maelm,3ml-cross --tokens_per_batch=$TOKENS --attention_impls=$ATTN
T=$(( $(left) - 20 ))
[ $T -gt 40 ] && tp base128 $T --sizes=$BASE --seq_lens=128 \
    --objectives=mlm,maelm,3ml-cross --tokens_per_batch=$TOKENS --attention_impls=$ATTN
T=$(( $(left) - 15 ))
[ $T -gt 30 ] && timeout -s INT $T $PY benchmarks/input_pipeline.py --source="text:$DATA" \
    --tokenizer=$TOKENIZER --seq_lens=128,512 --workers=8,15 --seconds=8 \
    > $OUT_DIR/logs/input_pipeline.log 2>&1
stamp done
# Few files come back (8): everything but the checkpoints in one archive.
tar -C $OUT_DIR -cJf $OUT_DIR/results.tar.xz p1 logs && rm -r $OUT_DIR/p1 $OUT_DIR/logs
ls -la $OUT_DIR

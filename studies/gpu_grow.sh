#!/bin/bash
# One GPU run, the kind that repeats: Part 1's next levers at
# `base`/512 side by side, then one encoder that grows across runs (Part 2:
# "accumulate compute across runs"). Phases, each writing under $OUT_DIR as it ends:
#   1. `base`/512, bf16, dropout 0, the fastest attention, batch 128, the default
#      unrolled layers: MLM, MAE-LM and 3ML (cross) in one process, so their step
#      ratios compare on one machine; then the pretraining shape (8 x 128 at 128) of
#      MLM and MAE-LM (cross). The first GPU run (2026-11-27) timed scanned against
#      unrolled and the batch-shared bias's bound here (benchmarks/gpu-throughput.md,
#      "Unrolled against scanned layers"); this phase now measures odd lengths padded for cuDNN (3ML's
#      encoder at 309 tokens, MAE-LM's at 111 and the cross decoders' K ran the
#      einsum before).
#   2. GROW: MAE-LM (cross) at 8 x 128 (configs/compare.py:size=tiny with 8 layers,
#      the shape of the best BLiMP so far), batch 256 x 128, bf16, ONE schedule of
#      GROW_TFLOPS spread over as many runs as it takes. The run's workdir (its
#      newest checkpoint only: parameters, Adam moments, the data iterator) comes
#      back as grow.tar.partNN; the next run reads those parts from .grow/parts and
#      this same script resumes the run where it stopped: the token ids
#      are prepared again from the same text into the same path, and prepare_data
#      writes one shard per text file, the same shards each time. The run is stopped
#      by SIGTERM (which saves) at its share of the run. Its config stays as the
#      first run set it (scanned layers, which the resumed state is stored as);
#      the code may change between runs (from the second run on, its encoder's
#      odd length 111 runs cuDNN instead of the einsum, equal up to rounding).
#   3. the input pipeline on the host's cores (text -> batches), with what is left.
# Reads from ignored folders beside the checkout: .whl (grain, array_record, ml_collections, portpicker,
# tensorboardX wheels for Python 3.12) and .grow: data/*.jsonl.xz (the text, chosen
# so that text + the 36 MB state + code + wheels fit the 64 MiB a run takes in),
# tokenizer.model, parts/ (after the first run). On the device, from the repository
# root:
#   OUT_DIR=/path/to/results TIME_LIMIT_S=570 bash studies/gpu_grow.sh
# A smoke test on a CPU (tiny shapes; run it twice: the second run resumes from the
# first one's parts, moved into .grow/parts as the next run would find them):
#   SMOKE=1 OUT_DIR=/tmp/smoke PY=.venv/bin/python GROW=/tmp/smoke_grow bash studies/gpu_grow.sh
GROW_TFLOPS=${GROW_TFLOPS:-24000}; BRING_BACK_S=${BRING_BACK_S:-40}
TAIL_S=${TAIL_S:-45}; WORKERS=${WORKERS:-8}; GROW=${GROW:-.grow}
IDS=${IDS:-/tmp/ids}; RUN=${RUN:-/tmp/grow}  # (the same paths in every call)
P1="--dtype=bfloat16 --attention_impls=auto --dropout=0 --steps=10 --repeats=3 --ceiling=8192"
A="--sizes=base --seq_lens=512 --tokens_per_batch=65536"
S="--sizes=8x128 --seq_lens=128 --tokens_per_batch=32768"
LAYERS=8; BATCH=256; EVAL_EVERY=2000; LOG_EVERY=200; LIMIT=110
if [ "${SMOKE:-0}" = 1 ]; then  # The same phases at toy sizes, on any machine.
  P1="$P1 --steps=2 --repeats=1 --ceiling=256"; A="--sizes=tiny --seq_lens=64 --tokens_per_batch=512"
  S="--sizes=2x64 --seq_lens=64 --tokens_per_batch=512"
  LAYERS=2; BATCH=8; EVAL_EVERY=20; LOG_EVERY=10; GROW_TFLOPS=${GROW_TFLOPS_SMOKE:-0.05}
  LIMIT=240
fi
source studies/gpu_common.sh

# Token ids on the CPU cores while the GPU runs phase 1.
( $PY -m maelm_jax.data.prepare_data --source="text:$GROW/data/*.jsonl.xz" --out=$IDS \
    --tokenizer=$GROW/tokenizer.model --workers=$WORKERS > $OUT_DIR/logs/prepare.log 2>&1
  echo $? > /tmp/prepare.rc ) &
PREPARE=$!

# ---------------------------------------------------------------- 1. levers
if [ "${LEVERS:-1}" = 1 ]; then
  tp base512 $((LIMIT + 40)) $A --objectives=mlm,maelm,3ml-cross --profile_dir=/tmp/profile
  for d in /tmp/profile/*; do
    [ -d "$d" ] && $PY -m maelm_jax.tools.profiling $d --top=12 >> $OUT_DIR/logs/profile.txt 2>&1
  done
  tp shape128 $LIMIT $S --objectives=mlm,maelm-cross
fi

# ---------------------------------------------------------------- 2. grow
wait $PREPARE; stamp "prepared rc=$(cat /tmp/prepare.rc)"
rm -rf $RUN
if ls $GROW/parts/grow.tar.part* > /dev/null 2>&1; then
  mkdir -p $RUN && cat $GROW/parts/grow.tar.part* | tar -C $RUN -xf - &&
    stamp "resuming from step $(ls $RUN/checkpoints | grep -E '^[0-9]+$' | sort -n | tail -1)"
fi
grow() {  # grow ATTENTION_IMPL LOG: the run until its share of the call.
  local run_s=$(( $(left) - BRING_BACK_S - TAIL_S ))
  # (timeout 0 would mean no limit at all, and nothing would come back.)
  [ $run_s -gt 30 ] || { stamp "grow ($1): no time left (${run_s}s)"; return 124; }
  stamp "grow ($1): ${run_s}s of a ${GROW_TFLOPS} TFLOP schedule"
  timeout -s TERM $run_s $PY -m maelm_jax.main --config=configs/compare.py:size=tiny \
    --config.model.num_layers=$LAYERS --config.model.objective=maelm \
    --config.model.decoder_type=cross --config.model.dtype=bfloat16 \
    --config.model.scan_layers=True --config.model.dropout=0 \
    --config.model.attention_dropout=0 --config.model.attention_impl=$1 \
    --config.learning_rate=1e-3 --config.warmup_ratio=0.06 \
    --config.batch_size=$BATCH --config.seq_len=128 \
    --config.tokenizer.path=$GROW/tokenizer.model --config.data.source=arrayrecord:$IDS \
    --config.data.num_workers=$WORKERS --config.eval_every=$EVAL_EVERY --config.eval_batches=20 \
    --config.log_every=$LOG_EVERY --config.checkpoint_every=$EVAL_EVERY \
    --config.keep_checkpoints=1 --config.total_flops=${GROW_TFLOPS}e12 \
    --workdir=$RUN > $OUT_DIR/logs/$2 2>&1
  local rc=$?
  stamp "grow ($1) rc=$rc at step $(ls $RUN/checkpoints 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)"
  return $rc
}
grow auto grow.log
RC=$?
# A kernel path that fails on this machine (an error, not the time limit: 124) must
# not cost the run: the same run goes on with the einsum (attention_impl is a
# runtime choice; a run resumes under another).
if [ $RC -ne 0 ] && [ $RC -ne 124 ] && [ $(( $(left) - BRING_BACK_S - TAIL_S )) -gt 60 ]; then
  rm -f $RUN/.lock
  grow xla grow_xla.log
fi
cp $RUN/metrics.jsonl $OUT_DIR/logs/grow_metrics.jsonl 2>/dev/null
rm -f $RUN/.lock
tar -C $RUN -cf - . | split -b 15M -d - $OUT_DIR/grow.tar.part
stamp "brought back: $(ls $OUT_DIR | grep -c grow.tar.part) parts"

# ---------------------------------------------------------------- 3. input pipeline
T=$(( $(left) - 10 ))
[ $T -gt 20 ] && timeout -s INT -k 5 $T $PY benchmarks/input_pipeline.py \
    --source="text:$GROW/data/*.jsonl.xz" --tokenizer=$GROW/tokenizer.model \
    --seq_lens=128,512 --workers=8,15 --seconds=8 > $OUT_DIR/logs/input_pipeline.log 2>&1
stamp done
# Few files come back (8): everything but the parts in one archive.
tar -C $OUT_DIR -cJf $OUT_DIR/results.tar.xz p1 logs && rm -r $OUT_DIR/p1 $OUT_DIR/logs
ls -la $OUT_DIR

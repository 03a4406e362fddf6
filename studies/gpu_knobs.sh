#!/bin/bash
# Do the BabyLM winners' knobs help at equal FLOPs? One GPU
# run. The rule that decides is written before the runs (studies/babylm-knobs.md,
# "The rule"). Each variant is a whole schedule of KNOB_TFLOPS on the grow run's
# shape, data and recipe (studies/gpu_grow.sh: MAE-LM with a cross decoder, 8 x 128,
# batch 256 x 128, bf16, dropout 0, scanned, AdamW at 1e-3 with 6% warm-up):
#   base        the grow run's config
#   geglu       model.mlp_activation=geglu with model.mlp=344 (2/3 of 512: the same
#               FLOPs and parameters, flops.py)
#   normformer  model.normformer=True
#   decay       model.mask_ratio_start=0.3: 0.3 -> 0.15 in 4 stages
#   lamb3, lamb10  relative_updates=True (LAMB) at 3e-3 and 1e-2: the rate means
#               a relative step now, so it gets two, and the rule picks between them
#               on held-out [MASK] loss, not on BLiMP
#   adam3, adam10  not knobs: the baseline's AdamW at those rates (VARIANTS=...)
# SEED=1 runs every variant's second pretraining seed (the rule's confirmation).
# The variants run at the same time, each with its share of the GPU's memory: at this
# shape one run is bound by launching small kernels (3.5% MFU in the grow run), so
# several processes fill the GPU better than one after another. Each writes its
# metrics as it goes; at the end BLiMP (36 paradigms, the first 200 pairs each, the
# protocol's) scores them all on the GPU, and their params come back as bfloat16
# (studies/slim_workdir.py) in tar parts.
# Reads from ignored folders beside the checkout: .whl, .grow/data (the text), .grow/tokenizer.model, and
# .knobs/blimp (the first 200 lines of each paradigm of ../shared/data/blimp: the
# same pairs, 2 MB):
#   mkdir -p .knobs/blimp && for f in ../shared/data/blimp/*.jsonl; do
#     head -200 $f > .knobs/blimp/$(basename $f); done
# On the device, from the repository root:
#   OUT_DIR=$OUT_DIR TIME_LIMIT_S=560 bash studies/gpu_knobs.sh
# A smoke test on a CPU (tiny shapes, a few pairs):
#   SMOKE=1 OUT_DIR=/tmp/knobs_smoke PY=.venv/bin/python bash studies/gpu_knobs.sh
# The probe at the CPU study's scale (2 x 128, 15 TFLOP each, 29 minutes of
# 2 cores; studies/babylm-knobs.md):
#   CPU=1 OUT_DIR=/tmp/knobs_cpu PY=.venv/bin/python TIME_LIMIT_S=9000 bash studies/gpu_knobs.sh
KNOB_TFLOPS=${KNOB_TFLOPS:-1200}; BLIMP_S=${BLIMP_S:-150}; BRING_BACK_S=${BRING_BACK_S:-40}
VARIANTS=${VARIANTS:-"base geglu normformer decay lamb3 lamb10"}
GROW=${GROW:-.grow}; BLIMP=${BLIMP:-.knobs/blimp}; IDS=${IDS:-/tmp/knob_ids}
RUNS=${RUNS:-/tmp/knob_runs}; MEM=${MEM:-0.12}; WORKERS=${WORKERS:-2}
LAYERS=8; BATCH=256; MLP=512; PAIRS=200; EVAL_EVERY=1000; DTYPE=bfloat16; WARMUP=0.06
if [ "${SMOKE:-0}" = 1 ]; then  # The same steps at toy sizes, on any machine.
  KNOB_TFLOPS=${KNOB_TFLOPS_SMOKE:-0.02}; LAYERS=2; BATCH=8; MLP=512; PAIRS=3
  EVAL_EVERY=20; MEM=0.9; WORKERS=0
fi
if [ "${CPU:-0}" = 1 ]; then  # The probe at the CPU study's scale, on 2 cores: the
  # 2 x 128 encoder at batch 32 in float32, warm-up a third (a short schedule with
  # less stays on the unigram plateau: studies/recipes-off-the-plateau.md), the protocol's BLiMP.
  KNOB_TFLOPS=${KNOB_TFLOPS_CPU:-15}; LAYERS=2; BATCH=32; DTYPE=float32; WARMUP=0.333
  EVAL_EVERY=250; MEM=0.9; WORKERS=0; BLIMP_S=${BLIMP_S_CPU:-2400}
fi
source studies/gpu_common.sh

flags() {  # The variant's own overrides.
  case $1 in
    base) ;;
    geglu) echo "--config.model.mlp_activation=geglu --config.model.mlp=$(( (MLP * 2 / 3 + 7) / 8 * 8 ))" ;;
    normformer) echo "--config.model.normformer=True" ;;
    decay) echo "--config.model.mask_ratio_start=0.3" ;;
    lamb3) echo "--config.relative_updates=True --config.learning_rate=3e-3" ;;
    lamb10) echo "--config.relative_updates=True --config.learning_rate=1e-2" ;;
    # Not knobs: the baseline's AdamW at LAMB's rates, to tell LAMB's trust ratio
    # from a larger step.
    adam3) echo "--config.learning_rate=3e-3" ;;
    adam10) echo "--config.learning_rate=1e-2" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

$PY -m maelm_jax.data.prepare_data --source="text:$GROW/data/*.jsonl.xz" --out=$IDS \
    --tokenizer=$GROW/tokenizer.model --workers=8 > $OUT_DIR/logs/prepare.log 2>&1
stamp "prepared rc=$?"

# ---------------------------------------------------------------- the variants
RUN_S=$(( $(left) - BLIMP_S - BRING_BACK_S ))
stamp "variants ($VARIANTS): ${RUN_S}s for ${KNOB_TFLOPS} TFLOP each"
rm -rf $RUNS && mkdir -p $RUNS
for v in $VARIANTS; do
  XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM timeout -s TERM $RUN_S $PY -m maelm_jax.main \
    --config=configs/compare.py:size=tiny \
    --config.model.num_layers=$LAYERS --config.model.objective=maelm \
    --config.model.decoder_type=cross --config.model.dtype=$DTYPE \
    --config.model.scan_layers=True --config.model.dropout=0 \
    --config.model.attention_dropout=0 --config.learning_rate=1e-3 \
    --config.warmup_ratio=$WARMUP --config.batch_size=$BATCH --config.seq_len=128 \
    --config.tokenizer.path=$GROW/tokenizer.model --config.data.source=arrayrecord:$IDS \
    --config.data.num_workers=$WORKERS --config.eval_every=$EVAL_EVERY \
    --config.eval_batches=20 --config.log_every=100 --config.checkpoint_every=100000 \
    --config.keep_checkpoints=1 --config.total_flops=${KNOB_TFLOPS}e12 \
    --config.seed=${SEED:-0} $(flags $v) --workdir=$RUNS/$v > $OUT_DIR/logs/$v.log 2>&1 &
done
wait
for v in $VARIANTS; do
  cp $RUNS/$v/metrics.jsonl $OUT_DIR/logs/${v}_metrics.jsonl 2>/dev/null
  cp $RUNS/$v/config.json $OUT_DIR/logs/${v}_config.json 2>/dev/null
  stamp "$v: $(tail -1 $RUNS/$v/metrics.jsonl 2>/dev/null | cut -c1-200)"
done

# ---------------------------------------------------------------- BLiMP, on the GPU
WORKDIRS=$(for v in $VARIANTS; do [ -d $RUNS/$v/checkpoints ] && printf "%s," $RUNS/$v; done)
timeout -s INT $(( $(left) - BRING_BACK_S )) $PY -m maelm_jax.evaluate.blimp \
    --workdir=${WORKDIRS%,} --data=$BLIMP --max_pairs=$PAIRS --ngram_tokens=0 \
    --out=$OUT_DIR/blimp > $OUT_DIR/logs/blimp.log 2>&1
stamp "blimp rc=$? $(ls $OUT_DIR/blimp 2>/dev/null | tr '\n' ' ')"

# ---------------------------------------------------------------- bring back
mkdir -p /tmp/knob_slim
for v in $VARIANTS; do
  [ -d $RUNS/$v/checkpoints ] && $PY studies/slim_workdir.py $RUNS/$v /tmp/knob_slim/$v \
      --dtype=bfloat16 >> $OUT_DIR/logs/slim.log 2>&1
done
tar -C /tmp/knob_slim -cf - . | split -b 15M -d - $OUT_DIR/knobs.tar.part
stamp "brought back: $(ls $OUT_DIR | grep -c knobs.tar.part) parts"
tar -C $OUT_DIR -cJf $OUT_DIR/results.tar.xz logs $(ls -d $OUT_DIR/blimp 2>/dev/null | xargs -r basename) &&
  rm -r $OUT_DIR/logs $OUT_DIR/p1 $OUT_DIR/blimp 2>/dev/null
ls -la $OUT_DIR

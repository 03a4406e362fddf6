#!/bin/bash
# GLUE for the encoders pretrained on the GPU machine, on the GPU machine. One GPU
# run. (First, about two minutes: benchmarks/roofline_check.py times
# `base` MLM and MAE-LM at 512 against the planner's roofline; roofline.jsonl.) On the 2 CPU cores one fine-tuning run of an 8 x 256 encoder took 8-14 minutes
# (18 runs an encoder: 3 tasks x (3 rates picked on training data + 3 seeds)); here
# every (encoder, task) pair is its own process with its share of the GPU's memory,
# all at once. The protocol is the comparison's, unchanged (studies/score_encoders.py,
# configs/compare.py get_finetune: float32, mean pooling, SST-2 8,000 examples x 2
# epochs, QNLI-half x 3, CoLA x 2, the rate picked on a split of the training data,
# medians of seeds 1-3), so the rows sit beside the CPU-scored ones.
# Reads from an ignored folder .glue (about 40 MB with three encoders):
#   .glue/data/{SST-2,QNLI,CoLA}  the tasks' tsv files, copied from ../shared/data/glue
#   .glue/enc/<name>/             each encoder as a slim bfloat16 workdir (what the
#                                 pretraining runs bring back; studies/slim_workdir.py
#                                 SRC .glue/enc/NAME --dtype=bfloat16 makes one)
#   .glue/done/ (optional)        glue_runs.tar.xz of an earlier run: its finished
#                                 runs are skipped (the same paths, the same configs)
# For example, the baseline and one variant a knob probe brought back (score them
# before the machine that holds them goes):
#   bash studies/prepare_gpu_inputs.sh glue
#   cat knobs.tar.part* | tar -C .glue/enc -xf - ./base ./geglu
# On the GPU machine, from the repository root (ROOFLINE_S=0 leaves out phase 0
# when little of the time limit is left):
#   OUT_DIR=/path/to/results TIME_LIMIT_S=560 bash studies/gpu_glue.sh
# Then here: tar -xJf glue_runs.tar.xz -C DIR; the scores are DIR/<name>/<task>/scores.json,
# merged in $OUT_DIR/glue.json (studies/encoder_rows.py --scores reads it).
# A smoke test on a CPU (one rate, 2 steps of data, 2 processes at a time):
#   SMOKE=1 OUT_DIR=/tmp/glue_smoke PY=.venv/bin/python bash studies/gpu_glue.sh
GLUE=${GLUE:-.glue}; RUNS=${RUNS:-/tmp/glue_runs}; ENC=${ENC:-/tmp/glue_enc}
BRING_BACK_S=${BRING_BACK_S:-30}; TASKS=${TASKS:-"sst2 qnli cola"}
CONFIG=configs/compare.py:size=tiny; PARALLEL=${PARALLEL:-16}; ROOFLINE_S=${ROOFLINE_S:-150}
RSIZE=base; ROOFLINE="--set=seq_len=512 --set=batch_size=128 --set=model.dtype=bfloat16"
ROOFLINE="$ROOFLINE --set=model.dropout=0 --set=model.attention_dropout=0"
if [ "${SMOKE:-0}" = 1 ]; then  # One rate, and JAX on the CPU (no chip constants: the
  # H100's stand in for the roofline check, whose numbers then mean nothing).
  CONFIG="configs/compare.py:size=tiny,ft_lrs=1e-3"; PARALLEL=2; RSIZE=tiny
  ROOFLINE="--set=seq_len=64 --set=batch_size=8 --set=model.dtype=bfloat16 --chip=H100 --steps=2"
fi
source studies/gpu_common.sh

# ---------------------------------------------------------------- 0. the roofline check
# The planner's roofline against the measured time of the executable it compiled
# (benchmarks/roofline_check.py), `base` MLM and MAE-LM at 512, with the GPU alone.
ROOFLINE_END=$(( SECONDS - START + ROOFLINE_S ))
for objective in mlm maelm; do
  limit=$(( ROOFLINE_END - (SECONDS - START) ))
  [ $limit -gt 20 ] || break
  timeout -s INT -k 10 $limit $PY benchmarks/roofline_check.py $ROOFLINE \
      --config=configs/pretrain.py:objective=$objective,size=$RSIZE \
      --json=$OUT_DIR/roofline.jsonl >> $OUT_DIR/logs/roofline.log 2>&1
  stamp "roofline $objective rc=$?"
done

# ---------------------------------------------------------------- the encoders, widened
# The CPU protocol's float32 is exact; a GPU's float32 matmuls default to TF32.
export JAX_DEFAULT_MATMUL_PRECISION=highest
# Fine-tuning and its checks expect the float32 params a CPU run would have.
rm -rf $ENC $RUNS && mkdir -p $ENC $RUNS
NAMES=$(ls $GLUE/enc)
for name in $NAMES; do
  $PY studies/slim_workdir.py $GLUE/enc/$name $ENC/$name --dtype=float32 \
      >> $OUT_DIR/logs/widen.log 2>&1 || stamp "widening $name failed"
done
[ -d $GLUE/done ] && for f in $GLUE/done/*.tar.xz; do tar -xJf $f -C $RUNS; done
find $RUNS -name .lock -delete  # (a run killed on another host left its lock)
stamp "encoders: $(echo $NAMES); earlier runs: $(find $RUNS -name eval_results.json | wc -l)"

# ---------------------------------------------------------------- fine-tuning, all at once
PAIRS=$(( $(echo $NAMES | wc -w) * $(echo $TASKS | wc -w) ))
[ $PAIRS -lt $PARALLEL ] && PARALLEL=$PAIRS
# Each process preallocates its share of the GPU's memory: 85% among those at once.
MEM=${MEM:-$(awk "BEGIN {print 0.85 / $PARALLEL}")}
[ "${SMOKE:-0}" = 1 ] && MEM=0.9
stamp "fine-tuning ($TASKS) for $(( $(left) - BRING_BACK_S ))s, $PARALLEL processes at a time, memory $MEM each"
running=0
for name in $NAMES; do
  for task in $TASKS; do
    run_s=$(( $(left) - BRING_BACK_S ))  # One deadline for all, however late they start.
    [ $run_s -gt 10 ] || break 2
    # Its own compilation cache: seeds share their compiled steps, and no process
    # reads an entry another is still writing.
    JAX_COMPILATION_CACHE_DIR=/tmp/glue_jax_cache/${name}_$task \
    XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM timeout -k 20 -s TERM $run_s \
      $PY studies/score_encoders.py --out=$RUNS/$name/$task --config=$CONFIG \
      --encoders=$name=$ENC/$name --glue_dir=$GLUE/data --tasks=$task --blimp_dir= \
      > $OUT_DIR/logs/${name}_$task.log 2>&1 &
    running=$((running + 1))
    if [ $running -ge $PARALLEL ]; then wait -n; running=$((running - 1)); fi
  done
done
wait
stamp "fine-tuned: $(find $RUNS -name eval_results.json | wc -l) runs finished"

# ---------------------------------------------------------------- bring back
# The scores merged per encoder, and every run's results without checkpoints (a
# later run carries them in as .glue/done and skips them).
$PY - $RUNS $OUT_DIR/glue.json <<'EOF'
import json, pathlib, sys
runs, merged = pathlib.Path(sys.argv[1]), {}
for path in sorted(runs.glob("*/*/scores.json")):
  name = path.parent.parent.name
  for task, entry in json.loads(path.read_text()).get(name, {}).get("glue", {}).items():
    merged.setdefault(name, {}).setdefault("glue", {})[task] = entry
pathlib.Path(sys.argv[2]).write_text(json.dumps(merged, indent=1))
print(json.dumps(merged))
EOF
tar -C $RUNS --exclude=checkpoints --exclude=tensorboard --exclude=glue \
    --exclude=glue_select --exclude="*.png" --exclude=.lock -cJf $OUT_DIR/glue_runs.tar.xz .
stamp "brought back $(du -h $OUT_DIR/glue_runs.tar.xz | cut -f1)"
tar -C $OUT_DIR -cJf $OUT_DIR/results.tar.xz logs && rm -r $OUT_DIR/logs $OUT_DIR/p1 2>/dev/null
ls -la $OUT_DIR

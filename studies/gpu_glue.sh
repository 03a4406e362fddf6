#!/bin/bash
# Issue 40, Part 2: GLUE for the encoders pretrained on the device, on the device. One
# call. On the 2 CPU cores one fine-tuning run of an 8 x 256 encoder took 8-14 minutes
# (18 runs an encoder: 3 tasks x (3 rates picked on training data + 3 seeds)); here
# every (encoder, task) pair is its own process with its share of the GPU's memory,
# all at once. The protocol is the comparison's, unchanged (studies/score_encoders.py,
# configs/compare.py get_finetune: float32, mean pooling, SST-2 8,000 examples x 2
# epochs, QNLI-half x 3, CoLA x 2, the rate picked on a split of the training data,
# medians of seeds 1-3), so the rows sit beside the CPU-scored ones.
# Carried in an ignored folder .glue (about 40 MB with three encoders):
#   .glue/data/{SST-2,QNLI,CoLA}  the tasks' tsv files, copied from ../shared/data/glue
#   .glue/enc/<name>/             each encoder as a slim bfloat16 workdir (what the
#                                 pretraining calls bring back; studies/slim_workdir.py
#                                 SRC .glue/enc/NAME --dtype=bfloat16 makes one)
#   .glue/done/ (optional)        glue_runs.tar.xz of an earlier call: its finished
#                                 runs are skipped (the same paths, the same configs)
# For example:
#   mkdir -p .glue/data .glue/enc && for t in SST-2 QNLI CoLA; do
#     cp -r ../shared/data/glue/$t .glue/data/; done
#   cp -r /work/gpu40/raw_mlm .glue/enc/mlm_8x256
#   cp -r /work/gpu40/raw_maelmx .glue/enc/maelmx_8x256
# On the device, from the repository root:
#   OUT=$OUT CALL_S=560 bash studies/gpu_glue.sh
# Then here: tar -xJf glue_runs.tar.xz -C DIR; the scores are DIR/<name>/<task>/scores.json,
# merged in $OUT/glue.json (studies/encoder_rows.py --scores reads it).
# A smoke test on a CPU (one rate, 2 steps of data, 2 processes at a time):
#   SMOKE=1 OUT=/tmp/glue_smoke PY=.venv/bin/python bash studies/gpu_glue.sh
GLUE=${GLUE:-.glue}; RUNS=${RUNS:-/tmp/glue_runs}; ENC=${ENC:-/tmp/glue_enc}
BRING_BACK_S=${BRING_BACK_S:-30}; TASKS=${TASKS:-"sst2 qnli cola"}
CONFIG=configs/compare.py:size=tiny; MEM=${MEM:-0.08}; PARALLEL=${PARALLEL:-16}
if [ "${SMOKE:-0}" = 1 ]; then  # One rate, and JAX on the CPU.
  CONFIG="configs/compare.py:size=tiny,ft_lrs=1e-3"; MEM=0.9; PARALLEL=2
fi
source studies/gpu_common.sh
export JAX_COMPILATION_CACHE_DIR=/tmp/glue_jax_cache  # Seeds share their compiled steps.

# ---------------------------------------------------------------- the encoders, widened
# Fine-tuning and its checks expect the float32 params a CPU run would have.
rm -rf $ENC $RUNS && mkdir -p $ENC $RUNS
NAMES=$(ls $GLUE/enc)
for name in $NAMES; do
  $PY studies/slim_workdir.py $GLUE/enc/$name $ENC/$name --dtype=float32 \
      >> $OUT/logs/widen.log 2>&1 || stamp "widening $name failed"
done
[ -d $GLUE/done ] && for f in $GLUE/done/*.tar.xz; do tar -xJf $f -C $RUNS; done
stamp "encoders: $(echo $NAMES); earlier runs: $(find $RUNS -name eval_results.json | wc -l)"

# ---------------------------------------------------------------- fine-tuning, all at once
stamp "fine-tuning ($TASKS) for $(( $(left) - BRING_BACK_S ))s, $PARALLEL processes at a time"
running=0
for name in $NAMES; do
  for task in $TASKS; do
    run_s=$(( $(left) - BRING_BACK_S ))  # One deadline for all, however late they start.
    [ $run_s -gt 10 ] || break 2
    XLA_PYTHON_CLIENT_MEM_FRACTION=$MEM timeout -s TERM $run_s \
      $PY studies/score_encoders.py --out=$RUNS/$name/$task --config=$CONFIG \
      --encoders=$name=$ENC/$name --glue_dir=$GLUE/data --tasks=$task --blimp_dir= \
      > $OUT/logs/${name}_$task.log 2>&1 &
    running=$((running + 1))
    if [ $running -ge $PARALLEL ]; then wait -n; running=$((running - 1)); fi
  done
done
wait
stamp "fine-tuned: $(find $RUNS -name eval_results.json | wc -l) runs finished"

# ---------------------------------------------------------------- bring back
# The scores merged per encoder, and every run's results without checkpoints (a
# later call carries them in as .glue/done and skips them).
$PY - $RUNS $OUT/glue.json <<'EOF'
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
    --exclude=glue_select --exclude="*.png" -cJf $OUT/glue_runs.tar.xz .
stamp "brought back $(du -h $OUT/glue_runs.tar.xz | cut -f1)"
tar -C $OUT -cJf $OUT/results.tar.xz logs && rm -r $OUT/logs $OUT/p1 2>/dev/null
ls -la $OUT

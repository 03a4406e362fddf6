#!/bin/bash
# The relative position bias on a GPU, side by side in one GPU run:
# `base` at length 512 (bf16, scanned, dropout 0, cuDNN attention) with
#   fixed: this tree (the bias table's gradient by a masked sum per row, the bias
#          cast to bf16 once before the layers) for MLM, MAE-LM and 3ML (cross);
#   old:   the tree before that change (a copy in .gpu/old: `git archive 19929ee
#          maelm_jax configs` and this train_throughput.py), MLM;
#   nobias: this tree without a relative position bias, MLM (the bias's remaining cost);
#   profile: MLM with XLA's command buffers off, so that the profile names the
#          kernels that the command buffers otherwise hide.
# Run from the repository root on the GPU machine: OUT_DIR=/path/to/results bash benchmarks/gpu_bias_ab.sh
set -u
PY=${PY:-python3}; OUT_DIR=${OUT_DIR:-runs/ab}; mkdir -p $OUT_DIR
SCRATCH=${TMPDIR:-/tmp}  # the wheels' site-packages and the profile
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target $SCRATCH/site .whl/*.whl || exit 1
  export PYTHONPATH=$SCRATCH/site
fi
A="--sizes=base --seq_lens=512 --dtype=bfloat16 --attention_impls=auto --scan_layers
   --dropout=0 --steps=10 --repeats=3 --tokens_per_batch=65536 --ceiling=8192"
ab() {  # ab NAME SCRIPT ARGS...
  local name=$1 script=$2; shift 2
  timeout -s INT ${LIMIT:-120} $PY $script $A --json=$OUT_DIR/$name.json --out=$OUT_DIR/$name.md \
      "$@" > $OUT_DIR/$name.log 2>&1
  echo "$(date +%T) $name rc=$?"; grep "^| base" $OUT_DIR/$name.md 2>/dev/null
}
ab fixed benchmarks/train_throughput.py --objectives=mlm,maelm,3ml-cross
ab old .gpu/old/benchmarks/train_throughput.py --objectives=mlm
ab nobias benchmarks/train_throughput.py --objectives=mlm --config.model.relative_position_bias=False
XLA_FLAGS=--xla_gpu_enable_command_buffer= ab profile benchmarks/train_throughput.py \
    --objectives=mlm --profile_dir=$SCRATCH/profile
for d in $SCRATCH/profile/*; do $PY -m maelm_jax.tools.profiling $d --top=12 >> $OUT_DIR/profile.txt 2>&1; done
tail -4 $OUT_DIR/profile.txt
# Few files come back (8): all in one archive.
(cd $OUT_DIR && tar -cJf ab.tar.xz *.json *.md *.log profile.txt && rm -f *.json *.md *.log profile.txt)

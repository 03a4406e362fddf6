#!/bin/bash
# Issue 25's lever on one GPU (benchmarks/RESULTS.md, "The lever on one GPU"): the
# 8-layer tiny MLM and MAE-LM (cross decoder) pretrained side by side on one GPU at
# equal FLOPs, the budget sized by a short probe of both so that they take ~RUN_S
# seconds; each run is stopped by SIGTERM (which saves) at RUN_S + 120 s. The params of
# the newest checkpoint and of the kept one nearest half way come back as tar parts
# under $OUT (studies/slim_workdir.py), for scoring on any machine with
# studies/score_encoders.py. Run from the repository root:
#   DATA='/data/imdb/*.jsonl.xz,/data/wiki/*.jsonl.xz' TOKENIZER=/work/study/tokenizer/tokenizer.model \
#     RUN_S=300 OUT=/tmp/out bash studies/gpu_pretrain_pair.sh
RUN_S=${RUN_S:-300}; PROBE_TFLOPS=${PROBE_TFLOPS:-80}; PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p $OUT
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.4
C="$PY -m maelm_jax.main --config=configs/compare.py:size=tiny --config.model.num_layers=8 --config.learning_rate=1e-3 --config.tokenizer.path=${TOKENIZER:-.gpu/tokenizer.model} --config.data.source=text:${DATA:-.gpu/data/*.jsonl.xz} --config.batch_size=128 --config.data.num_workers=${WORKERS:-6} --config.eval_every=1000 --config.log_every=100"
MLM="--config.model.objective=mlm"
MAE="--config.model.objective=maelm --config.model.decoder_type=cross"
date
( $C $MLM --workdir=/tmp/probe_mlm --config.total_flops=${PROBE_TFLOPS}e12 --config.checkpoint_every=100000 > $OUT/probe_mlm.log 2>&1 ) &
( $C $MAE --workdir=/tmp/probe_mae --config.total_flops=${PROBE_TFLOPS}e12 --config.checkpoint_every=100000 > $OUT/probe_mae.log 2>&1 ) &
wait; date; tail -n 3 $OUT/probe_*.log > $OUT/probe.txt; rm $OUT/probe_*.log
BUDGET=$($PY - <<PYEOF
import json
rates = []
for w in ("/tmp/probe_mlm", "/tmp/probe_mae"):
    c = json.load(open(f"{w}/config.json"))
    recs = [json.loads(l) for l in open(f"{w}/metrics.jsonl")]
    tps = sorted(r["tokens_per_sec"] for r in recs if "tokens_per_sec" in r)[-3:]
    sps = tps[0] / (c["batch_size"] * c["seq_len"])
    fps = c["total_flops"] / c["total_steps"]
    rates.append(fps * sps)
    print(w, c["total_steps"], "steps/s", round(sps, 1), "TFLOP/s", round(fps * sps / 1e12, 2), file=open("$OUT/probe.txt", "a"))
print(round(min(rates) * $RUN_S / 1e12, 3))
PYEOF
)
echo "budget ${BUDGET} TFLOP" | tee -a $OUT/probe.txt
for o in mlm mae; do
  if [ $o = mlm ]; then A=$MLM; else A=$MAE; fi
  ( timeout -s TERM $((RUN_S + 120)) $C $A --workdir=/tmp/gpu_$o --config.total_flops=${BUDGET}e12 --config.checkpoint_every=${CKPT_EVERY:-1000} --config.keep_checkpoints=1 --config.checkpoint_keep_period=${KEEP_PERIOD:-2000} > $OUT/run_$o.log 2>&1 ) &
done
wait; date
for o in mlm mae; do
  $PY studies/slim_workdir.py /tmp/gpu_$o /tmp/slim_$o && tar -C /tmp/slim_$o -cf - . | split -b 15M -d - $OUT/ckpt_$o.tar.part
  $PY studies/slim_workdir.py /tmp/gpu_$o /tmp/half_$o half && tar -C /tmp/half_$o -cf - . | split -b 15M -d - $OUT/half_$o.tar.part
done
ls -la $OUT

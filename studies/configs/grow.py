r"""One encoder that grows across time-limited GPU slots (studies/gpu-encoders.md,
"One encoder across runs"): MAE-LM with a cross-attention decoder at 8 x 128 (tiny's
width, 8 layers; the shape of the best BLiMP so far), batch 256 x 128, bf16, dropout
0, scanned layers, AdamW at 1e-3 with 6% warm-up: ONE schedule of `tflops` spread
over as many slots as it takes. Each slot trains until its time limit, saves, and
packs the workdir into parts (launch/slot.sh, --parts); the next slot, on this machine
or another, unpacks the newest complete set and resumes exactly where the last one
stopped (the data iterator's position included). The token ids are prepared again
from the same text into the same place each slot (one shard per text file: the same
shards each time).

Arguments: tflops (the whole schedule; 24000), scale (gpu | smoke: 2 layers at batch
8 x 64, float32, 0.05 TFLOP).

  # every slot, on a GPU machine with a 10-minute limit; PARTS is a directory that
  # outlives the machine (a mounted drive, a bucket's local copy):
  python studies/run_study.py --config=studies/configs/grow.py --out=runs/grow \
      --parts=PARTS --time_limit=9m
  # the same at toy sizes, on any machine (run it twice: the second resumes):
  python studies/run_study.py --config=studies/configs/grow.py:scale=smoke \
      --out=runs/grow_smoke --parts=runs/grow_parts --time_limit=4m

Results: studies/gpu-encoders.md and studies/results/device_encoders.json.
"""

import pathlib

from maelm_jax.run import config_lib

compare = config_lib.load_config_module(
    str(pathlib.Path(__file__).parents[2] / "configs" / "compare.py"))


def _arg(arg):
  a = config_lib.parse_arg(arg, tflops=24000.0, scale="gpu")
  if a.scale not in ("gpu", "smoke"):
    raise ValueError(f"scale={a.scale!r}: use gpu or smoke")
  return a


def get_config(arg=None):
  a = _arg(arg)
  smoke = a.scale == "smoke"
  config = compare.get_config("size=tiny")
  config.unlock()
  config.model.update(**compare.FORMER_POSITIONS)  # As measured.
  config.model.update(num_layers=2 if smoke else 8, objective="maelm",
                      decoder_type="cross", dtype="float32" if smoke else "bfloat16",
                      scan_layers=True, dropout=0.0, attention_dropout=0.0)
  config.update(learning_rate=1e-3, warmup_ratio=0.06, batch_size=8 if smoke else 256,
                seq_len=64 if smoke else 128, eval_every=20 if smoke else 2000,
                eval_batches=20, log_every=10 if smoke else 200,
                checkpoint_every=20 if smoke else 2000, keep_checkpoints=1,
                total_flops=(0.05 if smoke else a.tflops) * 1e12)
  config.data.source = "text:.grow/data/*.jsonl.xz"
  config.data.num_workers = 0 if smoke else 8
  config.tokenizer.path = ".grow/tokenizer.model"
  config.lock()
  return config


def get_sweep(arg=None):
  del arg
  return [{"name": "grow"}]


def get_study(arg=None):
  del arg  # The parts are the run: nothing else is kept.
  return {"together": True, "prepare": True, "keep_dtype": "", "grace_s": 60}

r"""MLM and MAE-LM (cross) at 8 x 256 pretrained one after the other, each with the
whole GPU, at one FLOP budget (studies/gpu-encoders.md, "8 x 256"): the slower
objective's probed rate x `safety` x the seconds each run gets. bf16, scanned layers,
dropout 0, AdamW at 1e-3, 65,536 tokens a batch at length 128. The newest params are
kept as bfloat16 and fine-tuned elsewhere by the comparison's protocol
(`--encoders` of this runner, or studies/score_encoders.py on a CPU).

Arguments: objectives (mlm+maelmx), lr (1e-3).

  # one GPU, 10 minutes (the throughput phases that shared it are
  # benchmarks/train_throughput.py's, benchmarks/gpu-throughput.md):
  python studies/run_study.py --config=studies/configs/pair_8x256.py --out=runs/pair \
      --time_limit=9m30s

Results: studies/gpu-encoders.md (an 8 x 256 encoder, BLiMP 60-63 and +6 points over
its random initialisation) and studies/results/device_encoders.json.
"""

import pathlib

from maelm_jax.run import config_lib

compare = config_lib.load_config_module(
    str(pathlib.Path(__file__).parents[2] / "configs" / "compare.py"))


def _arg(arg):
  a = config_lib.parse_arg(arg, objectives="mlm+maelmx", lr=1e-3)
  compare.objective_names(a.objectives)
  return a


def get_config(arg=None):
  a = _arg(arg)
  config = compare.get_config("size=small")
  config.unlock()
  config.model.update(**compare.FORMER_POSITIONS)  # As measured.
  config.model.update(num_layers=8, hidden=256, num_heads=4, mlp=1024, dtype="bfloat16",
                      scan_layers=True, dropout=0.0, attention_dropout=0.0)
  config.update(learning_rate=a.lr, batch_size=65536 // 128, seq_len=128, eval_every=500,
                eval_batches=20, log_every=50, checkpoint_every=1000, keep_checkpoints=1)
  config.data.source = "text:.grow/data/*.jsonl.xz"
  config.data.num_workers = 10
  config.tokenizer.path = ".grow/tokenizer.model"
  config.lock()
  return config


def get_sweep(arg=None):
  return [{"name": o, **compare.OBJECTIVES[o]}
          for o in compare.objective_names(_arg(arg).objectives)]


def get_study(arg=None):
  del arg
  return {"together": False, "prepare": True, "probe_s": 60, "safety": 0.75,
          "keep_dtype": "bfloat16"}

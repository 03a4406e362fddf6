r"""The lever on one GPU (studies/gpu-encoders.md, "8 x 128"): the 8-layer tiny
encoder of each objective pretrained side by side on one GPU at one FLOP budget,
sized by a probe of all of them running together, so that each finishes its schedule
in the time it gets; then BLiMP (200 pairs a paradigm) of each newest checkpoint and
of the kept one nearest half way, and the newest params kept for fine-tuning on any
machine (`--encoders` of this runner, or studies/score_encoders.py).

The probe runs every objective together, as they will run: an earlier probe ran each
to a FLOP budget, and the last to finish then ran alone at 1.5-2x the shared rate.
Even so the runs trained at 0.65x their probe (evaluation, checkpoints, a longer input
pipeline): hence `safety` 0.6. `--tflops` skips the probe.

Arguments: objectives ("+"-separated names of configs/compare.py's OBJECTIVES; default
mlm+maelmx+3mlx), batch (256), dtype (bfloat16; the measurements on the page ran
float32 at batch 128 and 256).

  # one GPU, 10 minutes; text and tokenizer from studies/prepare_gpu_inputs.sh grow:
  python studies/run_study.py --config=studies/configs/lever_8x128.py --out=runs/lever \
      --time_limit=9m30s --blimp_dir=.knobs/blimp
  # the page's second measurement (float32, batch 256, 4 input workers, 360 s of runs):
  python studies/run_study.py --config=studies/configs/lever_8x128.py:dtype=float32 \
      --out=runs/lever_f32 --time_limit=11m --blimp_dir=.knobs/blimp \
      --config.data.num_workers=4
  # the same phases at toy sizes on any machine:
  python studies/run_study.py --config=studies/configs/lever_8x128.py:batch=8,dtype=float32 \
      --out=runs/lever_smoke --time_limit=6m --config.model.num_layers=2

Results: studies/gpu-encoders.md (BLiMP 60-63 at 8 x 128 and 8 x 256) and
studies/results/device_encoders.json.
"""

import pathlib

from maelm_jax.run import config_lib

compare = config_lib.load_config_module(
    str(pathlib.Path(__file__).parents[2] / "configs" / "compare.py"))


def _arg(arg):
  a = config_lib.parse_arg(arg, objectives="mlm+maelmx+3mlx", batch=256,
                           dtype="bfloat16")
  compare.objective_names(a.objectives)
  return a


def get_config(arg=None):
  a = _arg(arg)
  config = compare.get_config("size=tiny")
  config.unlock()
  config.model.update(**compare.FORMER_POSITIONS)  # As measured.
  config.model.update(num_layers=8, dtype=a.dtype)
  config.update(learning_rate=1e-3, batch_size=a.batch, eval_every=1000, log_every=100,
                checkpoint_every=1000, keep_checkpoints=1, checkpoint_keep_period=2000)
  config.data.source = "text:.grow/data/*.jsonl.xz"
  config.data.num_workers = 6
  config.tokenizer.path = ".grow/tokenizer.model"
  config.lock()
  return config


def get_sweep(arg=None):
  return [{"name": o, **compare.OBJECTIVES[o]}
          for o in compare.objective_names(_arg(arg).objectives)]


def get_study(arg=None):
  del arg
  return {"together": True, "memory_fraction": 0.9, "prepare": True, "probe_s": 150,
          "safety": 0.6, "blimp_half_way": True, "keep_dtype": "float32"}

r"""Do the BabyLM winners' knobs help at equal FLOPs? (studies/babylm-knobs.md; the
rule that decides was written there before the runs.)

Each variant is a whole schedule of `tflops` on one shape, data and recipe: MAE-LM
with a cross-attention decoder, 8 x 128 (tiny's width, 8 layers), batch 256 x 128,
bf16, dropout 0, scanned layers, AdamW at 1e-3 with 6% warm-up, on Wikipedia shards
04-05 with their own 8,000-piece tokenizer (studies/prepare_gpu_inputs.sh grow):

  base        the baseline
  geglu       model.mlp_activation=geglu, model.mlp 2/3 of the baseline's (the same
              FLOPs and parameters, flops.py)
  normformer  model.normformer=True
  decay       model.mask_ratio_start=0.3: 0.3 -> 0.15 in 4 stages
  lamb3, lamb10  relative_updates=True (LAMB) at 3e-3 and 1e-2: the rate means a
              relative step, so it gets two, and the rule picks on held-out [MASK]
              loss, not on BLiMP
  adam3, adam10  not knobs: the baseline's AdamW at those rates, to tell LAMB's trust
              ratio from a larger step (variants=...)

The variants run at once, each with its share of the GPU's memory: at this shape one
run is bound by launching small kernels (3.5% MFU), so several fill the GPU better
than one after another. Then BLiMP (36 paradigms, the first 200 pairs each) scores
them all, and their params are kept as bfloat16.

Arguments: scale (gpu | cpu | smoke), tflops (each variant's budget; gpu 1200, cpu 15,
smoke 0.02), variants ("+"-separated; default base+geglu+normformer+decay+lamb3+lamb10),
seed (the pretraining seed; 1 is the rule's confirmation).

  # one GPU, 10 minutes (an H200: 1,200 TFLOP each, six at once):
  python studies/run_study.py --config=studies/configs/babylm_knobs.py \
      --out=runs/knobs --time_limit=9m20s --blimp_dir=.knobs/blimp
  # the CPU probe at the study's CPU scale: 2 x 128 at batch 32 in float32, warm-up a
  # third (a short schedule with less stays on the unigram plateau), 15 TFLOP each,
  # about 29 minutes of 2 cores for the runs and 40 for BLiMP:
  python studies/run_study.py --config=studies/configs/babylm_knobs.py:scale=cpu \
      --out=runs/knobs_cpu --time_limit=2h30m --blimp_dir=.knobs/blimp
  # the same steps at toy sizes, on any machine, in about 3 minutes:
  python studies/run_study.py --config=studies/configs/babylm_knobs.py:scale=smoke \
      --out=runs/knobs_smoke --blimp_dir=.knobs/blimp

Results (2 CPU cores, 15 TFLOP, two seeds): studies/babylm-knobs.md and
studies/results/knob_probe_cpu.json.
"""

import pathlib

from maelm_jax.run import config_lib

compare = config_lib.load_config_module(
    str(pathlib.Path(__file__).parents[2] / "configs" / "compare.py"))

# scale: (layers, batch, dtype, warm-up share, eval_every, data workers, tflops)
SCALES = {"gpu": (8, 256, "bfloat16", 0.06, 1000, 2, 1200.0),
          "cpu": (2, 32, "float32", 1 / 3, 250, 0, 15.0),
          "smoke": (2, 8, "float32", 1 / 3, 20, 0, 0.02)}
MLP = 512  # tiny's
VARIANTS = {
    "base": {},
    # 2/3 of the baseline's width, rounded up to 8: GeGLU's three matrices cost what
    # the baseline's two do.
    "geglu": {"model.mlp_activation": "geglu", "model.mlp": (MLP * 2 // 3 + 7) // 8 * 8},
    "normformer": {"model.normformer": True},
    "decay": {"model.mask_ratio_start": 0.3},
    "lamb3": {"relative_updates": True, "learning_rate": 3e-3},
    "lamb10": {"relative_updates": True, "learning_rate": 1e-2},
    "adam3": {"learning_rate": 3e-3},
    "adam10": {"learning_rate": 1e-2},
}


def _arg(arg):
  a = config_lib.parse_arg(arg, scale="gpu", tflops=0.0, seed=0,
                           variants="base+geglu+normformer+decay+lamb3+lamb10")
  if a.scale not in SCALES:
    raise ValueError(f"scale={a.scale!r}: use one of {sorted(SCALES)}")
  unknown = [v for v in a.variants.split("+") if v not in VARIANTS]
  if unknown:
    raise ValueError(f"variants: unknown {unknown}; use '+'-separated names of "
                     f"{sorted(VARIANTS)}")
  return a


def get_config(arg=None):
  a = _arg(arg)
  layers, batch, dtype, warmup, eval_every, workers, tflops = SCALES[a.scale]
  config = compare.get_config("size=tiny")
  config.unlock()
  config.model.update(**compare.FORMER_POSITIONS)  # As measured.
  config.model.update(num_layers=layers, objective="maelm", decoder_type="cross",
                      dtype=dtype, scan_layers=True, dropout=0.0,
                      attention_dropout=0.0)
  config.update(learning_rate=1e-3, warmup_ratio=warmup, batch_size=batch, seq_len=128,
                eval_every=eval_every, eval_batches=20, log_every=100,
                checkpoint_every=100000, keep_checkpoints=1,
                total_flops=(a.tflops or tflops) * 1e12, seed=a.seed)
  config.data.source = "text:.grow/data/*.jsonl.xz"
  config.data.num_workers = workers
  config.tokenizer.path = ".grow/tokenizer.model"
  config.lock()
  return config


def get_sweep(arg=None):
  return [{"name": v, **VARIANTS[v]} for v in _arg(arg).variants.split("+")]


def get_study(arg=None):
  a = _arg(arg)
  # Six at once on one GPU: 12% of its memory each, as measured; on a CPU, no share.
  return {"together": True, "memory_fraction": 0.72, "prepare": True,
          "blimp_pairs": 3 if a.scale == "smoke" else 200,
          "blimp_s": {"gpu": 150, "cpu": 2400, "smoke": 240}[a.scale]}

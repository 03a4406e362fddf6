r"""The papers' comparison as a sweep: MLM vs MAE-LM vs 3ML (self- and
cross-attention decoder) at equal pretraining compute, plus 3ML at 78% of it.

  python -m maelm_jax.compare --config=configs/compare.py:size=tiny,tflops=20 \
      --out=runs/compare --glue_dir=/data/glue \
      --config.data.source='text:/data/books/*.txt'
  python -m maelm_jax.sweep --config=configs/compare.py:size=tiny,tflops=20 \
      --sweep_dir=runs/compare/pretrain [--launch=tpu_pod]   # pretraining only

Arguments: size (tiny), recipe (fast), tflops (each run's pretraining budget in
TFLOPs: total_flops, so each objective's step count follows from its own cost
per step, flops.py), seeds (pretraining seeds, e.g. "0+1"), frac_3ml (0.78: 3ML
also at that fraction of the budget, as in the 3ML paper; 0 for none),
objectives ("+"-separated names of OBJECTIVES below; default
mlm+maelm+3ml+3mlx), ft_lrs ("+"-separated fine-tuning learning rates each
encoder picks its own from on a split of the training data; default
3e-4+1e-3+3e-3), random (1: also the untrained control, `random_seed<s>`:
the same architecture after one step at learning rate 0, fine-tuned by the same
protocol, so the table says whether pretraining helped at all).

At 8 encoder layers of tiny's width, where skipping tokens pays
(studies/recipes-off-the-plateau.md, "At 8 encoder layers"; 1e-3 was MLM's and
MAE-LM's best rate there), as measured in studies/objectives-at-equal-compute.md,
"At 8 encoder layers":

  python -m maelm_jax.compare --config=configs/compare.py:size=tiny,tflops=80,seeds=0,\
objectives=mlm+maelmx+3mlx,frac_3ml=0,random=1 --out=runs/compare8 --glue_dir=/data/glue \
      --config.data.source='text:/data/books/*.txt' --config.model.num_layers=8 \
      --config.learning_rate=1e-3 --config.model.tie_embeddings=False

`get_finetune` is the downstream protocol `maelm_jax.compare` applies to every
pretrained encoder (configs/glue.py with these overrides; measured in
studies/fine-tuning-protocol.md).
"""

import importlib.util
import pathlib

from maelm_jax.run import config_lib

_spec = importlib.util.spec_from_file_location(
    "maelm_configs_pretrain", pathlib.Path(__file__).with_name("pretrain.py"))
pretrain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pretrain)

DEFAULT_OBJECTIVES = "mlm+maelm+3ml+3mlx"
# Each encoder's fine-tuning rate is picked from these on a split of the
# training data (maelm_jax.compare); one rate: no selection.
DEFAULT_FINETUNE_LEARNING_RATES = "3e-4+1e-3+3e-3"
# The fast recipe's encoder positions before rotary ones became its default
# (2026-12-03): a learned table and a relative bias. The studies measured with
# them (studies/configs/*.py) keep them, so their commands rerun as measured.
FORMER_POSITIONS = {"position": "learned", "relative_position_bias": True}
# name: the keys that make the objective (the rest is the objective's default).
OBJECTIVES = {
    "mlm": {"model.objective": "mlm"},
    "maelm": {"model.objective": "maelm"},
    "maelmx": {"model.objective": "maelm", "model.decoder_type": "cross"},
    "3ml": {"model.objective": "3ml", "model.decoder_type": "self"},
    "3mlx": {"model.objective": "3ml", "model.decoder_type": "cross"},
}


def _arg(arg):
  return config_lib.parse_arg(arg, size="tiny", recipe="fast", tflops=20.0,
                              seeds="0+1", frac_3ml=0.78,
                              objectives=DEFAULT_OBJECTIVES, random=False,
                              ft_lrs=DEFAULT_FINETUNE_LEARNING_RATES)


def get_config(arg=None):
  """The base of every run: configs/pretrain.py at `size` and `recipe`."""
  a = _arg(arg)
  config = pretrain.get_config(f"objective=maelm,size={a.size},recipe={a.recipe}")
  config.unlock()
  config.total_flops = a.tflops * 1e12
  # Step counts differ between objectives at one budget; each warms up over the
  # same share of its run: a third, as in the plateau probes (200 of 600 steps,
  # studies/recipes-off-the-plateau.md). With a tenth, tiny MLM was still on the unigram
  # plateau at step 500 of 664 (held-out [MASK] accuracy 7.2%).
  config.warmup_ratio = 1 / 3
  if a.size == "tiny":  # As measured on 2 CPU cores (benchmarks/cpu-speed-and-memory.md).
    config.model.dtype = "float32"
    config.batch_size = 32
  # Every run's cadence: evaluate and save every 500 steps, log every 100.
  config.update(eval_every=500, eval_batches=10, checkpoint_every=500, log_every=100)
  config.lock()
  return config


def objective_names(objectives: str) -> list[str]:
  """'+'-separated names of OBJECTIVES (a config argument), checked."""
  names = objectives.split("+")
  unknown = [n for n in names if n not in OBJECTIVES]
  if unknown:
    raise ValueError(f"objectives={objectives!r}: unknown {unknown}; use "
                     f"'+'-separated names of {sorted(OBJECTIVES)}, e.g. "
                     f"objectives=mlm+maelmx")
  return names


def get_sweep(arg=None):
  a = _arg(arg)
  seeds = [int(s) for s in a.seeds.split("+")]
  runs = [{"name": f"{name}_seed{seed}", "seed": seed, **OBJECTIVES[name]}
          for name in objective_names(a.objectives) for seed in seeds]
  if a.random:
    # One step whose learning rate is 0 (a one-step warm-up starts at 0; the
    # config refuses learning_rate=0): the checkpoint holds the seed's initial
    # weights, in the workdir layout fine-tuning reads.
    runs += [{"name": f"random_seed{seed}", "seed": seed, "model.objective": "mlm",
              "total_flops": 0.0, "total_steps": 1, "warmup_ratio": 0.0,
              "warmup_steps": 1} for seed in seeds]
  if a.frac_3ml:
    runs += [{"name": f"3ml_{round(100 * a.frac_3ml)}pct_seed{seed}", "seed": seed,
              "total_flops": a.frac_3ml * a.tflops * 1e12, **OBJECTIVES["3ml"]}
             for seed in seeds]
  return runs


def get_finetune(arg=None):
  """Fine-tuning of every pretrained encoder: common overrides, per-task ones,
  the learning rates each encoder picks its own from (on a split of the task's
  training data, one run per rate at `select_seeds`), and the fine-tuning
  seeds (the median over them is reported)."""
  a = _arg(arg)
  learning_rates = tuple(float(r) for r in str(a.ft_lrs).split("+"))
  # keep_final_checkpoint: the comparison's product is its table; its many
  # fine-tuning runs keep no parameters.
  common = {"pooling": "mean", "learning_rate": learning_rates[0],
            "dtype": "float32", "batch_size": 32, "log_every": 100,
            "keep_final_checkpoint": False}
  tasks = {"sst2": {"num_epochs": 2, "max_seq_len": 64,
                    "data.max_train_examples": 8000},
           "qnli": {"num_epochs": 3, "max_seq_len": 128},
           "cola": {"num_epochs": 2, "max_seq_len": 48}}
  return {"config_file": str(pathlib.Path(__file__).with_name("glue.py")),
          "common": common, "tasks": tasks, "seeds": (1, 2, 3),
          "learning_rates": learning_rates, "select_seeds": (1,)}

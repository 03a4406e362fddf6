r"""GLUE fine-tuning of a pretrained encoder (any maelm_jax pretraining workdir).

  python -m maelm_jax.main --config=configs/glue.py:task=rte \
      --config.init_from=runs/maelm_base --config.data.dir=/data/glue/RTE \
      --workdir=runs/glue_rte

Tasks: cola sst2 mrpc stsb qqp mnli qnli rte wnli. Choose the task in the config
argument (`:task=mnli`) so that its defaults below apply. `data.dir` may be the
task's directory or the GLUE root holding it (`--config.data.dir=/data/glue`), with
TSVs, the hub's parquet files or a save_to_disk folder (finetune/glue_data.py);
`--config.data.source=tfds` reads tfds `glue/<task>` instead. Writes
`eval_results.json`, `eval_predictions.jsonl` and `metrics.jsonl` to the workdir,
and `glue_submission/<Task>.tsv` with `--config.data.predict_test=True`.

Per-task defaults follow the COCO-LM / MAE-LM recipe (batch 16-32, peak learning
rate 1e-5..4e-5 with 6% warm-up and linear decay, 2-10 epochs, AdamW with
b2=0.98, eps=1e-6, weight decay 0.01); papers sweep the learning rate and report
the median over 5 seeds, which `python -m maelm_jax.finetune.sweep` does.
"""

import ml_collections

from maelm_jax.finetune import common_config
from maelm_jax.run import config_lib

# task: (batch_size, learning_rate, num_epochs). Large tasks converge in 2-3
# epochs; the small ones (CoLA, RTE, MRPC, STS-B, WNLI) need 10.
TASK_DEFAULTS = {
    "mnli": (32, 2e-5, 2),
    "qqp": (32, 2e-5, 2),
    "qnli": (32, 2e-5, 3),
    "sst2": (32, 2e-5, 3),
    "cola": (16, 2e-5, 10),
    "rte": (16, 2e-5, 10),
    "mrpc": (16, 2e-5, 10),
    "stsb": (16, 2e-5, 10),
    "wnli": (16, 1e-5, 10),
}


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, task="rte")
  task = arg.task.lower().replace("-", "").replace("_", "")
  if task not in TASK_DEFAULTS:
    raise ValueError(f"unknown GLUE task {arg.task!r}; use one of "
                     f"{sorted(TASK_DEFAULTS)}, e.g. configs/glue.py:task=rte")
  batch_size, learning_rate, num_epochs = TASK_DEFAULTS[task]

  config = ml_collections.ConfigDict()
  config.mode = "glue"  # What main.py runs: 'glue' here.
  config.task = task  # The GLUE task (TASK_DEFAULTS).
  config.init_from = ""  # Pretraining workdir (required): tokenizer, config, encoder.
  config.init_step = -1  # Checkpoint step to load; -1: the latest.

  config.max_seq_len = 128  # Tokens per example, [CLS] and [SEP]s included.
  config.batch_size = batch_size  # Global, in examples.
  config.eval_batch_size = 64  # The last eval batch is padded; nothing is dropped.
  config.learning_rate = learning_rate  # Peak learning rate (the task's default).
  config.num_epochs = num_epochs  # Passes over the training set.
  common_config.add_common_keys(config)
  # The head reads 'cls' (the first token, the papers' recipe) or 'mean' (the
  # mean of the token vectors).
  config.pooling = "cls"

  config.data = ml_collections.ConfigDict()
  config.data.source = "tsv"  # "tsv" (data.dir) or "tfds" (glue/<task>).
  # The task's GLUE directory, or the GLUE root above it: TSVs
  # (download_glue_data.py), the hub's parquet files, or a save_to_disk folder.
  config.data.dir = ""
  # TFDS data_dir for data.source='tfds' ('': TFDS's default).
  config.data.tfds_data_dir = ""
  config.data.max_train_examples = 0  # 0: all; else a fixed random subset.
  config.data.predict_test = False  # Write glue_submission/<Task>.tsv.
  config.data.diagnostic_file = ""  # MNLI only: diagnostic.tsv -> AX.tsv.

  config.lock()
  return config

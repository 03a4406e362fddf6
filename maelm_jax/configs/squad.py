r"""SQuAD v1.1 / v2.0 fine-tuning of a pretrained encoder.

  python -m maelm_jax.main --config=configs/squad.py:version=1.1 \
      --config.init_from=runs/maelm_base \
      --config.data.train_file=/data/squad/train-v1.1.json \
      --config.data.eval_file=/data/squad/dev-v1.1.json --workdir=runs/squad11

`--config.data.source=tfds` reads tfds `squad/v1.1` or `squad/v2.0` instead of the
JSON files. Writes `predictions.json` (question id -> answer, the official
format), `eval_results.json` (`exact_match`, `f1`; for v2.0 also HasAns_/NoAns_
and the best no-answer threshold), `null_odds.json` (v2.0: the no-answer scores,
the official script's `--na-prob-file`) and `metrics.jsonl`.

Defaults: BERT's windows (384 tokens, stride 128, 64-token questions, answers of
at most 30 tokens) and the COCO-LM / MAE-LM optimisation recipe.
"""

import ml_collections

from maelm_jax.finetune import common_config
from maelm_jax.run import config_lib


def get_config(arg=None):
  arg = config_lib.parse_arg(arg, version="1.1")
  if arg.version not in ("1.1", "2.0"):
    raise ValueError(f"SQuAD version {arg.version!r}: use configs/squad.py:"
                     "version=1.1 or version=2.0")

  config = ml_collections.ConfigDict()
  config.mode = "squad"
  config.version = arg.version
  config.init_from = ""  # Pretraining workdir (required): tokenizer, config, encoder.
  config.init_step = -1  # Checkpoint step to load; -1: the latest.

  config.max_seq_len = 384
  config.doc_stride = 128
  config.max_query_len = 64
  config.max_answer_len = 30  # In tokens.
  config.n_best = 20  # Start and end candidates paired per window.
  config.null_score_diff_threshold = 0.0  # v2.0: answer "" above this.

  config.batch_size = 32  # Global, in windows.
  config.eval_batch_size = 64
  config.learning_rate = 3e-5
  config.num_epochs = 2 if arg.version == "1.1" else 3
  common_config.add_common_keys(config)

  config.data = ml_collections.ConfigDict()
  config.data.source = "json"  # "json" (train_file/eval_file) or "tfds".
  config.data.train_file = ""
  config.data.eval_file = ""
  config.data.tfds_data_dir = ""
  config.data.max_train_examples = 0  # 0: all questions; else a fixed random subset.

  config.lock()
  return config

r"""The embedded default behind `make demo`: a tiny MAE-LM, offline, in minutes.

  python -m maelm_jax.main --config=configs/demo.py --workdir=workdirs/demo
  python -m maelm_jax.main --config=configs/demo.py:objective=mlm --workdir=workdirs/demo_mlm

Trains a SentencePiece tokenizer and pretrains a tiny MAE-LM on the English
documentation that ships with CPython (`pydoc_data`) with the default (fast)
recipe, then scores the held-out [MASK]ed positions against the unigram and
bigram baselines, draws the learning curve and saves a checkpoint. Everything
is `configs/pretrain.py`; only the run length, the logging cadence and a
larger held-out share (the corpus is small) differ.
"""

import importlib.util
import pathlib

# Loaded by path so the config works from any working directory.
_spec = importlib.util.spec_from_file_location(
    "maelm_configs_pretrain", pathlib.Path(__file__).with_name("pretrain.py"))
pretrain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pretrain)


def get_config(arg=None):
  """arg: "" or "objective=mlm|maelm|3ml" (default maelm)."""
  options = dict(item.split("=", 1) for item in (arg or "").split(",") if item)
  unknown = set(options) - {"objective"}
  if unknown:
    raise ValueError(f"configs/demo.py takes only objective=..., not {sorted(unknown)}")
  objective = options.get("objective", "maelm")
  config = pretrain.get_config(f"objective={objective},size=tiny,recipe=fast")
  config.unlock()
  config.data.source = "pydoc:"
  config.data.eval_fraction = 0.1
  config.tokenizer.vocab_size = 3000
  config.total_steps = 800
  config.warmup_steps = 100
  config.batch_size = 32
  config.seq_len = 128
  config.model.dtype = "float32"  # Faster than bfloat16 on CPUs.
  config.log_every = 50
  config.eval_every = 100
  config.eval_batches = 8
  config.checkpoint_every = 400
  config.lock()
  return config

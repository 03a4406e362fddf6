"""Small builders shared by tests."""

import sys
import pathlib

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
import pretrain  # noqa: E402

from maelm_jax.run import config_lib  # noqa: E402


def tiny_config(objective="maelm", **overrides):
  """A resolved pretraining config small enough for CPU tests."""
  config = pretrain.get_config(f"objective={objective},size=tiny")
  config.unlock()
  config.total_steps = 4
  config.warmup_steps = 1
  config.batch_size = 8
  config.seq_len = 32
  config.model.dtype = "float32"
  for key, value in overrides.items():
    config_lib.set_path(config, key, value)
  return config_lib.resolve(config)


def random_ids(batch, seq_len, vocab_size, seed=0, num_pad=0):
  """Full rows `[CLS] w.. [SEP]`, optionally right-padded with [PAD]."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, vocab_size, (batch, seq_len)).astype(np.int32)
  ids[:, 0] = 2
  end = seq_len - num_pad - 1
  ids[:, end] = 3
  ids[:, end + 1:] = 0
  return ids

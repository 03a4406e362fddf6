"""Orbax checkpoints: the manager of a run, and loading another run's encoder.

A checkpoint step directory holds two items: `state` (the `TrainState`: params,
optimizer state, step, rng) and `data` (the grain iterator state).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from absl import logging
import grain
import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from maelm_jax import model as model_lib, tokenizer as tokenizer_lib

CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(workdir: str) -> str:
  return os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))


def latest_step(workdir: str) -> int | None:
  directory = checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    return None
  steps = [int(name) for name in os.listdir(directory) if name.isdigit()]
  return max(steps) if steps else None


def make_manager(workdir: str, config) -> ocp.CheckpointManager:
  """Async saves; keeps the last `keep_checkpoints` plus every
  `checkpoint_keep_period`-th step for good. Orbax writes each step into a
  temporary directory and renames it when complete, and deletes old steps only
  after a newer one is finalised, so a crash never leaves fewer good steps."""
  options = ocp.CheckpointManagerOptions(
      max_to_keep=config.keep_checkpoints,
      keep_period=config.checkpoint_keep_period or None,
      enable_async_checkpointing=True,
      cleanup_tmp_directories=True)
  return ocp.CheckpointManager(checkpoint_dir(workdir), item_names=("state", "data"),
                               options=options)


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator) -> None:
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state),
      data=grain.checkpoint.CheckpointSave(data_iterator)), force=True)


def _quarantine(manager: ocp.CheckpointManager, step: int) -> str:
  """Moves a bad step aside (never deletes it) so the next save can use its
  number; process 0 renames, everyone waits."""
  directory = os.path.join(str(manager.directory), str(step))
  target = f"{directory}.corrupt"
  suffix = 1
  while os.path.exists(target):
    target, suffix = f"{directory}.corrupt{suffix}", suffix + 1
  if jax.process_index() == 0:
    os.rename(directory, target)
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(f"maelm_quarantine_{step}")
  manager.reload()
  return target


def restore_latest_good(manager: ocp.CheckpointManager, abstract_state,
                        data_iterator):
  """Restores the newest checkpoint that reads back completely.

  A step whose files are truncated, corrupted or missing an item fails to
  restore; it is moved aside as `<step>.corrupt` and the previous one is tried.
  Returns (state, step), or (None, None) when no good checkpoint exists.
  """
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      restored = manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          data=grain.checkpoint.CheckpointRestore(data_iterator)))
      return restored.state, step
    except Exception as error:  # Orbax/tensorstore raise many types here.
      moved = _quarantine(manager, step)
      logging.error("checkpoint at step %d cannot be restored (%s: %s); moved "
                    "it to %s and falling back to the previous one", step,
                    type(error).__name__, str(error)[:500], moved)
  return None, None


@dataclasses.dataclass
class Pretrained:
  """What a downstream run needs from a pretraining workdir."""

  params: Any  # {'token_embed', 'encoder'} (encoder_only) or the full tree.
  model_cfg: model_lib.ModelConfig
  tokenizer: tokenizer_lib.Tokenizer
  config: ml_collections.ConfigDict  # The pretraining run's resolved config.
  step: int


def restore_params(workdir: str, step: int | None = None,
                   collections: tuple[str, ...] | None = None,
                   shardings: Any = None) -> tuple[Any, int]:
  """Restores `state.params` (optionally only some top-level collections).

  Reads the checkpoint's own metadata for the target tree, so it works whatever
  mesh or process count wrote it; arrays come back as numpy unless `shardings`
  (a tree matching the restored params) is given.
  """
  step = latest_step(workdir) if step is None else step
  if step is None:
    raise FileNotFoundError(
        f"no checkpoint in {checkpoint_dir(workdir)}; --config.init_from must name "
        "the workdir of a pretraining run that saved at least one checkpoint")
  path = os.path.join(checkpoint_dir(workdir), str(step), "state")
  checkpointer = ocp.PyTreeCheckpointer()
  metadata = checkpointer.metadata(path)
  tree = metadata.item_metadata.tree if hasattr(metadata, "item_metadata") else metadata.tree
  params_meta = tree["params"]
  if collections is not None:
    missing = [c for c in collections if c not in params_meta]
    if missing:
      raise KeyError(f"checkpoint {path} has no {missing}; it has {sorted(params_meta)}")
    params_meta = {c: params_meta[c] for c in collections}
  if shardings is None:
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                params_meta)
  else:
    restore_args = jax.tree.map(lambda _, s: ocp.ArrayRestoreArgs(sharding=s),
                                params_meta, shardings)
  item = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), params_meta)
  restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
      item={"params": item}, restore_args={"params": restore_args},
      partial_restore=True))
  return restored["params"], step


def load_pretrained(workdir: str, *, encoder_only: bool = True,
                    step: int | None = None) -> Pretrained:
  """Loads tokenizer, model config and params of a pretraining workdir.

  With `encoder_only` (fine-tuning), only `token_embed` and `encoder` are read:
  the MAE-LM/3ML decoder and the LM head are neither needed nor loaded.
  """
  config_path = os.path.join(workdir, "config.json")
  if not os.path.exists(config_path):
    raise FileNotFoundError(f"{config_path} not found: --config.init_from must be "
                            "the --workdir of a maelm_jax pretraining run")
  with open(config_path) as f:
    config = ml_collections.ConfigDict(json.load(f))
  tokenizer = tokenizer_lib.Tokenizer(os.path.join(workdir, "tokenizer.model"))
  model_cfg = model_lib.ModelConfig.from_config(config.model, tokenizer.vocab_size,
                                                tokenizer.mask_id)
  collections = model_lib.ENCODER_COLLECTIONS if encoder_only else None
  params, step = restore_params(workdir, step, collections)
  return Pretrained(params=params, model_cfg=model_cfg, tokenizer=tokenizer,
                    config=config, step=step)

"""Another run's parameters: a pretraining workdir read by fine-tuning, BLiMP, the
analysis, exports and `init_from` (the layout converted where it differs); this
run's own checkpoints are `checkpoints.py`.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from absl import logging
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from maelm_jax.core import storage, workdir as workdir_lib
from maelm_jax.data import tokenizer as tokenizer_lib
from maelm_jax.modeling import model as model_lib, param_layout
from maelm_jax.run import checkpoints


@dataclasses.dataclass
class Pretrained:
  """What a downstream run needs from a pretraining workdir."""

  params: Any  # {'token_embed', 'encoder'} (encoder_only) or the full tree.
  model_cfg: model_lib.ModelConfig
  tokenizer: tokenizer_lib.Tokenizer | tokenizer_lib.HFTokenizer
  config: ml_collections.ConfigDict  # The pretraining run's resolved config.
  step: int


def _params_metadata(workdir: str, step: int | None):
  """(step, path of its `state` item, the metadata tree of `state.params`),
  read from the checkpoint itself, whatever mesh or process count wrote it."""
  step = checkpoints.latest_step(workdir) if step is None else step
  if step is None:
    raise FileNotFoundError(
        f"no checkpoint in {checkpoints.checkpoint_dir(workdir)}; --config.init_from must name "
        "the workdir of a pretraining run that saved at least one checkpoint")
  path = os.path.join(checkpoints.checkpoint_dir(workdir), str(step), "state")
  metadata = ocp.PyTreeCheckpointer().metadata(path)
  tree = metadata.item_metadata.tree if hasattr(metadata, "item_metadata") else metadata.tree
  return step, path, tree["params"]


def saved_collections(workdir: str, step: int | None = None) -> list[str]:
  """Top-level names of the checkpoint's params (token_embed, encoder, ...)."""
  return sorted(_params_metadata(workdir, step)[2])


def saved_params_scanned(workdir: str, step: int | None = None) -> bool:
  """Whether the checkpoint stores its layers stacked (model.scan_layers)."""
  if checkpoints.latest_step(workdir) is None and step is None:
    return False  # restore_params names the problem.
  return param_layout.is_scanned(_params_metadata(workdir, step)[2])


def restore_params(workdir: str, step: int | None = None,
                   collections: tuple[str, ...] | None = None,
                   shardings: Any = None, expected: Any = None) -> tuple[Any, int]:
  """Restores `state.params` (optionally only some top-level collections).

  Reads the checkpoint's own metadata for the target tree, so it works whatever
  mesh or process count wrote it; arrays come back as numpy unless `shardings`
  (a tree matching the restored params) is given. With `expected` (a tree of
  shaped leaves) a checkpoint of another model raises `checkpoints.CheckpointMismatch` naming
  the first differences, before any array is read.
  """
  step, path, params_meta = _params_metadata(workdir, step)
  if collections is not None:
    missing = [c for c in collections if c not in params_meta]
    if missing:
      raise KeyError(f"checkpoint {path} has no {missing}; it has {sorted(params_meta)}")
    params_meta = {c: params_meta[c] for c in collections}
  if expected is not None:
    differences = checkpoints.tree_differences(params_meta, expected)
    if differences:
      raise checkpoints.CheckpointMismatch(
          f"{workdir} (step {step}) holds another model: " + "; ".join(differences)
          + ". Use a run of the same model (size, objective, decoder, vocabulary)")
  if shardings is None:
    return checkpoints.read_arrays(path, {"params": params_meta})["params"], step
  restore_args = jax.tree.map(lambda _, s: ocp.ArrayRestoreArgs(sharding=s),
                              params_meta, shardings)
  item = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), params_meta)
  restored = ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
      item={"params": item}, restore_args={"params": restore_args},
      partial_restore=True))
  return restored["params"], step


def check_pretraining_workdir(workdir: str, step: int | None = None) -> str:
  """The absolute path of a pretraining workdir that holds a config, a
  tokenizer and a committed checkpoint (of `step`, if given); otherwise a
  message naming what is missing, for tools that read one (--workdir)."""
  workdir = storage.absolute(workdir)
  for name, found in ((workdir_lib.CONFIG_FILE, workdir_lib.config_path(workdir)),
                      ("tokenizer.model (or tokenizer.json)",
                       tokenizer_lib.workdir_tokenizer_path(workdir))):
    if not os.path.isfile(found):
      raise FileNotFoundError(f"--workdir {workdir} has no {name}: pass the --workdir "
                              "of a maelm_jax pretraining run")
  steps = checkpoints.committed_steps(workdir)
  if not steps:
    raise FileNotFoundError(f"--workdir {workdir} has no checkpoint in "
                            f"{checkpoints.checkpoint_dir(workdir)}: pretrain it until it saves "
                            "one, or pass another workdir")
  if step is not None and step not in steps:
    raise ValueError(f"--workdir {workdir} has no checkpoint of --step={step}; it has "
                     f"steps {steps}")
  return workdir


def load_pretrained(workdir: str, *, encoder_only: bool = True,
                    step: int | None = None,
                    scan_layers: bool | None = None,
                    read_params: bool = True) -> Pretrained:
  """Loads tokenizer, model config and params of a pretraining workdir.

  With `encoder_only` (fine-tuning), only `token_embed` and `encoder` are read:
  the MAE-LM/3ML decoder and the LM head are neither needed nor loaded. With
  `scan_layers` (True/False) params and `model_cfg` come in that layer layout,
  whichever the run saved (None: as saved). Without `read_params`, `params` is
  None and `step` the checkpoint they would come from (`read_pretrained_params`).
  """
  saved = workdir_lib.read_config(workdir)
  if saved is None:
    raise FileNotFoundError(f"{workdir_lib.config_path(workdir)} not found: "
                            "--config.init_from must be the --workdir of a maelm_jax "
                            "pretraining run")
  config = ml_collections.ConfigDict(saved)
  tokenizer = tokenizer_lib.open_tokenizer(tokenizer_lib.workdir_tokenizer_path(workdir))
  model_cfg = model_lib.ModelConfig.from_config(config.model, tokenizer.vocab_size,
                                                tokenizer.mask_id)
  if scan_layers is not None:
    model_cfg = dataclasses.replace(model_cfg, scan_layers=scan_layers)
  pretrained = Pretrained(params=None, model_cfg=model_cfg, tokenizer=tokenizer,
                          config=config, step=step)
  if not read_params:
    pretrained.step = _params_metadata(workdir, step)[0]
    return pretrained
  return read_pretrained_params(workdir, pretrained, encoder_only=encoder_only)


def read_pretrained_params(workdir: str, pretrained: Pretrained, *,
                           encoder_only: bool = True) -> Pretrained:
  """Fills `pretrained.params` from its checkpoint (`pretrained.step`), in the
  layer layout of `pretrained.model_cfg`."""
  collections = model_lib.ENCODER_COLLECTIONS if encoder_only else None
  params, pretrained.step = restore_params(workdir, pretrained.step, collections)
  if pretrained.model_cfg.scan_layers != param_layout.is_scanned(params):
    params = param_layout.params_for(params, pretrained.model_cfg.scan_layers)
  pretrained.params = params
  return pretrained


def load_init_from(config, state, state_shardings):
  """Params of another run (`init_from`) in this run's sharding; fresh optimizer.

  A run without a decoder (MLM, an imported checkpoint) starts a MAE-LM / 3ML
  run's encoder and head; its decoder starts fresh."""
  scanned_here = param_layout.is_scanned(state.params)
  scanned_there = saved_params_scanned(config.init_from)
  saved = saved_collections(config.init_from)
  fresh = sorted(set(state.params) - set(saved))
  if fresh != ["decoder"]:
    fresh = []  # Anything else missing is a mismatch that restore_params names.
  names = tuple(c for c in state.params if c not in fresh)
  wanted = {c: state.params[c] for c in names}
  if scanned_there == scanned_here:
    params, step = restore_params(
        config.init_from, collections=names,
        shardings={c: state_shardings.params[c] for c in names}, expected=wanted)
  else:  # Read in the other layout (on the host), convert, place.
    expected = jax.eval_shape(lambda p: param_layout.params_for(p, scanned_there), wanted)
    params, step = restore_params(config.init_from, collections=names,
                                              expected=expected)
    params = jax.device_put(param_layout.params_for(params, scanned_here),
                            {c: state_shardings.params[c] for c in names})
  if fresh:
    logging.info("%s has no %s: it starts fresh", config.init_from, fresh)
  logging.info("initialised params from step %d of %s", step, config.init_from)
  return state.replace(params={**state.params, **params})

"""Keys added after workdirs were first written, and the one place their
defaults are stated.

A saved config.json without such a key means the value that does what runs did
before the key existed. `complete` fills them in, and every config a run or a
tool works with passes through it: a saved one as `core.workdir.read_config`
reads it, a new one in `run.config_lib.resolve` (pretraining) and
`finetune.run.run` (a config file written before a key existed). So code reads
every key one way, `config.key`, and `config_lib.config_differences` compares a
saved config with a new one key for key (old workdirs still resume).
`configs/*.py` state each key too, for the mode that has it (`ADDED_KEYS`).
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple


class SameAs(str):
  """An added key's default: the saved config's value of another key."""


PRETRAINING = ("pretrain",)
FINE_TUNING = ("glue", "squad")
EVERY_MODE = PRETRAINING + FINE_TUNING


class Added(NamedTuple):
  default: Any  # What runs did before the key existed.
  modes: tuple[str, ...]  # The runs whose configs have the key (config.mode).


ADDED_KEYS = {
    "model.relative_bias_init": Added("normal", PRETRAINING),
    "model.zero_init_residual": Added(False, PRETRAINING),
    "model.decoder_relative_position_bias": Added(False, PRETRAINING),
    "model.tie_embeddings": Added(True, PRETRAINING),
    "model.layer_norm_eps": Added(1e-5, PRETRAINING),
    "model.relative_bucket_fn": Added("t5", PRETRAINING),
    "model.untie_cls_position": Added(True, PRETRAINING),
    "model.position": Added("learned", PRETRAINING),
    "weight_decay_on": Added("matrices", PRETRAINING),
    "data.rows": Added("packed", PRETRAINING),
    "start_over": Added(False, EVERY_MODE),
    "dry_run": Added(False, PRETRAINING),
    "keep_final_checkpoint": Added(False, FINE_TUNING),
    "pooling": Added("cls", ("glue",)),
    "data.on_bad_text": Added("warn", PRETRAINING),
    "total_flops": Added(0.0, PRETRAINING),
    "warmup_ratio": Added(0.0, EVERY_MODE),
    "model.attention_impl": Added("auto", PRETRAINING),
    "model.remat_policy": Added("none", PRETRAINING),
    "model.scan_layers": Added(False, PRETRAINING),
    "attention_impl": Added("auto", FINE_TUNING),
    # The FFN's inner dropout was `dropout` before it had its own key.
    "model.activation_dropout": Added(SameAs("model.dropout"), PRETRAINING),
    "activation_dropout": Added(SameAs("dropout"), FINE_TUNING),
    "model.mask_ratio_start": Added(0.0, PRETRAINING),  # A constant mask rate.
    "model.mask_ratio_stages": Added(4, PRETRAINING),
    "model.mlp_activation": Added("gelu", PRETRAINING),
    "model.normformer": Added(False, PRETRAINING),
    "layer_decay": Added(1.0, EVERY_MODE),  # Layer-wise learning-rate decay: off.
    "relative_updates": Added(False, EVERY_MODE),  # LAMB-style relative updates: off.
    "lr_schedule_segments": Added((), PRETRAINING),
    "compilation_cache_dir": Added("auto", EVERY_MODE),  # run/compilation_cache.py
    "profile_steps": Added("", PRETRAINING),  # No trace.
    "wandb_project": Added("", EVERY_MODE),  # No W&B logging (run/wandb_writer.py).
    "wandb_entity": Added("", EVERY_MODE),
    "max_runtime": Added("", EVERY_MODE),  # No wall-clock limit (run/preemption.py).
}


def complete(saved: dict) -> dict:
  """A copy of config `saved` (nested dicts, as config.json holds it) with every
  added key of its mode that it lacks, at the value that does what its run did
  before the key existed. A config without `mode` is a pretraining one (written
  before fine-tuning shared the workdir format), and says so after."""
  out = copy.deepcopy(saved)
  mode = out.setdefault("mode", "pretrain")
  for key, added in ADDED_KEYS.items():
    parent, _, name = key.rpartition(".")
    node = _at(out, parent) if parent else out
    if mode not in added.modes or not isinstance(node, dict) or name in node:
      continue
    default = added.default
    if isinstance(default, SameAs):
      default = _at(out, default)
      if default is _MISSING:  # A partial config: what it did is unknown.
        continue
    node[name] = default
  return out


_MISSING = object()


def _at(config: dict, key: str):
  for part in key.split("."):
    if not isinstance(config, dict) or part not in config:
      return _MISSING
    config = config[part]
  return config

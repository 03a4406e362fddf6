"""Keys added after workdirs were first written, and the one place their
defaults are stated.

A saved config.json without such a key means the value that does what runs did
before the key existed (`ADDED_KEYS`): `config_lib.with_added_keys` fills them in
when a saved config is compared with a new one (so old workdirs still resume),
and `get` reads them from a config that may lack them (an old run's, read back by
`pretrained.load_pretrained`, `analyze`, ...). Nothing else spells these defaults.
"""

from __future__ import annotations

from typing import Any


class SameAs(str):
  """An ADDED_KEYS value: the saved config's value of another key."""


# Keys added after workdirs were first written, each with the value that does
# what runs did before the key existed: a saved config.json without the key is
# equal to a config with that value (so old workdirs still resume).
ADDED_KEYS = {
    "model.relative_bias_init": "normal",
    "model.zero_init_residual": False,
    "model.decoder_relative_position_bias": False,
    "model.tie_embeddings": True,
    "model.layer_norm_eps": 1e-5,
    "model.relative_bucket_fn": "t5",
    "model.untie_cls_position": True,
    "weight_decay_on": "matrices",
    "data.rows": "packed",
    "start_over": False,
    "dry_run": False,
    "keep_final_checkpoint": False,
    "pooling": "cls",
    "data.on_bad_text": "warn",
    "total_flops": 0.0,
    "warmup_ratio": 0.0,
    "model.attention_impl": "auto",
    "model.remat_policy": "none",
    "model.scan_layers": False,
    "attention_impl": "auto",
    # The FFN's inner dropout was `dropout` before it had its own key.
    "model.activation_dropout": SameAs("model.dropout"),
    "activation_dropout": SameAs("dropout"),
    "model.mask_ratio_start": 0.0,  # A constant mask rate.
    "model.mask_ratio_stages": 4,
    "model.mlp_activation": "gelu",
    "model.normformer": False,
    "layer_decay": 1.0,  # Fine-tuning's layer-wise learning-rate decay: off.
    "relative_updates": False,  # Fine-tuning's LAMB-style relative updates: off.
    "lr_schedule_segments": (),
    "compilation_cache_dir": "auto",  # run/compilation_cache.py
    "profile_steps": "",  # No trace.
    "wandb_project": "",  # No W&B logging (run/wandb_writer.py).
    "wandb_entity": "",
    "max_runtime": "",  # No wall-clock limit (run/preemption.py).
}


def get(config, key: str, within: str = "") -> Any:
  """`config`'s value at dotted `key`, or the ADDED_KEYS default when it lacks it.

  `within` names where `config` sits in a whole run config ("model" for its
  `model` part), so that `get(model_cfg, "tie_embeddings", within="model")`
  reads `model.tie_embeddings`.
  """
  node = config
  *parents, name = key.split(".")
  for part in parents:
    node = node[part]
  if name in node:
    return node[name]
  full = f"{within}.{key}" if within else key
  default = ADDED_KEYS[full]  # KeyError: not an added key (a required one).
  if isinstance(default, SameAs):
    assert default.startswith(within), (default, within)
    return get(config, default[len(within) + 1:] if within else default, within)
  return default

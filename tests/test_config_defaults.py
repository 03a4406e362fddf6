"""Keys added after workdirs were first written (core/config_defaults.py): every
config a run reads has them, at the value that does what its run did."""

import json

import ml_collections
import pytest

from maelm_jax.core import config_defaults, workdir as workdir_lib
from maelm_jax.modeling import model as model_lib
from maelm_jax.run import config_lib

MODES = ("pretrain", "glue", "squad")


def packaged(mode):
  arg = {"pretrain": "objective=maelm,size=tiny", "glue": "task=sst2", "squad": ""}[mode]
  return config_lib.load_config_module(f"maelm_jax/configs/{mode}.py").get_config(arg)


def has(config: dict, key: str) -> bool:
  node = config
  for part in key.split("."):
    if not isinstance(node, dict) or part not in node:
      return False
    node = node[part]
  return True


def without_added_keys(config: dict) -> dict:
  """`config` as a config.json written before every added key."""
  old = json.loads(json.dumps(config))
  for key in config_defaults.ADDED_KEYS:
    *parents, name = key.split(".")
    node = old
    for part in parents:
      node = node.get(part, {})
    node.pop(name, None)
  return old


@pytest.mark.parametrize("mode", MODES)
def test_each_added_key_is_in_the_configs_of_its_modes_and_no_others(mode):
  config = packaged(mode).to_dict()
  wrong = [k for k, added in config_defaults.ADDED_KEYS.items()
           if has(config, k) != (mode in added.modes)]
  assert wrong == [], f"configs/{mode}.py and ADDED_KEYS disagree on {wrong}"


@pytest.mark.parametrize("mode", MODES)
def test_a_config_from_before_every_added_key_reads_back_as_its_run_ran(mode):
  now = json.loads(json.dumps(packaged(mode).to_dict()))
  old = without_added_keys(now)
  completed = config_defaults.complete(old)
  for key, added in config_defaults.ADDED_KEYS.items():
    assert has(completed, key) == (mode in added.modes), key
  assert old == without_added_keys(now)  # The argument is left as it was.
  # Each added key at what runs did before it existed (the FFN's dropout was the
  # model's dropout), everything else as saved.
  for key, added in config_defaults.ADDED_KEYS.items():
    if mode in added.modes:
      default = added.default
      if isinstance(default, config_defaults.SameAs):
        default = _at(now, default)
      assert _at(completed, key) == default, key
  assert without_added_keys(completed) == old
  assert config_defaults.complete(now) == now  # Nothing to add: unchanged.


def _at(config, key):
  for part in key.split("."):
    config = config[part]
  return config


def test_a_saved_config_is_read_back_completed_and_builds_its_model(tmp_path):
  """An old run's config.json as `workdir.read_config` reads it for
  init_from, export, analysis and resume: the model it describes is built."""
  old = without_added_keys(packaged("pretrain").to_dict())
  old.pop("mode")  # Written before fine-tuning shared the format.
  old["model"].update(dropout=0.1, decoder_layers=1)  # The objective's own keys.
  (tmp_path / "config.json").write_text(json.dumps(old))
  saved = workdir_lib.read_config(str(tmp_path))
  assert saved["mode"] == "pretrain" and saved["model"]["activation_dropout"] == 0.1
  # It resumes under today's config of the same run (it was refused: mode None ->
  # 'pretrain').
  now = packaged("pretrain").to_dict()
  now["model"].update(dropout=0.1, decoder_layers=1, activation_dropout=0.1)
  assert [d for d in config_lib.config_differences(old, now)
          if d.split(":")[0] not in config_defaults.ADDED_KEYS] == []
  assert saved["lr_schedule_segments"] == () and "pooling" not in saved
  cfg = model_lib.ModelConfig.from_config(ml_collections.ConfigDict(saved["model"]),
                                          vocab_size=600, mask_id=4)
  assert (cfg.activation_dropout, cfg.tie_embeddings, cfg.relative_bucket_fn,
          cfg.scan_layers) == (0.1, True, "t5", False)
  assert workdir_lib.read_config(str(tmp_path / "none")) is None

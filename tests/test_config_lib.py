"""The overrides scripts take as the product's command line does (studies,
benchmarks: `config_lib.split_overrides` and `typed_set`) and a config file's
argument (`parse_arg`): each value typed like the one it replaces, each mistake
named in one line."""

import pytest

from maelm_jax.configs import pretrain
from maelm_jax.run import config_lib


def test_overrides_are_split_from_the_scripts_own_flags():
  rest, overrides = config_lib.split_overrides(
      ["--steps=600", "--config.seed=1", "--config.model.position=learned", "x"])
  assert rest == ["--steps=600", "x"]
  assert overrides == [("seed", "1"), ("model.position", "learned")]
  with pytest.raises(ValueError, match=r"--config.seed: write --config.KEY=VALUE"):
    config_lib.split_overrides(["--config.seed"])


def test_each_value_is_typed_like_the_one_it_replaces():
  config = pretrain.get_config("objective=mlm,size=tiny")
  config.unlock()
  config_lib.typed_set(config, "seed", "3")
  config_lib.typed_set(config, "learning_rate", "1e-3")
  config_lib.typed_set(config, "model.relative_position_bias", "True")
  config_lib.typed_set(config, "model.scan_layers", "0")
  config_lib.typed_set(config, "model.position", "learned")
  config_lib.typed_set(config, "mesh_shape", "(1, 4, 1)")
  config_lib.typed_set(config, "model.mask_ratio", "0.3")  # A None placeholder.
  config_lib.typed_set(config, "model.decoder_type", "cross")  # A str placeholder.
  assert config.seed == 3 and isinstance(config.seed, int)
  assert config.learning_rate == 1e-3 and isinstance(config.learning_rate, float)
  assert config.model.relative_position_bias is True and config.model.scan_layers is False
  assert config.model.position == "learned" and config.mesh_shape == (1, 4, 1)
  assert config.model.mask_ratio == 0.3 and config.model.decoder_type == "cross"


@pytest.mark.parametrize("key,text,error,message", [
    ("model.scan_layer", "True", KeyError, r"--config.model.scan_layer: no such config key"),
    ("modle.scan_layers", "True", KeyError, r"no such config key \('modle'\)"),
    ("model.scan_layers", "maybe", ValueError,
     r"--config.model.scan_layers=maybe: expected True or False"),
    ("seed", "one", ValueError, r"invalid literal"),
])
def test_a_mistyped_override_is_named(key, text, error, message):
  config = pretrain.get_config("objective=mlm,size=tiny")
  config.unlock()
  with pytest.raises(error, match=message):
    config_lib.typed_set(config, key, text)


def test_a_config_argument_is_typed_and_its_mistakes_named():
  arg = config_lib.parse_arg("size=base,tflops=2,random=1", size="tiny", tflops=20.0,
                             random=False)
  assert (arg.size, arg.tflops, arg.random) == ("base", 2.0, True)
  with pytest.raises(ValueError, match=r"config argument 'base' is not key=value; "
                     r"known keys: \['random', 'size'\]"):
    config_lib.parse_arg("base", size="tiny", random=False)
  with pytest.raises(ValueError, match=r"unknown config argument 'sise'"):
    config_lib.parse_arg("sise=base", size="tiny")
  with pytest.raises(ValueError, match=r"size='huge' is unknown; use one of"):
    config_lib.parse_arg("size=huge", size="tiny")

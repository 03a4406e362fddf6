"""JAX's persistent compilation cache is on by default (run/compilation_cache.py):
where it goes, how to move or turn it off, and that a compile lands in it."""

import os

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache
import jax.numpy as jnp
import pytest

from maelm_jax.run import compilation_cache
from tests.helpers import tiny_config


@pytest.fixture
def restored_cache_dir():
  """The session's cache directory (conftest.py) again after the test."""
  before = jax.config.jax_compilation_cache_dir
  yield
  jax.config.update("jax_compilation_cache_dir", before)
  jax_cache.reset_cache()


def test_auto_is_the_environment_variable_else_the_user_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "from_env"))
  assert compilation_cache.directory("auto") == str(tmp_path / "from_env")
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compilation_cache.directory("auto") == str(tmp_path / "xdg" / "maelm_jax" / "jax")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compilation_cache.directory("auto") == str(
      tmp_path / "home" / ".cache" / "maelm_jax" / "jax")
  assert compilation_cache.directory("~/jax") == str(tmp_path / "home" / "jax")
  assert compilation_cache.directory("gs://bucket/jax") == "gs://bucket/jax"
  assert compilation_cache.directory("") is None


def test_a_compile_lands_in_the_configured_directory(tmp_path, restored_cache_dir):
  # The process has compiled before (here, into the session's cache), as a
  # notebook or a second run in one Python has: JAX has opened its cache.
  jax.jit(lambda x: x * 1.5 - 0.25)(jnp.ones((3,))).block_until_ready()
  config = tiny_config(compilation_cache_dir=str(tmp_path / "cache"))
  assert compilation_cache.configure(config) == str(tmp_path / "cache")
  # A program no other test compiles: it is written, not found.
  jax.jit(lambda x: jnp.tanh(x) * 3.25 + x.sum())(jnp.ones((7, 5))).block_until_ready()
  assert [n for n in os.listdir(tmp_path / "cache") if n.endswith("-cache")]


def test_off_and_unwritable_compile_as_before(tmp_path, restored_cache_dir):
  assert compilation_cache.configure(tiny_config(compilation_cache_dir="")) is None
  assert jax.config.jax_compilation_cache_dir is None
  blocked = tmp_path / "file"
  blocked.write_text("not a directory")
  config = tiny_config(compilation_cache_dir=str(blocked / "cache"))
  assert compilation_cache.configure(config) is None

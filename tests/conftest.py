"""Test set-up: 8 fake CPU devices, set before JAX initialises."""

import importlib.util
import os

# Where libtpu is installed (the test extras have it, for the planner) and no
# CUDA plugin is, the CPU: jax would otherwise look for a local TPU first, and
# warn. A GPU machine keeps its GPU for the tests that use one.
if (importlib.util.find_spec("libtpu") is not None
    and not any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# One persistent compilation cache for the whole session: the controller makes
# the directory before xdist starts its workers, which inherit the variables, as
# does every run a test starts as a subprocess (most compile the same tiny
# steps). Everything is cached, however quick to compile. Removed at the end.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  import tempfile  # noqa: E402
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="maelm-test-jax-cache-")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pathlib  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data():
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared evaluation data not found at {SHARED_DATA}")
  return SHARED_DATA


def pytest_unconfigure(config):
  """The controller (not an xdist worker) removes the cache it made."""
  if _OWN_CACHE and not hasattr(config, "workerinput"):
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

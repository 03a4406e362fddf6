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

import pathlib  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data():
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared evaluation data not found at {SHARED_DATA}")
  return SHARED_DATA

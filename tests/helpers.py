"""Small builders shared by tests."""

import fcntl
import functools
import os
import pathlib
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
import pretrain  # noqa: E402

from maelm_jax.modeling import masking  # noqa: E402
from maelm_jax.run import config_lib  # noqa: E402


def xla_flags(devices: int) -> str:
  """XLA_FLAGS of a run a test starts on `devices` CPU devices, compiled as the
  test process's runs compile: conftest.py's flags (LLVM at -O1, the older fusion
  emitters, or what an `optimized` test set) with only the device count changed."""
  kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
          if not f.startswith("--xla_force_host_platform_device_count")]
  return " ".join([f"--xla_force_host_platform_device_count={devices}", *kept])


def with_sigint_default(cmd: list[str]) -> list[str]:
  """`cmd` started as from a terminal, with SIGINT at its default: a test worker
  may ignore SIGINT, a child inherits that, and neither Python nor bash can then
  hear a Ctrl-C (bash cannot even trap a signal ignored on entry). A small Python
  resets it and execs `cmd`, so the test process, which runs JAX's threads, is
  never forked to run Python in the child (`preexec_fn`; JAX warns that a fork
  of a threaded process can deadlock)."""
  return [sys.executable, "-c", "import os, signal, sys; "
          "signal.signal(signal.SIGINT, signal.SIG_DFL); "
          "os.execvp(sys.argv[1], sys.argv[1:])", *map(str, cmd)]


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


def built_once(tmp_path_factory, name, build):
  """`tmp/<name>`, built by `build(path)` once per test session and shared by
  every pytest-xdist worker: the first to ask builds it under a file lock, the
  others wait for it and reuse it (a session fixture alone is built once per
  worker). A build that failed is retried by the next to ask."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # The session's directory above the workers' own.
  path = root / name
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (root / f"{name}.built").exists():
      shutil.rmtree(path, ignore_errors=True)
      path.mkdir()
      build(path)
      (root / f"{name}.built").touch()
  return path


def draw_masks(cfg, ids, vocab_size, seed=1, mask_id=4, counts=None):
  """`masking.draw_masks` of `ids` for the model `cfg` (or at the given `counts`),
  as one jitted program: run op by op it compiles each operation on its own
  (seconds on the CPU)."""
  counts = cfg.mask_counts(ids.shape[1]) if counts is None else counts
  return jax.jit(lambda rng, x: masking.draw_masks(rng, x, counts, mask_id=mask_id,
                                                   vocab_size=vocab_size))(
      jax.random.PRNGKey(seed), jnp.asarray(ids))


def apply(module, variables, *args, **kwargs):
  """`module.apply(variables, *args, **kwargs)` as one jitted program: a forward
  run op by op compiles each of its operations on its own, a few hundred for the
  tiny model (tens of seconds on the CPU; MAELM_TEST_COMPILE_LOG in conftest
  counts them). Keyword arguments (`method`, `rngs`, flags) are closed over."""
  return jax.jit(functools.partial(module.apply, **kwargs))(variables, *args)

"""JAX's persistent compilation cache, on by default: a run started again (a
resume, a preempted job, the same command twice) loads its compiled steps from
disk instead of compiling them again.

`config.compilation_cache_dir`:
  "auto" (default)  $JAX_COMPILATION_CACHE_DIR when set, else
                    $XDG_CACHE_HOME/maelm_jax/jax (~/.cache/maelm_jax/jax)
  a path            that directory (a `gs://` bucket path too, which JAX reads
                    and writes itself)
  ""                off

Entries are keyed by the program, the compiler's flags, the devices and the
jax/jaxlib versions, so one directory serves any mix of runs; a stale entry is
never used, only left on disk. JAX caches only programs that took at least
`jax_persistent_cache_min_compile_time_secs` (1 s by default; the tests set 0)
to compile.
"""

from __future__ import annotations

import os

from absl import logging
import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache


AUTO = "auto"


def directory(setting: str) -> str | None:
  """The cache directory `setting` (config.compilation_cache_dir) names, or None."""
  if not setting:
    return None
  if setting != AUTO:
    return setting if setting.startswith("gs://") else os.path.expanduser(setting)
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return os.environ["JAX_COMPILATION_CACHE_DIR"]
  cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
  return os.path.join(cache_home, "maelm_jax", "jax")


def configure(config) -> str | None:
  """Points JAX's persistent cache at the config's directory (or turns it off)
  before the run compiles anything; returns the directory."""
  path = directory(config.compilation_cache_dir)
  if path is None:
    if jax.config.jax_compilation_cache_dir:
      _point_at(None)
    logging.info("compilation cache: off (compilation_cache_dir='')")
    return None
  if not path.startswith("gs://"):
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as error:  # A read-only home: compile as before.
      logging.warning("compilation cache: off, %s cannot be created (%s); set "
                      "--config.compilation_cache_dir to a writable directory",
                      path, error.strerror)
      return None
  _point_at(path)
  logging.info("compilation cache: %s (a restart reuses compiled steps; "
               "--config.compilation_cache_dir='' turns it off)", path)
  return path


def _point_at(path: str | None) -> None:
  """JAX opens its cache once, at the process's first compile, and keeps that
  directory: a run started in a process that has compiled before (a notebook,
  a second run in one Python) would write to the old one without the reset."""
  if jax.config.jax_compilation_cache_dir != path:
    jax.config.update("jax_compilation_cache_dir", path)
    jax_cache.reset_cache()

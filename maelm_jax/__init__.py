"""maelm-jax: MLM, MAE-LM and 3ML pretraining and fine-tuning of text encoders.

The package in layers, each importing only from the layers under it (the
import-linter contract in `.importlinter`, checked by tests/test_layers.py):

  main, compare, sweep, plan    the commands: pretrain or fine-tune, the papers'
                                comparison, sweeps, a TPU plan before launch
  interop/, tools/              Hugging Face and fairseq; fault injection, profiles
  evaluate/, finetune/          BLiMP and representation analysis; GLUE and SQuAD
  run/                          a run's lifecycle: train loop, step, checkpoints,
                                preemption, processes, metrics, config resolution
  modeling/ | data/             the model and the FLOP model | corpora, tokenizer,
                                input pipeline (neither imports the other)
  core/                         errors, the workdir's files, the mesh, old-config
                                defaults, the special-token layout

Modules that used to sit flat in this folder (`maelm_jax.train`, `maelm_jax.blimp`,
...) still import, and run with `python -m`, under their old names for this
release, with a DeprecationWarning (CHANGELOG.md): `_MOVED` maps each to its new
home, and both names are one module object (a patch through either is seen by
both).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_MOVED = {
    "errors": "core", "workdir": "core", "sharding": "core", "config_defaults": "core",
    "sources": "data", "prepared": "data", "prepare_data": "data", "pipeline": "data",
    "tokenizer": "data", "corpus_report": "data",
    "model": "modeling", "attention": "modeling", "relative_position": "modeling",
    "param_layout": "modeling", "masking": "modeling", "flops": "modeling",
    "train": "run", "train_lib": "run", "run_session": "run", "checkpoints": "run",
    "preemption": "run", "host_memory": "run", "distributed": "run",
    "metric_writers": "run", "config_lib": "run", "baselines": "run", "plots": "run",
    "blimp": "evaluate", "analyze": "evaluate",
    "export_hf": "interop", "import_hf": "interop", "import_fairseq": "interop",
    "hf_modeling": "interop",
    "chaos": "tools", "profiling": "tools", "hlo_stats": "tools",
}


def new_name(old: str) -> str | None:
  """'maelm_jax.train' -> 'maelm_jax.run.train' (submodules of a moved package
  too); None for a name that did not move."""
  parts = old.split(".")
  if len(parts) < 2 or parts[0] != __name__ or parts[1] not in _MOVED:
    return None
  return ".".join([__name__, _MOVED[parts[1]], *parts[1:]])


def _moved_message(old: str, new: str) -> str:
  return f"{old} is now {new}; the old name goes in the next release"


class _Alias(importlib.abc.Loader):
  """Loads an old name as the module of its new name (one object, two names);
  `python -m <old name>` runs the new module's code. Either says the new name."""

  def __init__(self, target: str):
    self.target = target

  def create_module(self, spec):
    # stacklevel 2: warnings skips the import machinery's frames, so the warning
    # names the code that imports the old name (pytest.ini's error filters for
    # maelm_jax and tests catch a stale name in the project's own code).
    warnings.warn(_moved_message(spec.name, self.target), DeprecationWarning,
                  stacklevel=2)
    return importlib.import_module(self.target)

  def exec_module(self, module):
    pass  # Already executed under its new name.

  def _spec(self):
    return importlib.util.find_spec(self.target)

  def get_code(self, fullname):  # For runpy (`python -m`): a line a user sees.
    sys.stderr.write(f"note: python -m {_moved_message(fullname, self.target)}\n")
    return self._spec().loader.get_code(self.target)

  def is_package(self, fullname):
    del fullname
    return self._spec().submodule_search_locations is not None


class _MovedFinder(importlib.abc.MetaPathFinder):

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    new = new_name(fullname)
    if new is None:
      return None
    real = importlib.util.find_spec(new)
    if real is None:
      return None
    spec = importlib.util.spec_from_loader(
        fullname, _Alias(new), origin=real.origin,
        is_package=real.submodule_search_locations is not None)
    if real.submodule_search_locations is not None:
      spec.submodule_search_locations = list(real.submodule_search_locations)
    return spec


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
  sys.meta_path.insert(0, _MovedFinder())

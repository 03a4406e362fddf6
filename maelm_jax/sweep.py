r"""Pretraining sweeps declared in config files, run one after another or launched.

  python -m maelm_jax.sweep --config=configs/compare.py:size=tiny,tflops=30 \
      --sweep_dir=runs/compare/pretrain --config.data.source='text:/data/*.txt'
  python -m maelm_jax.sweep --config=configs/compare.py --sweep_dir=/mnt/shared/cmp \
      --launch=tpu_pod         # prints one launch command per run, runs nothing

A sweep config is a pretraining config file (`get_config(arg)`, the base of every
run) that also defines `get_sweep(arg)`: a list of runs, each a dict with a
`name` (its workdir under --sweep_dir) and the `a.b` config keys it sets, e.g.

  def get_sweep(arg=None):
    return [{"name": f"{o}_seed{s}", "model.objective": o, "seed": s,
             "total_flops": 3e13} for o in ("mlm", "maelm") for s in (0, 1)]

`total_flops` (configs/pretrain.py) turns a compute budget into each run's step
count, so objectives are compared at equal FLOPs without hand arithmetic.
`--config.x=...` overrides apply to every run (a key the sweep sets per run is
refused: change it in the file).

Each run is `python -m maelm_jax.main --config=<file>:<arg> --workdir=<dir>
<overrides>`, the exact command `--launch` prints. Before anything runs, every
existing run directory is checked: one made with another config stops the sweep
(naming it), one already finished with this config is skipped, one stopped
midway resumes. Ctrl-C saves the running run and stops the sweep; the same
command resumes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from typing import Any

from absl import flags, logging
from ml_collections import config_flags

from maelm_jax.run import checkpoints, config_lib
from maelm_jax.core import cli, storage, workdir as workdir_lib

LAUNCHERS = ("local", "tpu_pod", "slurm")


def expand(config_file: str, overrides: dict[str, Any]) -> list[dict]:
  """The runs of a sweep config: [{name, sets, config (resolved)}].

  `overrides` (flattened `a.b` keys, e.g. from the command line) apply to every
  run; `sets` are the run's own keys from `get_sweep`.
  """
  module = config_lib.load_config_module(config_file)
  arg = config_file.split(":", 1)[1] if ":" in config_file else None
  if not hasattr(module, "get_sweep"):
    raise ValueError(f"{config_file.split(':')[0]} defines no get_sweep(arg); a sweep "
                     "config returns its runs from it (see maelm_jax/sweep.py)")
  runs, names = [], set()
  for entry in module.get_sweep(arg):
    entry = dict(entry)
    name = entry.pop("name", None)
    if not name or "/" in name or name in names:
      raise ValueError(f"sweep run {name!r}: every run needs a unique `name` "
                       "without '/' (its workdir)")
    names.add(name)
    clash = sorted(set(entry) & set(overrides))
    if clash:
      raise ValueError(f"--config.{clash[0]} is set per run by the sweep ({name}: "
                       f"{entry[clash[0]]!r}); change it in the sweep config instead")
    config = module.get_config(arg)
    config.unlock()
    for key, value in {**overrides, **entry}.items():
      try:
        config_lib.set_path(config, key, value)
      except (AttributeError, KeyError) as error:
        raise ValueError(f"sweep run {name}: the config has no key {key!r}") from error
    runs.append({"name": name, "sets": entry, "config": config_lib.resolve(config)})
  if not runs:
    raise ValueError(f"{config_file}: get_sweep returned no runs")
  return runs


def _flag(key: str, value) -> str:
  if isinstance(value, (list, tuple)):
    value = "(" + ",".join(str(v) for v in value) + ",)"
  return f"--config.{key}={value}"


def main_args(config_file: str, workdir: str, overrides: dict, sets: dict) -> list[str]:
  """The arguments of `maelm_jax.main` for one run."""
  return ([f"--config={config_file}", f"--workdir={workdir}"]
          + [_flag(k, v) for k, v in {**overrides, **sets}.items()])


def launch_commands(runs, config_file: str, sweep_dir: str, overrides: dict,
                    launcher: str) -> list[str]:
  """One shell command per run for launch/local.sh, tpu_pod.sh or slurm_gpu.sbatch."""
  if launcher not in LAUNCHERS:
    raise ValueError(f"--launch={launcher!r}: use one of {LAUNCHERS}")
  storage.check_local(sweep_dir, "--sweep_dir")
  sweep_dir = os.path.abspath(sweep_dir)
  lines = []
  for index, run in enumerate(runs):
    args = shlex.join(main_args(config_file, os.path.join(sweep_dir, run["name"]),
                                overrides, run["sets"]))
    if launcher == "local":
      prefix = ("launch/local.sh --num_processes=${NUM_PROCESSES:-1} "
                "--devices_per_process=${DEVICES_PER_PROCESS:-1} --")
    elif launcher == "tpu_pod":  # Copy and install once; the runs go one by one.
      skip = " --skip_copy --skip_install" if index else ""
      prefix = f'launch/tpu_pod.sh --tpu="$TPU" --zone="$ZONE"{skip} --'
    else:
      prefix = "sbatch launch/slurm_gpu.sbatch --"
    lines.append(f"{prefix} {args}")
  return lines


def run_state(run: dict, workdir: str,
              resumable=config_lib.RESUMABLE_CHANGES) -> str:
  """"new", "finished", "resume at step N", or raises for another config's run
  (one that differs in a key other than `resumable`)."""
  saved = workdir_lib.read_config(workdir)
  if saved is None:
    return "new"
  differences = config_lib.config_differences(
      saved, json.loads(run["config"].to_json_best_effort()), resumable)
  if differences:
    raise ValueError(f"{workdir} holds a run of another config ("
                     + "; ".join(differences[:3]) + ")")
  step = checkpoints.latest_step(workdir)
  if step is None:
    return "new"
  return "finished" if step >= run["config"].total_steps else f"resume at step {step}"


def run_sweep(config_file: str, sweep_dir: str, overrides: dict) -> list[dict]:
  """Runs every run not finished yet; returns the runs with their `workdir`."""
  storage.check_local(sweep_dir, "--sweep_dir")
  runs = expand(config_file, overrides)
  stale, states = [], []
  for run in runs:
    run["workdir"] = os.path.join(os.path.abspath(sweep_dir), run["name"])
    try:
      states.append(run_state(run, run["workdir"]))
    except ValueError as error:
      stale.append(str(error))
  if stale:  # Before anything runs: their results would not be this sweep's.
    raise ValueError(f"{len(stale)} run(s) in {sweep_dir} were made with another "
                     "config:\n  " + "\n  ".join(stale[:3]) + "\nPass a new "
                     "--sweep_dir, or remove those runs.")
  for index, (run, state) in enumerate(zip(runs, states), start=1):
    steps = run["config"].total_steps
    flops = config_lib.train_flops_per_step(run["config"]) * steps
    logging.info("[%d/%d] %s: %s (%d steps, %.3g FLOPs)", index, len(runs),
                 run["name"], state, steps, flops)
    if state == "finished":
      continue
    cmd = [sys.executable, "-m", "maelm_jax.main",
           *main_args(config_file, run["workdir"], overrides, run["sets"])]
    done = subprocess.run(cmd)
    if done.returncode == 130:
      raise KeyboardInterrupt  # Saved by the run; the same command resumes.
    if done.returncode:
      raise RuntimeError(f"sweep run {run['name']} failed (exit {done.returncode}): "
                         f"{shlex.join(cmd)}")
  return runs


def _define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "A sweep config, e.g. "
                                  "configs/compare.py:size=tiny", lock_config=False)
  flags.DEFINE_string("sweep_dir", None, "One workdir per run goes here")
  flags.DEFINE_enum("launch", None, LAUNCHERS, "Print one launch command per run "
                    "instead of running them")
  flags.mark_flags_as_required(["config", "sweep_dir"])


def main() -> None:
  FLAGS = flags.FLAGS
  config_file = config_flags.get_config_filename(FLAGS["config"])
  overrides = config_flags.get_override_values(FLAGS["config"])
  if FLAGS.launch:
    runs = expand(config_file, overrides)
    print("\n".join(launch_commands(runs, config_file, FLAGS.sweep_dir, overrides,
                                    FLAGS.launch)))
    return
  run_sweep(config_file, FLAGS.sweep_dir, overrides)


# `python -m` and the maelm-sweep command (setup.py's console scripts).
console = cli.command(main, _define_flags, stopped="the running run saved; the same "
                      "command resumes the sweep")

if __name__ == "__main__":
  console()

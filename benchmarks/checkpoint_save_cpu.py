r"""What a checkpoint save costs on CPU devices, with orbax's replica-parallel
save (its default there) and without it (checkpoints.py turns it off on CPUs).

The tiny pretraining state (0.8 M parameters and Adam, 192 arrays) replicated
over 8 CPU devices, as the tests and a CPU run hold it. Each setting runs in a
fresh process, alternating, `--rounds` times; per process: the first save, then
two more, each timed from the call until orbax has written it.

  python benchmarks/checkpoint_save_cpu.py --rounds=3
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_integer("rounds", 3, "processes per setting, alternating")
flags.DEFINE_string("child", "", "internal: run one process's saves ('on' or 'off')")
FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(replica_parallel: bool) -> dict:
  sys.path.insert(0, REPO)
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  from maelm_jax.core import sharding  # pylint: disable=import-outside-toplevel
  from maelm_jax.modeling import model as model_lib  # pylint: disable=import-outside-toplevel
  from maelm_jax.run import checkpoints, train_lib  # pylint: disable=import-outside-toplevel
  from tests.helpers import tiny_config  # pylint: disable=import-outside-toplevel
  config = tiny_config("maelm", keep_checkpoints=2)
  cfg = model_lib.ModelConfig.from_config(config.model, 600, 4)
  tx = train_lib.make_optimizer(config)
  mesh = sharding.make_mesh((-1, 1, 1))
  state, _ = train_lib.create_sharded_state(cfg, 32, tx, mesh, 0)
  with tempfile.TemporaryDirectory() as workdir:
    manager = checkpoints.make_manager(workdir, config, item_names=("state",))
    if replica_parallel:  # Back to orbax's own default, after make_manager.
      ocp.type_handlers.register_type_handler(
          jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=True),
          override=True)
    seconds = []
    for step in (1, 2, 3):
      started = time.perf_counter()
      checkpoints.save(manager, step, state)
      manager.wait_until_finished()
      seconds.append(time.perf_counter() - started)
    manager.close()
  return {"devices": jax.device_count(), "first": seconds[0], "later": seconds[1:]}


def main(argv):
  del argv
  if FLAGS.child:
    print(json.dumps(child(FLAGS.child == "on")))
    return
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="8",
             XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_ENABLE_COMPILATION_CACHE="false")
  results = {"on": [], "off": []}
  for _ in range(FLAGS.rounds):
    for setting in ("on", "off"):
      out = subprocess.run([sys.executable, __file__, f"--child={setting}"], env=env,
                           capture_output=True, text=True, check=True)
      results[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
  print("replica-parallel | first save (median s) | later saves (median s) | processes")
  for setting, runs in results.items():
    first = statistics.median(r["first"] for r in runs)
    later = statistics.median(s for r in runs for s in r["later"])
    print(f"{setting:>16} | {first:21.2f} | {later:22.2f} | {len(runs)}")


if __name__ == "__main__":
  app.run(main)

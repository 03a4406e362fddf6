r"""Does saving checkpoints grow the process's memory? Saves a 10 MB state over
and over with the run's checkpoint manager (`checkpoints.make_manager`: async,
3 kept, checksums recorded) or with orbax's own (`--manager=orbax`, same
options), printing RSS every 50 saves (after waiting for the save to finish).

  python benchmarks/checkpoint_memory.py --saves=600 --dir=/tmp/ckloop
  python benchmarks/checkpoint_memory.py --saves=600 --dir=/tmp/ckloop --manager=orbax
  python benchmarks/checkpoint_memory.py --saves=600 --dir=/tmp/ckloop --with_iterator
  python benchmarks/checkpoint_memory.py --saves=600 --dir=/tmp/ckloop --leaves=150

With `--with_iterator` every save also holds a grain data iterator's state, as a
training run's saves do (`checkpoints.save`).
"""

import argparse
import pathlib
import shutil
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from maelm_jax import checkpoints  # noqa: E402


def rss_mb() -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--saves", type=int, default=600)
  parser.add_argument("--dir", default="/tmp/ckloop")
  parser.add_argument("--manager", choices=("maelm", "orbax"), default="maelm")
  parser.add_argument("--with_iterator", action="store_true")
  parser.add_argument("--leaves", type=int, default=1,
                      help="Arrays the 10 MB are split into (a tiny train state has ~150)")
  parser.add_argument("--recreate_every", type=int, default=0,
                      help="Close the manager and open a new one every N saves")
  parser.add_argument("--sync", action="store_true", help="Synchronous saves (orbax)")
  args = parser.parse_args()
  shutil.rmtree(args.dir, ignore_errors=True)
  values = np.random.rand(2_500_000).astype(np.float32)
  state = {f"w{i}": jnp.asarray(part)
           for i, part in enumerate(np.array_split(values, args.leaves))}
  state["step"] = jnp.asarray(0)
  items = ("state", "data") if args.with_iterator else ("state",)
  iterator = None
  if args.with_iterator:
    import grain  # pylint: disable=g-import-not-at-top
    iterator = iter(grain.MapDataset.range(1_000_000).shuffle(seed=0).to_iter_dataset())
  def make():
    if args.manager == "maelm":
      return checkpoints.make_manager(args.dir, ml_collections.ConfigDict(
          {"keep_checkpoints": 3, "checkpoint_keep_period": 0}), item_names=items)
    return ocp.CheckpointManager(args.dir, item_names=items,
                                 options=ocp.CheckpointManagerOptions(
                                     max_to_keep=3,
                                     enable_async_checkpointing=not args.sync,
                                     cleanup_tmp_directories=True))
  manager = make()
  for i in range(1, args.saves + 1):
    if iterator is not None:
      next(iterator)
      checkpoints.save(manager, i, state, iterator)
    else:
      manager.save(i, args=ocp.args.Composite(state=ocp.args.StandardSave(state)),
                   force=True)
    if args.recreate_every and i % args.recreate_every == 0:
      manager.wait_until_finished()
      manager.close()
      manager = make()
    if i % 50 == 0:
      manager.wait_until_finished()
      print(i, round(rss_mb(), 1), flush=True)
  manager.wait_until_finished()
  manager.close()


if __name__ == "__main__":
  main()

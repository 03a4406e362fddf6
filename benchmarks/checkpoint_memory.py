r"""Does saving checkpoints grow the process's memory? Saves a 10 MB state over
and over with the run's checkpoint manager (`checkpoints.make_manager`: async,
3 kept, checksums recorded) or with orbax's own (`--manager=orbax`, same
options), printing RSS every 50 saves (after waiting for the save to finish).

  python benchmarks/checkpoint_memory.py --saves=600 --dir=runs/ckloop
  python benchmarks/checkpoint_memory.py --saves=600 --dir=runs/ckloop --manager=orbax
  python benchmarks/checkpoint_memory.py --saves=600 --dir=runs/ckloop --with_iterator
  python benchmarks/checkpoint_memory.py --saves=600 --dir=runs/ckloop --leaves=150
  python benchmarks/checkpoint_memory.py --saves=160 --dir=runs/ckloop --leaves=150 \
      --manager=orbax --sync --malloc_trim [--no_ocdbt] [--tracemalloc]

With `--with_iterator` every save also holds a grain data iterator's state, as a
training run's saves do (`checkpoints.save`). `--malloc_trim` hands glibc's free
pages back before each reading (what stays is held, not fragmentation);
`--no_ocdbt` writes one TensorStore per array instead of OCDBT's shared files;
`--tracemalloc` prints where the Python heap grew between a third of the saves and
the end (slow: a few saves a second).
"""

import argparse
import gc
import os
import pathlib
import shutil
import sys
import tempfile
import tracemalloc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax.numpy as jnp  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from maelm_jax.run import checkpoints, host_memory  # noqa: E402


def rss_mb() -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--saves", type=int, default=600)
  parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ckloop"))
  parser.add_argument("--manager", choices=("maelm", "orbax"), default="maelm")
  parser.add_argument("--with_iterator", action="store_true")
  parser.add_argument("--leaves", type=int, default=1,
                      help="Arrays the 10 MB are split into (a tiny train state has ~150)")
  parser.add_argument("--recreate_every", type=int, default=0,
                      help="Close the manager and open a new one every N saves")
  parser.add_argument("--sync", action="store_true", help="Synchronous saves (orbax)")
  parser.add_argument("--no_ocdbt", action="store_true", help="orbax without OCDBT")
  parser.add_argument("--malloc_trim", action="store_true",
                      help="malloc_trim(0) before each RSS reading")
  parser.add_argument("--tracemalloc", action="store_true",
                      help="Print the Python heap's growth by allocation site")
  args = parser.parse_args()
  args.dir = os.path.abspath(args.dir)  # orbax's own manager takes absolute paths only.
  if args.no_ocdbt and (args.manager != "orbax" or args.with_iterator):
    sys.exit("--no_ocdbt needs --manager=orbax and no --with_iterator")
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
    registry = None
    if args.no_ocdbt:
      registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
      registry.add("state", ocp.args.StandardSave,
                   ocp.StandardCheckpointHandler(use_ocdbt=False))
    return ocp.CheckpointManager(args.dir, item_names=None if registry else items,
                                 handler_registry=registry,
                                 options=ocp.CheckpointManagerOptions(
                                     max_to_keep=3,
                                     enable_async_checkpointing=not args.sync,
                                     cleanup_tmp_directories=True))
  manager = make()
  heap_before = None
  if args.tracemalloc:
    tracemalloc.start(8)
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
    if args.tracemalloc and i == args.saves // 3:
      manager.wait_until_finished()
      gc.collect()
      heap_before = tracemalloc.take_snapshot()
    if i % 50 == 0 or i == args.saves:
      manager.wait_until_finished()
      if args.malloc_trim:
        host_memory.release_free_pages()
      heap = tracemalloc.get_traced_memory()[0] / 2**20 if args.tracemalloc else None
      print(i, round(rss_mb(), 1), *(() if heap is None else (f"heap {heap:.1f}",)),
            flush=True)
  manager.wait_until_finished()
  manager.close()
  if heap_before is not None:
    gc.collect()
    growth = tracemalloc.take_snapshot().compare_to(heap_before, "traceback")
    saves = args.saves - args.saves // 3
    for stat in growth[:5]:
      print(f"+{stat.size_diff / 1024:.0f} KB, {stat.count_diff / saves:+.0f} objects "
            f"per save, allocated at:")
      print("\n".join(stat.traceback.format()[-4:]))


if __name__ == "__main__":
  main()

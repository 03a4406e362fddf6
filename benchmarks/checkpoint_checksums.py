r"""What checkpoint checksums cost: recording them when a step is final and
verifying them on restore, at `base` size (params + AdamW moments), against the
save and the restore themselves.

  python benchmarks/checkpoint_checksums.py --size=base --dir=runs/ckpt_bench

A real train state of the size (`train_lib.create_sharded_state`, vocabulary
--vocab; every float array filled with random values, as a trained state has
no zeros to compress) is saved with the run's manager (`checkpoints.make_manager`: async,
checksums recorded by `wait_until_finished`), then restored the way a resume
does (`checkpoints.restore_newest_readable`, which verifies first). Each phase
is timed --repeats times into a fresh directory; medians are printed as JSON.
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "configs")]

import jax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import pretrain  # noqa: E402  (configs/pretrain.py)

from maelm_jax.run import checkpoints, config_lib, train_lib  # noqa: E402
from maelm_jax.modeling import model as model_lib  # noqa: E402
from maelm_jax.core import sharding  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--size", default="base")
  parser.add_argument("--vocab", type=int, default=32000)
  parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "ckpt_bench"))
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  config = config_lib.resolve(pretrain.get_config(f"objective=mlm,size={args.size}"))
  model_cfg = model_lib.ModelConfig.from_config(config.model, args.vocab, 4)
  mesh = sharding.make_mesh(config.mesh_shape)
  tx = train_lib.make_optimizer(config)
  state, _ = train_lib.create_sharded_state(model_cfg, config.seq_len, tx, mesh, 0)
  # A trained state has no zeros to compress (a fresh one's Adam moments are
  # all zero): every float leaf gets random values, as after training.
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
  state = jax.tree.unflatten(treedef, [
      jax.random.normal(k, x.shape, x.dtype).astype(x.dtype)
      if jax.numpy.issubdtype(x.dtype, jax.numpy.floating) and x.ndim else x
      for k, x in zip(keys, leaves)])
  abstract, _ = train_lib.abstract_sharded_state(model_cfg, config.seq_len, tx, mesh)
  times = {"save": [], "record_checksums": [], "verify_checksums": [],
           "restore_unverified": [], "size_check_only": []}
  nbytes = 0
  for repeat in range(args.repeats):
    workdir = pathlib.Path(args.dir) / f"run{repeat}"
    shutil.rmtree(workdir, ignore_errors=True)
    manager = checkpoints.make_manager(str(workdir), config, item_names=("state",))
    started = time.perf_counter()
    ocp.CheckpointManager.save(manager, 1, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state)))
    ocp.CheckpointManager.wait_until_finished(manager)  # Without the checksums.
    times["save"].append(time.perf_counter() - started)
    step_dir = os.path.join(checkpoints.checkpoint_dir(str(workdir)), "1")
    nbytes = sum(os.path.getsize(os.path.join(r, f))
                 for r, _, fs in os.walk(step_dir) for f in fs)
    os.sync()
    started = time.perf_counter()
    manager.wait_until_finished()  # Records the checksums of the final step.
    times["record_checksums"].append(time.perf_counter() - started)
    started = time.perf_counter()
    checkpoints.verify_checksums(step_dir)
    times["verify_checksums"].append(time.perf_counter() - started)
    started = time.perf_counter()
    checkpoints.verify_checksums(step_dir, full=False)
    times["size_check_only"].append(time.perf_counter() - started)
    started = time.perf_counter()
    restored = checkpoints._local_checkpointer().restore(  # pylint: disable=protected-access
        step_dir, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))).state
    jax.block_until_ready(restored)
    times["restore_unverified"].append(time.perf_counter() - started)
    manager.close()
    shutil.rmtree(workdir)
  result = {"size": args.size, "vocab": args.vocab, "checkpoint_mb": round(nbytes / 2**20),
            **{f"{k}_s": round(statistics.median(v), 2) for k, v in times.items()}}
  result["verify_vs_restore"] = round(
      result["verify_checksums_s"] / result["restore_unverified_s"], 2)
  print(json.dumps(result))


if __name__ == "__main__":
  main()

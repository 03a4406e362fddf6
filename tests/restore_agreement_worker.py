"""One process of `test_multiprocess.py::test_hosts_agree_on_the_step_they_restore`.

  python tests/restore_agreement_worker.py ADDRESS PROCESS_ID WORKDIR OUT_JSON

Two of these (4 CPU devices each) save steps 1, 2 and 3 of a state sharded over
all 8 devices, then restore with `checkpoints.restore_newest_readable` while
each host sees a different fault, as hosts with their own view of a network
filesystem (a stale cache, a partial copy) can:

  step 3: only process 1 fails to read its metadata;
  step 2: metadata reads everywhere, but the files of process 0's shards are
          zeroed: only process 0 fails, while reading its arrays;
  step 1: reads everywhere.

Both must restore step 1 (with step 1's values), and both bad steps must be
moved aside once, by process 0. A host deciding alone would restore step 3 or
2 on one side and hang or diverge on the other.
"""

import json
import os
import sys

os.environ["JAX_NUM_CPU_DEVICES"] = "4"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after the device count is set)

address, process_id, workdir, out_path = sys.argv[1:5]
process_id = int(process_id)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(address, 2, process_id)

import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from maelm_jax.run import checkpoints  # noqa: E402

mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def state_at(step):
  # Row r holds r + 100 * step plus noise below 0.5, so that the 256 KiB chunks
  # do not compress away and live in the data files, not inline in the index.
  noise = np.random.default_rng(step).random((8, 65536), np.float32) / 2
  values = np.arange(8, dtype=np.float32)[:, None] + 100 * step + noise
  return {"w": jax.make_array_from_callback(values.shape, rows, lambda i: values[i])}


config = ml_collections.ConfigDict({"keep_checkpoints": 3})
manager = checkpoints.make_manager(workdir, config, item_names=("state", "progress"))
for step in (1, 2, 3):
  manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state_at(step)),
      progress=ocp.args.JsonSave({"step": step})), force=True)
manager.wait_until_finished()

# The faults, each on one host only.
read_metadata = checkpoints._tree_metadata  # pylint: disable=protected-access


def faulty_metadata(path):
  if process_id == 1 and os.path.basename(os.path.dirname(path)) == "3":
    raise OSError(f"injected: process 1 cannot read {path}")
  return read_metadata(path)


checkpoints._tree_metadata = faulty_metadata  # pylint: disable=protected-access
# Step 2: the data files of process 0's shards zeroed (a corrupt file only one
# host reads: OCDBT keeps each process's chunks under ocdbt.process_<i>).
if process_id == 0:
  data_dir = os.path.join(checkpoints.checkpoint_dir(workdir), "2", "state",
                          "ocdbt.process_0", "d")
  for name in os.listdir(data_dir):
    path = os.path.join(data_dir, name)
    with open(path, "r+b") as f:
      f.write(bytes(os.path.getsize(path)))
multihost_utils.sync_global_devices("corrupted")

abstract = {"w": jax.ShapeDtypeStruct((8, 65536), np.float32, sharding=rows)}
state, progress, step = checkpoints.restore_newest_readable(
    manager, abstract, "progress", ocp.args.JsonRestore, "(test)")
local = {str(shard.index): int(np.floor(np.asarray(shard.data).min()))
         for shard in state["w"].addressable_shards}
with open(out_path, "w") as f:
  json.dump({"step": step, "progress": progress, "local_shards": local,
             "steps_left": sorted(manager.all_steps()),
             "listing": sorted(os.listdir(checkpoints.checkpoint_dir(workdir)))}, f)
manager.close()
jax.distributed.shutdown()

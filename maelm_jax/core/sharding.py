"""Device mesh ('data', 'fsdp', 'tensor') and the logical-axis rules.

Parameters and activations are annotated with logical names in `model.py`; the
table below maps them to mesh axes, as Flax lm1b and MaxText do. Changing the
parallelism of a run means changing `config.mesh_shape`, never the model.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

LOGICAL_AXIS_RULES = (
    # Parameters.
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("embed_out", "tensor"),
    ("kv", None),
    ("pos", None),
    ("rel_buckets", None),
    ("norm", None),
    ("layers", None),  # The stacked layer axis of scan_layers.
    # Activations.
    ("batch", BATCH_AXES),
    ("act_len", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
)


def resolve_mesh_shape(mesh_shape: Sequence[int], num_devices: int) -> tuple[int, ...]:
  """Fills in at most one -1 so that the product equals `num_devices`."""
  shape = [int(s) for s in mesh_shape]
  if len(shape) != len(MESH_AXES):
    raise ValueError(f"mesh_shape {tuple(shape)} must have {len(MESH_AXES)} entries "
                     f"for the axes {MESH_AXES}, e.g. --config.mesh_shape='(-1,1,1)'")
  if shape.count(-1) > 1:
    raise ValueError(f"mesh_shape {tuple(shape)} has more than one -1; "
                     "at most one axis can be inferred.")
  if any(s == 0 or s < -1 for s in shape):
    raise ValueError(f"mesh_shape {tuple(shape)} has a non-positive size.")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ValueError(f"mesh_shape {tuple(shape)}: {num_devices} devices are not "
                       f"divisible by {known}.")
    shape[shape.index(-1)] = num_devices // known
  if math.prod(shape) != num_devices:
    raise ValueError(f"mesh_shape {tuple(shape)} uses {math.prod(shape)} devices but "
                     f"{num_devices} are available; use -1 for one axis, e.g. "
                     f"(-1, {shape[1]}, {shape[2]}).")
  return tuple(shape)


def make_mesh(mesh_shape: Sequence[int], devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  # Auto axes: the partitioner propagates shardings from our annotations
  # (jax.make_mesh now defaults to Explicit axes, which this code does not use).
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # Fake CPU devices and odd shapes: plain order is fine.
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES, axis_types=(AxisType.Auto,) * len(shape))


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension over ('data', 'fsdp'); the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def global_batch(mesh: Mesh, local_batch: dict) -> dict:
  """This process's rows (a dict of numpy arrays) -> global arrays sharded by
  `batch_sharding`; every process passes its own contiguous block of rows."""
  rows = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(rows, v)
          for k, v in local_batch.items()}


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def fraction_replicated(tree, shardings, min_size: int = 2**16) -> float:
  """Fraction of the bytes of large arrays that are fully replicated.

  MaxText-style guard: on a mesh with fsdp or tensor > 1, anything big that ends up
  replicated is usually a missing annotation.
  """
  total = replicated_bytes = 0
  for leaf, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    size = math.prod(leaf.shape) * leaf.dtype.itemsize
    if size < min_size:
      continue
    total += size
    if sharding.is_fully_replicated:
      replicated_bytes += size
  return replicated_bytes / total if total else 0.0


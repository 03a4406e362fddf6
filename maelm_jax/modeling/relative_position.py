"""Relative position buckets: which row of the [buckets, heads] bias table a
(query, key) pair reads, and the table's "local" initialiser.

Two bucket functions, both bidirectional (half the buckets for keys before the
query, half after), exact for small offsets and log-spaced up to `max_distance`:

  * 't5' (default): T5's, floor of the log ratio, buckets 0..n-1 in two halves.
  * 'mae_lm': the MAE-LM / COCO-LM release's (fairseq
    `transformer_sentence_encoder.relative_position_bucket`): ceil of the log
    ratio with `max_distance - 1`, signed, then shifted so the smallest bucket of
    a `max_positions`-long sequence is 0 (64 buckets use rows 0..62).

`recipe=paper` uses the release's function with its 64 buckets; the `fast`
recipe keeps T5's 32 (what every measurement in benchmarks/ used).
"""

from __future__ import annotations

import functools
import math
import types

import jax
import jax.numpy as jnp
import numpy as np

BUCKET_FNS = ("t5", "mae_lm")
RELATIVE_BIAS_INITS = ("normal", "local")


def t5_bucket(relative_position: jax.Array, num_buckets: int,
              max_distance: int) -> jax.Array:
  """T5's bidirectional bucketing: exact for small offsets, log-spaced beyond."""
  num_buckets //= 2
  bucket = (relative_position > 0).astype(jnp.int32) * num_buckets
  distance = jnp.abs(relative_position)
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) / (
      math.log(max_distance / max_exact))
  large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(is_small, distance, large)


def _mae_lm_signed(relative_position, num_buckets: int, max_distance: int, xp):
  half = num_buckets // 2
  max_exact = half // 2
  distance = xp.abs(relative_position)
  # float32 as the release computes it (torch: n.float() / max_exact, then a
  # float32 log divided by a Python float).
  ratio = xp.log(xp.maximum(distance, 1).astype(np.float32) / np.float32(max_exact))
  large = max_exact + xp.ceil(
      ratio / np.float32(math.log((max_distance - 1) / max_exact))
      * np.float32(half - 1 - max_exact)).astype(np.int32)
  large = xp.minimum(large, half - 1)
  return xp.where(distance < max_exact, distance, large) * xp.sign(relative_position)


def mae_lm_bucket(relative_position: jax.Array, num_buckets: int, max_distance: int,
                  max_positions: int) -> jax.Array:
  """The release's buckets for key position - query position."""
  # The release subtracts the minimum over its max_positions x max_positions
  # table, i.e. the bucket of the farthest key to the left.
  shift = -int(_mae_lm_signed(np.array([-(max_positions - 1)]), num_buckets,
                              max_distance, np)[0])
  return (_mae_lm_signed(relative_position, num_buckets, max_distance, jnp)
          + shift).astype(jnp.int32)


def bucket(relative_position: jax.Array, cfg) -> jax.Array:
  """Buckets of `relative_position` (key - query) under `cfg`'s function."""
  if cfg.relative_bucket_fn == "mae_lm":
    return mae_lm_bucket(relative_position, cfg.relative_buckets,
                         cfg.relative_max_distance, cfg.max_positions)
  return t5_bucket(relative_position, cfg.relative_buckets, cfg.relative_max_distance)


def local_bias_init(cfg):
  """Initialiser of the [buckets, heads] table: bias = -slope_h * distance.

  ALiBi-like slopes, geometric from 1 (head 0: a neighbour at distance d gets
  e^-d of the weight of the token itself) down to 1/64 (the last head: nearly
  uniform). Distance is the smallest |offset| that falls into the bucket. With
  it, attention reads the neighbourhood from step 0, which is what a masked
  slot needs first; with N(0, 0.02) every offset looks alike until the table
  has learned otherwise, and a decoder that sees no neighbours can settle on
  the unigram guess before it does (studies/recipes-off-the-plateau.md).
  """
  num_buckets, max_distance = cfg.relative_buckets, cfg.relative_max_distance
  # Only offsets a sequence can hold: the release's function numbers its buckets
  # from the farthest offset of a max_positions-long sequence, so farther ones
  # would get negative bucket numbers (which numpy would wrap to the last rows).
  reach = min(max_distance, cfg.max_positions - 1)

  def init(key, shape, dtype=jnp.float32):
    del key
    # Computed only when the table is created, never in the forward pass.
    offsets, buckets = _buckets_within(reach, cfg.relative_bucket_fn, num_buckets,
                                       max_distance, cfg.max_positions)
    # Smallest |offset| per bucket (buckets no offset reaches get max_distance).
    distance = np.full((num_buckets,), float(max_distance), np.float32)
    np.minimum.at(distance, buckets, np.abs(offsets).astype(np.float32))
    heads = shape[1]
    slopes = 64.0 ** (-jnp.arange(heads) / max(heads - 1, 1))
    return (-distance[:, None] * slopes[None, :]).astype(dtype)
  return init


@functools.lru_cache(maxsize=None)
def _buckets_within(reach: int, bucket_fn: str, num_buckets: int, max_distance: int,
                    max_positions: int) -> tuple[np.ndarray, np.ndarray]:
  """(offsets -reach..reach, their buckets) as numpy, computed once a process
  (the table's init is traced more than once at a start) and as one jitted
  program: run op by op, its twenty operations were compiled one by one."""
  cfg = types.SimpleNamespace(relative_bucket_fn=bucket_fn, relative_buckets=num_buckets,
                              relative_max_distance=max_distance,
                              max_positions=max_positions)
  with jax.ensure_compile_time_eval():  # Constants, also under jit.
    offsets = jnp.arange(-reach, reach + 1)
    buckets = jax.jit(lambda o: bucket(o, cfg))(offsets)
  return np.asarray(offsets), np.asarray(buckets)


@jax.custom_vjp
def lookup(table: jax.Array, buckets: jax.Array) -> jax.Array:
  """`table[buckets]`: [R, H] rows at int [...] buckets -> [..., H].

  The same values as plain indexing; only the gradient is computed differently.
  Indexing's gradient is a scatter-add of every (query, key) pair's [H] vector
  into the R (32) rows of the table: on a GPU, tens of millions of atomic adds
  onto a few hundred addresses (a fifth of `base`'s step at length 512 on an H200,
  benchmarks/gpu-throughput.md). Here it is one masked sum per row,
  which XLA fuses into a single reduction over the cotangent.
  """
  return table[buckets]


def _lookup_fwd(table, buckets):
  return table[buckets], (table, buckets)


def _lookup_bwd(residuals, g):
  table, buckets = residuals
  rows = jnp.arange(table.shape[0], dtype=buckets.dtype)
  hit = buckets[..., None] == rows  # [..., R]
  summed = tuple(range(buckets.ndim))
  d_table = jnp.sum(jnp.where(hit[..., None], g[..., None, :].astype(jnp.float32),
                              0.0), axis=summed)  # [R, H]
  return d_table.astype(table.dtype), None


lookup.defvjp(_lookup_fwd, _lookup_bwd)

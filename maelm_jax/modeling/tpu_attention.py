"""The project's Pallas TPU attention kernel for encoder lengths (up to
`MAX_LENGTH`): one head of one row a grid step, every key in VMEM, moving only
what attention must through HBM.

What the stock kernel (`jax.experimental.pallas.ops.tpu.flash_attention`) moves
and this one does not (`base` MLM at 512 on v5e:2x2, benchmarks/tpu-plans.md):
- **The position bias once for the batch.** The stock kernel tiles its bias per
  batch row, so a bias shared by every row ([1, H, n, m], MLM's and the
  decoders') reached it as [B, H, n, m] float32 with the padding mask added in;
  each layer's three kernels read it and the dq kernel wrote its gradient at
  that size. Here the grid runs the batch innermost: a shared bias block is
  fetched once per head and its gradient is summed over the batch in VMEM and
  written once. Padding reaches the kernel as key lengths (scalars in SMEM), not
  as a mask in the bias.
- **Compact statistics.** The stock kernel stores `l` and `m` as [B, H, n, 128]
  and reads `di` as [B, H, n, 128 or more]; here the log-sum-exp and `di` are
  [B, H, 1, n] float32. The kernel works on the transposed scores s^T [m, n]
  (keys on sublanes, queries on lanes, as splash attention's dkv kernel does),
  so a query's statistics are a lane-oriented row that is stored as it is.

The forward and the backward each run one grid step per (head, row): q, k, v
and the head's bias block stay in VMEM, and queries go in chunks of
`block_q` columns. Semantics: softmax(q k^T + bias + masks) v with q already
scaled (the caller's `attention.tpu_flash_attention`); keys from `kv_len` on
(the caller's padding to 128) get `PADDED_KEY_BIAS`; keys from `lengths[b]` on
get `NEG_INF` added, as the einsum's padding mask adds it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Longest query or key length this kernel takes: a head's [m, n] float32 bias
# gradient and its bias stay in VMEM (double-buffered: 4 MB each at 512, 16 MB at
# 1024). Longer lengths run the stock flash kernel (`attention.tpu_flash_attention`).
MAX_LENGTH = 1024
NEG_INF = -1e9  # = model.NEG_INF: what the einsum's padding mask adds.
PADDED_KEY_BIAS = -1e12  # = attention.PADDED_KEY_BIAS: keys past `kv_len`.
_NT = (((1,), (1,)), ((), ()))  # a [x, d] . b [y, d] -> [x, y]
_TN = (((0,), (0,)), ((), ()))  # a [x, y] . b [x, d] -> [y, d]
_NN = (((1,), (0,)), ((), ()))  # a [x, y] . b [y, d] -> [x, d]


def _block_q(n: int, m: int) -> int:
  """Query columns a chunk: [m, block_q] float32 scores and their kin stay
  about 1 MB each."""
  return next(b for b in (512, 256, 128) if n % b == 0 and b * m <= 512 * 512)


def _vmem_limit(n: int, m: int, d: int, bias_bytes: int) -> int:
  """Scoped VMEM a grid step needs, with room: double-buffered q, k, v, do,
  dq, dk, dv, the bias block and its float32 gradient, and the chunk's
  temporaries; at least XLA's default (16 MiB)."""
  blocks = 2 * (4 * n * d + 3 * m * d) * 4 + 2 * n * m * (bias_bytes + 4)
  temporaries = 6 * m * _block_q(n, m) * 4
  return max(16 << 20, int(1.5 * (blocks + temporaries)))


def _cost(args, out_shape, b, h, n, m, d, matmuls: int) -> pl.CostEstimate:
  """What a call computes and moves, for XLA's cost analysis and scheduler:
  `matmuls` [n, m, d] products a head and row, one exp a score."""
  moved = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves([args, out_shape]))
  return pl.CostEstimate(flops=2 * matmuls * b * h * n * m * d,
                         transcendentals=b * h * n * m, bytes_accessed=moved)


def _scores(k, q, bias_t, length, *, kv_len: int):
  """s^T [m, bq] float32: k q^T plus the bias, the key-length mask and the
  caller's padding keys."""
  s = lax.dot_general(k, q, _NT, preferred_element_type=jnp.float32)
  if bias_t is not None:
    s = s + bias_t.astype(jnp.float32)
  key = lax.broadcasted_iota(jnp.int32, s.shape, 0)
  s = jnp.where(key < length, s, s + NEG_INF)
  if kv_len < s.shape[0]:
    s = jnp.where(key < kv_len, s, PADDED_KEY_BIAS)
  return s


def _bias_block(bias_ref, cols):
  """The bias for a chunk of query columns: [m, bq], or a per-key mask's [m, 1]
  (added to every query)."""
  return bias_ref[:, cols] if bias_ref.shape[1] > 1 else bias_ref[...]


def _forward_kernel(lengths_ref, q_ref, k_ref, v_ref, *refs, kv_len: int,
                    block_q: int, has_bias: bool):
  bias_ref = refs[0] if has_bias else None
  o_ref, lse_ref = refs[-2:]
  length = lengths_ref[pl.program_id(1)]
  k, v = k_ref[...], v_ref[...]
  for start in range(0, q_ref.shape[0], block_q):
    cols = pl.ds(start, block_q)
    s = _scores(k, q_ref[cols, :], _bias_block(bias_ref, cols) if has_bias else None,
                length, kv_len=kv_len)
    top = jnp.max(s, axis=0, keepdims=True)  # [1, bq]
    p = jnp.exp(s - top)
    total = jnp.sum(p, axis=0, keepdims=True)
    p = p * (1.0 / total)  # Normalised, then rounded, as the einsum's probs.
    o_ref[cols, :] = lax.dot_general(p.astype(v.dtype), v, _TN,
                                     preferred_element_type=jnp.float32
                                     ).astype(o_ref.dtype)
    lse_ref[:, cols] = top + jnp.log(total)


def _backward_kernel(lengths_ref, q_ref, k_ref, v_ref, *refs, kv_len: int,
                     block_q: int, has_bias: bool, bias_grad: bool, shared_bias: bool):
  bias_ref, refs = (refs[0], refs[1:]) if has_bias else (None, refs)
  do_ref, lse_ref, di_ref, dq_ref, dk_ref, dv_ref = refs[:6]
  dbias_ref = refs[6] if bias_grad else None
  row = pl.program_id(1)
  length = lengths_ref[row]
  k, v = k_ref[...], v_ref[...]
  dk = jnp.zeros(k.shape, jnp.float32)
  dv = jnp.zeros(v.shape, jnp.float32)
  for start in range(0, q_ref.shape[0], block_q):
    cols = pl.ds(start, block_q)
    q, do = q_ref[cols, :], do_ref[cols, :]
    s = _scores(k, q, _bias_block(bias_ref, cols) if has_bias else None, length,
                kv_len=kv_len)
    p = jnp.exp(s - lse_ref[:, cols])  # [m, bq]
    dp = lax.dot_general(v, do, _NT, preferred_element_type=jnp.float32)
    ds = p * (dp - di_ref[:, cols])
    dv += lax.dot_general(p.astype(do.dtype), do, _NN, preferred_element_type=jnp.float32)
    dk += lax.dot_general(ds.astype(q.dtype), q, _NN, preferred_element_type=jnp.float32)
    dq_ref[cols, :] = lax.dot_general(ds.astype(k.dtype), k, _TN,
                                      preferred_element_type=jnp.float32
                                      ).astype(dq_ref.dtype)
    if bias_grad and shared_bias:  # Summed over the batch, the innermost axis.
      @pl.when(row == 0)
      def _():
        dbias_ref[:, cols] = ds

      @pl.when(row > 0)
      def _():
        dbias_ref[:, cols] += ds
    elif bias_grad:
      dbias_ref[:, cols] = ds.astype(dbias_ref.dtype)
  dk_ref[...] = dk.astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _specs(b, h, n, m, d, bias_shape):
  """BlockSpecs of q, k, v (and the transposed bias), grid (heads, rows):
  one head of one row a step; a bias shared by the rows keeps its block index
  over the (innermost) rows, so it is fetched once a head."""
  del b, h
  head_row = lambda hi, bi, lengths: (bi, hi, 0, 0)
  q_spec = pl.BlockSpec((None, None, n, d), head_row)
  kv_spec = pl.BlockSpec((None, None, m, d), head_row)
  specs = [q_spec, kv_spec, kv_spec]
  if bias_shape is not None:
    per_row, per_head = bias_shape[0] > 1, bias_shape[1] > 1
    specs.append(pl.BlockSpec(
        (None, None, m, bias_shape[3]),
        lambda hi, bi, lengths: (bi if per_row else 0, hi if per_head else 0, 0, 0)))
  stats = pl.BlockSpec((None, None, 1, n), head_row)
  return q_spec, kv_spec, specs, stats


def _call(kernel, args, in_specs, out_specs, out_shape, *, b, h, n, m, d, bias_t,
          matmuls: int, name: str):
  """One pallas_call on the (heads, rows) grid, the rows innermost and in order
  (a shared bias' gradient accumulates over them), `lengths` (args[0]) in SMEM."""
  bias_bytes = bias_t.dtype.itemsize if bias_t is not None else 0
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=1, grid=(h, b), in_specs=in_specs, out_specs=out_specs),
      out_shape=out_shape,
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary"),
          vmem_limit_bytes=_vmem_limit(n, m, d, bias_bytes)),
      cost_estimate=_cost(args, out_shape, b, h, n, m, d, matmuls=matmuls),
      name=name,
  )(*args)


def _forward(q, k, v, bias_t, lengths, kv_len: int):
  b, h, n, d = q.shape
  m = k.shape[2]
  has_bias = bias_t is not None
  q_spec, _, in_specs, stats = _specs(b, h, n, m, d, bias_t.shape if has_bias else None)
  kernel = functools.partial(_forward_kernel, kv_len=kv_len, block_q=_block_q(n, m),
                             has_bias=has_bias)
  args = (lengths, q, k, v, *([bias_t] if has_bias else []))
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct((b, h, 1, n), jnp.float32)]
  return _call(kernel, args, in_specs, [q_spec, stats], out_shape, b=b, h=h, n=n,
               m=m, d=d, bias_t=bias_t, matmuls=2, name="maelm_attention_fwd")


def _backward(q, k, v, bias_t, lengths, lse, di, do, kv_len: int):
  b, h, n, d = q.shape
  m = k.shape[2]
  has_bias = bias_t is not None
  bias_grad = has_bias and not is_key_mask(bias_t)
  shared = has_bias and bias_t.shape[0] == 1
  q_spec, kv_spec, in_specs, stats = _specs(b, h, n, m, d,
                                            bias_t.shape if has_bias else None)
  out_specs = [q_spec, kv_spec, kv_spec]
  out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype),
               jax.ShapeDtypeStruct(k.shape, k.dtype),
               jax.ShapeDtypeStruct(v.shape, v.dtype)]
  if bias_grad:
    out_specs.append(in_specs[3])
    # A shared bias' gradient sums the rows in float32; a per-row one is
    # written as the bias was read (bfloat16 in a bfloat16 run: half the bytes).
    out_shape.append(jax.ShapeDtypeStruct(bias_t.shape,
                                          jnp.float32 if shared else bias_t.dtype))
  kernel = functools.partial(_backward_kernel, kv_len=kv_len, block_q=_block_q(n, m),
                             has_bias=has_bias, bias_grad=bias_grad, shared_bias=shared)
  args = (lengths, q, k, v, *([bias_t] if has_bias else []), do, lse, di)
  # Five products: the scores again, then dp, dv, dk and dq.
  return _call(kernel, args, [*in_specs, q_spec, stats, stats], out_specs, out_shape,
               b=b, h=h, n=n, m=m, d=d, bias_t=bias_t, matmuls=5,
               name="maelm_attention_bwd")


def is_key_mask(bias_t) -> bool:
  """A bias [B|1, 1, m, 1]: one additive value a key (a padding mask that is not
  a prefix of the row), the same for every head and query; a constant, whose
  gradient `attention` does not compute."""
  return bias_t.shape[1] == 1 and bias_t.shape[3] == 1


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def attention(q, k, v, bias_t, lengths, kv_len: int):
  """softmax(q k^T + bias + masks) v, q [B, H, n, d] already scaled, k and v
  [B, H, m, d] (n and m multiples of 128, at most `MAX_LENGTH`); `bias_t` the
  additive bias transposed, [1|B, H, m, n] (float32 or the inputs' dtype), a
  constant per-key mask [1|B, 1, m, 1] (`is_key_mask`), or None; `lengths` int32 [B]: row b's keys from lengths[b] on are padding;
  keys from `kv_len` on are the caller's padding to 128. Returns [B, H, n, d]."""
  return _forward(q, k, v, bias_t, lengths, kv_len)[0]


def _attention_fwd(q, k, v, bias_t, lengths, kv_len):
  out, lse = _forward(q, k, v, bias_t, lengths, kv_len)
  return out, (q, k, v, bias_t, lengths, out, lse)


def _attention_bwd(kv_len, residuals, do):
  q, k, v, bias_t, lengths, out, lse = residuals
  # di = rowsum(do * o): one [B, H, n] row a head, as the kernel reads it.
  di = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)[:, :, None, :]
  grads = _backward(q, k, v, bias_t, lengths, lse, di, do, kv_len)
  dq, dk, dv = grads[:3]
  dbias = None
  if bias_t is not None:  # (A key mask is a constant: no gradient computed.)
    dbias = (jnp.zeros_like(bias_t) if is_key_mask(bias_t)
             else grads[3].astype(bias_t.dtype))
  return dq, dk, dv, dbias, None


attention.defvjp(_attention_fwd, _attention_bwd)


def reference(q, k, v, bias_t, lengths, kv_len: int):
  """`attention`'s semantics in plain jnp (tests, and a stand-in where Pallas'
  interpreter cannot run)."""
  s = jnp.einsum("bhqd,bhkd->bhkq", q, k, preferred_element_type=jnp.float32)
  if bias_t is not None:
    s = s + bias_t.astype(jnp.float32)
  key = jnp.arange(k.shape[2])[None, None, :, None]
  s = jnp.where(key < lengths[:, None, None, None], s, s + NEG_INF)
  s = jnp.where(key < kv_len, s, PADDED_KEY_BIAS)
  p = jax.nn.softmax(s, axis=2).astype(v.dtype)
  return jnp.einsum("bhkq,bhkd->bhqd", p, v)

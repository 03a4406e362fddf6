"""Attention kernels and the rules for using them: which of 'xla', 'cudnn' and
'tpu_flash' a layer runs (`resolve`, at trace time, per layer's lengths), what a
config may ask for (`config_errors`, before compiling), the kernels' calls, and
the mesh they are partitioned over (`kernel_mesh`).

The choice is a runtime one, not part of the model: every implementation gives
the same result up to rounding, and a run may resume under another.
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp

from maelm_jax.core import sharding

# How attention is computed (the result is the same up to rounding; a runtime
# choice, not part of the model): 'xla' the explicit einsum-softmax-einsum, the
# reference, with attention dropout; 'cudnn' cuDNN's fused flash attention through
# `jax.nn.dot_product_attention` (CUDA GPU, bf16, no attention dropout); 'tpu_flash'
# the Pallas TPU flash-attention kernel (`jax.experimental.pallas.ops.tpu`; TPU, no
# attention dropout; lengths padded up to its 128-wide blocks). Both kernels take the padding mask
# and the relative position bias as one additive bias, whose gradient they return,
# so the bias table trains. 'auto': the platform's kernel where it applies, xla
# elsewhere.
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "tpu_flash")
# Let 'tpu_flash' resolve off a TPU: for tests, which run the kernel under Pallas'
# TPU interpreter (`pltpu.force_tpu_interpret_mode()`); never set in runs.
TPU_FLASH_OFF_TPU = False
# The mesh the kernels are partitioned over (`kernel_mesh`; a custom kernel is
# opaque to XLA's partitioner, so it runs per shard under `jax.shard_map`). Its
# devices are also the platform the kernel rules are decided for
# (`target_platform`): a step compiled on a CPU host for TPU chips (plan.py) is
# decided for the TPU.
_KERNEL_MESH = contextvars.ContextVar("kernel_mesh", default=None)
# While `recording_choices` is active: each attention call site's decision.
_CHOICES = contextvars.ContextVar("attention_choices", default=None)


@contextlib.contextmanager
def kernel_mesh(mesh):
  """While a step is traced: the mesh the attention kernels are sharded over."""
  token = _KERNEL_MESH.set(mesh)
  try:
    yield
  finally:
    _KERNEL_MESH.reset(token)


def current_mesh():
  """The mesh the traced step is compiled for (`kernel_mesh`), or None."""
  return _KERNEL_MESH.get()


def target_platform() -> str:
  """'tpu', 'gpu' or 'cpu': the platform of the devices the traced step is
  compiled for (the kernel mesh's), else this host's default backend."""
  mesh = _KERNEL_MESH.get()
  if mesh is not None:
    platform = mesh.devices.flat[0].platform
    return "gpu" if platform in ("cuda", "rocm") else platform
  return jax.default_backend()


@contextlib.contextmanager
def recording_choices():
  """Collects, while a step is traced, what each attention call site resolved
  to: a list of {site, implementation, q_len, kv_len} (`site_of`), one per
  traced call (a scanned stack traces its layer once)."""
  choices = []
  token = _CHOICES.set(choices)
  try:
    yield choices
  finally:
    _CHOICES.reset(token)


def site_of(module_path: tuple[str, ...]) -> str:
  """'encoder', 'decoder' or 'cross': the call site a module path is in
  (('decoder', 'layer_0', 'cross_attn') -> 'cross'; a fine-tuning model's
  ('backbone', 'encoder', ...) -> 'encoder')."""
  if any(name.startswith("cross_attn") for name in module_path):
    return "cross"
  return "decoder" if "decoder" in module_path else "encoder"


def record_choice(module_path, implementation: str, q_len: int, kv_len: int) -> None:
  choices = _CHOICES.get()
  if choices is not None:
    choices.append({"site": site_of(tuple(module_path)),
                    "implementation": implementation,
                    "q_len": int(q_len), "kv_len": int(kv_len)})


def resolve(impl: str, *, dtype, head_dim: int, dropout_active: bool,
            q_len: int = 2, kv_len: int = 2) -> str:
  """'xla', 'cudnn' or 'tpu_flash': what `impl` (a config's attention_impl)
  resolves to here (at trace time). 'auto' takes a kernel only where all its
  conditions hold; asking for one explicitly where they do not raises, naming
  each unmet condition."""
  if impl == "xla":
    return "xla"
  unmet = {"cudnn": cudnn_unmet(dtype, head_dim, dropout_active, q_len, kv_len),
           "tpu_flash": tpu_flash_unmet(dropout_active, q_len, kv_len)}
  if impl == "auto":
    return next((kernel for kernel, why in unmet.items() if not why), "xla")
  why = unmet[impl]
  if why:
    raise ValueError(f"attention_impl={impl!r} needs " +
                     ", ".join(why) + "; use attention_impl='auto' (a kernel "
                     "where it applies) or 'xla'")
  return impl


def cudnn_unmet(dtype, head_dim: int, dropout_active: bool, q_len: int,
                kv_len: int) -> list[str]:
  """cuDNN flash attention's conditions as jax checks them: half precision and a
  head size that is a multiple of 8 up to 128. Its training kernel with a bias
  also wants even query and key lengths; odd ones (MAE-LM's encoder length L - K,
  the cross decoder's K) are padded by one (`fused_attention`), so any length runs
  it."""
  del q_len, kv_len
  why = []
  if target_platform() != "gpu":
    why.append(f"a CUDA GPU (this is {target_platform()})")
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    why.append(f"bfloat16 (model.dtype is {jnp.dtype(dtype).name})")
  if dropout_active:
    why.append("no attention dropout (set attention_dropout=0)")
  if head_dim % 8 or head_dim > 128:
    why.append(f"a head size that is a multiple of 8 up to 128 (it is {head_dim})")
  return why


def tpu_flash_unmet(dropout_active: bool, q_len: int, kv_len: int) -> list[str]:
  """The Pallas TPU kernel's: a TPU and no attention dropout. Any lengths: those
  that are not multiples of its 128-wide blocks (MAE-LM's encoder length L - K,
  the cross decoder's K) are padded with keys nobody attends to
  (`tpu_flash_attention`)."""
  del q_len, kv_len
  why = []
  if target_platform() != "tpu" and not TPU_FLASH_OFF_TPU:
    why.append(f"a TPU (this is {target_platform()})")
  if dropout_active:
    why.append("no attention dropout (set attention_dropout=0)")
  return why


def config_errors(impl: str, *, dtype: str, attention_dropout: float,
                  key: str = "attention_impl") -> list[str]:
  """What a config asks of a kernel that cannot hold anywhere, said before
  compiling (the platform and lengths are only known at trace time, where
  `resolve` names them). `key`: the config key, for the message; dtype ''
  (fine-tuning: the pretrained model's) is not checked here."""
  if impl not in ATTENTION_IMPLS:
    return [f"{key}={impl!r} must be one of {ATTENTION_IMPLS}"]
  if impl == "cudnn" and (attention_dropout != 0 or dtype not in ("bfloat16", "")):
    return [f"{key}='cudnn' runs bfloat16 without attention dropout (got "
            f"dtype={dtype!r}, attention_dropout={attention_dropout}): set those, or "
            "use attention_impl='auto', which falls back to 'xla' where cuDNN does "
            "not apply"]
  if impl == "tpu_flash" and attention_dropout != 0:
    return [f"{key}='tpu_flash' runs without attention dropout (got "
            f"attention_dropout={attention_dropout}): set it to 0, or use "
            "attention_impl='auto', which falls back to 'xla' where the kernel does "
            "not apply"]
  return []


def even_length(length: int) -> int:
  """The length cuDNN's training kernel runs at: `length` rounded up to even."""
  return length + length % 2


def pad_bias(bias, q_len: int, kv_len: int):
  """An additive bias [B|1, H|1, n|1, m] padded to `q_len` query rows (bias 0: the
  padded queries' outputs are cut off) and `kv_len` keys (`PADDED_KEY_BIAS`: no
  query attends to them), as a kernel that runs longer lengths reads it. A bias
  already at those lengths is returned as it is."""
  rows = 0 if bias.shape[2] == 1 else q_len - bias.shape[2]
  cols = kv_len - bias.shape[3]
  if rows:
    bias = jnp.pad(bias, ((0, 0), (0, 0), (0, rows), (0, 0)))
  if cols:
    bias = jnp.pad(bias, ((0, 0), (0, 0), (0, 0), (0, cols)),
                   constant_values=PADDED_KEY_BIAS)
  return bias


def fused_attention(q, k, v, bias, implementation: str, pad_odd: bool | None = None,
                    key_lengths=None):
  """`jax.nn.dot_product_attention` on [B, n|m, H, d] q/k/v with our additive
  float32 bias [B|1, H|1, n, m], broadcast to the full [B, H, n, m] and cast to the
  activation dtype (cuDNN takes a bias of the inputs' dtype and shape). The same
  call with implementation='xla' is what the CPU tests compare with the einsum.

  cuDNN's training kernel with a bias takes even lengths only (jax refuses odd
  ones), so with `pad_odd` (default: for 'cudnn') an odd query length gets one more
  query, whose output is cut off, and an odd key length one more key, which no
  query attends to (`pad_bias`): the result and every gradient are the unpadded
  attention's, as for `tpu_flash_attention`'s blocks. A bias that `model.Stack`
  padded already (once for all layers) is used as it is. `key_lengths` (int32 [B]):
  row b's keys from key_lengths[b] on are padding, for cuDNN its padding mask, so
  that the bias can stay shared across the batch ([1, H, n, m]) or be None."""
  b, n, h, _ = q.shape
  m = k.shape[1]
  if pad_odd is None:
    pad_odd = implementation == "cudnn"
  n_run, m_run = (even_length(n), even_length(m)) if pad_odd else (n, m)
  if n_run > n:
    q = jnp.pad(q, ((0, 0), (0, n_run - n), (0, 0), (0, 0)))
  if m_run > m:
    k = jnp.pad(k, ((0, 0), (0, m_run - m), (0, 0), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, m_run - m), (0, 0), (0, 0)))
  if bias is not None:  # The batch axis stays as it comes: 1 or B.
    bias = jnp.broadcast_to(pad_bias(bias, n_run, m_run),
                            (bias.shape[0], h, n_run, m_run)).astype(q.dtype)
  elif m_run > m and key_lengths is None:
    raise ValueError("an odd key length without a bias needs key_lengths")
  out = jax.nn.dot_product_attention(q, k, v, bias=bias,
                                     scale=1.0 / math.sqrt(q.shape[-1]),
                                     key_value_seq_lengths=key_lengths,
                                     implementation=implementation)
  return out[:, :n]


TPU_BLOCK = 128  # The kernel's lengths are multiples of its 128-wide blocks.
# The bias of padded keys: far below the model's own mask value (model.NEG_INF,
# -1e9), so that a row whose every real key is masked still spreads its weight
# over its real keys, as the einsum does, and none over the padding.
PADDED_KEY_BIAS = -1e12


def padded_length(length: int) -> int:
  """The length the TPU kernel runs at: `length` rounded up to its block."""
  return -(-length // TPU_BLOCK) * TPU_BLOCK


def _flash_block(length: int) -> int:
  return next(b for b in (512, 256, 128) if length % b == 0)


def tpu_flash_attention(q, k, v, bias, key_lengths=None):
  """Attention on the TPU on [B, n|m, H, d] q/k/v, our additive float32 bias
  [B|1, H|1, n, m] (or None) and `key_lengths` (int32 [B], or None: row b's keys
  from key_lengths[b] on are padding), equal to the einsum path. Lengths that are
  not multiples of 128 are padded up to one: padded keys get `PADDED_KEY_BIAS`
  (no query attends to them), padded queries are computed and cut off, so the
  result and every gradient are the unpadded attention's. Under `kernel_mesh`
  with more than one device the kernel runs per shard (batch over data x fsdp,
  heads over tensor).

  Up to `tpu_attention.MAX_LENGTH` it is the project's kernel (`tpu_attention`):
  a bias shared by the rows stays [1, H, n, m] and its gradient is summed over
  the rows inside the kernel, padding arrives as key lengths, the saved
  statistics are [B, H, n]; a per-row bias (MAE-LM's encoder, whose rows keep
  different positions) is read in the activations' dtype; a bias [B, 1, 1, m]
  (a padding mask alone that is not a prefix: MAE-LM's decoder) is read as one
  value a key and taken as a constant (no gradient). Longer lengths run
  the stock Pallas flash kernel (`_stock_flash_attention`)."""
  from maelm_jax.modeling import tpu_attention  # pylint: disable=g-import-not-at-top  (Pallas: on TPU only)
  b, n, h, d = q.shape
  m = k.shape[1]
  n_run, m_run = padded_length(n), padded_length(m)
  if max(n_run, m_run) > tpu_attention.MAX_LENGTH:
    if key_lengths is not None:
      valid = jnp.arange(m)[None, :] < key_lengths[:, None]
      mask = jnp.where(valid, 0.0, tpu_attention.NEG_INF)[:, None, None, :]
      bias = mask if bias is None else bias + mask
    return _stock_flash_attention(q, k, v, bias)
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, L, H, d] <-> [B, H, L, d]
  q = heads_first((q * (1.0 / math.sqrt(d))).astype(q.dtype))
  k, v = heads_first(k), heads_first(v)
  q = jnp.pad(q, ((0, 0), (0, 0), (0, n_run - n), (0, 0)))
  k = jnp.pad(k, ((0, 0), (0, 0), (0, m_run - m), (0, 0)))
  v = jnp.pad(v, ((0, 0), (0, 0), (0, m_run - m), (0, 0)))
  if key_lengths is None:
    key_lengths = jnp.full((b,), m, jnp.int32)
  key_lengths = key_lengths.astype(jnp.int32)
  bias_t = None
  if bias is not None and bias.shape[1] == bias.shape[2] == 1:
    # A padding mask alone ([B, 1, 1, m], not a prefix of the row: MAE-LM's
    # decoder): one value a key, a constant, read as a column by the kernel.
    bias_t = jax.lax.stop_gradient(jnp.pad(bias.astype(jnp.float32),
                                           ((0, 0), (0, 0), (0, 0), (0, m_run - m))))
    bias_t = jnp.swapaxes(bias_t, 2, 3)  # [B, 1, m, 1]
  elif bias is not None:
    rows = bias.shape[0]
    # Read once for the batch, a shared bias keeps float32; a per-row one is
    # read row by row, in the activations' dtype (half the bytes at bfloat16).
    bias = jnp.broadcast_to(bias, (rows, h, n, m)).astype(
        jnp.float32 if rows == 1 else q.dtype)
    bias = jnp.pad(bias, ((0, 0), (0, 0), (0, n_run - n), (0, m_run - m)))
    bias_t = jnp.swapaxes(bias, 2, 3)  # [., H, m, n]: keys on the kernel's rows.

  def kernel(q, k, v, bias_t, lengths):
    return tpu_attention.attention(q, k, v, bias_t, lengths, m)

  mesh = _KERNEL_MESH.get()
  if mesh is not None and mesh.size > 1:
    dp, tp = sharding.data_parallel_size(mesh), mesh.shape["tensor"]
    if b % dp == 0 and h % tp == 0:
      spec = jax.sharding.PartitionSpec(sharding.BATCH_AXES, "tensor")
      bias_spec = jax.sharding.PartitionSpec(
          sharding.BATCH_AXES if bias_t is not None and bias_t.shape[0] > 1 else None,
          "tensor" if bias_t is not None and bias_t.shape[1] > 1 else None)
      kernel = jax.shard_map(
          kernel, mesh=mesh,
          in_specs=(spec, spec, spec, bias_spec if bias_t is not None else None,
                    jax.sharding.PartitionSpec(sharding.BATCH_AXES)),
          out_specs=spec, check_vma=False)
  return heads_first(kernel(q, k, v, bias_t, key_lengths)[:, :, :n])


def _stock_flash_attention(q, k, v, bias):
  """The stock Pallas TPU flash-attention kernel (lengths over
  `tpu_attention.MAX_LENGTH`), as `tpu_flash_attention` takes it: the kernel adds
  its bias *before* scaling, softmax((q k + bias) * scale), so q is scaled first
  and the kernel's scale is 1; the bias is broadcast to [B, H, n, m] float32 (the
  kernel tiles it per batch row and head)."""
  from jax.experimental.pallas.ops.tpu import flash_attention as tpu_kernel  # pylint: disable=g-import-not-at-top
  b, n, h, d = q.shape
  m = k.shape[1]
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # [B, L, H, d] <-> [B, H, L, d]
  q = heads_first((q * (1.0 / math.sqrt(d))).astype(q.dtype))
  k, v = heads_first(k), heads_first(v)
  bias = (jnp.zeros((1, 1, n, m), jnp.float32) if bias is None else bias)
  bias = jnp.broadcast_to(bias, (b, h, n, m)).astype(jnp.float32)
  n_pad, m_pad = padded_length(n) - n, padded_length(m) - m
  if n_pad or m_pad:
    q = jnp.pad(q, ((0, 0), (0, 0), (0, n_pad), (0, 0)))
    k = jnp.pad(k, ((0, 0), (0, 0), (0, m_pad), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, 0), (0, m_pad), (0, 0)))
    bias = pad_bias(bias, n + n_pad, m + m_pad)
  bq, bk = _flash_block(n + n_pad), _flash_block(m + m_pad)
  # The dq kernel's key blocks at the smallest width, 128: the kernel stores
  # `di` broadcast to [B, H, L, block_k_major_dq] in HBM (at 512, 4x the bytes).
  blocks = tpu_kernel.BlockSizes(
      block_q=bq, block_k_major=bk, block_k=bk, block_b=1,
      block_q_major_dkv=bq, block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq,
      block_k_major_dq=TPU_BLOCK, block_k_dq=TPU_BLOCK, block_q_dq=bq)

  def kernel(q, k, v, bias):
    return tpu_kernel.flash_attention(q, k, v, ab=bias, sm_scale=1.0,
                                      block_sizes=blocks)

  mesh = _KERNEL_MESH.get()
  if mesh is not None and mesh.size > 1:
    dp, tp = sharding.data_parallel_size(mesh), mesh.shape["tensor"]
    if b % dp == 0 and h % tp == 0:
      spec = jax.sharding.PartitionSpec(sharding.BATCH_AXES, "tensor")
      kernel = jax.shard_map(kernel, mesh=mesh, in_specs=(spec,) * 4,
                             out_specs=spec, check_vma=False)
  return heads_first(kernel(q, k, v, bias)[:, :, :n])

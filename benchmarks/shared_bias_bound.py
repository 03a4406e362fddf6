r"""What a relative position bias shared across the batch would save on a GPU: an
upper bound, measured before building it.

Today every layer's cuDNN attention reads a `[B, H, L, L]` bias (padding mask +
relative position bias; `model.Stack`) and writes its `[B, H, L, L]` gradient, and
the table's gradient is reduced from that (`relative_position.lookup`). In MLM
every row has the same positions, so the position part is `[1, H, L, L]`: 128x
fewer bytes at batch 128. Only the padding mask differs between rows.

This runs `benchmarks/train_throughput.py` (all its flags) with the model patched
so that the bias is computed from the first row's positions and the padding mask
is left out: exact for the benchmark's full rows without padding, *not* for real
data with padding and *not* for MAE-LM (whose rows keep different positions), so
use it with `--objectives=mlm` only. It measured 1.17x
(benchmarks/gpu-throughput.md, "Unrolled against scanned layers"); the real
change is now in the model (`model.Encoder.right_padded`: the padding as cuDNN's
key lengths, the bias shared), and this script stays as the record of how the
bound was measured.

  python benchmarks/shared_bias_bound.py --sizes=base --seq_lens=512 --objectives=mlm \
      --dtype=bfloat16 --attention_impls=auto --scan_layers --dropout=0 \
      --tokens_per_batch=65536 --json=runs/shared.json --out=runs/shared.md
"""

import math
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from maelm_jax.modeling import attention, model  # noqa: E402


PerRowRelativePositionBias = model.RelativePositionBias


class SharedRelativePositionBias(PerRowRelativePositionBias):
  """The same table and module name; the bias of the first row only: [1, H, n, m]."""

  def __call__(self, q_positions, k_positions):
    return PerRowRelativePositionBias.__call__(self, q_positions[:1], k_positions[:1])


def no_padding_bias(key_valid):
  return jnp.zeros((1, 1, 1, key_valid.shape[1]), jnp.float32)


def fused_attention_batch_shared(q, k, v, bias, implementation: str, key_lengths=None):
  """attention.fused_attention as it was measured: the bias not broadcast over the
  batch, no key lengths, no padding of odd lengths."""
  del key_lengths  # (The bound leaves the padding out.)
  _, n, h, _ = q.shape
  bias = jnp.broadcast_to(bias, (bias.shape[0], h, n, k.shape[1])).astype(q.dtype)
  return jax.nn.dot_product_attention(q, k, v, bias=bias,
                                      scale=1.0 / math.sqrt(q.shape[-1]),
                                      implementation=implementation)


if __name__ == "__main__":
  if any(a.startswith("--objectives") and a.split("=", 1)[-1] != "mlm"
         for a in sys.argv[1:]):
    sys.exit("shared_bias_bound.py: use --objectives=mlm (the bound is exact only for "
             "rows that share their positions)")
  model.RelativePositionBias = SharedRelativePositionBias
  model._padding_bias = no_padding_bias
  attention.fused_attention = fused_attention_batch_shared
  # sys.argv[0] stays this script: the rows' `command` names it.
  runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                              "train_throughput.py"), run_name="__main__")

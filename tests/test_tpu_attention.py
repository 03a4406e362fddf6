"""The project's Pallas TPU attention kernel (maelm_jax/modeling/tpu_attention.py),
run by Pallas' TPU interpreter on the CPU: values and every gradient equal a plain
jnp softmax attention with the same masks, for a bias shared by the rows (its
gradient summed over them inside the kernel), a bias per row, no bias, key
lengths, keys padded to the kernel's 128, and more than one chunk of queries;
and the statistics it saves are [B, H, 1, n], not block-wide."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from maelm_jax.modeling import tpu_attention


def inputs(batch, heads, n, m, d, bias_rows, dtype=jnp.float32, seed=0):
  rng = np.random.RandomState(seed)
  q = jnp.asarray(rng.randn(batch, heads, n, d) * 0.5, dtype)
  k = jnp.asarray(rng.randn(batch, heads, m, d), dtype)
  v = jnp.asarray(rng.randn(batch, heads, m, d), dtype)
  bias_t = (None if bias_rows is None else
            jnp.asarray(rng.randn(bias_rows, heads, m, n), jnp.float32))
  return q, k, v, bias_t


def loss_and_grads(attention, q, k, v, bias_t, lengths, kv_len):
  def loss(q, k, v, bias_t):
    out = attention(q, k, v, bias_t, lengths, kv_len).astype(jnp.float32)
    weights = jnp.sin(jnp.arange(out.size, dtype=jnp.float32)).reshape(out.shape)
    return jnp.sum(out * weights)
  argnums = (0, 1, 2) if bias_t is None else (0, 1, 2, 3)
  return jax.jit(jax.value_and_grad(loss, argnums=argnums))(q, k, v, bias_t)


@pytest.mark.parametrize("case", [
    # (batch, n queries, m keys, bias rows, kv_len, lengths)
    dict(n=256, m=128, bias_rows=1, kv_len=111, lengths=(100, 77)),  # shared
    dict(n=128, m=256, bias_rows=2, kv_len=256, lengths=(256, 130)),  # per row
    dict(n=128, m=128, bias_rows=None, kv_len=97, lengths=(97, 5)),  # no bias
    dict(n=1024, m=128, bias_rows=1, kv_len=128, lengths=(128, 128)),  # 2 chunks
], ids=["shared", "per-row", "no-bias", "chunks"])
def test_kernel_values_and_gradients_equal_the_plain_attention(case):
  q, k, v, bias_t = inputs(2, 2, case["n"], case["m"], 8, case["bias_rows"])
  lengths = jnp.asarray(case["lengths"], jnp.int32)
  with pltpu.force_tpu_interpret_mode():
    loss, grads = loss_and_grads(tpu_attention.attention, q, k, v, bias_t, lengths,
                                 case["kv_len"])
  want_loss, want_grads = loss_and_grads(tpu_attention.reference, q, k, v, bias_t,
                                         lengths, case["kv_len"])
  np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-5)
  for name, got, want in zip(("dq", "dk", "dv", "dbias"), grads, want_grads):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-4,
                               err_msg=name)
  # Padding keys get nothing: their k and v gradients are exactly zero.
  first_padded = min(case["kv_len"], min(case["lengths"]))
  if first_padded < case["m"]:
    assert float(jnp.abs(grads[2][1, :, first_padded:]).max()) == 0.0
  if bias_t is not None and case["bias_rows"] == 1:
    # One gradient for the batch, of the shared bias' own shape.
    assert grads[3].shape == (1, 2, case["m"], case["n"])


def test_kernel_in_bfloat16_stays_within_its_rounding():
  """bfloat16 q, k, v (as runs have them): the kernel and the plain attention
  round differently, within bfloat16's error."""
  q, k, v, bias_t = inputs(2, 2, 128, 128, 8, 1, dtype=jnp.bfloat16, seed=1)
  lengths = jnp.asarray([128, 60], jnp.int32)
  with pltpu.force_tpu_interpret_mode():
    loss, grads = loss_and_grads(tpu_attention.attention, q, k, v, bias_t, lengths, 128)
  want_loss, want_grads = loss_and_grads(tpu_attention.reference, q, k, v, bias_t,
                                         lengths, 128)
  np.testing.assert_allclose(float(loss), float(want_loss), rtol=2e-2)
  for name, got, want in zip(("dq", "dk", "dv", "dbias"), grads, want_grads):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.abs(got - want).max() <= 0.03 * np.abs(want).max() + 1e-3, name


def test_saved_statistics_are_one_number_a_query():
  """The residuals the backward keeps: the log-sum-exp [B, H, 1, n] float32, not
  the stock kernel's [B, H, n, 128] `l` and `m`."""
  q, k, v, bias_t = inputs(2, 3, 256, 128, 8, 1)
  lengths = jnp.asarray([128, 90], jnp.int32)
  with pltpu.force_tpu_interpret_mode():
    _, residuals = jax.jit(tpu_attention._attention_fwd, static_argnums=5)(  # pylint: disable=protected-access
        q, k, v, bias_t, lengths, 128)
  lse = residuals[-1]
  assert lse.shape == (2, 3, 1, 256) and lse.dtype == jnp.float32
  s = jnp.einsum("bhqd,bhkd->bhkq", q, k) + bias_t
  s = jnp.where(jnp.arange(128)[None, None, :, None] < lengths[:, None, None, None],
                s, s - 1e9)
  np.testing.assert_allclose(np.asarray(lse[:, :, 0]),
                             np.asarray(jax.nn.logsumexp(s, axis=2)), rtol=1e-5)


def test_a_per_key_mask_is_read_as_one_column_and_not_differentiated():
  """A padding mask that is not a prefix of the row (MAE-LM's decoder) reaches
  the kernel as [B, 1, m, 1], one value a key for every head and query: the
  values and the q, k, v gradients are the plain attention's with that mask,
  and the mask, a constant, gets a zero gradient."""
  q, k, v, _ = inputs(2, 2, 128, 128, 8, None)
  keep = np.random.RandomState(3).rand(2, 128) > 0.3
  mask_t = jnp.asarray(np.where(keep, 0.0, -1e9)[:, None, :, None], jnp.float32)
  lengths = jnp.asarray([128, 128], jnp.int32)
  assert tpu_attention.is_key_mask(mask_t)
  with pltpu.force_tpu_interpret_mode():
    loss, grads = loss_and_grads(tpu_attention.attention, q, k, v, mask_t, lengths, 128)
  want_loss, want_grads = loss_and_grads(
      lambda q, k, v, b, *a: tpu_attention.reference(q, k, v, jax.lax.stop_gradient(b), *a),
      q, k, v, mask_t, lengths, 128)
  np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5, atol=1e-5)
  for name, got, want in zip(("dq", "dk", "dv", "dmask"), grads, want_grads):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-4,
                               err_msg=name)
  assert float(jnp.abs(grads[3]).max()) == 0.0
  # Masked keys get nothing.
  assert float(jnp.abs(grads[2][~np.broadcast_to(keep[:, None, :], (2, 2, 128))]).max()) == 0.0

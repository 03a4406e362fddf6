"""How attention is computed and what is rematerialised: runtime choices that
must not change the math (attention.ATTENTION_IMPLS, model.REMAT_POLICIES)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from maelm_jax.modeling import attention, model as model_lib
from maelm_jax.run import config_lib
from tests import helpers
from tests.helpers import random_ids, tiny_config

VOCAB = 120


def build(objective, **overrides):
  config = tiny_config(objective, **overrides)
  return model_lib.ModelConfig.from_config(config.model, vocab_size=VOCAB, mask_id=4)


def loss_fn_and_params(cfg, ids, seed=1, params=None, right_padded=False):
  """The summed masked-LM loss as a function of the params, and fresh params
  (or `params`, when given: no init is run)."""
  masks = helpers.draw_masks(cfg, ids, VOCAB, seed)  # Jitted, as the init.
  model = model_lib.MaskedLM(cfg, right_padded=right_padded)
  if params is None:
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), masks)["params"])

  def loss_fn(p):
    logits = helpers.apply(model, {"params": p}, masks)
    return model_lib.masked_lm_loss(logits, masks.targets, masks.selected_weights)[0]

  return loss_fn, params


def loss_and_grads(cfg, ids, right_padded=False):
  loss_fn, params = loss_fn_and_params(cfg, ids, right_padded=right_padded)
  return jax.jit(jax.value_and_grad(loss_fn))(params)


def assert_trees_close(a, b, tol):
  """Leaf by leaf, within `tol` of the leaf's largest magnitude (the loss is a
  sum over the batch, so gradients reach ~10 and float32 rounding scales)."""
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a),
                          jax.tree_util.tree_leaves(b)):
    y = np.asarray(y)
    np.testing.assert_allclose(np.asarray(x), y, rtol=0,
                               atol=tol * max(1.0, float(np.abs(y).max())),
                               err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("objective,decoder_type,seq_len,right_padded",
                         [("mlm", None, 32, False), ("maelm", "cross", 32, False),
                          ("3ml", "self", 32, False), ("mlm", None, 33, False),
                          ("maelm", "cross", 33, False), ("3ml", "cross", 33, False),
                          ("mlm", None, 33, True), ("maelm", "cross", 32, True),
                          ("3ml", "self", 33, True)])
def test_fused_attention_call_matches_the_einsum_with_bias_gradients(
    monkeypatch, objective, decoder_type, seq_len, right_padded):
  """The cuDNN path's exact call (q/k/v layout, scale, padding and relative bias
  folded into one additive bias, odd lengths padded to even as cuDNN's training
  kernel needs; with `right_padded`, as pretraining and fine-tuning run, the
  padding as cuDNN's key lengths and MLM's bias shared by the batch), run through
  jax.nn.dot_product_attention's XLA implementation: on a GPU only the kernel
  changes. Loss and every gradient, the relative-bias tables' included, equal the
  einsum path's with the padding mask as given."""
  overrides = {"model.ln_type": "pre", "model.dropout": 0.0,
               "model.attention_dropout": 0.0, "model.relative_bias_init": "local",
               "model.position": "learned", "model.relative_position_bias": True,
               "model.decoder_relative_position_bias": True}
  if decoder_type:
    overrides["model.decoder_type"] = decoder_type
  cfg = build(objective, **overrides)
  ids = random_ids(4, seq_len, VOCAB, num_pad=5)  # Padding exercises the mask bias.
  ids[1, -8:] = 0  # Rows of other lengths.
  ids[2, -5:] = np.where(np.arange(5) == 0, 3, 0)
  reference_loss, reference_grads = loss_and_grads(
      model_lib.dataclasses.replace(cfg, attention_impl="xla"), ids)

  original = attention.fused_attention
  calls = []

  def fused_via_xla(q, k, v, bias, implementation, key_lengths=None):
    calls.append((implementation, q.shape[1], k.shape[1],
                  None if bias is None else bias.shape[0], key_lengths is not None))
    return original(q, k, v, bias, implementation="xla", pad_odd=True,
                    key_lengths=key_lengths)

  monkeypatch.setattr(attention, "fused_attention", fused_via_xla)
  monkeypatch.setattr(model_lib.ModelConfig, "attention_backend",
                      lambda self, dropout_active, q_len, kv_len: "cudnn")
  loss, grads = loss_and_grads(cfg, ids, right_padded=right_padded)
  assert calls and {call[0] for call in calls} == {"cudnn"}
  if seq_len % 2:  # Odd lengths went through the padding (L; L - K or K).
    assert any(n % 2 or m % 2 for _, n, m, _, _ in calls)
  # The encoder's self-attention (the first call): the padding as key lengths
  # where rows are right-padded; then MLM's bias is one [1, H, L, L] for the batch.
  _, _, _, bias_batch, lengths = calls[0]
  assert lengths == right_padded
  assert bias_batch == (1 if right_padded and objective == "mlm" else len(ids))
  np.testing.assert_allclose(float(loss), float(reference_loss), rtol=1e-6)
  assert_trees_close(grads, reference_grads, tol=2e-6)
  table = grads["encoder"]["relative_bias"]["table"]
  assert float(jnp.abs(table).max()) > 1e-4  # The bias gradient is really there.


def test_attention_impl_resolves_by_platform_dtype_and_dropout():
  cfg = build("maelm", **{"model.attention_dropout": 0.0})  # float32, on CPU.
  assert model_lib.dataclasses.replace(cfg, attention_impl="auto").attention_backend(
      False) == "xla"
  bf16 = model_lib.dataclasses.replace(cfg, dtype=jnp.bfloat16, attention_impl="auto")
  assert bf16.attention_backend(False) == ("cudnn" if jax.default_backend() == "gpu"
                                           else "xla")
  assert bf16.attention_backend(True) == "xla"  # Attention dropout: no fused kernel.
  # Odd lengths are padded to even for cuDNN's kernel: they do not decide.
  assert bf16.attention_backend(False, 19, 111) == bf16.attention_backend(False)
  forced = model_lib.dataclasses.replace(cfg, attention_impl="cudnn")
  with pytest.raises(ValueError) as error:
    forced.attention_backend(True, 19, 111)
  message = str(error.value)
  assert "bfloat16 (model.dtype is float32)" in message
  assert "no attention dropout" in message
  assert "attention_impl='auto'" in message
  assert "even" not in message
  if jax.default_backend() != "gpu":
    assert "a CUDA GPU (this is cpu)" in message


@pytest.mark.parametrize("q_len,kv_len", [(7, 7), (19, 111), (20, 9)])
def test_odd_lengths_padded_for_cudnn_give_the_unpadded_attention(q_len, kv_len):
  """`fused_attention(pad_odd=True)`, the padding cuDNN's training kernel needs,
  run through the XLA implementation: the output and the gradients of q, k, v
  and the bias equal the same call at the odd lengths, also for a row whose
  every key is masked and a bias already padded once (as model.Stack does)."""
  rng = np.random.default_rng(q_len * 1000 + kv_len)
  q, k, v = (jnp.asarray(rng.standard_normal((2, n, 3, 8)), jnp.float32)
             for n in (q_len, kv_len, kv_len))
  bias = rng.standard_normal((2, 3, q_len, kv_len)).astype(np.float32)
  bias[0, :, :, kv_len // 2:] = model_lib.NEG_INF  # Padding keys.
  bias[1, :, 0, :] = model_lib.NEG_INF  # A query that sees only masked keys.
  bias = jnp.asarray(bias)
  cotangent = jnp.asarray(rng.standard_normal((2, q_len, 3, 8)), jnp.float32)

  def run(pad_odd, prepad=False):
    def f(q, k, v, bias):
      if prepad:
        bias = attention.pad_bias(bias, attention.even_length(q_len),
                                  attention.even_length(kv_len))
      return attention.fused_attention(q, k, v, bias, "xla", pad_odd=pad_odd)
    out, vjp = jax.vjp(f, q, k, v, bias)
    return (out, *vjp(cotangent))

  reference = run(False)
  for padded in (run(True), run(True, prepad=True)):
    assert padded[0].shape == (2, q_len, 3, 8)
    for name, x, y in zip(("out", "dq", "dk", "dv", "dbias"), padded, reference):
      np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                                 atol=1e-5, err_msg=name)


# With the encoder's relative bias (the recipe has rotary positions and none):
# the bias, its gradient and its sharing are what the kernels' tests check.
KERNEL_OVERRIDES = {"model.ln_type": "pre", "model.dropout": 0.0,
                    "model.attention_dropout": 0.0, "model.relative_bias_init": "local",
                    "model.position": "learned", "model.relative_position_bias": True,
                    "model.decoder_relative_position_bias": True}


def count_tpu_kernel_calls(monkeypatch):
  """Let `auto` take the Pallas TPU kernel off a TPU (the caller runs it under
  `pltpu.force_tpu_interpret_mode()`), counting its calls."""
  monkeypatch.setattr(attention, "TPU_FLASH_OFF_TPU", True)
  original, calls = attention.tpu_flash_attention, []

  def counted(q, k, v, bias, key_lengths=None):
    calls.append((q.shape[1], k.shape[1]))
    return original(q, k, v, bias, key_lengths)

  monkeypatch.setattr(attention, "tpu_flash_attention", counted)
  return calls


@pytest.mark.parametrize("objective,decoder_type,lengths,scanned", [
    ("mlm", None, {(128, 128)}, False),
    # The layers under one nn.scan: the kernel's call traced once a stack.
    ("mlm", None, {(128, 128)}, True),
    # 3ML drops its 51 [MASK]ed slots: a 77-token encoder, padded to 128.
    ("3ml", None, {(77, 77), (128, 128)}, False),
    # MAE-LM's 111 visible tokens (17 removed), and the cross decoder's 19
    # selected slots over them.
    ("maelm", "cross", {(111, 111), (19, 19), (19, 111)}, False),
])
def test_tpu_flash_kernel_matches_the_einsum_with_bias_gradients(
    monkeypatch, objective, decoder_type, lengths, scanned):
  """The real Pallas TPU flash-attention kernel (interpreted on CPU) at every
  call site, lengths that are not multiples of its 128-wide blocks padded with
  keys nobody attends to: loss and every gradient, the relative-bias tables'
  included, equal the einsum path's."""
  overrides = dict(KERNEL_OVERRIDES, **{"model.scan_layers": scanned})
  if decoder_type:
    overrides["model.decoder_type"] = decoder_type
  cfg = build(objective, **overrides)
  ids = random_ids(2, 128, VOCAB, num_pad=9)  # Padding exercises the mask bias.
  reference_fn, params = loss_fn_and_params(
      model_lib.dataclasses.replace(cfg, attention_impl="xla"), ids)
  reference_loss, reference_grads = jax.jit(jax.value_and_grad(reference_fn))(params)
  calls = count_tpu_kernel_calls(monkeypatch)
  # The same params (init is eager, and the interpreter can stall on eager
  # kernels); only the one jitted loss-and-gradient program runs interpreted.
  kernel_fn, _ = loss_fn_and_params(
      model_lib.dataclasses.replace(cfg, attention_impl="auto"), ids, params=params)
  with pltpu.force_tpu_interpret_mode():
    loss, grads = jax.jit(jax.value_and_grad(kernel_fn))(params)
  assert set(calls) == lengths
  np.testing.assert_allclose(float(loss), float(reference_loss), rtol=1e-5)
  assert_trees_close(grads, reference_grads, tol=1e-5)
  for part in ("encoder", "decoder"):
    if part in grads and "relative_bias" in grads[part]:
      table = grads[part]["relative_bias"]["table"]
      assert float(jnp.abs(table).max()) > 1e-4  # The bias gradient is really there.


@pytest.mark.parametrize("objective", ["mlm", "maelm"])
def test_tpu_flash_kernel_without_a_bias_under_rotary_positions(monkeypatch, objective):
  """Rotary positions and no relative bias, rows padded at their end (as the
  pipelines make them): the kernel gets no bias at all, the padding as key
  lengths, and loss and every gradient equal the einsum path's."""
  overrides = dict(KERNEL_OVERRIDES, **{"model.position": "rope",
                                        "model.relative_position_bias": False,
                                        "model.decoder_relative_position_bias": False})
  cfg = build(objective, **overrides)
  ids = random_ids(2, 128, VOCAB, num_pad=9)
  reference_fn, params = loss_fn_and_params(
      model_lib.dataclasses.replace(cfg, attention_impl="xla"), ids, right_padded=True)
  reference_loss, reference_grads = jax.jit(jax.value_and_grad(reference_fn))(params)
  monkeypatch.setattr(attention, "TPU_FLASH_OFF_TPU", True)
  seen = []
  original = attention.tpu_flash_attention

  def spy(q, k, v, bias, key_lengths=None):
    seen.append((bias is None, key_lengths is not None))
    return original(q, k, v, bias, key_lengths)

  monkeypatch.setattr(attention, "tpu_flash_attention", spy)
  kernel_fn, _ = loss_fn_and_params(model_lib.dataclasses.replace(cfg, attention_impl="auto"),
                                    ids, params=params, right_padded=True)
  with pltpu.force_tpu_interpret_mode():
    loss, grads = jax.jit(jax.value_and_grad(kernel_fn))(params)
  assert (True, True) in seen  # The encoder: no bias, key lengths.
  np.testing.assert_allclose(float(loss), float(reference_loss), rtol=1e-5)
  assert_trees_close(grads, reference_grads, tol=1e-5)


def test_tpu_flash_kernel_runs_per_shard_in_the_sharded_train_step(monkeypatch):
  """On a (data 2, fsdp 2, tensor 2) mesh the kernel runs under shard_map, each
  device on its rows and heads, with the shared bias and the key lengths split
  as the rows and heads are (the bias gradient summed over the data shards), and
  one train step equals the einsum's. The kernel itself is replaced by the
  module's pure-jnp reference of the same semantics (`tpu_attention.reference`),
  since Pallas' TPU interpreter does not run under 8 fake devices; the test
  above runs the kernel."""
  from maelm_jax.modeling import tpu_attention  # pylint: disable=g-import-not-at-top
  from maelm_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import train_lib  # pylint: disable=g-import-not-at-top
  shard_shapes = []

  def reference_kernel(q, k, v, bias_t, lengths, kv_len):
    shard_shapes.append((q.shape, None if bias_t is None else bias_t.shape, lengths.shape))
    return tpu_attention.reference(q, k, v, bias_t, lengths, kv_len)

  monkeypatch.setattr(tpu_attention, "attention", reference_kernel)
  config = tiny_config("mlm", **KERNEL_OVERRIDES, seq_len=128)
  mesh = sharding.make_mesh((2, 2, 2), jax.devices()[:8])
  tx = train_lib.make_optimizer(config)
  ids = random_ids(8, 128, VOCAB, num_pad=9)
  results = {}
  for impl in ("xla", "auto"):
    cfg = model_lib.dataclasses.replace(
        model_lib.ModelConfig.from_config(config.model, vocab_size=VOCAB, mask_id=4),
        attention_impl=impl)
    calls = count_tpu_kernel_calls(monkeypatch) if impl == "auto" else []
    state, shardings = train_lib.create_sharded_state(cfg, 128, tx, mesh, seed=0)
    step, _ = train_lib.jit_steps(cfg, 128, tx, mesh, shardings)
    batch = {"input_ids": jax.device_put(ids, sharding.batch_sharding(mesh))}
    state, metrics = step(state, batch, train_lib.learning_rate_knots(config))
    results[impl] = (float(metrics["loss"]), jax.device_get(state.params))
    assert bool(calls) == (impl == "auto")
  # The step's calls are per shard: 8 rows / (data 2 x fsdp 2), 2 heads / tensor 2,
  # [B, H, L, d], the shared bias [1, H, L, L] split by heads only, a length a
  # row; no call sees the global batch (init traces one row, unsharded).
  assert ((2, 1, 128, cfg.head_dim), (1, 1, 128, 128), (2,)) in shard_shapes
  assert all(q[0] < 8 for q, _, _ in shard_shapes), shard_shapes
  np.testing.assert_allclose(results["auto"][0], results["xla"][0], rtol=1e-5)
  assert_trees_close(results["auto"][1], results["xla"][1], tol=1e-5)


def test_tpu_flash_resolution_and_its_unmet_conditions(monkeypatch):
  cfg = build("maelm", **{"model.attention_dropout": 0.0})
  auto = model_lib.dataclasses.replace(cfg, attention_impl="auto")
  forced = model_lib.dataclasses.replace(cfg, attention_impl="tpu_flash")
  if jax.default_backend() != "tpu":
    with pytest.raises(ValueError) as error:
      forced.attention_backend(True, 128, 109)
    message = str(error.value)
    assert f"a TPU (this is {jax.default_backend()})" in message
    assert "no attention dropout" in message
    assert "128" not in message  # Any length: the kernel pads.
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert auto.attention_backend(False, 128, 128) == "tpu_flash"
  assert auto.attention_backend(False, 512, 512) == "tpu_flash"
  assert auto.attention_backend(False, 109, 109) == "tpu_flash"  # MAE-LM's encoder.
  assert auto.attention_backend(True, 128, 128) == "xla"  # Attention dropout.
  assert forced.attention_backend(False, 256, 256) == "tpu_flash"


@pytest.mark.parametrize("overrides,expected", [
    ({"model.attention_impl": "flash"}, "model.attention_impl='flash' must be one of"),
    ({"model.attention_impl": "cudnn", "model.attention_dropout": 0.1},
     "set those, or use attention_impl='auto'"),
    ({"model.attention_impl": "tpu_flash", "model.attention_dropout": 0.1},
     "set it to 0, or use attention_impl='auto'"),
    ({"model.remat_policy": "everything"}, "model.remat_policy='everything' must be one"),
    ({"model.remat": True, "model.remat_policy": "dots_saveable"},
     "set only model.remat_policy"),
])
def test_bad_attention_or_remat_settings_are_named(overrides, expected):
  config = tiny_config("maelm", **overrides)
  with pytest.raises(ValueError, match="invalid config") as error:
    config_lib.validate(config)
  assert expected in str(error.value)


def test_a_run_resumes_under_another_attention_impl_or_remat_policy():
  saved = tiny_config("maelm").to_dict()
  current = tiny_config("maelm", **{"model.attention_impl": "xla",
                                     "model.remat_policy": "dots_saveable"}).to_dict()
  assert config_lib.config_differences(saved, current) == []
  del saved["model"]["attention_impl"], saved["model"]["remat_policy"]  # An old run.
  assert config_lib.config_differences(saved, tiny_config("maelm").to_dict()) == []
  other = tiny_config("maelm", **{"model.num_layers": 3}).to_dict()
  assert config_lib.config_differences(saved, other) == ["model.num_layers: 0 -> 3"]


def saved_residual_bytes(cfg, ids):
  """Bytes the backward pass keeps from the forward pass (parameters included):
  what rematerialisation trades for recomputation, the same on every platform.
  (On CPU, XLA's compiled temp size does not shrink with remat: 102 MB with
  'full' against 94 MB with 'none' for this model; peak memory on an accelerator
  is measured in benchmarks/, not here.)"""
  from jax._src.ad_checkpoint import saved_residuals  # pylint: disable=g-import-not-at-top
  loss_fn, params = loss_fn_and_params(cfg, ids)
  return sum(int(np.prod(aval.shape)) * aval.dtype.itemsize
             for aval, _ in saved_residuals(loss_fn, params))


def test_remat_policies_give_the_same_gradients_and_keep_less():
  ids = random_ids(4, 32, VOCAB)
  base = build("mlm", **{"model.num_layers": 4, "model.dropout": 0.0,
                         "model.attention_dropout": 0.0})
  reference_loss, reference_grads = loss_and_grads(base, ids)
  for policy in model_lib.REMAT_POLICIES:
    loss, grads = loss_and_grads(model_lib.dataclasses.replace(
        base, remat_policy=policy), ids)
    np.testing.assert_allclose(float(loss), float(reference_loss), rtol=1e-6)
    assert_trees_close(grads, reference_grads, tol=1e-6)
  # Kept bytes at a length where activations dominate: measured 126 MB (none),
  # 67 (dots), 46 (weight dots only), 12 (full) for 4 layers at 8 x 256, under
  # rotary positions (with the relative bias: 167, 78, 57, 24).
  long_ids = random_ids(8, 256, VOCAB)
  kept = {policy: saved_residual_bytes(model_lib.dataclasses.replace(
      base, remat_policy=policy), long_ids) for policy in model_lib.REMAT_POLICIES}
  assert (kept["full"] < kept["dots_with_no_batch_dims_saveable"]
          < kept["dots_saveable"] < kept["none"]), kept
  assert kept["full"] < 0.2 * kept["none"], kept
  # remat=True (the old switch) is the 'full' policy.
  assert model_lib.dataclasses.replace(base, remat=True).effective_remat_policy == "full"
  assert saved_residual_bytes(model_lib.dataclasses.replace(base, remat=True),
                              long_ids) == kept["full"]

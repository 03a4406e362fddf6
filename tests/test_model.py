"""The model family against straightforward reference computations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from maelm_jax.core import config_defaults
from maelm_jax.run import config_lib
from maelm_jax.modeling import masking, model as model_lib, relative_position
from tests import helpers
from tests.helpers import random_ids, tiny_config

VOCAB = 120


def build(objective="maelm", **overrides):
  config = tiny_config(objective, **overrides)
  cfg = model_lib.ModelConfig.from_config(config.model, vocab_size=VOCAB, mask_id=4)
  return cfg


def init(cfg, masks):
  # Jitted: run op by op, an init compiles each of its few hundred operations
  # on its own (3x the time on the CPU: benchmarks/eager_init_cpu.py).
  boxed = jax.jit(model_lib.MaskedLM(cfg).init)(jax.random.PRNGKey(0), masks)["params"]
  return nn.meta.unbox(boxed)


def draw(cfg, ids, seed=1):
  return helpers.draw_masks(cfg, ids, VOCAB, seed)


def padding_reference_loss(cfg, params, ids, masks):
  """MAE-LM the way variable-length code (fairseq) does it, at full length:
  masked slots become padding for the encoder (excluded as keys), then the decoder
  reads encoder outputs with the [MASK] embedding at masked slots; the head runs at
  every position and the loss is averaged over masked positions."""
  ids = jnp.asarray(ids)
  batch, seq_len = ids.shape
  is_masked = jnp.zeros((batch, seq_len), bool).at[
      jnp.arange(batch)[:, None], masks.masked_positions].set(True)

  def forward(mdl):
    positions = jnp.broadcast_to(jnp.arange(seq_len), ids.shape)
    enc = mdl.encoder(mdl.token_embed(ids), positions, ~is_masked & (ids != 0))
    mask_vector = mdl.token_embed.embedding[4]
    dec_in = jnp.where(is_masked[..., None], mask_vector, enc)
    if cfg.decoder_type == "self":
      dec = mdl.decoder(dec_in, positions, jnp.ones_like(is_masked))
    else:
      dec = dec_in
    return mdl.lm_head(dec, mdl.token_embed.embedding)

  logits = jax.jit(nn.apply(forward, model_lib.MaskedLM(cfg)))({"params": params})
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), ids[..., None], -1)[..., 0]
  return float((nll * is_masked).sum() / is_masked.sum())


@pytest.mark.parametrize("ln_type,rel,position", [
    ("post", True, "learned"), ("pre", False, "learned"),
    # Rotary positions, no bias: the visible tokens and the decoder's [MASK]
    # slots are rotated by their original positions, as at full length.
    ("pre", False, "rope")])
def test_maelm_loss_equals_padding_reference(ln_type, rel, position):
  cfg = build("maelm", **{"model.ln_type": ln_type, "model.position": position,
                          "model.relative_position_bias": rel})
  ids = random_ids(4, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  logits = helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks)
  assert logits.shape == (4, cfg.mask_counts(32).num_selected, VOCAB)
  loss_sum, _, weight = model_lib.masked_lm_loss(logits, masks.targets,
                                                 masks.selected_weights)
  ours = float(loss_sum / weight)
  reference = padding_reference_loss(cfg, params, ids, masks)
  assert ours == pytest.approx(reference, rel=1e-5)
  assert ours == pytest.approx(np.log(VOCAB), rel=0.1)  # Untrained: near uniform.
  assert ("position_embed" in params["encoder"]) == (position == "learned")


def test_rotary_scores_depend_only_on_the_positions_difference():
  """q . k after `rotary` at positions (i, j) equals it at (i + s, j + s), and
  differs from the unrotated product once i != j; position 0 is the identity."""
  rng = np.random.RandomState(0)
  q = jnp.asarray(rng.randn(1, 5, 2, 8), jnp.float32)
  k = jnp.asarray(rng.randn(1, 5, 2, 8), jnp.float32)
  positions = jnp.asarray([[0, 3, 4, 9, 20]])

  def scores(shift):
    rq, rk = model_lib.rotary(q, positions + shift), model_lib.rotary(k, positions + shift)
    return np.asarray(jnp.einsum("bqhd,bkhd->bhqk", rq, rk))

  np.testing.assert_allclose(scores(0), scores(37), rtol=1e-4, atol=1e-5)
  plain = np.asarray(jnp.einsum("bqhd,bkhd->bhqk", q, k))
  assert np.abs(scores(0) - plain).max() > 0.1
  np.testing.assert_allclose(np.diagonal(scores(0), axis1=2, axis2=3),
                             np.diagonal(plain, axis1=2, axis2=3), rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(model_lib.rotary(q, jnp.zeros((1, 5), int))),
                                np.asarray(q))


def test_mlm_is_a_plain_encoder_with_a_sparse_head():
  cfg = build("mlm")
  ids = random_ids(4, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  assert set(params) == {"token_embed", "encoder", "lm_head"}
  logits = helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks)

  def dense_head(mdl):  # Head on every position, then read the selected ones.
    hidden = mdl.encoder(mdl.token_embed(masks.encoder_ids), masks.encoder_positions,
                         masks.encoder_ids != 0)
    return mdl.lm_head(hidden, mdl.token_embed.embedding)
  full = jax.jit(nn.apply(dense_head, model_lib.MaskedLM(cfg)))({"params": params})
  expected = jnp.take_along_axis(full, masks.selected_positions[..., None], axis=1)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_cross_decoder_reads_only_selected_slots():
  cfg = build("3ml", **{"model.decoder_type": "cross"})
  ids = random_ids(2, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  assert "cross_attn" in params["decoder"]["layer_0"]
  logits = helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks)
  assert logits.shape == (2, cfg.mask_counts(32).num_selected, VOCAB)
  # The decoder sequence is the K selected slots: logits at one slot depend on the
  # encoder (cross-attention), so changing a visible unselected token changes them.
  visible_only = np.setdiff1d(np.asarray(masks.encoder_positions[0]),
                              np.asarray(masks.selected_positions[0]))
  idx = int(np.flatnonzero(np.asarray(masks.encoder_positions[0]) == visible_only[3])[0])
  changed = masks.encoder_ids.at[0, idx].set(7 if masks.encoder_ids[0, idx] != 7 else 8)
  other = helpers.apply(model_lib.MaskedLM(cfg),
      {"params": params}, masks.__class__(**{**masks.__dict__, "encoder_ids": changed}))
  assert not np.allclose(logits[0], other[0])
  np.testing.assert_allclose(logits[1], other[1], rtol=1e-6)


def test_encoder_view_needs_no_decoder_and_matches_pretraining_encoder():
  cfg = build("maelm")
  ids = random_ids(2, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  enc_params = model_lib.encoder_params(params)
  assert set(enc_params) == {"token_embed", "encoder"}
  out = helpers.apply(model_lib.Encoder(cfg), {"params": enc_params}, jnp.asarray(ids))
  assert out.shape == (2, 32, cfg.hidden)
  # Same weights, same computation as inside the pretraining model.
  inner = jax.jit(nn.apply(lambda m: m.encoder(m.token_embed(jnp.asarray(ids)),
                                       jnp.broadcast_to(jnp.arange(32), ids.shape),
                                       jnp.asarray(ids) != 0),
                   model_lib.MaskedLM(cfg)))({"params": params})
  np.testing.assert_allclose(out, inner, rtol=1e-6)


def test_relative_bucket_is_symmetric_exact_then_logarithmic():
  rel = jnp.arange(-200, 201)
  buckets = np.asarray(relative_position.t5_bucket(rel, 32, 128))
  assert buckets.min() >= 0 and buckets.max() < 32
  assert len(set(buckets[195:206])) == 11  # Distances below 8 are exact.
  assert buckets[200 + 150] == buckets[200 + 128]  # Beyond max distance: one bucket.
  assert buckets[0] != buckets[-1]  # Direction matters.


def test_bf16_compute_keeps_fp32_params_and_logits():
  cfg = build("maelm", **{"model.dtype": "bfloat16"})
  ids = random_ids(2, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(params))
  logits = helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks)
  assert logits.dtype == jnp.float32
  cfg32 = build("maelm")
  logits32 = helpers.apply(model_lib.MaskedLM(cfg32), {"params": params}, masks)
  np.testing.assert_allclose(logits, logits32, atol=0.05)


def test_local_relative_bias_init_prefers_near_neighbours():
  table = np.asarray(relative_position.local_bias_init(build("mlm"))(None, (32, 4)))
  offsets = jnp.arange(-128, 129)
  buckets = np.asarray(relative_position.t5_bucket(offsets, 32, 128))
  bias = table[buckets]  # [offset, head]
  # Head 0: slope 1 (bias -|d| for exact buckets); the last head: slope 1/64.
  for d in (0, 1, 2, 7):
    np.testing.assert_allclose(bias[128 + d], -d * np.array([1, 64**(-1 / 3),
                                                             64**(-2 / 3), 1 / 64]),
                               rtol=1e-6)
    np.testing.assert_allclose(bias[128 - d], bias[128 + d])  # Symmetric.
  # Non-increasing with distance in every head, for both directions.
  assert np.all(np.diff(bias[128:], axis=0) <= 0)
  assert np.all(np.diff(bias[:129][::-1], axis=0) <= 0)


@pytest.mark.parametrize("decoder_type", ["self", "cross"])
def test_decoder_relative_bias_is_its_own_and_reads_original_positions(decoder_type):
  cfg = build("3ml", **{"model.decoder_type": decoder_type,
                        "model.decoder_relative_position_bias": True,
                        "model.position": "learned", "model.relative_position_bias": True,
                        "model.relative_bias_init": "local"})
  ids = random_ids(2, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  assert "relative_bias" in params["encoder"] and "relative_bias" in params["decoder"]
  assert ("cross_relative_bias" in params["decoder"]) == (decoder_type == "cross")
  # Starting local: head 0 of the decoder's table is -distance at exact buckets.
  table = np.asarray(params["decoder"]["relative_bias"]["table"])
  assert table[0, 0] == 0.0 and table[1, 0] == -1.0
  # The bias moves the predictions: a flat table gives other logits.
  logits = helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks)
  flat = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.zeros_like(x) if "relative_bias" in jax.tree_util.keystr(p)
      and "decoder" in jax.tree_util.keystr(p) else x, params)
  other = helpers.apply(model_lib.MaskedLM(cfg), {"params": flat}, masks)
  assert not np.allclose(logits, other, atol=1e-4)
  without = build("3ml", **{"model.decoder_type": decoder_type,
                            "model.decoder_relative_position_bias": False})
  assert "relative_bias" not in init(without, masks)["decoder"]


@pytest.mark.parametrize("position", ["learned", "rope"])
def test_zero_init_residual_makes_every_layer_start_as_the_identity(position):
  cfg = build("maelm", **{"model.zero_init_residual": True, "model.ln_type": "pre",
                          "model.position": position})
  ids = random_ids(2, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  layer = params["encoder"]["layer_0"]
  assert not np.any(layer["self_attn"]["out"]["kernel"])
  assert not np.any(layer["mlp"]["wo"]["kernel"])
  assert np.any(layer["mlp"]["wi"]["kernel"])
  # Pre-LN with identity layers: the encoder is final_ln(token + position), or
  # final_ln(token) under rotary positions (they turn queries and keys only).
  out = helpers.apply(model_lib.Encoder(cfg), {"params": model_lib.encoder_params(params)},
                      jnp.asarray(ids))
  assert ("position_embed" in params["encoder"]) == (position == "learned")

  def embeddings_only(mdl):
    positions = jnp.broadcast_to(jnp.arange(32), ids.shape)
    x = mdl.token_embed(jnp.asarray(ids))
    if position == "learned":
      x = x + mdl.encoder.variables["params"]["position_embed"]["embedding"][positions]
    ln = nn.LayerNorm(epsilon=1e-5)
    return ln.apply({"params": mdl.encoder.variables["params"]["final_ln"]}, x)
  expected = jax.jit(nn.apply(embeddings_only, model_lib.Encoder(cfg)))(
      {"params": model_lib.encoder_params(params)})
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_cls_is_untied_from_relative_positions():
  """[CLS] reads and is read by content alone (TUPE): no positional bias in its
  row or column, whatever the table; every other pair keeps its bucket's bias."""
  cfg = build("mlm", **{"model.relative_bias_init": "local"})
  positions = jnp.arange(12)[None]
  module = model_lib.RelativePositionBias(cfg)
  params = nn.meta.unbox(jax.jit(module.init)(jax.random.PRNGKey(0), positions, positions))
  bias = np.asarray(helpers.apply(module, params, positions, positions))[0]  # [H, n, m]
  assert not np.any(bias[:, 0, :]) and not np.any(bias[:, :, 0])
  table = np.asarray(params["params"]["table"])
  buckets = np.asarray(relative_position.t5_bucket(
      positions[0][None, :] - positions[0][:, None], cfg.relative_buckets,
      cfg.relative_max_distance))
  np.testing.assert_allclose(bias[:, 1:, 1:],
                             np.transpose(table[buckets[1:, 1:]], (2, 0, 1)))
  assert bias[0, 5, 6] == -1.0 and bias[0, 5, 8] == -3.0  # Local elsewhere.


@pytest.mark.parametrize("objective", ["mlm", "maelm"])
def test_untied_embeddings_move_only_the_words_that_were_read(objective):
  """With `tie_embeddings=False` the softmax trains the head's own output
  embedding, so a piece the batch never reads gets no gradient on its input
  embedding; tied, every piece's row is pushed by the softmax."""
  ids = random_ids(2, 32, VOCAB)
  grads = {}
  for tied in (True, False):
    cfg = build(objective, **{"model.tie_embeddings": tied})
    masks = draw(cfg, ids)
    params = init(cfg, masks)
    assert ("embedding" in params["lm_head"]) == (not tied)

    def loss(p):
      logits = helpers.apply(model_lib.MaskedLM(cfg), {"params": p}, masks)
      total, _, weight = model_lib.masked_lm_loss(logits, masks.targets,
                                                  masks.selected_weights)
      return total / weight

    grads[tied] = jax.grad(loss)(params)
  read = np.zeros(VOCAB, bool)
  read[np.asarray(masks.encoder_ids).ravel()] = True
  read[4] = True  # [MASK]: the decoder / MLM input reads its embedding.
  row_norm = lambda g: np.linalg.norm(np.asarray(g["token_embed"]["embedding"]), axis=1)
  assert (~read).sum() > 10  # Enough unread pieces for the check to mean something.
  assert np.all(row_norm(grads[False])[~read] == 0.0)
  assert np.all(row_norm(grads[False])[read] > 0.0)
  assert np.all(row_norm(grads[True])[~read] > 0.0)
  assert np.any(np.asarray(grads[False]["lm_head"]["embedding"]))


def test_activation_dropout_is_its_own_knob_and_off_by_default():
  """The dropout on the FFN's hidden units (after GELU) follows
  `model.activation_dropout`, which is 0 by default as in BERT, RoBERTa and MAE-LM,
  not `model.dropout`; runs saved before the knob existed read back as they ran."""
  ids = random_ids(2, 32, VOCAB)

  def encode(cfg, params, train):
    return helpers.apply(
        model_lib.Encoder(cfg, deterministic=not train),
        {"params": model_lib.encoder_params(params)}, jnp.asarray(ids),
        rngs={"dropout": jax.random.PRNGKey(3)})

  no_dropout = {"model.dropout": 0.0, "model.attention_dropout": 0.0}
  default = build("mlm", **no_dropout)
  assert default.activation_dropout == 0.0
  params = init(default, draw(default, ids))  # (the knob adds no parameter)
  np.testing.assert_array_equal(encode(default, params, True),
                                encode(default, params, False))
  ffn_only = build("mlm", **no_dropout, **{"model.activation_dropout": 0.5})
  changed = np.abs(np.asarray(encode(ffn_only, params, True)
                              - encode(ffn_only, params, False)))
  assert changed.mean() > 0.1, changed.mean()

  # A config.json from before the knob: the FFN dropped out at `dropout`.
  saved = tiny_config("mlm", **{"model.dropout": 0.1}).to_dict()
  del saved["model"]["activation_dropout"]
  # As every reader of a saved config gets it (core.workdir.read_config).
  read_back = ml_collections.ConfigDict(config_defaults.complete(saved))
  legacy = model_lib.ModelConfig.from_config(read_back.model, vocab_size=VOCAB,
                                             mask_id=4)
  assert legacy.activation_dropout == 0.1
  now = tiny_config("mlm", **{"model.dropout": 0.1}).to_dict()
  assert config_lib.config_differences(saved, now) == [
      "model.activation_dropout: 0.1 -> 0.0"]
  assert config_lib.resume_flags(saved, now) == ["--config.model.activation_dropout=0.1"]
  as_it_ran = tiny_config("mlm", **{"model.dropout": 0.1,
                                    "model.activation_dropout": 0.1}).to_dict()
  assert config_lib.config_differences(saved, as_it_ran) == []
  # Runs without dropout (the fast recipe) resume unchanged.
  old_fast = tiny_config("mlm", **no_dropout).to_dict()
  del old_fast["model"]["activation_dropout"]
  assert config_lib.config_differences(
      old_fast, tiny_config("mlm", **no_dropout).to_dict()) == []


@pytest.mark.parametrize("max_positions", [32, 64, 100, 512])
def test_local_init_with_the_releases_buckets_at_any_max_positions(max_positions):
  """With the release's bucket function and sequences shorter than its max
  distance, every offset a sequence can hold reads -slope * (the smallest |offset|
  of its bucket); none is numbered below 0 and wrapped onto another row."""
  cfg = build("maelm", **{"model.relative_bucket_fn": "mae_lm",
                          "model.relative_buckets": 64,
                          "model.max_positions": max_positions})
  table = np.asarray(relative_position.local_bias_init(cfg)(None, (64, 4)))
  reach = min(cfg.relative_max_distance, max_positions - 1)
  offsets = np.arange(-reach, reach + 1)
  buckets = np.asarray(relative_position.bucket(jnp.asarray(offsets), cfg))
  assert buckets.min() >= 0 and buckets.max() < 64
  nearest = {}
  for offset, b in zip(offsets, buckets):
    nearest[b] = min(nearest.get(b, np.inf), abs(offset))
  for offset, b in zip(offsets, buckets):
    np.testing.assert_allclose(table[b, 0], -nearest[b], err_msg=str(offset))
  assert table[buckets[reach], 0] == 0  # The token itself.
  # Rows no offset of such a sequence reaches keep the farthest value (before,
  # far offsets numbered below 0 wrapped onto them).
  unreached = sorted(set(range(64)) - set(buckets.tolist()))
  np.testing.assert_allclose(table[unreached, 0], -cfg.relative_max_distance)


def padded_masks(ids, real, counts):
  """Masks of a `[CLS] doc [SEP] [PAD]..` row that predict the tokens at `real`
  ([MASK]ed / removed) and fill the rest of the static counts with padding, as
  per-row counts do (masking.py)."""
  pads = [int(p) for p in np.flatnonzero(ids == 0)]
  fill_mask = pads[:counts.num_mask - len(real)]
  fill_rest = pads[len(fill_mask):len(fill_mask) + counts.num_random + counts.num_keep]
  masked = sorted(real + fill_mask)
  selected = sorted(real + fill_mask + fill_rest)
  visible = [p for p in range(len(ids)) if p not in masked]
  return masking.Masks(
      selected_positions=jnp.asarray([selected], jnp.int32),
      selected_weights=jnp.asarray([[float(p in real) for p in selected]]),
      targets=jnp.asarray([ids[selected]], jnp.int32),
      encoder_ids=jnp.asarray([ids[visible]], jnp.int32),
      encoder_positions=jnp.asarray([visible], jnp.int32),
      masked_positions=jnp.asarray([masked], jnp.int32))


@pytest.mark.parametrize("decoder_type", ["self", "cross"])
def test_padding_that_fills_the_static_count_is_never_read(decoder_type):
  """A short document in rows padded to 32 or 48 positions, the same 3 tokens
  predicted: the predictions are the same, so the [MASK] slots that only fill a
  row's static count (padding) are read by no attention, the decoder's included."""
  cfg = build("maelm", **{"model.decoder_type": decoder_type,
                          "model.decoder_relative_position_bias": True})
  doc = random_ids(1, 14, VOCAB)[0]  # [CLS] 12 tokens [SEP]
  real = [2, 5, 9]
  logits = []
  for length in (32, 48):
    ids = np.concatenate([doc, np.zeros(length - len(doc), np.int32)])
    masks = padded_masks(ids, real, cfg.mask_counts(length))
    params = init(cfg, padded_masks(np.concatenate([doc, np.zeros(18, np.int32)]),
                                    real, cfg.mask_counts(32)))
    out = np.asarray(helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks))
    picked = np.asarray(masks.selected_weights[0]) == 1
    logits.append(out[0][picked])
  assert logits[0].shape == (3, VOCAB)
  np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)


def test_relative_bias_lookup_has_indexings_values_and_gradient():
  """`relative_position.lookup` replaces the scatter-add of indexing's gradient by
  a masked sum per table row: the same numbers, buckets repeated and unused
  alike (row 31 is never read here, and must get a zero gradient)."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  table = jax.random.normal(k1, (32, 6))
  buckets = jax.random.randint(k2, (3, 17, 19), 0, 31)
  g = jax.random.normal(k3, (3, 17, 19, 6))
  np.testing.assert_array_equal(relative_position.lookup(table, buckets),
                                table[buckets])
  ours = jax.grad(lambda t: jnp.sum(relative_position.lookup(t, buckets) * g))(table)
  plain = jax.grad(lambda t: jnp.sum(t[buckets] * g))(table)
  np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-5)
  assert float(jnp.abs(ours[31]).max()) == 0.0 and float(jnp.abs(ours[:31]).min()) > 0


def test_cudnn_gets_its_bias_in_the_activation_dtype_cast_once(monkeypatch):
  """bf16 layers on the cuDNN path read a bf16 bias made once before the stack
  (not a float32 one cast in every layer); the einsum path keeps float32."""
  from maelm_jax.modeling import attention
  cfg = build("mlm", **{"model.attention_dropout": 0.0, "model.dropout": 0.0,
                        "model.dtype": "bfloat16"})
  ids = random_ids(2, 16, VOCAB, num_pad=3)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  seen = []

  def fused_via_xla(q, k, v, bias, implementation, key_lengths=None):
    seen.append(bias.dtype)
    return attention.fused_attention.__wrapped__(q, k, v, bias, "xla", pad_odd=True,
                                                 key_lengths=key_lengths)

  fused_via_xla.__wrapped__ = attention.fused_attention
  monkeypatch.setattr(attention, "fused_attention", fused_via_xla)
  for backend, expected in (("cudnn", jnp.bfloat16), ("xla", None)):
    seen.clear()
    monkeypatch.setattr(model_lib.ModelConfig, "attention_backend",
                        lambda self, *a, b=backend: b)
    helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks)
    assert ({jnp.dtype(d) for d in seen} == {jnp.dtype(expected)}) if expected \
        else not seen


def test_rows_padded_at_their_end_run_to_their_last_token(monkeypatch):
  """`Encoder.right_padded` (the pipelines' rows): a row's length is one past its
  last real token, at least 1, and a row of padding only (a batch filled up) stays
  finite on the einsum and on the cuDNN call with key lengths (run through jax's
  XLA implementation), with the same outputs."""
  from maelm_jax.modeling import attention
  valid = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0],
                       [1, 0, 1, 0, 0]], bool)
  np.testing.assert_array_equal(model_lib.row_lengths(valid), [3, 5, 1, 3])
  cfg = build("mlm", **{"model.attention_dropout": 0.0, "model.dropout": 0.0})
  ids = random_ids(3, 16, VOCAB, num_pad=4)
  ids[2] = 0  # Padding only.
  encoder = model_lib.Encoder(cfg, right_padded=True)
  params = jax.jit(encoder.init)(jax.random.PRNGKey(0), ids)
  einsum = helpers.apply(encoder, params, ids)
  original = attention.fused_attention
  monkeypatch.setattr(attention, "fused_attention",
                      lambda q, k, v, bias, implementation, key_lengths=None: original(
                          q, k, v, bias, "xla", pad_odd=True, key_lengths=key_lengths))
  monkeypatch.setattr(model_lib.ModelConfig, "attention_backend",
                      lambda self, *a: "cudnn")
  fused = helpers.apply(encoder, params, ids)
  assert np.isfinite(np.asarray(einsum)).all() and np.isfinite(np.asarray(fused)).all()
  np.testing.assert_allclose(np.asarray(fused), np.asarray(einsum), rtol=1e-5, atol=1e-5)


def _float32(cfg):
  return cfg.__class__(**{**cfg.__dict__, "dtype": jnp.float32})


def test_geglu_is_gelu_of_one_projection_times_the_other():
  cfg = _float32(build("mlm", **{"model.mlp_activation": "geglu"}))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 8, cfg.hidden)), jnp.float32)
  mlp = model_lib.Mlp(cfg, 0.0, True)
  params = nn.meta.unbox(jax.jit(mlp.init)(jax.random.PRNGKey(0), x)["params"])
  assert set(params) == {"wi_0", "wi_1", "wo"}  # MaxText's names for a gated FFN.
  dense = lambda p, h: h @ p["kernel"] + p["bias"]
  expected = dense(params["wo"], jax.nn.gelu(dense(params["wi_0"], x), approximate=False)
                   * dense(params["wi_1"], x))
  np.testing.assert_allclose(helpers.apply(mlp, {"params": params}, x), expected,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("normformer", [False, True])
def test_normformer_norms_each_attention_output_and_the_ffn_hidden_units(normformer):
  """With NormFormer's LayerNorms, scaling an attention's output projection, or
  GEGLU's linear half, changes nothing (a LayerNorm follows each); without
  them it changes the encoder's output."""
  cfg = _float32(build("3ml", **{"model.decoder_type": "cross",
                                 "model.mlp_activation": "geglu",
                                 "model.normformer": normformer,
                                 # At init a branch's output is small enough
                                 # for RoBERTa's 1e-5 to matter.
                                 "model.layer_norm_eps": 1e-12}))
  ids = random_ids(2, 32, VOCAB)
  masks = draw(cfg, ids)
  params = init(cfg, masks)
  layer = params["decoder"]["layer_0"]
  has = {"self_attn_out_ln", "cross_attn_out_ln"} <= set(layer)
  assert has == normformer and ("mid_ln" in layer["mlp"]) == normformer
  logits = helpers.apply(model_lib.MaskedLM(cfg), {"params": params}, masks)
  for path in (("encoder", "layer_0", "self_attn", "out"),
               ("encoder", "layer_1", "mlp", "wi_1"),
               ("decoder", "layer_0", "cross_attn", "out")):
    scaled = jax.tree.map(lambda x: x, params)
    node = scaled
    for key in path[:-1]:
      node = node[key]
    node[path[-1]] = jax.tree.map(lambda x: 3.0 * x, node[path[-1]])
    moved = np.abs(np.asarray(helpers.apply(model_lib.MaskedLM(cfg), {"params": scaled}, masks)
                              - logits)).max()
    if normformer:
      assert moved < 1e-3, (path, moved)
    else:
      assert moved > 1e-2, (path, moved)

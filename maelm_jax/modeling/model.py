"""Transformer encoder and the masked-LM objective family (MLM, MAE-LM, 3ML).

One model, three objectives, chosen by knobs (see `ModelConfig`):

  objective  encoder input                    after the encoder              head on
  ---------  -------------------------------  -----------------------------  --------
  mlm        all L tokens, [MASK] in place    nothing (decoder_type='none')  K slots
  maelm      the L-K visible tokens           [MASK] re-inserted, decoder    K slots
  3ml        L-K_mask tokens (random-replaced  as maelm; decoder 'self' over   K slots
             and kept tokens stay visible)     L or 'cross' from the K slots

The parameter tree is `{token_embed, encoder, decoder?, lm_head}`; `token_embed` and
`encoder` alone make the fine-tuning encoder (`encoder_params`), so the decoder is
never built or loaded downstream.

Parameters carry logical axis names (`embed`, `mlp`, `heads`, `kv`, `vocab`, ...)
that `sharding.LOGICAL_AXIS_RULES` maps onto the ('data', 'fsdp', 'tensor') mesh.
Parameters are float32; matmuls run in `dtype` (bf16 by default) and softmax, layer
norm statistics and the loss in float32.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from maelm_jax.core import sharding
from maelm_jax.modeling import attention, masking, param_layout
from maelm_jax.modeling import relative_position

SIZES = {
    # name: (layers, hidden, heads, mlp, default decoder layers)
    "tiny": (2, 128, 2, 512, 1),
    "small": (4, 256, 4, 1024, 2),
    "base": (12, 768, 12, 3072, 4),
    "large": (24, 1024, 16, 4096, 4),
}

# Defaults each objective preset starts from; every field is an independent knob.
OBJECTIVES = {
    "mlm": dict(mask_ratio=0.15, random_replace_prob=0.1, keep_prob=0.1,
                drop_masked=False, decoder_type="none"),
    "maelm": dict(mask_ratio=0.15, random_replace_prob=0.0, keep_prob=0.0,
                  drop_masked=True, decoder_type="self"),
    "3ml": dict(mask_ratio=0.5, random_replace_prob=0.1, keep_prob=0.1,
                drop_masked=True, decoder_type="self"),
}
DECODER_TYPES = ("none", "self", "cross")
LN_TYPES = ("post", "pre")
MLP_ACTIVATIONS = ("gelu", "geglu")
NEG_INF = -1e9  # additive mask; finite so fully-masked rows stay NaN-free.

# What a rematerialised layer keeps from its forward pass for the backward pass
# (`jax.checkpoint_policies`); everything else is recomputed. 'none': no remat,
# everything kept; 'full': only the layer's input; 'dots_saveable': the outputs of
# every matmul (recomputes layer norms, GELU, softmax);
# 'dots_with_no_batch_dims_saveable': the outputs of the weight matmuls only (also
# recomputes the attention scores and probabilities, the [B, H, L, L] tensors).
# What each keeps: benchmarks/cpu-speed-and-memory.md.
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots_saveable": jax.checkpoint_policies.dots_saveable,
    "dots_with_no_batch_dims_saveable":
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything the network needs; built from `config.model` by `from_config`."""

  vocab_size: int
  num_layers: int = 2
  hidden: int = 128
  num_heads: int = 2
  mlp: int = 512
  max_positions: int = 512
  ln_type: str = "post"
  # Where positions enter: 'learned', a table of absolute position vectors added
  # to the tokens (BERT, RoBERTa, MAE-LM); 'rope', rotary positions (Su et al.
  # 2021; ModernBERT) applied to every attention's queries and keys at their
  # original positions, no table. Either combines with the relative bias below;
  # rope without it leaves the attention kernels no bias to read.
  position: str = "learned"
  relative_position_bias: bool = True
  relative_buckets: int = 32
  relative_max_distance: int = 128
  # 't5' or the MAE-LM release's 'mae_lm' (relative_position.py).
  relative_bucket_fn: str = "t5"
  # Pairs that touch position 0 ([CLS]) get no position bias (TUPE); False as
  # the MAE-LM release.
  untie_cls_position: bool = True
  # 'local': attention starts out preferring near neighbours (see
  # `local_relative_bias_init`); 'normal': BERT's N(0, 0.02), i.e. no preference.
  relative_bias_init: str = "normal"
  # The FFN: 'gelu' (BERT: wo(gelu(wi x))) or 'geglu' (GLU variants, Shazeer
  # 2020; LTG-BERT and GPT-BERT, the BabyLM winners: wo(gelu(wi_0 x) * wi_1 x)).
  # GEGLU has a third d x mlp matrix: flops.py counts it, and mlp at 2/3 of
  # GELU's keeps the FLOPs and the parameters.
  mlp_activation: str = "gelu"
  # NormFormer's extra LayerNorms (Shleifer et al. 2021; as LTG-BERT has them):
  # one on each attention's output before the residual add (`<site>_out_ln`),
  # one on the FFN's hidden units before `wo` (`mlp/mid_ln`). Elementwise work
  # only: the FLOP model (matmuls) does not change.
  normformer: bool = False
  # Zero-initialised output projections of every residual branch (attention
  # `out`, MLP `wo`): each layer starts as the identity (Fixup / ReZero style).
  zero_init_residual: bool = False
  dropout: float = 0.1
  attention_dropout: float = 0.1
  # Dropout on the encoder's FFN hidden units, after GELU (fairseq's
  # --activation-dropout). 0, as in BERT, RoBERTa and MAE-LM: their FFN has no
  # dropout inside. Runs made before this knob existed used `dropout` there, and
  # read back that way (`core.config_defaults.ADDED_KEYS`).
  activation_dropout: float = 0.0
  dtype: Any = jnp.bfloat16
  attention_impl: str = "auto"
  remat: bool = False  # Shorthand for remat_policy='full'.
  remat_policy: str = "none"
  # One `nn.scan` over identical layers: the step compiles once per stack instead
  # of once per layer. Parameters are stored stacked (`layers/...` with a leading
  # layer axis) instead of `layer_0/...`; `stack_layers`/`unstack_layers` convert,
  # and every reader of checkpoints (init_from, fine-tuning, analysis, export)
  # takes either layout.
  scan_layers: bool = False
  # Objective knobs.
  mask_ratio: float = 0.15
  random_replace_prob: float = 0.0
  keep_prob: float = 0.0
  drop_masked: bool = True
  decoder_type: str = "self"
  decoder_layers: int = 1
  decoder_dropout: float = 0.0
  # The decoder's own relative position bias (MAE-LM's --decoder-rel-pos).
  decoder_relative_position_bias: bool = False
  # False: the LM head predicts with its own output embedding, so a word's input
  # embedding moves only when the word is read. Tied (BERT, RoBERTa, MAE-LM), the
  # softmax pushes every unread word's embedding the same way each step, and rare
  # words collapse into one direction ("representation degeneration", Gao et al.
  # 2019): measured here, rare-piece embeddings at mean cosine 0.90 after 4000
  # tiny steps, and an encoder worse than random initialisation on SST-2.
  tie_embeddings: bool = True
  mask_id: int = 4
  # 1e-5 as RoBERTa; an imported BERT keeps its 1e-12.
  layer_norm_eps: float = 1e-5
  # Each row masks mask_ratio of its own tokens (masking.py): set by the training
  # loop for data.rows=complete_doc, whose rows are padded.
  mask_per_row: bool = False

  @classmethod
  def from_config(cls, model_cfg, vocab_size: int, mask_id: int) -> "ModelConfig":
    layers, hidden, heads, mlp, _ = SIZES[model_cfg.size]
    return cls(
        vocab_size=vocab_size,
        num_layers=model_cfg.get("num_layers") or layers,
        hidden=model_cfg.get("hidden") or hidden,
        num_heads=model_cfg.get("num_heads") or heads,
        mlp=model_cfg.get("mlp") or mlp,
        max_positions=model_cfg.max_positions,
        ln_type=model_cfg.ln_type,
        position=model_cfg.position,
        relative_position_bias=model_cfg.relative_position_bias,
        relative_buckets=model_cfg.relative_buckets,
        relative_max_distance=model_cfg.relative_max_distance,
        relative_bucket_fn=model_cfg.relative_bucket_fn,
        untie_cls_position=model_cfg.untie_cls_position,
        relative_bias_init=model_cfg.relative_bias_init,
        zero_init_residual=model_cfg.zero_init_residual,
        mlp_activation=model_cfg.mlp_activation,
        normformer=model_cfg.normformer,
        dropout=model_cfg.dropout,
        attention_dropout=model_cfg.attention_dropout,
        activation_dropout=model_cfg.activation_dropout,
        dtype=jnp.dtype(model_cfg.dtype),
        attention_impl=model_cfg.attention_impl,
        remat=model_cfg.remat,
        remat_policy=model_cfg.remat_policy,
        scan_layers=model_cfg.scan_layers,
        mask_ratio=model_cfg.mask_ratio,
        random_replace_prob=model_cfg.random_replace_prob,
        keep_prob=model_cfg.keep_prob,
        drop_masked=model_cfg.drop_masked,
        decoder_type=model_cfg.decoder_type,
        decoder_layers=model_cfg.decoder_layers,
        decoder_dropout=model_cfg.decoder_dropout,
        decoder_relative_position_bias=model_cfg.decoder_relative_position_bias,
        tie_embeddings=model_cfg.tie_embeddings,
        mask_id=mask_id,
        layer_norm_eps=model_cfg.layer_norm_eps,
    )

  def mask_counts(self, seq_len: int) -> masking.MaskCounts:
    return masking.MaskCounts.create(seq_len, self.mask_ratio,
                                     self.random_replace_prob, self.keep_prob,
                                     self.drop_masked, self.mask_per_row)

  @property
  def head_dim(self) -> int:
    return self.hidden // self.num_heads

  @property
  def effective_remat_policy(self) -> str:
    return "full" if self.remat and self.remat_policy == "none" else self.remat_policy

  def attention_backend(self, dropout_active: bool, q_len: int = 2,
                        kv_len: int = 2) -> str:
    """What `attention_impl` resolves to for these lengths (attention.resolve)."""
    return attention.resolve(self.attention_impl, dtype=self.dtype,
                             head_dim=self.head_dim, dropout_active=dropout_active,
                             q_len=q_len, kv_len=kv_len)



def _dense_init():
  return nn.initializers.normal(stddev=0.02)  # BERT init.


def _dense(cfg, features: int, name: str, kernel_axes: tuple[str, str],
           bias_axis: str, init=None) -> nn.Dense:
  """A Dense layer in `cfg.dtype`, BERT-initialised unless `init`, its kernel and
  bias named by logical axes (sharding.LOGICAL_AXIS_RULES)."""
  return nn.Dense(features, dtype=cfg.dtype, name=name,
                  kernel_init=nn.with_logical_partitioning(init or _dense_init(),
                                                           kernel_axes),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                         (bias_axis,)))


def _residual_out_init(cfg):
  return nn.initializers.zeros if cfg.zero_init_residual else _dense_init()


def _constrain(x, axes):
  """x laid out by its logical `axes` (sharding.LOGICAL_AXIS_RULES: the rows over
  data x fsdp, heads and the FFN's units over tensor) on the mesh the step is
  traced for (`attention.kernel_mesh`, set by train_lib's steps); a mesh axis a
  dimension does not divide is left out. Outside a step (or on one device) x is
  returned as it is. Without these constraints XLA propagated the activations'
  layout from the parameters', and under fsdp sharded activations as the weights
  are, moving 6x the HBM bytes of the data-parallel step (benchmarks/tpu-plans.md)."""
  mesh = attention.current_mesh()
  if mesh is None or mesh.size == 1:
    return x
  rules = dict(sharding.LOGICAL_AXIS_RULES)
  spec = []
  for dim, name in zip(x.shape, axes):
    mesh_axes = rules.get(name)
    mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes or ())
    size = 1
    for axis in mesh_axes:
      size *= mesh.shape[axis]
    spec.append(mesh_axes if mesh_axes and dim % size == 0 else None)
  return jax.lax.with_sharding_constraint(
      x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))


class RelativePositionBias(nn.Module):
  """One table shared by all layers (as MAE-LM/COCO-LM do), indexed by the
  original positions, so removed tokens leave the distances of the others intact."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, q_positions, k_positions):
    cfg = self.cfg
    init = (relative_position.local_bias_init(cfg)
            if cfg.relative_bias_init == "local" else _dense_init())
    table = self.param(
        "table",
        nn.with_logical_partitioning(init, ("rel_buckets", "heads")),
        (cfg.relative_buckets, cfg.num_heads), jnp.float32)
    rel = k_positions[:, None, :] - q_positions[:, :, None]  # [B, n, m]
    bias = relative_position.lookup(  # [B, n, m, H]
        table, relative_position.bucket(rel, cfg))
    if cfg.untie_cls_position:
      # [CLS] (position 0) is untied from positions (TUPE, Ke et al. 2021): it
      # reads and is read by content alone. Fine-tuning classifies from [CLS];
      # tied, a local table made it see only its first neighbours, and GLUE
      # fine-tuning of such encoders stayed at chance. (The MAE-LM release, and
      # recipe=paper, bias every pair.)
      untied = (q_positions[:, :, None] == 0) | (k_positions[:, None, :] == 0)
      bias = jnp.where(untied[..., None], 0.0, bias)
    return jnp.transpose(bias, (0, 3, 1, 2))  # [B, H, n, m]


POSITIONS = ("learned", "rope")
ROPE_THETA = 10000.0  # The rotary frequencies' base (RoFormer's, GPT-NeoX's).


def rotary(x, positions):
  """Rotary positions (Su et al. 2021) on x [B, L, H, d] at `positions` [B|1, L]:
  the pairs (x[i], x[i + d/2]) turned by positions * theta^(-2i/d), in float32
  (the rotate-half layout of GPT-NeoX, transformers' RoPE and ModernBERT). Then
  q . k depends on the positions only through their difference."""
  half = x.shape[-1] // 2
  frequencies = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angles = positions.astype(jnp.float32)[..., None] * frequencies  # [B|1, L, d/2]
  cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin],
                         axis=-1).astype(x.dtype)


class Attention(nn.Module):
  cfg: ModelConfig
  dropout_rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, x_q, x_kv, bias, key_lengths=None, q_positions=None,
               k_positions=None):
    """bias: additive float32 [B|1, H|1, n, m] (padding mask + position bias), or
    None; key_lengths: int32 [B], given only where a kernel (cuDNN, the TPU
    kernel) runs and the padding mask is not in the bias: row b's keys from
    key_lengths[b] on are padding. q_positions [B|1, n] and k_positions
    [B|1, m]: the original positions of queries and keys, which rotate them
    under `position='rope'`."""
    cfg = self.cfg
    proj = lambda name: nn.DenseGeneral(
        (cfg.num_heads, cfg.head_dim), dtype=cfg.dtype, name=name,
        kernel_init=nn.with_logical_partitioning(_dense_init(),
                                                 ("embed", "heads", "kv")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                               ("heads", "kv")))
    q = proj("query")(x_q)
    k = proj("key")(x_kv)
    v = proj("value")(x_kv)
    if cfg.position == "rope":
      q, k = rotary(q, q_positions), rotary(k, k_positions)
    q = _constrain(q, ("batch", "act_len", "act_heads", "act_kv"))
    dropout_active = self.dropout_rate > 0 and not self.deterministic
    backend = cfg.attention_backend(dropout_active, x_q.shape[1], x_kv.shape[1])
    attention.record_choice(self.scope.path, backend, x_q.shape[1], x_kv.shape[1])
    if backend == "cudnn":
      out = attention.fused_attention(q, k, v, bias, implementation="cudnn",
                                      key_lengths=key_lengths)
    elif backend == "tpu_flash":
      out = attention.tpu_flash_attention(q, k, v, bias, key_lengths)
    else:
      scores = jnp.einsum("bqhd,bkhd->bhqk", q * (1.0 / math.sqrt(cfg.head_dim)), k,
                          preferred_element_type=jnp.float32) + bias
      probs = jax.nn.softmax(scores, axis=-1).astype(cfg.dtype)
      probs = nn.Dropout(self.dropout_rate)(probs, deterministic=self.deterministic)
      out = jnp.einsum("bhqk,bkhd->bqhd", probs, v)
    return nn.DenseGeneral(
        cfg.hidden, axis=(-2, -1), dtype=cfg.dtype, name="out",
        kernel_init=nn.with_logical_partitioning(_residual_out_init(cfg),
                                                 ("heads", "kv", "embed")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                               ("norm",)))(out)


def _layer_norm(cfg, name):
  return nn.LayerNorm(epsilon=cfg.layer_norm_eps, dtype=cfg.dtype, name=name,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones,
                                                              ("norm",)),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                             ("norm",)))


@jax.checkpoint
def exact_gelu(h):
  """GELU with erf (BERT's and RoBERTa's; the exports' `gelu`), whose backward
  recomputes erfc(h) from h: differentiated plainly, the forward keeps both h
  and erfc(h) ([tokens, mlp] each) for the backward, one more array of the
  FFN's widest shape written and read back per layer."""
  return nn.gelu(h, approximate=False)


class Mlp(nn.Module):
  cfg: ModelConfig
  dropout_rate: float
  deterministic: bool

  @nn.compact
  def __call__(self, x):
    cfg = self.cfg
    if cfg.mlp_activation == "geglu":  # MaxText's names for a gated FFN.
      h = (exact_gelu(_dense(cfg, cfg.mlp, "wi_0", ("embed", "mlp"), "mlp")(x))
           * _dense(cfg, cfg.mlp, "wi_1", ("embed", "mlp"), "mlp")(x))
    else:
      h = exact_gelu(_dense(cfg, cfg.mlp, "wi", ("embed", "mlp"), "mlp")(x))
    h = _constrain(h, ("batch", "act_len", "act_mlp"))
    if cfg.normformer:
      h = _layer_norm(cfg, "mid_ln")(h)
    h = nn.Dropout(self.dropout_rate)(h, deterministic=self.deterministic)
    return _dense(cfg, cfg.hidden, "wo", ("mlp", "embed"), "norm",
                  init=_residual_out_init(cfg))(h)


class TransformerLayer(nn.Module):
  """Self-attention, optional cross-attention, MLP; post-LN or pre-LN."""

  cfg: ModelConfig
  dropout_rate: float
  attention_dropout_rate: float
  deterministic: bool
  cross_attention: bool = False
  returns_carry: bool = False  # (x, None): the form `nn.scan` iterates.
  activation_dropout_rate: float | None = None  # None: dropout_rate.

  @nn.compact
  def __call__(self, x, self_bias, memory=None, cross_bias=None, self_key_lengths=None,
               positions=None, memory_positions=None):
    cfg, det = self.cfg, self.deterministic
    drop = lambda y: nn.Dropout(self.dropout_rate)(y, deterministic=det)
    attn = lambda name: Attention(cfg, self.attention_dropout_rate, det, name=name)
    pre = cfg.ln_type == "pre"

    def sublayer(x, fn, name):
      if cfg.normformer and name != "mlp":  # NormFormer: the branch's output normed.
        fn = lambda h, branch=fn: _layer_norm(cfg, f"{name}_out_ln")(branch(h))
      if pre:
        return x + drop(fn(_layer_norm(cfg, f"{name}_ln")(x)))
      return _layer_norm(cfg, f"{name}_ln")(x + drop(fn(x)))

    x = sublayer(x, lambda h: attn("self_attn")(h, h, self_bias, self_key_lengths,
                                                positions, positions),
                 "self_attn")
    if self.cross_attention:
      x = sublayer(x, lambda h: attn("cross_attn")(h, memory, cross_bias, None,
                                                   positions, memory_positions),
                   "cross_attn")
    activation_dropout = (self.dropout_rate if self.activation_dropout_rate is None
                          else self.activation_dropout_rate)
    x = sublayer(x, Mlp(cfg, activation_dropout, det, name="mlp"), "mlp")
    x = _constrain(x, ("batch", "act_len", "act_embed"))
    return (x, None) if self.returns_carry else x


def _bias_for_kernel(cfg, bias, dropout_active: bool, q_len: int, kv_len: int):
  """The additive bias as the layers' attention reads it: cuDNN takes it in the
  activation dtype, at even lengths (`attention.fused_attention` pads odd ones),
  so it is padded and cast here once rather than in every layer, and its
  gradient accumulates across the layers in that dtype (half the bytes, and no
  per-layer conversion of a [B, H, n, m] tensor; benchmarks/gpu-throughput.md,
  "The relative-bias gradient fix"). Other kernels and the einsum keep float32."""
  if bias is not None and cfg.attention_backend(dropout_active, q_len, kv_len) == "cudnn":
    return attention.pad_bias(bias, attention.even_length(q_len),
                              attention.even_length(kv_len)).astype(cfg.dtype)
  return bias


def _padding_bias(key_valid):
  """[B, m] bool -> additive [B, 1, 1, m]."""
  return jnp.where(key_valid, 0.0, NEG_INF)[:, None, None, :].astype(jnp.float32)


def row_lengths(valid):
  """[B, n] bool -> int32 [B]: one past each row's last real token, the length of
  a row padded at its end (a [PAD] inside a row, which the pipelines never make,
  would count as a token). At least 1: a row of padding only (a batch filled up)
  attends to its first slot, so that no kernel sees a row without keys."""
  n = valid.shape[1]
  last = jnp.max(jnp.where(valid, jnp.arange(1, n + 1)[None, :], 0), axis=1)
  return jnp.maximum(last, 1).astype(jnp.int32)


def _positions_table(cfg, name):
  return nn.Embed(cfg.max_positions, cfg.hidden, name=name,
                  embedding_init=nn.with_logical_partitioning(_dense_init(),
                                                              ("pos", "embed")))


class Stack(nn.Module):
  """Layers with their own absolute position table and input LayerNorm."""

  cfg: ModelConfig
  num_layers: int
  dropout_rate: float
  attention_dropout_rate: float
  deterministic: bool
  relative_position_bias: bool = False
  cross_attention: bool = False
  # Dropout after the FFN's GELU; None: dropout_rate (the decoder, whose every
  # dropout is `decoder_dropout`).
  activation_dropout_rate: float | None = None

  @nn.compact
  def __call__(self, x, positions, key_valid, memory=None, memory_valid=None,
               memory_positions=None, key_lengths=None):
    """x: [B, n, D] token vectors at original `positions` [B|1, n] (one row: the
    same for every row, so the relative bias is [1, H, n, n], 128x fewer bytes for
    an attention kernel to read and its gradient to write at batch 128); `memory`
    [B, m, D] (cross-attention) sits at original `memory_positions` [B, m].
    key_lengths: int32 [B], where the caller knows its rows are padded at their
    end only (`Encoder.right_padded`): row b's tokens from key_lengths[b] on are
    padding, for every kernel, and the kernels (cuDNN, the TPU kernel) take them
    as key lengths instead of a padding mask in the bias, which then stays
    [1, H, n, n]."""
    cfg = self.cfg
    if cfg.position == "learned":
      x = x + _positions_table(cfg, "position_embed")(positions).astype(x.dtype)
    if cfg.ln_type == "post":  # BERT/RoBERTa: LayerNorm on the summed embeddings.
      x = _layer_norm(cfg, "input_ln")(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=self.deterministic)
    x = _constrain(x.astype(cfg.dtype), ("batch", "act_len", "act_embed"))

    dropout_active = self.attention_dropout_rate > 0 and not self.deterministic
    n = x.shape[1]
    if key_lengths is not None:  # One rule for every kernel: a prefix of the row.
      key_valid = jnp.arange(n)[None, :] < key_lengths[:, None]
    lengths_in_kernel = (key_lengths is not None and
                         cfg.attention_backend(dropout_active, n, n) in ("cudnn",
                                                                         "tpu_flash"))
    self_key_lengths = key_lengths if lengths_in_kernel else None  # (int32)
    self_bias = None if lengths_in_kernel else _padding_bias(key_valid)
    if self.relative_position_bias:
      # Computed once, added in every layer.
      relative = RelativePositionBias(cfg, name="relative_bias")(positions, positions)
      self_bias = relative if self_bias is None else self_bias + relative
    cross_bias = None if memory is None else _padding_bias(memory_valid)
    if memory is not None and self.relative_position_bias:
      # Queries and memory share one position axis (the original sequence).
      cross_bias = cross_bias + RelativePositionBias(
          cfg, name="cross_relative_bias")(positions, memory_positions)
    self_bias = _bias_for_kernel(cfg, self_bias, dropout_active, x.shape[1], x.shape[1])
    if memory is not None:
      cross_bias = _bias_for_kernel(cfg, cross_bias, dropout_active, x.shape[1],
                                    memory.shape[1])

    policy = cfg.effective_remat_policy
    # Under scan, CSE across iterations cannot undo the remat (JAX's advice).
    layer_cls = (TransformerLayer if policy == "none" else
                 nn.remat(TransformerLayer, policy=REMAT_POLICIES[policy],
                          prevent_cse=not cfg.scan_layers))
    if cfg.scan_layers:
      scanned = nn.scan(layer_cls, variable_axes={"params": 0},
                        split_rngs={"params": True, "dropout": True},
                        in_axes=(nn.broadcast,) * 6,
                        length=self.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = scanned(cfg, self.dropout_rate, self.attention_dropout_rate,
                     self.deterministic, self.cross_attention, True,
                     self.activation_dropout_rate,
                     name=param_layout.SCANNED_LAYERS)(x, self_bias, memory, cross_bias,
                                                       self_key_lengths, positions,
                                                       memory_positions)
    else:
      for i in range(self.num_layers):
        x = layer_cls(cfg, self.dropout_rate, self.attention_dropout_rate,
                      self.deterministic, self.cross_attention,
                      activation_dropout_rate=self.activation_dropout_rate,
                      name=f"layer_{i}")(x, self_bias, memory, cross_bias,
                                         self_key_lengths, positions, memory_positions)
    if cfg.ln_type == "pre":
      x = _layer_norm(cfg, "final_ln")(x)
    return x


class LMHead(nn.Module):
  """dense -> GELU -> LayerNorm -> projection onto the word embeddings (or, with
  `tie_embeddings=False`, onto the head's own output embedding) + bias."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x, embedding):
    cfg = self.cfg
    x = _dense(cfg, cfg.hidden, "dense", ("embed", "embed_out"), "norm")(x)
    x = _layer_norm(cfg, "ln")(nn.gelu(x, approximate=False))
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                           ("vocab",)),
                      (cfg.vocab_size,), jnp.float32)
    if not cfg.tie_embeddings:
      embedding = self.param(
          "embedding", nn.with_logical_partitioning(_dense_init(), ("vocab", "embed")),
          (cfg.vocab_size, cfg.hidden), jnp.float32)
    logits = jnp.einsum("bkd,vd->bkv", x.astype(cfg.dtype),
                        embedding.astype(cfg.dtype),
                        preferred_element_type=jnp.float32)
    return _constrain(logits + bias, ("batch", "act_len", "act_vocab"))


class Encoder(nn.Module):
  """Token embeddings + encoder stack: the part kept for fine-tuning."""

  cfg: ModelConfig
  deterministic: bool = True
  # True where every row is padded at its end only, as the pretraining and
  # fine-tuning pipelines build them (`[CLS] tokens [SEP] [PAD]...`): a row then
  # runs up to its last real token (`row_lengths`), and cuDNN takes that length
  # instead of a padding mask in its bias. False (any `valid`): the mask as given.
  right_padded: bool = False

  def setup(self):
    cfg = self.cfg
    self.token_embed = nn.Embed(
        cfg.vocab_size, cfg.hidden, name="token_embed",
        embedding_init=nn.with_logical_partitioning(_dense_init(),
                                                    ("vocab", "embed")))
    self.encoder = Stack(cfg, cfg.num_layers, cfg.dropout, cfg.attention_dropout,
                         self.deterministic, cfg.relative_position_bias,
                         activation_dropout_rate=cfg.activation_dropout,
                         name="encoder")

  def encode(self, input_ids, positions, valid):
    lengths = row_lengths(valid) if self.right_padded else None
    return self.encoder(self.token_embed(input_ids), positions, valid,
                        key_lengths=lengths)

  def __call__(self, input_ids, positions=None, valid=None):
    """input_ids [B, n] at original positions [B|1, n] (default 0..n-1 for every
    row); valid marks real (non-padding) tokens. Returns [B, n, D]."""
    if positions is None:
      positions = jnp.arange(input_ids.shape[1])[None, :]
    if valid is None:
      valid = input_ids != 0  # [PAD]
    return self.encode(input_ids, positions, valid)


class MaskedLM(Encoder):
  """Encoder + (optional) decoder + LM head on the K selected positions.

  A subclass of `Encoder`, so the pretraining model and the fine-tuning encoder
  are one definition with one parameter layout.
  """

  def setup(self):
    super().setup()
    cfg = self.cfg
    if cfg.decoder_type != "none":
      self.decoder = Stack(cfg, cfg.decoder_layers, cfg.decoder_dropout,
                           cfg.decoder_dropout, self.deterministic,
                           relative_position_bias=cfg.decoder_relative_position_bias,
                           cross_attention=cfg.decoder_type == "cross",
                           name="decoder")
    self.lm_head = LMHead(cfg, name="lm_head")

  def __call__(self, masks: masking.Masks) -> jax.Array:
    """Returns float32 logits [B, K, V] at `masks.selected_positions`."""
    cfg = self.cfg
    enc_valid = masks.encoder_ids != 0
    # Without removal every row keeps every position, in order: one row stands for
    # all, and the relative bias is shared across the batch.
    enc_positions = (masks.encoder_positions if cfg.drop_masked
                     else masks.encoder_positions[:1])
    enc_out = self.encode(masks.encoder_ids, enc_positions, enc_valid)
    if cfg.decoder_type == "none":
      # MLM: the encoder ran on all L positions; read the selected ones.
      hidden = jnp.take_along_axis(enc_out, masks.selected_positions[..., None],
                                   axis=1)
    else:
      mask_vector = self.token_embed.embedding[cfg.mask_id]
      full = (masking.unpermute_to_full_length(enc_out, masks.encoder_positions,
                                               mask_vector, masks.masked_positions)
              if cfg.drop_masked else enc_out)
      seq_len = full.shape[1]
      if cfg.decoder_type == "self":
        positions = jnp.arange(seq_len)[None, :]
        full_valid = jnp.ones(full.shape[:2], bool)
        if cfg.drop_masked:  # padding slots keep their place among the visible;
          # removed slots that only fill the static count are not read either.
          full_valid = jnp.take_along_axis(
              jnp.concatenate([enc_valid, masking.slot_is_token(masks)], axis=1),
              jnp.argsort(jnp.concatenate([masks.encoder_positions,
                                           masks.masked_positions], axis=1)),
              axis=1)
        dec_out = self.decoder(full, positions, full_valid)
        hidden = jnp.take_along_axis(dec_out, masks.selected_positions[..., None],
                                     axis=1)
      else:  # cross: the decoder sequence is the K selected slots only.
        queries = jnp.take_along_axis(full, masks.selected_positions[..., None],
                                      axis=1)
        # Slots of weight 0 (fillers of a short row's static count) are not read.
        hidden = self.decoder(queries, masks.selected_positions,
                              masks.selected_weights > 0, memory=enc_out,
                              memory_valid=enc_valid,
                              memory_positions=masks.encoder_positions)
    return self.lm_head(hidden, self.token_embed.embedding)


ENCODER_COLLECTIONS = ("token_embed", "encoder")


def encoder_params(params):
  """The fine-tuning view: drops the decoder and the pretraining head."""
  return {k: params[k] for k in ENCODER_COLLECTIONS}


def masked_lm_loss(logits, targets, weights):
  """Summed cross-entropy, number of correct predictions, and total weight."""
  logits = logits.astype(jnp.float32)
  log_probs = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  return (nll * weights).sum(), (correct * weights).sum(), weights.sum()

"""Task heads on the pretrained encoder, and their losses.

Both models keep the pretrained encoder as the `backbone` sub-tree, so its
parameters are exactly `{token_embed, encoder}` of a pretraining checkpoint
(`pretrained.load_pretrained`) and the head sits beside it:

  SequenceClassifier  params {backbone: {token_embed, encoder}, head: {dense, out}}
                      first token ([CLS]) -> dropout -> dense -> tanh -> dropout
                      -> dense to the classes (1 output: STS-B regression)
  SpanExtractor       params {backbone: ..., span_head}
                      every token -> dense to (start, end) logits; [PAD]
                      positions can never be chosen

Head kernels carry logical axis names like the encoder's, so they are sharded
by the same rules (`sharding.LOGICAL_AXIS_RULES`); the tiny class dimension is
left unsharded.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from maelm_jax.modeling.model import NEG_INF, Encoder, ModelConfig


def _kernel(axes):
  return nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), axes)


def _bias(axes):
  return nn.with_logical_partitioning(nn.initializers.zeros, axes)


class ClassificationHead(nn.Module):
  """The COCO-LM / MAE-LM recipe's head on the first token's vector."""

  num_outputs: int
  hidden: int
  dropout_rate: float
  dtype: jnp.dtype
  deterministic: bool

  @nn.compact
  def __call__(self, first_token):
    drop = lambda x: nn.Dropout(self.dropout_rate)(x, deterministic=self.deterministic)
    x = nn.Dense(self.hidden, dtype=self.dtype, name="dense",
                 kernel_init=_kernel(("embed", "embed_out")),
                 bias_init=_bias(("norm",)))(drop(first_token))
    x = drop(jnp.tanh(x))
    # The class dimension (2-3) is too small to shard: None keeps it replicated.
    logits = nn.Dense(self.num_outputs, dtype=self.dtype, name="out",
                      kernel_init=_kernel(("embed", None)),
                      bias_init=_bias((None,)))(x)
    return logits.astype(jnp.float32)


POOLINGS = ("cls", "mean")


def pool(hidden: jax.Array, input_ids: jax.Array, pooling: str) -> jax.Array:
  """[B, L, D] -> [B, D]: the first token's vector ('cls'), or the mean over the
  real (non-[PAD]) tokens ('mean', as sentence-transformers pools)."""
  if pooling == "cls":
    return hidden[:, 0]
  valid = (input_ids != 0)[..., None].astype(hidden.dtype)
  return (hidden * valid).sum(1) / jnp.maximum(valid.sum(1), 1)


class SequenceClassifier(nn.Module):
  """Encoder + classification (or, with 1 output, regression) head."""

  cfg: ModelConfig
  num_outputs: int
  deterministic: bool = True
  pooling: str = "cls"

  @nn.compact
  def __call__(self, input_ids):
    """input_ids int32 [B, L] -> float32 [B, num_outputs]."""
    hidden = Encoder(self.cfg, self.deterministic, right_padded=True,
                     name="backbone")(input_ids)
    return ClassificationHead(self.num_outputs, self.cfg.hidden, self.cfg.dropout,
                              self.cfg.dtype, self.deterministic,
                              name="head")(pool(hidden, input_ids, self.pooling))


class SpanExtractor(nn.Module):
  """Encoder + per-token start/end logits (SQuAD)."""

  cfg: ModelConfig
  deterministic: bool = True

  @nn.compact
  def __call__(self, input_ids):
    """input_ids int32 [B, L] -> (start, end) float32 logits, each [B, L]."""
    hidden = Encoder(self.cfg, self.deterministic, right_padded=True,
                     name="backbone")(input_ids)
    logits = nn.Dense(2, dtype=self.cfg.dtype, name="span_head",
                      kernel_init=_kernel(("embed", None)),
                      bias_init=_bias((None,)))(hidden).astype(jnp.float32)
    logits = jnp.where((input_ids != 0)[..., None], logits, NEG_INF)  # [PAD]
    return logits[..., 0], logits[..., 1]


# --------------------------------------------------------------------------
# Losses: means over the batch.


def classification_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def regression_loss(outputs: jax.Array, labels: jax.Array) -> jax.Array:
  """Mean squared error of the single output (STS-B)."""
  return jnp.mean(jnp.square(outputs[:, 0] - labels))


def span_loss(start_logits: jax.Array, end_logits: jax.Array,
              start_positions: jax.Array, end_positions: jax.Array) -> jax.Array:
  """Mean of the start and end cross-entropies (BERT)."""
  start = optax.softmax_cross_entropy_with_integer_labels(start_logits, start_positions)
  end = optax.softmax_cross_entropy_with_integer_labels(end_logits, end_positions)
  return ((start + end) / 2).mean()

"""PyTorch port of the maelm-jax encoder, for Hugging Face transformers.

Written into an export directory by `python -m maelm_jax.interop.export_hf` and loaded with

    model = AutoModel.from_pretrained(dir, trust_remote_code=True)

It is the fine-tuning encoder of `maelm_jax/modeling/model.py` (`Encoder`): token and
absolute position embeddings (or rotary positions), pre- or post-LN transformer
layers, and the optional relative position bias shared by all layers. Parameter names follow the JAX tree
(`encoder.layer_0.self_attn.query` is `params['encoder']['layer_0']['self_attn']
['query']`). Self-contained: needs only torch and transformers.
"""

import math

import torch
from torch import nn
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import (BaseModelOutput, MaskedLMOutput,
                                           QuestionAnsweringModelOutput,
                                           SequenceClassifierOutput)

from .configuration_maelm import MaelmConfig

NEG_INF = -1e9  # As in maelm-jax: finite, so a row with no valid key stays NaN-free.
ROPE_THETA = 10000.0  # maelm_jax.modeling.model.ROPE_THETA


def rotary(x, positions):
  """maelm_jax.modeling.model.rotary on x [B, H, L, d] at positions [B, L]: the
  pairs (x[i], x[i + d/2]) turned by positions * theta^(-2i/d), in float32."""
  half = x.shape[-1] // 2
  frequencies = ROPE_THETA ** (-torch.arange(half, dtype=torch.float32,
                                             device=x.device) / half)
  angles = positions.float()[:, None, :, None] * frequencies  # [B, 1, L, d/2]
  cos, sin = angles.cos(), angles.sin()
  x1, x2 = x.float().chunk(2, dim=-1)
  return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def relative_position_bucket(relative_position, num_buckets, max_distance):
  """T5's bidirectional bucketing (maelm_jax.modeling.model.relative_position_bucket)."""
  num_buckets //= 2
  bucket = (relative_position > 0).long() * num_buckets
  distance = relative_position.abs()
  max_exact = num_buckets // 2
  is_small = distance < max_exact
  log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(
      max_distance / max_exact)
  large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
  large = large.clamp(max=num_buckets - 1)
  return bucket + torch.where(is_small, distance, large)


class MaelmRelativeBias(nn.Module):
  """[buckets, heads] table; `buckets[offset + max_positions - 1]` is the bucket
  of key position - query position (a buffer, so the export stores the exact
  buckets the JAX model used)."""

  def __init__(self, config):
    super().__init__()
    self.table = nn.Parameter(torch.zeros(config.relative_buckets,
                                          config.num_attention_heads))
    n = config.max_position_embeddings
    offsets = torch.arange(-(n - 1), n)
    self.register_buffer("buckets", relative_position_bucket(
        offsets, config.relative_buckets, config.relative_max_distance))
    self.max_positions = n
    self.untie_cls_position = getattr(config, "untie_cls_position", True)

  def forward(self, positions, key_positions=None):
    """positions [B, n] (and keys' [B, m], default the same) -> additive bias
    [B, heads, n, m]."""
    keys = positions if key_positions is None else key_positions
    rel = keys[:, None, :] - positions[:, :, None]  # key - query
    bias = self.table[self.buckets[rel + self.max_positions - 1]]  # [B, n, m, H]
    if self.untie_cls_position:  # Position 0 ([CLS]): content alone (TUPE).
      untied = (positions[:, :, None] == 0) | (keys[:, None, :] == 0)
      bias = bias.masked_fill(untied[..., None], 0.0)
    return bias.permute(0, 3, 1, 2)


class MaelmAttention(nn.Module):

  def __init__(self, config):
    super().__init__()
    d = config.hidden_size
    self.num_heads = config.num_attention_heads
    self.head_dim = d // self.num_heads
    self.query, self.key, self.value, self.out = (nn.Linear(d, d) for _ in range(4))

  def forward(self, x, bias, memory=None, rope=None):
    """Self-attention, or with `memory` [B, m, D], attention to it; `rope`:
    (query positions [B, n], key positions [B, m]) to rotate q and k by."""
    kv = x if memory is None else memory
    split = lambda t: t.view(t.shape[0], t.shape[1], self.num_heads,
                             self.head_dim).transpose(1, 2)
    q, k, v = split(self.query(x)), split(self.key(kv)), split(self.value(kv))
    if rope is not None:
      q, k = rotary(q, rope[0]), rotary(k, rope[1])
    q = q / math.sqrt(self.head_dim)
    probs = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
    return self.out(out)


class MaelmMlp(nn.Module):
  """wo(gelu(wi x)), or GEGLU's wo(gelu(wi_0 x) * wi_1 x); NormFormer's
  `mid_ln` on the hidden units before wo."""

  def __init__(self, config):
    super().__init__()
    d, f = config.hidden_size, config.intermediate_size
    activation = getattr(config, "mlp_activation", "gelu")
    if activation not in ("gelu", "geglu"):
      raise ValueError(f"mlp_activation={activation!r}: this port knows 'gelu' and "
                       "'geglu'; export the model again with this maelm-jax")
    self.geglu = activation == "geglu"
    if self.geglu:
      self.wi_0, self.wi_1 = nn.Linear(d, f), nn.Linear(d, f)
    else:
      self.wi = nn.Linear(d, f)
    if getattr(config, "normformer", False):
      self.mid_ln = nn.LayerNorm(f, eps=config.layer_norm_eps)
    self.wo = nn.Linear(f, d)

  def forward(self, x):
    # Exact (erf) GELU, as in maelm-jax.
    h = F.gelu(self.wi_0(x)) * self.wi_1(x) if self.geglu else F.gelu(self.wi(x))
    if hasattr(self, "mid_ln"):
      h = self.mid_ln(h)
    return self.wo(h)


class MaelmLayer(nn.Module):
  """Self-attention, optional cross-attention (3ML's cross decoder), MLP."""

  def __init__(self, config, cross_attention=False):
    super().__init__()
    eps = config.layer_norm_eps
    self.pre = config.ln_type == "pre"
    normformer = getattr(config, "normformer", False)
    sites = ("self_attn", "cross_attn") if cross_attention else ("self_attn",)
    for site in sites:
      setattr(self, site, MaelmAttention(config))
      setattr(self, f"{site}_ln", nn.LayerNorm(config.hidden_size, eps=eps))
      if normformer:  # NormFormer: each attention's output normed.
        setattr(self, f"{site}_out_ln", nn.LayerNorm(config.hidden_size, eps=eps))
    self.mlp = MaelmMlp(config)
    self.mlp_ln = nn.LayerNorm(config.hidden_size, eps=eps)

  def _sublayer(self, x, fn, ln):
    return x + fn(ln(x)) if self.pre else ln(x + fn(x))

  def _attention(self, site, *args):
    out_ln = getattr(self, f"{site}_out_ln", None)
    def branch(h):
      out = getattr(self, site)(h, *args)
      return out if out_ln is None else out_ln(out)
    return branch

  def forward(self, x, bias, memory=None, cross_bias=None, rope=None, cross_rope=None):
    x = self._sublayer(x, self._attention("self_attn", bias, None, rope),
                       self.self_attn_ln)
    if hasattr(self, "cross_attn"):
      x = self._sublayer(x, self._attention("cross_attn", cross_bias, memory, cross_rope),
                         self.cross_attn_ln)
    return self._sublayer(x, self.mlp, self.mlp_ln)


class MaelmEncoder(nn.Module):
  """maelm_jax.modeling.model.Stack: the encoder, or (with `num_layers`, its own relative
  bias and cross-attention) the MAE-LM / 3ML decoder."""

  def __init__(self, config, num_layers=None, relative_position_bias=None,
               cross_attention=False):
    super().__init__()
    eps = config.layer_norm_eps
    self.pre = config.ln_type == "pre"
    self.rope = getattr(config, "position", "learned") == "rope"
    if not self.rope:
      self.position_embed = nn.Embedding(config.max_position_embeddings,
                                         config.hidden_size)
    if not self.pre:
      self.input_ln = nn.LayerNorm(config.hidden_size, eps=eps)
    if (config.relative_position_bias if relative_position_bias is None
        else relative_position_bias):
      self.relative_bias = MaelmRelativeBias(config)
      if cross_attention:
        self.cross_relative_bias = MaelmRelativeBias(config)
    self.layers = nn.ModuleList(
        MaelmLayer(config, cross_attention)
        for _ in range(config.num_hidden_layers if num_layers is None else num_layers))
    if self.pre:
      self.final_ln = nn.LayerNorm(config.hidden_size, eps=eps)

  def forward(self, x, positions, valid, output_hidden_states=False, memory=None,
              memory_valid=None, memory_positions=None):
    if not self.rope:
      x = x + self.position_embed(positions)
    if not self.pre:
      x = self.input_ln(x)
    bias = torch.where(valid, 0.0, NEG_INF)[:, None, None, :].to(x.dtype)
    if hasattr(self, "relative_bias"):
      bias = bias + self.relative_bias(positions)
    cross_bias = None
    if memory is not None:  # Queries and memory share the sequence's positions.
      cross_bias = torch.where(memory_valid, 0.0, NEG_INF)[:, None, None, :].to(x.dtype)
      if hasattr(self, "cross_relative_bias"):
        cross_bias = cross_bias + self.cross_relative_bias(positions, memory_positions)
    rope = (positions, positions) if self.rope else None
    cross_rope = (positions, memory_positions) if self.rope else None
    hidden_states = [x]
    for layer in self.layers:
      x = layer(x, bias, memory, cross_bias, rope, cross_rope)
      hidden_states.append(x)
    if self.pre:
      x = self.final_ln(x)
      hidden_states[-1] = x  # The last entry is what the encoder returns.
    return x, tuple(hidden_states) if output_hidden_states else None


class MaelmPreTrainedModel(PreTrainedModel):
  config_class = MaelmConfig
  base_model_prefix = "maelm"

  def _init_weights(self, module):
    """BERT's N(0, 0.02), zero biases, unit LayerNorms (as maelm-jax)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
      module.weight.data.normal_(0.0, 0.02)
      if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.data.zero_()
    elif isinstance(module, nn.LayerNorm):
      module.weight.data.fill_(1.0)
      module.bias.data.zero_()
    elif isinstance(module, MaelmRelativeBias):
      module.table.data.normal_(0.0, 0.02)


class MaelmModel(MaelmPreTrainedModel):
  """The encoder: input ids -> last hidden states [B, n, hidden].

  `hidden_states` (with `output_hidden_states=True`) has the embeddings and each
  layer's output; for pre-LN the last entry is after the final LayerNorm, equal
  to `last_hidden_state`.
  """

  def __init__(self, config):
    super().__init__(config)
    self.token_embed = nn.Embedding(config.vocab_size, config.hidden_size)
    self.encoder = MaelmEncoder(config)
    self.post_init()

  def get_input_embeddings(self):
    return self.token_embed

  def set_input_embeddings(self, value):
    self.token_embed = value

  def forward(self, input_ids=None, attention_mask=None, position_ids=None,
              output_hidden_states=None, return_dict=None, **kwargs):
    if attention_mask is None:
      attention_mask = input_ids != self.config.pad_token_id
    if position_ids is None:
      position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
      position_ids = position_ids.expand(input_ids.shape)
    output_hidden_states = (output_hidden_states if output_hidden_states is not None
                            else self.config.output_hidden_states)
    x, hidden_states = self.encoder(self.token_embed(input_ids), position_ids,
                                    attention_mask.bool(), output_hidden_states)
    if return_dict is False:
      return (x, hidden_states) if output_hidden_states else (x,)
    return BaseModelOutput(last_hidden_state=x, hidden_states=hidden_states)


class MaelmLMHead(nn.Module):
  """dense -> GELU -> LayerNorm -> projection onto the word (or own) embeddings."""

  def __init__(self, config):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)
    self.ln = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

  def forward(self, x):
    return self.decoder(self.ln(F.gelu(self.dense(x))))


def _pack(keep):
  """Per row, the indices of the positions where `keep` [B, L] holds, in order,
  left-packed to the longest row: (indices [B, n], valid [B, n])."""
  order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
  n = int(keep.sum(1).max()) if keep.numel() else 0
  index = order[:, :n]
  return index, keep.gather(1, index)


class MaelmForMaskedLM(MaelmPreTrainedModel):
  """Encoder + the pretraining head: an MLM run's LM head (predicts the token at
  every position), or an MAE-LM / 3ML run's decoder and LM head.

  With a decoder, as in pretraining: the `[MASK]` positions of `input_ids` are
  removed before the encoder, which reads the other tokens at their original
  positions; the decoder gets the encoder's outputs back at their slots and the
  `[MASK]` embedding at the removed ones (`decoder_type` "self"), or the `[MASK]`
  slots alone, attending to the encoder's outputs ("cross"). The logits at the
  `[MASK]` positions are the model's predictions; at the others they are the LM
  head applied to the decoder's input (self: its output) and predict nothing
  the model was trained for."""

  # transformers 5 reads a mapping {tied weight: its source}; 4.x iterates the
  # keys, so the same mapping serves both (a list breaks 5.x's post_init).
  _tied_weights_keys = {"lm_head.decoder.weight": "maelm.token_embed.weight"}

  def __init__(self, config):
    super().__init__(config)
    self.maelm = MaelmModel(config)
    self.decoder_type = getattr(config, "decoder_type", "none")
    if self.decoder_type != "none":
      self.decoder = MaelmEncoder(
          config, num_layers=config.decoder_layers,
          relative_position_bias=config.decoder_relative_position_bias,
          cross_attention=self.decoder_type == "cross")
    self.lm_head = MaelmLMHead(config)
    self.post_init()

  def get_output_embeddings(self):
    return self.lm_head.decoder

  def set_output_embeddings(self, value):
    self.lm_head.decoder = value

  def _decode(self, input_ids, attention_mask):
    """Logits [B, L, V] through the decoder (see the class docstring)."""
    real = (input_ids != self.config.pad_token_id if attention_mask is None
            else attention_mask.bool())
    masked = real & (input_ids == self.config.mask_token_id)
    index, valid = _pack(real & ~masked)
    enc_ids = input_ids.gather(1, index).masked_fill(~valid, self.config.pad_token_id)
    enc = self.maelm(enc_ids, valid, position_ids=index).last_hidden_state
    embed = self.maelm.token_embed.weight[self.config.mask_token_id]
    full = embed.expand(input_ids.shape[0], input_ids.shape[1], -1).clone()
    full[real & ~masked] = enc[valid]  # Row order: both keep the original order.
    if self.decoder_type == "self":
      positions = torch.arange(input_ids.shape[1], device=input_ids.device)
      hidden, _ = self.decoder(full, positions.expand(input_ids.shape), real)
      return self.lm_head(hidden)
    logits = self.lm_head(full)
    slots, slot_valid = _pack(masked)
    if slots.shape[1]:
      queries = full.gather(1, slots[..., None].expand(-1, -1, full.shape[-1]))
      hidden, _ = self.decoder(queries, slots, slot_valid, memory=enc,
                               memory_valid=valid, memory_positions=index)
      logits[masked] = self.lm_head(hidden)[slot_valid]
    return logits

  def forward(self, input_ids=None, attention_mask=None, position_ids=None,
              labels=None, output_hidden_states=None, return_dict=None, **kwargs):
    if self.decoder_type != "none":
      logits = self._decode(input_ids, attention_mask)
      loss = None
      if labels is not None:
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                               ignore_index=-100)
      return MaskedLMOutput(loss=loss, logits=logits)
    out = self.maelm(input_ids, attention_mask, position_ids,
                     output_hidden_states=output_hidden_states)
    logits = self.lm_head(out.last_hidden_state)
    loss = None
    if labels is not None:
      loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1),
                             ignore_index=-100)
    return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class MaelmClassificationHead(nn.Module):
  """maelm-jax's fine-tuning head: dropout -> dense -> tanh -> dropout -> the
  class (or, with one label, regression) projection."""

  def __init__(self, config):
    super().__init__()
    self.dense = nn.Linear(config.hidden_size, config.hidden_size)
    self.dropout = nn.Dropout(getattr(config, "hidden_dropout_prob", 0.1))
    self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

  def forward(self, pooled):
    x = torch.tanh(self.dense(self.dropout(pooled)))
    return self.out_proj(self.dropout(x))


class MaelmForSequenceClassification(MaelmPreTrainedModel):
  """Encoder + the head of a GLUE fine-tuning run, on the first token's vector
  (`config.pooling == "cls"`) or on the mean of the real tokens' ("mean")."""

  def __init__(self, config):
    super().__init__(config)
    self.num_labels = config.num_labels
    self.maelm = MaelmModel(config)
    self.classifier = MaelmClassificationHead(config)
    self.post_init()

  def forward(self, input_ids=None, attention_mask=None, position_ids=None,
              labels=None, output_hidden_states=None, return_dict=None, **kwargs):
    if attention_mask is None:
      attention_mask = input_ids != self.config.pad_token_id
    out = self.maelm(input_ids, attention_mask, position_ids,
                     output_hidden_states=output_hidden_states)
    hidden = out.last_hidden_state
    if getattr(self.config, "pooling", "cls") == "mean":
      valid = attention_mask[..., None].to(hidden.dtype)
      pooled = (hidden * valid).sum(1) / valid.sum(1).clamp(min=1)
    else:
      pooled = hidden[:, 0]
    logits = self.classifier(pooled)
    loss = None
    if labels is not None:
      if self.num_labels == 1:
        loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype))
      else:
        loss = F.cross_entropy(logits, labels.view(-1))
    return SequenceClassifierOutput(loss=loss, logits=logits,
                                    hidden_states=out.hidden_states)


class MaelmForQuestionAnswering(MaelmPreTrainedModel):
  """Encoder + the span head of a SQuAD fine-tuning run: a start and an end
  logit per token (padding gets -inf, as in maelm-jax)."""

  def __init__(self, config):
    super().__init__(config)
    self.maelm = MaelmModel(config)
    self.qa_outputs = nn.Linear(config.hidden_size, 2)
    self.post_init()

  def forward(self, input_ids=None, attention_mask=None, position_ids=None,
              start_positions=None, end_positions=None, output_hidden_states=None,
              return_dict=None, **kwargs):
    if attention_mask is None:
      attention_mask = input_ids != self.config.pad_token_id
    out = self.maelm(input_ids, attention_mask, position_ids,
                     output_hidden_states=output_hidden_states)
    logits = self.qa_outputs(out.last_hidden_state)
    logits = logits.masked_fill(~attention_mask.bool()[..., None],
                                torch.finfo(logits.dtype).min)
    start_logits, end_logits = logits[..., 0], logits[..., 1]
    loss = None
    if start_positions is not None and end_positions is not None:
      loss = (F.cross_entropy(start_logits, start_positions)
              + F.cross_entropy(end_logits, end_positions)) / 2
    return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits,
                                        end_logits=end_logits,
                                        hidden_states=out.hidden_states)

"""PyTorch port of the maelm-jax encoder, for Hugging Face transformers.

Written into an export directory by `python -m maelm_jax.export_hf` and loaded with

    model = AutoModel.from_pretrained(dir, trust_remote_code=True)

It is the fine-tuning encoder of `maelm_jax/modeling/model.py` (`Encoder`): token and
absolute position embeddings, pre- or post-LN transformer layers, and the optional
relative position bias shared by all layers. Parameter names follow the JAX tree
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


def relative_position_bucket(relative_position, num_buckets, max_distance):
  """T5's bidirectional bucketing (maelm_jax.model.relative_position_bucket)."""
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

  def forward(self, positions):
    """positions [B, n] -> additive bias [B, heads, n, n]."""
    rel = positions[:, None, :] - positions[:, :, None]  # key - query
    bias = self.table[self.buckets[rel + self.max_positions - 1]]  # [B, n, n, H]
    if self.untie_cls_position:  # Position 0 ([CLS]): content alone (TUPE).
      untied = (positions[:, :, None] == 0) | (positions[:, None, :] == 0)
      bias = bias.masked_fill(untied[..., None], 0.0)
    return bias.permute(0, 3, 1, 2)


class MaelmAttention(nn.Module):

  def __init__(self, config):
    super().__init__()
    d = config.hidden_size
    self.num_heads = config.num_attention_heads
    self.head_dim = d // self.num_heads
    self.query, self.key, self.value, self.out = (nn.Linear(d, d) for _ in range(4))

  def forward(self, x, bias):
    b, n, _ = x.shape
    split = lambda t: t.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
    q = split(self.query(x)) / math.sqrt(self.head_dim)
    k, v = split(self.key(x)), split(self.value(x))
    probs = torch.softmax(q @ k.transpose(-1, -2) + bias, dim=-1)
    out = (probs @ v).transpose(1, 2).reshape(b, n, -1)
    return self.out(out)


class MaelmMlp(nn.Module):

  def __init__(self, config):
    super().__init__()
    self.wi = nn.Linear(config.hidden_size, config.intermediate_size)
    self.wo = nn.Linear(config.intermediate_size, config.hidden_size)

  def forward(self, x):
    return self.wo(F.gelu(self.wi(x)))  # Exact (erf) GELU, as in maelm-jax.


class MaelmLayer(nn.Module):

  def __init__(self, config):
    super().__init__()
    eps = config.layer_norm_eps
    self.pre = config.ln_type == "pre"
    self.self_attn = MaelmAttention(config)
    self.self_attn_ln = nn.LayerNorm(config.hidden_size, eps=eps)
    self.mlp = MaelmMlp(config)
    self.mlp_ln = nn.LayerNorm(config.hidden_size, eps=eps)

  def forward(self, x, bias):
    if self.pre:
      x = x + self.self_attn(self.self_attn_ln(x), bias)
      return x + self.mlp(self.mlp_ln(x))
    x = self.self_attn_ln(x + self.self_attn(x, bias))
    return self.mlp_ln(x + self.mlp(x))


class MaelmEncoder(nn.Module):
  """maelm_jax.model.Stack without cross-attention (the encoder)."""

  def __init__(self, config):
    super().__init__()
    eps = config.layer_norm_eps
    self.pre = config.ln_type == "pre"
    self.position_embed = nn.Embedding(config.max_position_embeddings,
                                       config.hidden_size)
    if not self.pre:
      self.input_ln = nn.LayerNorm(config.hidden_size, eps=eps)
    if config.relative_position_bias:
      self.relative_bias = MaelmRelativeBias(config)
    self.layers = nn.ModuleList(MaelmLayer(config)
                                for _ in range(config.num_hidden_layers))
    if self.pre:
      self.final_ln = nn.LayerNorm(config.hidden_size, eps=eps)

  def forward(self, x, positions, valid, output_hidden_states=False):
    x = x + self.position_embed(positions)
    if not self.pre:
      x = self.input_ln(x)
    bias = torch.where(valid, 0.0, NEG_INF)[:, None, None, :].to(x.dtype)
    if hasattr(self, "relative_bias"):
      bias = bias + self.relative_bias(positions)
    hidden_states = [x]
    for layer in self.layers:
      x = layer(x, bias)
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


class MaelmForMaskedLM(MaelmPreTrainedModel):
  """Encoder + the MLM head of an MLM run (predicts the token at every position)."""

  # transformers 5 reads a mapping {tied weight: its source}; 4.x iterates the
  # keys, so the same mapping serves both (a list breaks 5.x's post_init).
  _tied_weights_keys = {"lm_head.decoder.weight": "maelm.token_embed.weight"}

  def __init__(self, config):
    super().__init__(config)
    self.maelm = MaelmModel(config)
    self.lm_head = MaelmLMHead(config)
    self.post_init()

  def get_output_embeddings(self):
    return self.lm_head.decoder

  def set_output_embeddings(self, value):
    self.lm_head.decoder = value

  def forward(self, input_ids=None, attention_mask=None, position_ids=None,
              labels=None, output_hidden_states=None, return_dict=None, **kwargs):
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

"""A PyTorch reference of the official MAE-LM release's pretraining forward,
written from its code (github.com/yumeng5/MAE-LM): `fairseq/models/ae/model.py`
(`AutoEncodingModel.forward` with `--no-return-mask`, `AEDecoder`, `AELMHead`),
`fairseq/modules/transformer_sentence_encoder.py` (`relative_position_bucket`,
`get_rel_pos_bias`, the embedding path), `transformer_sentence_encoder_layer.py`
(post-LN layers) and fairseq's `MultiheadAttention`, at the release's
`run_pretrain.sh` settings: `--rel-pos 1 --rel-pos-bins 64 --max-rel-pos 128`,
no decoder relative position (`--decoder-rel-pos` left at 0), GELU, learned
absolute positions in the encoder and a separate table in the decoder, the LM
head tied to the encoder's token embeddings. Dropout is left out (the
comparison is in eval mode; the release's decoder runs without dropout anyway:
`--decoder-sample-mode zero-dropout`).

Parameter names are the release's state-dict keys (`encoder.sentence_encoder.*`,
`gen_decoder.sentence_encoder.*`, `gen_decoder.lm_head.*`), so a state dict of
this module is what `maelm_jax.interop.import_fairseq` reads. Vocabulary order is
fairseq's: `<s>=0 <pad>=1 </s>=2 <unk>=3`, the dictionary's words, `<mask>`
last.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

PAD, BOS, EOS, UNK = 1, 0, 2, 3


def relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
  """Verbatim from the release (transformer_sentence_encoder.py)."""
  sign = torch.sign(relative_position)
  num_buckets //= 2
  n = torch.abs(relative_position)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  max_bucket_val = num_buckets - 1 - max_exact
  val_if_large = max_exact + torch.ceil(
      torch.log(n.float() / max_exact) / math.log((max_distance - 1) / max_exact)
      * (max_bucket_val)).long()
  val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
  return torch.where(is_small, n, val_if_large) * sign


class MultiheadAttention(nn.Module):
  """fairseq's self-attention: q scaled after its projection, an additive
  float `attn_mask` [B*H, T, T], padded keys at -inf."""

  def __init__(self, dim, heads):
    super().__init__()
    self.heads, self.head_dim = heads, dim // heads
    self.scaling = self.head_dim ** -0.5
    self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
        nn.Linear(dim, dim) for _ in range(4))

  def forward(self, x, key_padding_mask, attn_mask):
    t, b, d = x.shape  # fairseq's time-first layout.
    split = lambda y: y.contiguous().view(t, b * self.heads, self.head_dim).transpose(0, 1)
    q, k, v = split(self.q_proj(x) * self.scaling), split(self.k_proj(x)), split(
        self.v_proj(x))
    weights = torch.bmm(q, k.transpose(1, 2))
    if attn_mask is not None:
      weights = weights + attn_mask
    if key_padding_mask is not None:
      weights = weights.view(b, self.heads, t, t).masked_fill(
          key_padding_mask[:, None, None, :], float("-inf")).view(b * self.heads, t, t)
    probs = F.softmax(weights.float(), dim=-1).type_as(weights)
    out = torch.bmm(probs, v).transpose(0, 1).contiguous().view(t, b, d)
    return self.out_proj(out)


class Layer(nn.Module):
  """TransformerSentenceEncoderLayer: post-LN attention, then the FFN."""

  def __init__(self, dim, ffn, heads):
    super().__init__()
    self.self_attn = MultiheadAttention(dim, heads)
    self.self_attn_layer_norm = nn.LayerNorm(dim)
    self.fc1, self.fc2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
    self.final_layer_norm = nn.LayerNorm(dim)

  def forward(self, x, padding_mask, attn_mask):
    x = self.self_attn_layer_norm(x + self.self_attn(x, padding_mask, attn_mask))
    return self.final_layer_norm(x + self.fc2(F.gelu(self.fc1(x))))


class SentenceEncoder(nn.Module):
  """TransformerSentenceEncoder: tokens (or given embeddings) + learned positions
  (at `position_index` when given), embedding LayerNorm, padded rows zeroed, the
  layers, with one relative-position table for all layers if `rel_pos`."""

  def __init__(self, vocab, dim, ffn, heads, layers, max_positions, rel_pos,
               rel_pos_bins=64, max_rel_pos=128, embed_tokens=None):
    super().__init__()
    self.heads = heads
    self.embed_tokens = embed_tokens or nn.Embedding(vocab, dim, PAD)
    self.embed_positions = nn.Embedding(max_positions, dim)
    self.emb_layer_norm = nn.LayerNorm(dim)
    self.layers = nn.ModuleList(Layer(dim, ffn, heads) for _ in range(layers))
    self.rel_pos = rel_pos
    if rel_pos:
      self.relative_attention_bias = nn.Embedding(rel_pos_bins, heads)
      positions = torch.arange(max_positions)
      bucket = relative_position_bucket(positions[None, :] - positions[:, None],
                                        rel_pos_bins, max_rel_pos)
      self.register_buffer("rp_bucket", bucket - bucket.min(), persistent=False)

  def rel_pos_bias(self, position_index):
    """get_rel_pos_bias with pos_idx: bucket[pos_i, pos_j] -> [B*H, T, T]."""
    buckets = self.rp_bucket[position_index[:, :, None], position_index[:, None, :]]
    values = self.relative_attention_bias(buckets).permute(0, 3, 1, 2)
    return values.reshape(-1, buckets.shape[1], buckets.shape[2])

  def forward(self, padding_mask, position_index, tokens=None, token_embeddings=None):
    x = token_embeddings if token_embeddings is not None else self.embed_tokens(tokens)
    x = x + self.embed_positions(position_index)
    x = self.emb_layer_norm(x)
    x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))
    x = x.transpose(0, 1)
    attn_mask = self.rel_pos_bias(position_index) if self.rel_pos else None
    for layer in self.layers:
      x = layer(x, padding_mask, attn_mask)
    return x.transpose(0, 1)


class LMHead(nn.Module):
  """AELMHead: dense, GELU, LayerNorm, the tied token embeddings, a bias."""

  def __init__(self, dim, weight):
    super().__init__()
    self.dense, self.layer_norm = nn.Linear(dim, dim), nn.LayerNorm(dim)
    self.weight = weight
    self.bias = nn.Parameter(torch.zeros(weight.shape[0]))

  def forward(self, features):
    return F.linear(self.layer_norm(F.gelu(self.dense(features))), self.weight) + self.bias


class Encoder(nn.Module):
  def __init__(self, **kw):
    super().__init__()
    self.sentence_encoder = SentenceEncoder(rel_pos=True, **kw)


class Decoder(nn.Module):
  def __init__(self, embed_tokens, **kw):
    super().__init__()
    self.sentence_encoder = SentenceEncoder(rel_pos=False, embed_tokens=embed_tokens,
                                            **kw)
    self.lm_head = LMHead(kw["dim"], embed_tokens.weight)


class MaeLm(nn.Module):
  """AutoEncodingModel (`ae`, criterion masked_lm, --no-return-mask)."""

  def __init__(self, vocab, dim=32, ffn=64, heads=4, layers=2, decoder_layers=1,
               max_positions=64, rel_pos_bins=64, max_rel_pos=128, mask_idx=None):
    super().__init__()
    self.mask_idx = vocab - 1 if mask_idx is None else mask_idx
    common = dict(vocab=vocab, dim=dim, ffn=ffn, heads=heads, max_positions=max_positions)
    self.encoder = Encoder(layers=layers, rel_pos_bins=rel_pos_bins,
                           max_rel_pos=max_rel_pos, **common)
    self.gen_decoder = Decoder(self.encoder.sentence_encoder.embed_tokens,
                               layers=decoder_layers, **common)

  def forward(self, src_tokens, position_index, masked_tokens, padding_mask):
    """src_tokens [B, Te]: each row's unselected tokens, right-padded with <pad>;
    position_index [B, Te]: their positions in the full row; masked_tokens and
    padding_mask [B, T] over the full row. Returns (encoder states [B, Te, D],
    logits of the masked positions [N, V] in row-major order)."""
    x = self.encoder.sentence_encoder(src_tokens.eq(PAD), position_index,
                                      tokens=src_tokens)
    # The scatter back (model.py: enc_outputs[~masked_tokens & ~padding_mask] =
    # x[src_tokens.ne(pad)]), then the [MASK] embedding at the masked slots.
    enc_outputs = torch.zeros(masked_tokens.shape + (x.shape[-1],), dtype=x.dtype)
    enc_outputs[~masked_tokens & ~padding_mask] = x[src_tokens.ne(PAD)]
    embed = self.encoder.sentence_encoder.embed_tokens.weight
    enc_outputs[masked_tokens] = embed[self.mask_idx]
    positions = torch.arange(masked_tokens.shape[1]).expand(masked_tokens.shape)
    features = self.gen_decoder.sentence_encoder(padding_mask, positions,
                                                 token_embeddings=enc_outputs)
    return x, self.gen_decoder.lm_head(features[masked_tokens])


def randomize(model, seed=0):
  """Every tensor random (LayerNorm scales around 1), so a mapping that swaps or
  drops one shows."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      norm = "layer_norm" in name
      p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if norm else 0.1)
              + (1.0 if norm and name.endswith("weight") else 0.0))
  return model

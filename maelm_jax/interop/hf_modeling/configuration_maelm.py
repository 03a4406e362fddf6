"""Configuration of a maelm-jax encoder exported to Hugging Face transformers.

Written next to `modeling_maelm.py` by `python -m maelm_jax.export_hf`; loaded by
`AutoConfig.from_pretrained(dir, trust_remote_code=True)`. Self-contained: needs
only transformers.
"""

from transformers import PretrainedConfig


class MaelmConfig(PretrainedConfig):
  """The encoder of a maelm-jax run (MLM, MAE-LM or 3ML; the decoder is not kept).

  ln_type: "pre" (LayerNorm before each sublayer, one after the last layer) or
    "post" (BERT: LayerNorm on the summed embeddings and after each sublayer).
  relative_position_bias: a T5-style bucketed bias, one [buckets, heads] table
    shared by all layers, added to every layer's attention scores (the export
    stores the run's exact buckets, T5's or the MAE-LM release's).
  untie_cls_position: position 0 ([CLS]) neither gives nor gets that bias
    (False for recipe=paper, as the MAE-LM release).
  """

  model_type = "maelm"

  def __init__(self, vocab_size=8000, hidden_size=128, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=512,
               max_position_embeddings=512, ln_type="pre",
               relative_position_bias=True, relative_buckets=32,
               relative_max_distance=128, untie_cls_position=True,
               layer_norm_eps=1e-5,
               tie_word_embeddings=True, objective="maelm", pad_token_id=0,
               bos_token_id=2, eos_token_id=3, **kwargs):
    super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                     eos_token_id=eos_token_id,
                     tie_word_embeddings=tie_word_embeddings, **kwargs)
    self.vocab_size = vocab_size
    self.hidden_size = hidden_size
    self.num_hidden_layers = num_hidden_layers
    self.num_attention_heads = num_attention_heads
    self.intermediate_size = intermediate_size
    self.max_position_embeddings = max_position_embeddings
    self.ln_type = ln_type
    self.relative_position_bias = relative_position_bias
    self.relative_buckets = relative_buckets
    self.relative_max_distance = relative_max_distance
    self.untie_cls_position = untie_cls_position
    self.layer_norm_eps = layer_norm_eps
    self.objective = objective

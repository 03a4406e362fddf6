"""Configuration of a maelm-jax encoder exported to Hugging Face transformers.

Written next to `modeling_maelm.py` by `python -m maelm_jax.interop.export_hf`; loaded by
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
  position: "learned" (a table of absolute positions added to the tokens) or
    "rope" (rotary positions on every attention's queries and keys, no table).
  mlp_activation: "gelu" (wo(gelu(wi x))) or "geglu" (wo(gelu(wi_0 x) * wi_1 x)).
  normformer: NormFormer's extra LayerNorms, on each attention's output and on
    the FFN's hidden units.
  """

  model_type = "maelm"
  # The encoder's own fields and their defaults (a tiny encoder); config.json
  # gives the run's values.
  FIELDS = dict(vocab_size=8000, hidden_size=128, num_hidden_layers=2,
                num_attention_heads=2, intermediate_size=512,
                max_position_embeddings=512, ln_type="pre", position="learned",
                relative_position_bias=True, relative_buckets=32,
                relative_max_distance=128, untie_cls_position=True,
                layer_norm_eps=1e-5, objective="maelm",
                mlp_activation="gelu", normformer=False,
                pooling="cls",  # A fine-tuned classifier's: "cls" or "mean".
                # The pretraining decoder (MAE-LM, 3ML), exported --with_lm_head.
                decoder_type="none", decoder_layers=0,
                decoder_relative_position_bias=False, mask_token_id=4)

  def __init__(self, tie_word_embeddings=True, pad_token_id=0, bos_token_id=2,
               eos_token_id=3, **kwargs):
    fields = {name: kwargs.pop(name, default) for name, default in self.FIELDS.items()}
    super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                     eos_token_id=eos_token_id,
                     tie_word_embeddings=tie_word_embeddings, **kwargs)
    for name, value in fields.items():
      setattr(self, name, value)

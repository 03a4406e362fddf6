r"""Export a pretrained encoder as a Hugging Face transformers model directory.

  python -m maelm_jax.interop.export_hf --workdir=runs/maelm_tiny --out=runs/maelm_tiny_hf
  python -m maelm_jax.interop.export_hf --workdir=W --out=DIR --step=4000 --with_lm_head

and then, in PyTorch (`pip install torch transformers`):

  tokenizer = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)
  model = AutoModel.from_pretrained(DIR, trust_remote_code=True)

(transformers 4.57 and 5.x; 5.x asks before it runs a directory's code, also for
the tokenizer, unless `trust_remote_code=True` says yes.)

What is written (the decoder of MAE-LM / 3ML is never exported; it is a
pretraining device, dropped for fine-tuning as in the papers):

  config.json, model.safetensors   the encoder (token and position embeddings,
                                   layers); with --with_lm_head (a pretraining of
                                   any objective) also the masked-LM head
  tokenizer.json, tokenizer_config.json, special_tokens_map.json, tokenizer.model
                                   the run's SentencePiece model as a fast
                                   tokenizer: the project's ids (but for ties
                                   of reordered pieces, see `fast_tokenizer`),
                                   `[CLS] a [SEP]` / `[CLS] a [SEP] b [SEP]`, and
                                   "[MASK]" typed in text stays text
  reference_outputs.npz            a few tokenized sentences (`input_ids`,
                                   `attention_mask`) and the last hidden states
                                   maelm-jax computes for them (float32), to
                                   check a port against
  README.md                        a model card: objective, size, data, steps,
                                   held-out [MASK] accuracy
  export.json                      what was exported from where (also marks the
                                   directory as an export, for --overwrite)

Two kinds of model. A post-LN encoder with absolute positions only (`recipe=paper`
without the relative bias) is a RoBERTa: `model_type: roberta`, loadable with plain
`AutoModel.from_pretrained(DIR)` (its pooler is not part of pretraining and starts
untrained, which transformers reports). Every other encoder (rotary positions or
a relative position bias, pre-LN: the project's defaults) is written with `modeling_maelm.py` and
`configuration_maelm.py`, a self-contained PyTorch port of `maelm_jax.modeling.model.Encoder`
loaded through `trust_remote_code=True`.

Needs `safetensors` and `tokenizers` (`pip install -e '.[export]'`), not torch.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import shutil
import types
import uuid

from absl import flags

from maelm_jax.core import cli, storage, workdir as workdir_lib

REFERENCE_TEXTS = (
    ("The quick brown fox jumps over the lazy dog.",),
    ("It was the best of times, it was the worst of times.",),
    ("Who wrote Hamlet?", "Hamlet is a tragedy written by William Shakespeare."),
    ("A literal [MASK] in the text   stays text, as do accents: naïve café.",),
)
MARKER = "export.json"
HF_MODELING_DIR = pathlib.Path(__file__).parent / "hf_modeling"
REMOTE_CODE_FILES = ("configuration_maelm.py", "modeling_maelm.py")


# --------------------------------------------------------------------------
# Checks (before anything is loaded).
# --------------------------------------------------------------------------


def check_out_dir(out: str, overwrite: bool) -> None:
  """`out` is new or empty, or (with --overwrite) an earlier export."""
  if not os.path.exists(out):
    return
  if not os.path.isdir(out):
    raise FileExistsError(f"--out={out} is a file; name a new directory")
  if not os.listdir(out):
    return
  if not os.path.exists(os.path.join(out, MARKER)):
    raise FileExistsError(
        f"--out={out} is not empty and is not an earlier export; name a new "
        "directory (nothing in it was touched)")
  if not overwrite:
    raise FileExistsError(
        f"--out={out} holds an earlier export; name a new directory, or pass "
        "--overwrite to replace it")


def architecture(model_cfg) -> str:
  """"roberta" where transformers has the architecture, else "maelm"."""
  if (model_cfg.ln_type == "post" and not model_cfg.relative_position_bias
      and model_cfg.mlp_activation == "gelu" and not model_cfg.normformer
      and model_cfg.position == "learned"):
    return "roberta"
  return "maelm"


# --------------------------------------------------------------------------
# Parameters: the JAX tree -> PyTorch state dicts (numpy arrays).
# --------------------------------------------------------------------------


def _dense(p) -> dict:
  """A flax Dense/DenseGeneral kernel [in..., out...] -> torch Linear [out, in]."""
  import numpy as np
  kernel, bias = np.asarray(p["kernel"]), np.asarray(p["bias"])
  if kernel.ndim == 3 and bias.ndim == 2:  # query/key/value: [D, H, hd]
    kernel = kernel.reshape(kernel.shape[0], -1)
  elif kernel.ndim == 3:  # out: [H, hd, D]
    kernel = kernel.reshape(-1, kernel.shape[-1])
  return {"weight": kernel.T.copy(), "bias": bias.reshape(-1)}


def _ln(p) -> dict:
  return {"weight": p["scale"], "bias": p["bias"]}


def _flatten(prefix: str, tree: dict, out: dict) -> dict:
  for key, value in tree.items():
    if isinstance(value, dict):
      _flatten(f"{prefix}{key}.", value, out)
    else:
      out[prefix + key] = value
  return out


def _finetuned_head(head) -> dict:
  """A fine-tuning run's head -> transformers' names: the ClassificationHead is
  *ForSequenceClassification's `classifier` (dense, out_proj), SQuAD's span
  head *ForQuestionAnswering's `qa_outputs`."""
  if "span_head" in head:
    return {"qa_outputs": _dense(head["span_head"])}
  return {"classifier": {"dense": _dense(head["dense"]), "out_proj": _dense(head["out"])}}


def maelm_tensors(params, model_cfg, with_lm_head: bool, head=None) -> dict:
  """State dict of `modeling_maelm.MaelmModel` (or `MaelmForMaskedLM`, or with
  a fine-tuning run's `head`, `MaelmForSequenceClassification` or
  `MaelmForQuestionAnswering`)."""
  import numpy as np
  from maelm_jax.modeling import relative_position
  n = model_cfg.max_positions
  # The buckets the JAX model uses, stored exactly (a float32 log on another
  # library could round a bucket boundary the other way).
  buckets = np.asarray(relative_position.bucket(np.arange(-(n - 1), n), model_cfg),
                       np.int64)

  def stack(p, num_layers):
    """A Stack (encoder or decoder): `modeling_maelm.MaelmEncoder`'s names."""
    out = ({"position_embed": {"weight": p["position_embed"]["embedding"]}}
           if "position_embed" in p else {})  # (Rotary positions: no table.)
    for name in ("input_ln", "final_ln"):
      if name in p:
        out[name] = _ln(p[name])
    for name in ("relative_bias", "cross_relative_bias"):
      if name in p:
        out[name] = {"table": p[name]["table"], "buckets": buckets}
    out["layers"] = {}
    for i in range(num_layers):
      layer = p[f"layer_{i}"]
      out["layers"][str(i)] = {
          name: ({k: (_ln if k.endswith("_ln") else _dense)(layer[name][k])
                  for k in layer[name]}
                 if name.endswith("attn") or name == "mlp" else _ln(layer[name]))
          for name in layer}
    return out

  tree = {"token_embed": {"weight": params["token_embed"]["embedding"]},
          "encoder": stack(params["encoder"], model_cfg.num_layers)}
  if with_lm_head:
    head = params["lm_head"]
    tree = {"maelm": tree, "lm_head": {
        "dense": _dense(head["dense"]), "ln": _ln(head["ln"]),
        "decoder": {"bias": head["bias"]}}}
    if model_cfg.decoder_type != "none":
      tree["decoder"] = stack(params["decoder"], model_cfg.decoder_layers)
    if not model_cfg.tie_embeddings:
      tree["lm_head"]["decoder"]["weight"] = head["embedding"]
  elif head is not None:
    tree = {"maelm": tree, **_finetuned_head(head)}
  return _flatten("", tree, {})


def roberta_tensors(params, model_cfg, with_lm_head: bool, head=None) -> dict:
  """State dict of transformers' `RobertaModel` (or `RobertaForMaskedLM`, or
  with a fine-tuning run's `head`, `RobertaForSequenceClassification` or
  `RobertaForQuestionAnswering`).

  RoBERTa numbers positions from `pad_token_id + 1` (= 1 here), so our position
  p is its row p + 1; row 0 (padding) is zero, as is the single token-type row.
  """
  import numpy as np
  enc = params["encoder"]
  positions = np.asarray(enc["position_embed"]["embedding"])
  hidden = positions.shape[1]
  layers = {}
  for i in range(model_cfg.num_layers):
    layer = enc[f"layer_{i}"]
    attn = layer["self_attn"]
    layers[str(i)] = {
        "attention": {"self": {n: _dense(attn[n]) for n in ("query", "key", "value")},
                      "output": {"dense": _dense(attn["out"]),
                                 "LayerNorm": _ln(layer["self_attn_ln"])}},
        "intermediate": {"dense": _dense(layer["mlp"]["wi"])},
        "output": {"dense": _dense(layer["mlp"]["wo"]),
                   "LayerNorm": _ln(layer["mlp_ln"])},
    }
  tree = {"embeddings": {
      "word_embeddings": {"weight": params["token_embed"]["embedding"]},
      "position_embeddings": {"weight": np.concatenate(
          [np.zeros((1, hidden), positions.dtype), positions])},
      "token_type_embeddings": {"weight": np.zeros((1, hidden), positions.dtype)},
      "LayerNorm": _ln(enc["input_ln"])},
      "encoder": {"layer": layers}}
  if with_lm_head:
    head = params["lm_head"]
    tree = {"roberta": tree, "lm_head": {
        "dense": _dense(head["dense"]), "layer_norm": _ln(head["ln"]),
        "bias": head["bias"], "decoder": {"bias": head["bias"]}}}
    if not model_cfg.tie_embeddings:
      tree["lm_head"]["decoder"]["weight"] = head["embedding"]
  elif head is not None:
    tree = {"roberta": tree, **_finetuned_head(head)}
  return _flatten("", tree, {})


def classifier_config(task, pooling: str) -> dict:
  """transformers' keys for a GLUE task's head: labels (the names of its
  classes, glue_data.label_names), regression for STS-B, and maelm's pooling."""
  from maelm_jax.finetune import glue_data  # pylint: disable=g-import-not-at-top
  if task.is_regression:
    return dict(head="classifier", num_labels=1, problem_type="regression",
                pooling=pooling)
  return dict(head="classifier", num_labels=len(task.labels),
              problem_type="single_label_classification",
              id2label=dict(enumerate(glue_data.label_names(task))),
              label2id={label: i for i, label in enumerate(glue_data.label_names(task))},
              pooling=pooling)


QA_CONFIG = {"head": "qa", "pooling": "cls"}  # SQuAD's span head (pools nothing).
_FINETUNED_CLASS = {"classifier": "ForSequenceClassification",
                    "qa": "ForQuestionAnswering"}


def hf_config(kind: str, model_cfg, with_lm_head: bool, finetuned: dict | None = None
              ) -> dict:
  """config.json; `finetuned`: `classifier_config` or `QA_CONFIG` of a
  fine-tuned head."""
  architecture_of = lambda prefix: (
      prefix + _FINETUNED_CLASS[finetuned["head"]] if finetuned else
      prefix + ("ForMaskedLM" if with_lm_head else "Model"))
  common = dict(
      vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.hidden,
      num_hidden_layers=model_cfg.num_layers,
      num_attention_heads=model_cfg.num_heads,
      intermediate_size=model_cfg.mlp, layer_norm_eps=model_cfg.layer_norm_eps,
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
      pad_token_id=0, bos_token_id=2, eos_token_id=3,
      tie_word_embeddings=model_cfg.tie_embeddings, torch_dtype="float32")
  if finetuned is not None:
    common.update({k: v for k, v in finetuned.items() if k not in ("pooling", "head")})
  if kind == "roberta":
    assert finetuned is None or finetuned["pooling"] == "cls", finetuned
    return dict(common, model_type="roberta",
                architectures=[architecture_of("Roberta")],
                max_position_embeddings=model_cfg.max_positions + 1,
                type_vocab_size=1, hidden_act="gelu",
                position_embedding_type="absolute")
  return dict(common, model_type="maelm",
              architectures=[architecture_of("Maelm")],
              auto_map={"AutoConfig": "configuration_maelm.MaelmConfig",
                        "AutoModel": "modeling_maelm.MaelmModel",
                        "AutoModelForMaskedLM": "modeling_maelm.MaelmForMaskedLM",
                        "AutoModelForSequenceClassification":
                            "modeling_maelm.MaelmForSequenceClassification",
                        "AutoModelForQuestionAnswering":
                            "modeling_maelm.MaelmForQuestionAnswering"},
              pooling=(finetuned or {}).get("pooling", "cls"),
              mask_token_id=model_cfg.mask_id,
              **(dict(decoder_type=model_cfg.decoder_type,
                      decoder_layers=model_cfg.decoder_layers,
                      decoder_relative_position_bias=(
                          model_cfg.decoder_relative_position_bias))
                 if with_lm_head and model_cfg.decoder_type != "none" else {}),
              max_position_embeddings=model_cfg.max_positions,
              ln_type=model_cfg.ln_type,
              position=model_cfg.position,
              relative_position_bias=model_cfg.relative_position_bias,
              relative_buckets=model_cfg.relative_buckets,
              relative_max_distance=model_cfg.relative_max_distance,
              untie_cls_position=model_cfg.untie_cls_position,
              mlp_activation=model_cfg.mlp_activation,
              normformer=model_cfg.normformer)


# --------------------------------------------------------------------------
# Tokenizer: the SentencePiece model as a `tokenizers` fast tokenizer.
# --------------------------------------------------------------------------


# SentencePiece never produces a control piece ([PAD] [CLS] [SEP] [MASK]) or [UNK]
# from text, but a `tokenizers` Unigram/BPE model matches every piece it holds,
# and its penalty for unknown characters follows its lowest score, so no score
# keeps "[MASK]" typed in a text from becoming id 4. Every "[" is therefore
# renamed after normalisation, in the text and in the ordinary pieces alike, to a
# character NFKC never leaves standing (U+FB01 "fi" ligature): the special
# pieces keep their "[" and cannot match text; all other segmentation is
# unchanged. The decoder renames it back.
_BRACKET, _RENAMED_BRACKET = "[", "\ufb01"


def _bpe_merges(vocab: dict[str, int], scores: dict[str, float]) -> list:
  """SentencePiece BPE as ranked merges: every split of a piece into two pieces,
  ranked by the piece's score (as transformers' SentencePieceExtractor does)."""
  merges = []
  for piece, score in scores.items():
    local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
             if piece[:i] in vocab and piece[i:] in vocab]
    merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
  merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
  return [(left, right) for left, right, _ in merges]


def fast_tokenizer(sp_model_path: str):
  """The run's SentencePiece model as a `tokenizers.Tokenizer` giving its ids.

  SentencePiece's nmt_nfkc normaliser is its precompiled character map, then
  runs of spaces collapsed and the ends stripped (`remove_extra_whitespaces`);
  words get the "▁" prefix; see `_RENAMED_BRACKET` for the special pieces.
  Where two segmentations are the same pieces in another order (runs of one
  character, "====="), SentencePiece's float32 path scores break the tie and
  `tokenizers`' float64 ones may break it the other way: about 0.5% of pydoc
  sentences, none of 18,872 book and SST-2 lines
  (studies/export_tokenizer_check.py).
  """
  from sentencepiece import sentencepiece_model_pb2
  from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
  from tokenizers.models import BPE, Unigram
  from maelm_jax.data import tokenizer as tokenizer_lib
  with open(sp_model_path, "rb") as f:
    proto = sentencepiece_model_pb2.ModelProto.FromString(f.read())
  normal, unknown, control = 1, 2, 3  # sentencepiece ModelProto.SentencePiece.Type
  unsupported = sorted({p.type for p in proto.pieces} - {normal, unknown, control})
  charsmap = proto.normalizer_spec.precompiled_charsmap
  if unsupported or proto.trainer_spec.byte_fallback or not charsmap:
    raise ValueError(
        f"{sp_model_path}: only SentencePiece models with NFKC normalisation and "
        "no user-defined or byte-fallback pieces export (maelm_jax trains such "
        "models); this one has " + (f"piece types {unsupported}" if unsupported
                                    else "byte fallback" if charsmap else
                                    "no normalisation map"))
  if normalizers.Precompiled(charsmap).normalize_str(_RENAMED_BRACKET) == _RENAMED_BRACKET:
    raise ValueError(f"{sp_model_path}: its normaliser keeps U+FB01, which the "
                     "export needs to be normalised away (NFKC does)")
  vocab = [(p.piece.replace(_BRACKET, _RENAMED_BRACKET) if p.type == normal
            else p.piece, p.score if p.type == normal else 0.0)
           for p in proto.pieces]
  if proto.trainer_spec.model_type == 2:  # BPE
    ids = {piece: i for i, (piece, _) in enumerate(vocab)}
    model = BPE(ids, _bpe_merges(ids, dict(vocab)),
                unk_token=tokenizer_lib.SPECIAL_TOKENS[tokenizer_lib.UNK_ID],
                fuse_unk=True, byte_fallback=False)
  else:
    model = Unigram(vocab, unk_id=tokenizer_lib.UNK_ID, byte_fallback=False)
  tok = Tokenizer(model)
  # transformers splits the text at "[MASK]" (an added special token) first;
  # each part is then normalised and pre-tokenised on its own. So the leading
  # space of a part is kept (the part after "[MASK]" in "[MASK] sat" is the word
  # "▁sat"; after "[MASK]." it is "." with no word start), and the word-start
  # "▁" is prepended to the text's first part only ("first"): the ids of
  # `Tokenizer.encode_with_masks`. With no "[MASK]", the same as SentencePiece.
  steps = [normalizers.Precompiled(charsmap)]
  if proto.normalizer_spec.remove_extra_whitespaces:
    steps += [normalizers.Replace(Regex(" {2,}"), " "),
              normalizers.Strip(left=False, right=True)]
  tok.normalizer = normalizers.Sequence(steps + [
      normalizers.Replace(_BRACKET, _RENAMED_BRACKET)])
  prepend = "first" if proto.normalizer_spec.add_dummy_prefix else "never"
  # split=True: a word per whitespace, as SentencePiece (split_by_whitespace)
  # never lets a piece cross one, so the ids are the same and `word_ids()` names
  # words, not the whole text (word-level tools, e.g. minicons' PLL-word-l2r,
  # read them).
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend,
                                               split=True)
  tok.decoder = decoders.Sequence([
      decoders.Replace(_RENAMED_BRACKET, _BRACKET),
      decoders.Metaspace(replacement="▁", prepend_scheme=prepend, split=False)])
  cls, sep = (tokenizer_lib.SPECIAL_TOKENS[i] for i in (tokenizer_lib.CLS_ID,
                                                       tokenizer_lib.SEP_ID))
  tok.post_processor = processors.TemplateProcessing(
      single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:0 {sep}:0",
      special_tokens=[(cls, tokenizer_lib.CLS_ID), (sep, tokenizer_lib.SEP_ID)])
  return tok


def write_tokenizer(tokenizer_path: str, out: str, max_length: int) -> None:
  """The run's SentencePiece model as a fast tokenizer, or the run's own
  tokenizer.json (an imported checkpoint's, already in the project's ids)."""
  from maelm_jax.data import tokenizer as tokenizer_lib
  if tokenizer_path.endswith(".json"):
    tokenizer = tokenizer_lib.HFTokenizer(tokenizer_path)
    shutil.copyfile(tokenizer_path, os.path.join(out, "tokenizer.json"))
    roles = [tokenizer.id_to_piece(i) for i in range(tokenizer_lib.NUM_SPECIAL)]
  else:
    fast_tokenizer(tokenizer_path).save(os.path.join(out, "tokenizer.json"))
    shutil.copyfile(tokenizer_path, os.path.join(out, "tokenizer.model"))
    roles = tokenizer_lib.SPECIAL_TOKENS
  names = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                   roles))
  with open(os.path.join(out, "special_tokens_map.json"), "w") as f:
    json.dump(names, f, indent=2)
  with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump(dict(names, tokenizer_class="PreTrainedTokenizerFast",
                   model_max_length=max_length, padding_side="right",
                   # "[MASK]" typed in a text is the mask token, as transformers'
                   # pipelines (fill-mask) expect; maelm-jax reads it as text:
                   # pass split_special_tokens=True for the project's ids.
                   split_special_tokens=False,
                   model_input_names=["input_ids", "attention_mask"],
                   clean_up_tokenization_spaces=False), f, indent=2)


# --------------------------------------------------------------------------
# Reference outputs and the model card.
# --------------------------------------------------------------------------


def reference_outputs(model_cfg, params, tokenizer, head=None,
                      finetuned: dict | None = None) -> dict:
  """Token ids of REFERENCE_TEXTS as fine-tuning encodes them, and the float32
  last hidden states of the JAX encoder; with a fine-tuned `head`, also the
  classifier's `logits` or the span head's `start_logits` and `end_logits`."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from maelm_jax.modeling import model as model_lib
  from maelm_jax.finetune import glue_data
  # Cut to the encoder's positions as fine-tuning cuts (a small model or a fine
  # tokenizer makes the texts longer than its position table).
  longest = min(model_cfg.max_positions,
                max(sum(len(tokenizer.encode_one(t)) + 1 for t in texts) + 1
                    for texts in REFERENCE_TEXTS))
  rows = [glue_data.encode_examples([types.SimpleNamespace(texts=texts)], tokenizer,
                                    longest)[0] for texts in REFERENCE_TEXTS]
  input_ids = np.stack(rows)
  cfg = dataclasses.replace(model_cfg, dtype=jnp.float32, dropout=0.0,
                            attention_dropout=0.0, attention_impl="xla",
                            remat=False, remat_policy="none")
  # Each forward as one jitted program: run op by op, the model compiles each of
  # its operations on its own (about 80 for the tiny model, seconds on a CPU host).
  hidden = jax.jit(model_lib.Encoder(cfg).apply)(
      {"params": model_lib.encoder_params(params)}, jnp.asarray(input_ids))
  out = {"input_ids": input_ids.astype(np.int64),
         "attention_mask": (input_ids != tokenizer.pad_id).astype(np.int64),
         "last_hidden_state": np.asarray(hidden, np.float32)}
  backbone = model_lib.encoder_params(params)
  if head is not None and finetuned["head"] == "qa":
    from maelm_jax.finetune import heads  # pylint: disable=g-import-not-at-top
    start, end = jax.jit(heads.SpanExtractor(cfg).apply)(
        {"params": {"backbone": backbone, **head}}, jnp.asarray(input_ids))
    out["start_logits"] = np.asarray(start, np.float32)
    out["end_logits"] = np.asarray(end, np.float32)
  elif head is not None:
    from maelm_jax.finetune import heads  # pylint: disable=g-import-not-at-top
    model = heads.SequenceClassifier(cfg, finetuned["num_labels"],
                                     pooling=finetuned["pooling"])
    logits = jax.jit(model.apply)({"params": {"backbone": backbone, "head": head}},
                                  jnp.asarray(input_ids))
    out["logits"] = np.asarray(logits, np.float32)
  return out


def load_finetuned(workdir: str, run_config: dict, step: int | None):
  """(Pretrained, GLUE task or None for SQuAD, head params) of a fine-tuning
  workdir: its encoder's shape and tokenizer come from the pretraining run it
  started from (`init_from`), its parameters from its own checkpoint, layers
  unrolled."""
  from maelm_jax.finetune import glue_data  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import param_layout  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import pretrained as pretrained_lib  # pylint: disable=g-import-not-at-top
  init_from = run_config.get("init_from", "")
  if not os.path.isfile(workdir_lib.config_path(init_from)):
    raise FileNotFoundError(
        f"{workdir} was fine-tuned from {init_from!r}, whose config.json and "
        "tokenizer (the model's shape and ids) are gone; restore that workdir")
  pretrained = pretrained_lib.load_pretrained(init_from, read_params=False,
                                              scan_layers=False)
  params, pretrained.step = pretrained_lib.restore_params(workdir, step)
  backbone = params["backbone"]
  if param_layout.is_scanned(backbone):
    backbone = param_layout.params_for(backbone, False)
  pretrained.params = backbone
  if run_config["mode"] == "squad":
    return pretrained, None, {"span_head": params["span_head"]}
  return pretrained, glue_data.get_task(run_config["task"]), params["head"]


def _corpus(pretraining_workdir: str, source: str) -> str:
  """The pretraining data, as its corpus report counted it."""
  path = os.path.join(storage.local(pretraining_workdir), "corpus_report.json")
  if not os.path.isfile(path):
    return f"`{source}`"
  with open(path) as f:
    report = json.load(f)
  counts = ", ".join(f"{report[k]:,} {name}" for k, name in (
      ("documents", "documents"), ("words", "words"), ("tokens", "tokens"))
      if isinstance(report.get(k), (int, float)))
  return f"`{source}`" + (f" ({counts}, by its corpus report)" if counts else "")


def _finetuned(workdir: str, run_config: dict) -> str:
  """Table rows of a fine-tuned head: its task and the results it holds."""
  path = os.path.join(workdir, "eval_results.json")
  results = {}
  if os.path.isfile(path):
    with open(path) as f:
      results = json.load(f)
  main = results.get("main_metric")
  score = (f"{main} {results[main]:.4f} at the last epoch (best epoch "
           f"{results['best']['epoch']}: {results['best'][main]:.4f})"
           if main in results else "not recorded")
  what = (f"SQuAD v{run_config['version']}" if run_config["mode"] == "squad" else
          f"GLUE {run_config['task']}, {run_config.get('pooling', 'cls')} pooling")
  return (f"| fine-tuned | {what}, from `{run_config['init_from']}`; learning rate "
          f"{run_config['learning_rate']}, {run_config['num_epochs']} epochs, seed "
          f"{run_config['seed']} |\n| dev results | {score} |\n")


def model_card(kind: str, pretrained, workdir: str, with_lm_head: bool,
               run_config: dict | None = None, num_exported: int | None = None) -> str:
  """The export's README.md. `num_exported`: the parameters in model.safetensors
  (head included); a fine-tuned run's card gives its own steps and batch beside
  the pretraining's."""
  from maelm_jax.run import config_lib  # pylint: disable=g-import-not-at-top
  cfg, config = pretrained.model_cfg, pretrained.config
  run_config = run_config or {}
  mode = run_config.get("mode", "pretrain")
  finetuned = mode != "pretrain"
  pretraining_workdir = run_config["init_from"] if finetuned else workdir
  num_params = num_exported if num_exported is not None else sum(
      v.size for v in _flatten("", model_params(pretrained.params), {}).values())
  if finetuned:
    pretrained_step = (workdir_lib.evaluations(pretraining_workdir) or [{}])[-1].get(
        "step", "?")
    steps = (f"| pretraining steps | {pretrained_step} of {config.total_steps}, batch "
             f"{config.batch_size} x {config.seq_len} tokens |\n| fine-tuning steps | "
             f"{pretrained.step}, batch {run_config.get('batch_size', '?')} x "
             f"{run_config.get('max_seq_len', '?')} tokens |")
  else:
    steps = (f"| steps | {pretrained.step} of {config.total_steps}, batch "
             f"{config.batch_size} x {config.seq_len} tokens |")
  ev = (workdir_lib.evaluations(pretraining_workdir) or [{}])[-1]
  score = (f"{100 * ev['eval/mask_accuracy']:.1f}% top-1 on held-out [MASK]ed "
           f"positions at step {ev['step']} (always the most frequent piece: "
           f"{100 * ev.get('eval/unigram_accuracy', float('nan')):.1f}%, the "
           f"left-neighbour bigram table: "
           f"{100 * ev.get('eval/bigram_accuracy', float('nan')):.1f}%); "
           f"loss {ev['eval/mask_loss']:.3f}" if ev else "not recorded")
  remote = "" if kind == "roberta" else ", trust_remote_code=True"
  decoder = ("none (MLM)" if cfg.decoder_type == "none" else
             f"{cfg.decoder_type}-attention, {cfg.decoder_layers} layers: "
             + ("exported with the LM head (fill-mask reads it)" if with_lm_head
                else "not exported"))
  task = ("question-answering" if mode == "squad" else
          "text-classification" if finetuned else
          "fill-mask" if with_lm_head else "feature-extraction")
  auto = ("AutoModelForQuestionAnswering" if mode == "squad" else
          "AutoModelForSequenceClassification" if finetuned else
          "AutoModelForMaskedLM" if with_lm_head else "AutoModel")
  example = ('question="Where did she go?", context="She went to Paris by train."'
             if mode == "squad" else '"The cat sat on the [MASK]."' if with_lm_head
             else '"A sentence."')
  return f"""---
library_name: transformers
license: apache-2.0
pipeline_tag: {task}
tags: [maelm-jax, {config.model.objective}]
---
# {os.path.basename(os.path.normpath(storage.display(workdir)))}: a maelm-jax encoder

Pretrained with maelm-jax (JAX/Flax) and exported by
`python -m maelm_jax.interop.export_hf --workdir={storage.display(workdir)}` (step {pretrained.step}).

| | |
|---|---|
| objective | {config.model.objective} (mask ratio {" -> ".join(f"{r:g}" for r in config_lib.mask_ratios(config))}, decoder {decoder}) |
| size | {config.model.size}: {cfg.num_layers} layers, hidden {cfg.hidden}, {cfg.num_heads} heads, MLP {cfg.mlp}; {num_params:,} parameters exported |
| layers | {cfg.ln_type}-LN{" with NormFormer's extra LayerNorms" if cfg.normformer else ""}, {"GEGLU" if cfg.mlp_activation == "geglu" else "GELU"} FFN, {"relative position bias + " if cfg.relative_position_bias else ""}{"rotary" if cfg.position == "rope" else "absolute"} positions (up to {cfg.max_positions}) |
| tokenizer | {"SentencePiece" if pretrained.tokenizer.path.endswith(".model") else "Hugging Face"} {pretrained.tokenizer.model_type}, {cfg.vocab_size} pieces |
| data | {_corpus(pretraining_workdir, config.data.source)} |
{steps}
| held-out | {score} |
| head | {"the fine-tuned span head" if mode == "squad" else "the fine-tuned classifier" if finetuned else "the MLM head (fill-mask)" if with_lm_head else "none: the encoder only"} |
{_finetuned(workdir, run_config) if finetuned else ""}| license | Apache-2.0, as maelm-jax; the pretraining data's own terms apply to what was learned from it |

```python
from transformers import {auto}, AutoTokenizer, pipeline
tokenizer = AutoTokenizer.from_pretrained(DIR{remote})
model = {auto}.from_pretrained(DIR{remote})
print(pipeline("{task}", model=DIR{remote})({example}))
```

Tested with transformers 4.57 and 5.x (PyTorch) by maelm-jax's test suite.

`reference_outputs.npz` holds a few tokenized sentences and the float32 last hidden
states maelm-jax computes for them; a correct load matches them to about 1e-5.
Inputs are `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`; pad on the right.
{"The RoBERTa pooler is not part of pretraining: it starts untrained (transformers says so when loading)." if kind == "roberta" else ""}
"""


def model_params(params):
  from maelm_jax.modeling import model as model_lib
  return model_lib.encoder_params(params)


# --------------------------------------------------------------------------
# The export.
# --------------------------------------------------------------------------


def export(workdir: str, out: str, *, step: int | None = None,
           with_lm_head: bool = False, overwrite: bool = False) -> str:
  """Writes the export of `workdir` (its newest finished checkpoint, or `step`)
  to `out`; returns the model kind ("roberta" or "maelm")."""
  import numpy as np
  from safetensors.numpy import save_file
  from maelm_jax.run import checkpoints
  from maelm_jax.run import pretrained as pretrained_lib
  if storage.is_remote(out):
    raise ValueError(f"--out={out}: an export is written to a local directory; "
                     "upload it from there (or push it to the Hub)")
  # A bucket workdir is read from its mirror, its checkpoints in place (storage.py).
  workdir, out = storage.local(storage.absolute(workdir)), os.path.abspath(out)
  check_out_dir(out, overwrite)
  run_config = workdir_lib.read_config(workdir)
  if run_config is None:
    raise FileNotFoundError(f"{workdir_lib.config_path(workdir)} not found: --workdir "
                            "must be the --workdir of a maelm_jax pretraining run")
  mode = run_config.get("mode", "pretrain")
  if mode != "pretrain" and with_lm_head:
    raise ValueError(f"--with_lm_head: {workdir} is a fine-tuned {mode} model, which "
                     "has no LM head; drop --with_lm_head")
  steps = sorted(s for s, d in checkpoints.step_dirs(workdir).items()
                 if checkpoints.is_committed(d))
  if not steps:
    raise FileNotFoundError(f"no finished checkpoint in "
                            f"{checkpoints.checkpoint_dir(workdir)}; train first")
  if step is not None and step not in steps:
    raise ValueError(f"--step={step}: {workdir} has checkpoints at steps {steps}")

  head, finetuned = None, None
  if mode != "pretrain":
    pretrained, task, head = load_finetuned(workdir, run_config, step)
    finetuned = (QA_CONFIG if task is None else
                 classifier_config(task, run_config["pooling"]))
  else:
    pretrained = pretrained_lib.load_pretrained(workdir, encoder_only=not with_lm_head,
                                             step=step, scan_layers=False)
  cfg = pretrained.model_cfg
  # RoBERTa's classifier reads the first token: a mean-pooled one is remote code;
  # so is a pretraining decoder (MAE-LM, 3ML).
  kind = architecture(cfg)
  if ((finetuned or {}).get("pooling", "cls") != "cls"
      or (with_lm_head and cfg.decoder_type != "none")):
    kind = "maelm"
  params = pretrained.params if with_lm_head else model_params(pretrained.params)
  tensors = (roberta_tensors if kind == "roberta" else maelm_tensors)(
      params, cfg, with_lm_head, head)
  tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}

  # Written aside and renamed into place: a failed export leaves nothing half-done.
  tmp = f"{out}.tmp-{uuid.uuid4().hex[:8]}"
  os.makedirs(tmp)
  try:
    save_file(tensors, os.path.join(tmp, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(tmp, workdir_lib.HF_CONFIG_FILE), "w") as f:
      json.dump(hf_config(kind, cfg, with_lm_head, finetuned), f, indent=2)
    if kind == "maelm":
      for name in REMOTE_CODE_FILES:
        shutil.copyfile(HF_MODELING_DIR / name, os.path.join(tmp, name))
    write_tokenizer(pretrained.tokenizer.path, tmp, cfg.max_positions)
    np.savez(os.path.join(tmp, "reference_outputs.npz"),
             **reference_outputs(cfg, pretrained.params, pretrained.tokenizer, head,
                                 finetuned))
    with open(os.path.join(tmp, "README.md"), "w") as f:
      f.write(model_card(kind, pretrained, workdir, with_lm_head, run_config,
                         num_exported=sum(int(v.size) for v in tensors.values())))
    with open(os.path.join(tmp, MARKER), "w") as f:
      json.dump({"workdir": workdir, "step": pretrained.step, "kind": kind,
                 "with_lm_head": with_lm_head, "mode": mode,
                 "date": datetime.datetime.now().isoformat(timespec="seconds")},
                f, indent=2)
    if os.path.exists(out):
      old = f"{out}.old-{uuid.uuid4().hex[:8]}"
      os.rename(out, old)
      os.rename(tmp, out)
      shutil.rmtree(old)
    else:
      os.rename(tmp, out)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
  return kind


# --------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------


def _define_flags() -> None:
  flags.DEFINE_string("workdir", None, "A pretraining or fine-tuning workdir (a "
                      "fine-tuned one exports its task head too)")
  flags.DEFINE_string("out", None, "A new directory for the export")
  flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest)")
  flags.DEFINE_bool("with_lm_head", False, "Also export the masked-LM head (a "
                    "pretraining of any objective), for pipeline('fill-mask')")
  flags.DEFINE_bool("overwrite", False, "Replace an earlier export in --out")
  flags.mark_flags_as_required(["workdir", "out"])


def main():
  FLAGS = flags.FLAGS
  kind = export(FLAGS.workdir, FLAGS.out, step=FLAGS.step,
                with_lm_head=FLAGS.with_lm_head, overwrite=FLAGS.overwrite)
  out = os.path.abspath(FLAGS.out)
  remote = "" if kind == "roberta" else ", trust_remote_code=True"
  print(f"exported a {kind} encoder to {out}\n"
        f"  AutoTokenizer.from_pretrained({out!r}{remote})\n"
        f"  {auto_class(out)}.from_pretrained({out!r}{remote})")


def auto_class(out: str) -> str:
  """The transformers Auto class that loads the export with its head (a
  fine-tuned classifier, span head or LM head), from its config's architecture."""
  with open(os.path.join(out, "config.json")) as f:
    architecture = (json.load(f).get("architectures") or [""])[0]
  for suffix in ("SequenceClassification", "QuestionAnswering", "MaskedLM"):
    if architecture.endswith("For" + suffix):
      return "AutoModelFor" + suffix
  return "AutoModel"


# `python -m` and the maelm-export command (setup.py's console scripts).
console = cli.command(main, _define_flags)

if __name__ == "__main__":
  console()

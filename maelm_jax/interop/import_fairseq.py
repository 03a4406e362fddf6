r"""Import a checkpoint of the official MAE-LM release (fairseq `ae` model,
github.com/yumeng5/MAE-LM) as a maelm-jax workdir.

  python -m maelm_jax.interop.import_fairseq --src=checkpoint.pt --dict=dict.txt \
      --tokenizer=DIR --workdir=W

  * checkpoint.pt: what the release's fairseq saves (`{"model": state_dict,
    "args"/"cfg": ...}`), or a bare state dict;
  * dict.txt: fairseq's dictionary of the run (`<symbol> <count>` per line, after
    the implicit `<s> <pad> </s> <unk>`; `<mask>` is appended by the task): it
    fixes the vocabulary's size and order, and is checked against the weights;
  * DIR: a fast tokenizer (`tokenizer.json`, e.g. roberta-base's, whose ids are
    fairseq's: the release uses RoBERTa's GPT-2 BPE and dictionary) with the
    same ids as the dictionary.

The workdir is a `recipe=paper` MAE-LM (the release's bucket function and 64
buckets, no [CLS] untie, post-LN, the decoder without relative position bias) at
the checkpoint's shape: the encoder, the decoder and the head. It is accepted by
fine-tuning (`--config.init_from=W`), continued pretraining, BLiMP, `analyze` and
`export_hf`. Names mapped: `encoder.sentence_encoder.*` (token and position
tables, embedding LayerNorm, the shared relative-bias table, the layers),
`gen_decoder.sentence_encoder.*` (its own position table and embedding
LayerNorm, its layers), `gen_decoder.lm_head.*`. A tensor it cannot map, or a
model option it does not implement (`--decoder-rel-pos`, a decoder of another
width), is refused in one line naming it. `ae_large` checkpoints were trained with
`--max-rel-pos 256`: pass `--max_rel_pos=256` (a state dict does not record it).

Loading: `torch.load(weights_only=True)`, which refuses pickled code. fairseq
checkpoints also pickle their `args` (an argparse.Namespace) or `cfg`
(omegaconf), which that mode refuses: save the state dict alone first, where you
trust the file (`torch.save(torch.load(src, weights_only=False)["model"], out)`),
and pass that.
"""

from __future__ import annotations

import json
import os
import sys

from absl import flags, logging
import numpy as np

from maelm_jax.core import cli
from maelm_jax.interop import import_hf

PRETRAIN_ARG = "objective=maelm,size=base,recipe=paper"
ENC = "encoder.sentence_encoder."
DEC = "gen_decoder.sentence_encoder."
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def read_state_dict(src: str) -> dict:
  """The checkpoint's tensors as float32 numpy arrays, by name."""
  import torch  # pylint: disable=g-import-not-at-top
  try:
    loaded = torch.load(src, map_location="cpu", weights_only=True)
  except Exception as e:  # pickle.UnpicklingError and friends.
    raise ValueError(
        f"--src={src} does not load with torch.load(weights_only=True) ({type(e).__name__}:"
        f" {str(e).splitlines()[0][:120]}); fairseq pickles its args beside the weights: "
        "where you trust the file, save the state dict alone with torch.save(torch.load"
        "(src, weights_only=False)['model'], 'weights.pt') and pass that") from None
  state = loaded.get("model", loaded) if isinstance(loaded, dict) else None
  if not isinstance(state, dict) or not all(hasattr(v, "shape") for v in state.values()):
    raise ValueError(f"--src={src} holds no state dict (a mapping of names to tensors)")
  return {k: v.detach().float().numpy() for k, v in state.items()}


def read_dict(path: str) -> list[str]:
  """fairseq's symbols in id order: the four implicit specials, the file's, <mask>.

  Read as upstream fairseq's `Dictionary.add_from_file` reads it: `<symbol>
  <count>` per line, the symbol possibly holding spaces; a symbol seen before is
  an error unless its line ends with `#fairseq:overwrite`, which gives it a new
  id. (The MAE-LM release's fork is laxer: it skips repeats, takes lines without
  a count and aliases [CLS]/[MASK]... to <s>/<mask>; a dict.txt that relies on
  that is refused here, and needs those lines removed.)
  """
  symbols = list(FAIRSEQ_SPECIALS)
  seen = set(symbols)
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      line = line.rstrip()
      if not line:
        continue
      symbol, _, count = line.rpartition(" ")
      overwrite = count == "#fairseq:overwrite"
      if overwrite:
        symbol, _, count = symbol.rpartition(" ")
      if not symbol or not count.isdigit():
        raise ValueError(f"{path}:{n}: expected '<symbol> <count>' (optionally "
                         f"'#fairseq:overwrite'), got {line[:60]!r}")
      if symbol in seen and not overwrite:
        raise ValueError(f"{path}:{n}: {symbol!r} is in the dictionary twice; "
                         "fairseq refuses that too unless the line ends with "
                         "#fairseq:overwrite")
      seen.add(symbol)
      symbols.append(symbol)
  if "<mask>" not in seen:
    symbols.append("<mask>")
  return symbols


def _layer(t, prefix: str, heads: int) -> dict:
  hidden = t[prefix + "self_attn.q_proj.weight"].shape[0]
  qkv = (hidden, heads, hidden // heads)
  d = lambda name, shape=None: import_hf._dense(t, prefix + name, shape)
  out = d("self_attn.out_proj")
  return {"self_attn": {"query": d("self_attn.q_proj", qkv),
                        "key": d("self_attn.k_proj", qkv),
                        "value": d("self_attn.v_proj", qkv),
                        "out": {"kernel": out["kernel"].reshape(heads, hidden // heads,
                                                                hidden),
                                "bias": out["bias"]}},
          "self_attn_ln": import_hf._ln(t, prefix + "self_attn_layer_norm"),
          "mlp": {"wi": d("fc1"), "wo": d("fc2")},
          "mlp_ln": import_hf._ln(t, prefix + "final_layer_norm")}


def _count_layers(tensors: dict, prefix: str) -> int:
  return len({k[len(prefix):].split(".")[1] for k in tensors
              if k.startswith(prefix + "layers.")})


def params_from_release(tensors: dict, heads: int, old_id: np.ndarray) -> dict:
  """The maelm-jax tree of a release state dict; `old_id[new]` is the release's
  id of the token our id `new` stands for (embedding rows and head bias)."""
  t = import_hf.Tensors(tensors, "")
  for option, name in (("--decoder-rel-pos 1", DEC + "relative_attention_bias.weight"),
                       ("a decoder of another width (encoder_to_decoder)",
                        "encoder_to_decoder.weight")):
    if name in tensors:
      raise ValueError(f"the checkpoint was trained with {option} ({name}); this "
                       "importer maps the release's run_pretrain.sh model only")
  params = {"token_embed": {"embedding": t[ENC + "embed_tokens.weight"][old_id]}}
  for part, prefix in (("encoder", ENC), ("decoder", DEC)):
    tree = {"position_embed": {"embedding": t[prefix + "embed_positions.weight"]},
            "input_ln": import_hf._ln(t, prefix + "emb_layer_norm")}
    for i in range(_count_layers(tensors, prefix)):
      tree[f"layer_{i}"] = _layer(t, f"{prefix}layers.{i}.", heads)
    params[part] = tree
  params["encoder"]["relative_bias"] = {
      "table": t[ENC + "relative_attention_bias.weight"]}
  params["lm_head"] = {"dense": import_hf._dense(t, "gen_decoder.lm_head.dense"),
                       "ln": import_hf._ln(t, "gen_decoder.lm_head.layer_norm"),
                       "bias": t["gen_decoder.lm_head.bias"][old_id]}
  # The head and the decoder share the encoder's token table in the release.
  for shared in (DEC + "embed_tokens.weight", "gen_decoder.lm_head.weight"):
    if shared in tensors and not np.array_equal(tensors[shared],
                                                tensors[ENC + "embed_tokens.weight"]):
      raise ValueError(f"{shared} differs from {ENC}embed_tokens.weight; the release "
                       "ties them, and so does this importer")
    t.used.add(shared)
  ignored = [n for n in t.unused() if not n.endswith("version")]
  if ignored:
    raise ValueError(f"the checkpoint has tensors this importer cannot map: "
                     f"{', '.join(ignored[:5])}")
  return params


def run_config(tensors: dict, heads: int, vocab_size: int, model_type: str):
  """`recipe=paper` MAE-LM (self-attention decoder) at the checkpoint's shape."""
  from maelm_jax.run import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(config_lib.load_config_module(
      import_hf.PRETRAIN_CONFIG).get_config(PRETRAIN_ARG))
  m = config.model
  m.num_layers = _count_layers(tensors, ENC)
  m.decoder_layers = _count_layers(tensors, DEC)
  m.hidden = tensors[ENC + "embed_tokens.weight"].shape[1]
  m.mlp = tensors[ENC + "layers.0.fc1.weight"].shape[0]
  m.num_heads = heads
  m.max_positions = tensors[ENC + "embed_positions.weight"].shape[0]
  decoder_positions = tensors[DEC + "embed_positions.weight"].shape[0]
  if decoder_positions != m.max_positions:
    raise ValueError(f"the decoder has {decoder_positions} positions and the encoder "
                     f"{m.max_positions}; this importer needs one length")
  m.relative_buckets = tensors[ENC + "relative_attention_bias.weight"].shape[0]
  m.dtype = "float32"
  config.seq_len = min(config.seq_len, m.max_positions)
  config.tokenizer.vocab_size = vocab_size
  config.tokenizer.model_type = model_type
  config.total_steps = 0
  return config


def import_checkpoint(src: str, dict_path: str, tokenizer_dir: str, workdir: str,
                      *, heads: int = 0, max_rel_pos: int = 128) -> dict:
  """Writes `workdir` from the release checkpoint `src`; returns a summary."""
  import jax  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import checkpoints, train_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import model as model_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  src, workdir = os.path.abspath(src), os.path.abspath(workdir)
  import_hf.check_workdir(workdir)
  symbols = read_dict(dict_path)
  tensors = read_state_dict(src)
  if ENC + "embed_tokens.weight" not in tensors:
    raise ValueError(f"--src={src} has no {ENC}embed_tokens.weight: not a checkpoint "
                     "of the release's `ae` model")
  rows = tensors[ENC + "embed_tokens.weight"].shape[0]
  if rows != len(symbols):
    raise ValueError(f"--dict={dict_path} gives {len(symbols)} symbols (with <s> <pad> "
                     f"</s> <unk> and <mask>) but the embedding has {rows} rows; pass "
                     "the dict.txt the checkpoint was trained with")
  with import_hf.staged_workdir(workdir) as tmp:
    hf_path = os.path.join(tmp, tokenizer_lib.HF_TOKENIZER_FILENAME)
    old_id = tokenizer_lib.import_hf_tokenizer(tokenizer_dir, hf_path)
    if int(old_id.max()) >= rows:
      raise ValueError(f"--tokenizer has ids up to {int(old_id.max())} but the "
                       f"dictionary has {rows}; the two do not belong together")
    mask_id = old_id[tokenizer_lib.NUM_SPECIAL - 1]
    if symbols[mask_id] != "<mask>":
      raise ValueError(f"the tokenizer's mask token has id {mask_id}, which is "
                       f"{symbols[mask_id]!r} in --dict; the two do not belong together")
    tokenizer = tokenizer_lib.HFTokenizer(hf_path)
    heads = heads or _default_heads(src, tensors)
    params = params_from_release(tensors, heads, old_id)
    config = run_config(tensors, heads, tokenizer.vocab_size, tokenizer.model_type)
    config.model.relative_max_distance = max_rel_pos
    model_cfg = model_lib.ModelConfig.from_config(config.model, tokenizer.vocab_size,
                                                  tokenizer.mask_id)
    expected = jax.eval_shape(lambda: train_lib.init_params(
        model_cfg, config.seq_len, jax.random.PRNGKey(0)))
    differences = checkpoints.tree_differences(params, expected)
    if differences:
      raise ValueError(f"--src={src} does not map onto a recipe=paper MAE-LM: "
                       + "; ".join(differences))
    summary = {"src": src, "kind": "mae-lm release (fairseq ae)",
               "layers": model_cfg.num_layers, "decoder_layers": model_cfg.decoder_layers,
               "hidden": model_cfg.hidden, "heads": heads,
               "vocab_size": tokenizer.vocab_size, "dropped_rows": rows - len(old_id)}
    import_hf.write_import(tmp, config, params, summary)
  logging.info("imported %s into %s: %s", src, workdir, summary)
  return summary


def _default_heads(src: str, tensors: dict) -> int:
  """A state dict does not record its heads: BERT/RoBERTa's 64-wide heads."""
  hidden = tensors[ENC + "embed_tokens.weight"].shape[1]
  if hidden % 64:
    raise ValueError(f"--src={src}: hidden size {hidden} is not a multiple of 64; pass "
                     "--heads (the state dict does not record them)")
  return hidden // 64  # The release's base (12) and large (16) alike.


def _define_flags() -> None:
  flags.DEFINE_string("src", None, "The release's checkpoint.pt (or a bare state dict).")
  flags.DEFINE_string("dict", None, "fairseq's dict.txt of the run.")
  flags.DEFINE_string("tokenizer", None, "Folder with the matching tokenizer.json.")
  flags.DEFINE_string("workdir", None, "New workdir to write (must not exist or be empty).")
  flags.DEFINE_integer("heads", 0, "Attention heads (0: hidden / 64, the release's "
                       "base and large; a state dict does not record them).")
  flags.DEFINE_integer("max_rel_pos", 128, "The release's --max-rel-pos.")
  flags.mark_flags_as_required(["src", "dict", "tokenizer", "workdir"])


def main():
  f = flags.FLAGS
  try:
    summary = import_checkpoint(f.src, f.dict, f.tokenizer, f.workdir,
                                heads=f.heads, max_rel_pos=f.max_rel_pos)
  except (ValueError, KeyError, FileNotFoundError, FileExistsError) as e:
    # Also what torch and numpy raise reading a file of another kind.
    sys.exit(f"error: {e}")
  print(json.dumps(summary, indent=2))
  print(f"fine-tune: python -m maelm_jax.main --config=configs/glue.py:task=sst2 "
        f"--config.init_from={os.path.abspath(f.workdir)} --workdir=W_sst2")


# `python -m` and the maelm-import-fairseq command (setup.py's console scripts).
console = cli.command(main, _define_flags)

if __name__ == "__main__":
  console()

r"""Import a Hugging Face BERT or RoBERTa checkpoint as a maelm-jax workdir.

  python -m maelm_jax.interop.import_hf --src=DIR --workdir=W

DIR is a local transformers checkpoint: `config.json`, `model.safetensors` and the
fast tokenizer's `tokenizer.json` (with `tokenizer_config.json` or
`special_tokens_map.json` naming its special tokens, where it has them). W becomes
a workdir that every tool reading a pretraining run accepts:

  fine-tuning   python -m maelm_jax.finetune.run --config=configs/glue.py:task=sst2 \
                    --config.init_from=W --workdir=W_sst2
  continued     python -m maelm_jax.main --config=configs/pretrain.py:objective=mlm,size=base,recipe=paper \
  pretraining       --config.init_from=W --config.data.source='text:/my/*.txt' --workdir=W2
                (the model's shape comes from W; `maelm`/`3ml` start a fresh decoder)
  BLiMP, analysis, export: python -m maelm_jax.evaluate.blimp / analyze / export_hf --workdir=W

What changes on the way in, and why it changes nothing the model computes:
  * ids: the project keeps [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0..4, so the
    tokenizer is re-indexed (`tokenizer.import_hf_tokenizer`: those five first,
    every other token in its old order) and the embedding rows (and the MLM
    head's bias) are permuted the same way;
  * positions: RoBERTa numbers positions from `pad_token_id + 1`, so its rows
    from there on are positions 0, 1, ...; BERT's single token type is added to
    every position row (it is added to every token);
  * rows of the embedding no token of the tokenizer can produce are dropped.

Weights are read from safetensors only: a pickled `pytorch_model.bin` can run code
when it is loaded, and is refused with the safe conversion named. The workdir
holds the parameters at step 0 (no optimizer state): continue pretraining in a
new workdir with `--config.init_from=W`.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import shutil
import sys
import uuid

from absl import flags, logging
import numpy as np

from maelm_jax.core import cli, workdir as workdir_lib

MARKER = "import.json"
PARITY_TOLERANCE = 1e-4  # float32, largest absolute difference.
MODEL_TYPES = ("bert", "roberta")


# --------------------------------------------------------------------------
# Checks (before any tensor is read).
# --------------------------------------------------------------------------


def read_hf_config(src: str) -> dict:
  """The checkpoint's config.json, checked for what the encoder can be."""
  path = os.path.join(src, workdir_lib.HF_CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--src={src} has no config.json; pass a local "
                            "transformers checkpoint directory (save_pretrained)")
  with open(path, encoding="utf-8") as f:
    hf = json.load(f)
  kind = hf.get("model_type")
  if kind not in MODEL_TYPES:
    raise ValueError(f"--src={src} is a {kind!r} model; import_hf reads "
                     f"{' and '.join(MODEL_TYPES)} checkpoints")
  if hf.get("hidden_act", "gelu") != "gelu":
    raise ValueError(f"--src={src} uses hidden_act={hf['hidden_act']!r}; the "
                     "encoder computes the exact GELU ('gelu') only")
  if hf.get("position_embedding_type", "absolute") != "absolute":
    raise ValueError(f"--src={src} uses position_embedding_type="
                     f"{hf['position_embedding_type']!r}; only 'absolute' is read")
  if hf["hidden_size"] % hf["num_attention_heads"]:
    raise ValueError(f"--src={src}: hidden_size {hf['hidden_size']} is not a "
                     f"multiple of num_attention_heads {hf['num_attention_heads']}")
  return hf


def check_weights_file(src: str) -> str:
  path = os.path.join(src, "model.safetensors")
  if os.path.isfile(path):
    return path
  if any(os.path.isfile(os.path.join(src, n)) for n in ("pytorch_model.bin",
                                                        "model.safetensors.index.json")):
    raise ValueError(
        f"--src={src} holds its weights as pytorch_model.bin (or in shards), not "
        "one model.safetensors; a pickle can run code when it is read. Convert "
        "it where you trust it: AutoModelForMaskedLM.from_pretrained(DIR)"
        ".save_pretrained(DIR2, safe_serialization=True, max_shard_size='100GB')")
  raise FileNotFoundError(f"--src={src} has no model.safetensors")


def check_workdir(workdir: str) -> None:
  if os.path.exists(workdir) and (not os.path.isdir(workdir) or os.listdir(workdir)):
    raise FileExistsError(f"--workdir={workdir} exists and is not empty; name a new "
                          "directory (nothing in it was touched)")


# --------------------------------------------------------------------------
# Parameters: transformers' state dict -> the maelm-jax tree.
# --------------------------------------------------------------------------


class Tensors:
  """The checkpoint's tensors by name, with the base model's prefix optional
  (`roberta.` / `bert.` where the checkpoint has a head); remembers what it
  handed out, so unused tensors can be named."""

  def __init__(self, tensors: dict, kind: str):
    self._tensors, self._prefix, self.used = tensors, kind + ".", set()

  def __contains__(self, name):
    return name in self._tensors or self._prefix + name in self._tensors

  def __getitem__(self, name) -> np.ndarray:
    key = name if name in self._tensors else self._prefix + name
    if key not in self._tensors:
      raise KeyError(f"the checkpoint has no tensor {name!r}; it is not a "
                     "BERT/RoBERTa state dict this importer can map")
    self.used.add(key)
    return np.asarray(self._tensors[key], np.float32)

  def unused(self) -> list[str]:
    return sorted(set(self._tensors) - self.used)


def _dense(t: Tensors, name: str, shape=None) -> dict:
  """torch Linear [out, in] -> flax kernel [in, out...] (reshaped to `shape`)."""
  kernel = t[name + ".weight"].T
  bias = t[name + ".bias"]
  if shape is not None:
    kernel, bias = kernel.reshape(shape), bias.reshape(shape[1:])
  return {"kernel": kernel, "bias": bias}


def _ln(t: Tensors, name: str) -> dict:
  return {"scale": t[name + ".weight"], "bias": t[name + ".bias"]}


def encoder_tree(t: Tensors, hf: dict, old_id: np.ndarray) -> dict:
  """`token_embed` and `encoder` of the maelm-jax tree (post-LN, absolute)."""
  kind, hidden = hf["model_type"], hf["hidden_size"]
  heads = hf["num_attention_heads"]
  qkv = (hidden, heads, hidden // heads)
  positions = t["embeddings.position_embeddings.weight"]
  if kind == "roberta":
    positions = positions[hf.get("pad_token_id", 1) + 1:]
  # Both add token type 0 to every token: fold it into every position row.
  positions = positions + t["embeddings.token_type_embeddings.weight"][0]
  encoder = {"position_embed": {"embedding": positions},
             "input_ln": _ln(t, "embeddings.LayerNorm")}
  for i in range(hf["num_hidden_layers"]):
    p = f"encoder.layer.{i}."
    out = _dense(t, p + "attention.output.dense")
    encoder[f"layer_{i}"] = {
        "self_attn": {
            "query": _dense(t, p + "attention.self.query", qkv),
            "key": _dense(t, p + "attention.self.key", qkv),
            "value": _dense(t, p + "attention.self.value", qkv),
            "out": {"kernel": out["kernel"].reshape(heads, hidden // heads, hidden),
                    "bias": out["bias"]}},
        "self_attn_ln": _ln(t, p + "attention.output.LayerNorm"),
        "mlp": {"wi": _dense(t, p + "intermediate.dense"),
                "wo": _dense(t, p + "output.dense")},
        "mlp_ln": _ln(t, p + "output.LayerNorm"),
    }
  embedding = t["embeddings.word_embeddings.weight"][old_id]
  return {"token_embed": {"embedding": embedding}, "encoder": encoder}


def lm_head_tree(t: Tensors, hf: dict, old_id: np.ndarray, tied: bool) -> dict | None:
  """The MLM head, where the checkpoint has one (else None: a fresh head)."""
  names = {"roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias",
                       "lm_head.decoder.weight"),
           "bert": ("cls.predictions.transform.dense",
                    "cls.predictions.transform.LayerNorm", "cls.predictions.bias",
                    "cls.predictions.decoder.weight")}[hf["model_type"]]
  dense, ln, bias, decoder = names
  if dense + ".weight" not in t:
    return None
  head = {"dense": _dense(t, dense), "ln": _ln(t, ln), "bias": t[bias][old_id]}
  if decoder in t:
    weight = t[decoder][old_id]
    if not tied:
      head["embedding"] = weight
    elif not np.array_equal(weight, t["embeddings.word_embeddings.weight"][old_id]):
      raise ValueError(f"config.json says tie_word_embeddings, but {decoder} "
                       "differs from the word embeddings")
  elif not tied:
    raise KeyError(f"the head is untied but the checkpoint has no {decoder}")
  return head


# --------------------------------------------------------------------------
# The workdir.
# --------------------------------------------------------------------------


PRETRAIN_CONFIG = str(pathlib.Path(__file__).resolve().parents[1] / "configs"
                      / "pretrain.py")
BASE_CONFIG_ARG = "objective=mlm,size=base,recipe=paper"
# The config keys that carry the checkpoint's shape: continued pretraining
# (`--config.init_from=W`) must set the same values.
SHAPE_KEYS = ("num_layers", "hidden", "num_heads", "mlp", "max_positions",
              "ln_type", "position", "relative_position_bias", "tie_embeddings",
              "layer_norm_eps")


def run_config(hf: dict, vocab_size: int, model_type: str, src: str):
  """A pretraining config (`recipe=paper`, MLM) with the checkpoint's shape."""
  from maelm_jax.run import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(
      config_lib.load_config_module(PRETRAIN_CONFIG).get_config(BASE_CONFIG_ARG))
  positions = hf["max_position_embeddings"] - (
      hf.get("pad_token_id", 1) + 1 if hf["model_type"] == "roberta" else 0)
  m = config.model
  m.num_layers, m.hidden = hf["num_hidden_layers"], hf["hidden_size"]
  m.num_heads, m.mlp = hf["num_attention_heads"], hf["intermediate_size"]
  m.max_positions, m.ln_type, m.relative_position_bias = positions, "post", False
  m.tie_embeddings = bool(hf.get("tie_word_embeddings", True))
  m.layer_norm_eps = float(hf.get("layer_norm_eps", 1e-12))
  m.dropout = float(hf.get("hidden_dropout_prob", 0.1))
  m.attention_dropout = float(hf.get("attention_probs_dropout_prob", 0.1))
  m.activation_dropout = m.dropout
  m.dtype = "float32"
  config.seq_len = min(config.seq_len, positions)
  config.tokenizer.vocab_size = vocab_size
  config.tokenizer.model_type = model_type
  config.total_steps = 0
  return config


def continue_flags(workdir: str) -> str:
  """The flags of a continued pretraining from `workdir` (an import)."""
  saved = workdir_lib.read_config(workdir)
  shape = " ".join(f"--config.model.{k}={saved['model'][k]}" for k in SHAPE_KEYS)
  return (f"--config=configs/pretrain.py:{BASE_CONFIG_ARG} {shape} "
          f"--config.tokenizer.vocab_size={saved['tokenizer']['vocab_size']} "
          f"--config.init_from={workdir}")


def write_params_checkpoint(workdir: str, params: dict) -> None:
  """`params` as step 0 of the workdir, in the layout `restore_params` reads."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import checkpoints  # pylint: disable=g-import-not-at-top
  manager = ocp.CheckpointManager(checkpoints.checkpoint_dir(workdir),
                                  item_names=("state",))
  manager.save(0, args=ocp.args.Composite(
      state=ocp.args.StandardSave({"params": params, "step": np.int32(0)})))
  manager.wait_until_finished()
  manager.close()


@contextlib.contextmanager
def staged_workdir(workdir: str):
  """A temporary sibling of `workdir` to write an import into; it becomes
  `workdir` (which must be absent or empty) when the block succeeds and is removed
  when it fails: an import is all or nothing."""
  tmp = f"{workdir}.tmp-{uuid.uuid4().hex[:8]}"
  os.makedirs(tmp)
  try:
    yield tmp
    if os.path.exists(workdir):
      os.rmdir(workdir)  # Empty (check_workdir).
    os.rename(tmp, workdir)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)


def write_import(tmp: str, config, params: dict, summary: dict) -> None:
  """The run config, the parameters at step 0 and the import's summary."""
  workdir_lib.write_config(config, tmp)
  write_params_checkpoint(tmp, params)
  summary["date"] = datetime.datetime.now().isoformat(timespec="seconds")
  with open(os.path.join(tmp, MARKER), "w") as f:
    json.dump(summary, f, indent=2)


def import_checkpoint(src: str, workdir: str) -> dict:
  """Writes `workdir` from the checkpoint in `src`; returns a summary."""
  import jax  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import checkpoints, train_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import model as model_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  src, workdir = os.path.abspath(src), os.path.abspath(workdir)
  hf = read_hf_config(src)
  weights = check_weights_file(src)
  check_workdir(workdir)
  if not os.path.isfile(os.path.join(src, tokenizer_lib.HF_TOKENIZER_FILENAME)):
    raise FileNotFoundError(
        f"--src={src} has no tokenizer.json; save the checkpoint's fast tokenizer "
        "there: AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)")

  with staged_workdir(workdir) as tmp:
    old_id = tokenizer_lib.import_hf_tokenizer(
        src, os.path.join(tmp, tokenizer_lib.HF_TOKENIZER_FILENAME))
    tokenizer = tokenizer_lib.HFTokenizer(
        os.path.join(tmp, tokenizer_lib.HF_TOKENIZER_FILENAME))
    rows = hf["vocab_size"]
    if int(old_id.max()) >= rows:
      raise ValueError(f"the tokenizer has ids up to {int(old_id.max())} but the "
                       f"embedding has {rows} rows; the two do not belong together")
    t = Tensors(load_file(weights), hf["model_type"])
    tied = bool(hf.get("tie_word_embeddings", True))
    params = encoder_tree(t, hf, old_id)
    head = lm_head_tree(t, hf, old_id, tied)
    config = run_config(hf, tokenizer.vocab_size, tokenizer.model_type, src)
    model_cfg = model_lib.ModelConfig.from_config(config.model, tokenizer.vocab_size,
                                                  tokenizer.mask_id)
    # The tree the model expects; every leaf must be filled, in its shape.
    expected = jax.eval_shape(lambda: train_lib.init_params(
        model_cfg, config.seq_len, jax.random.PRNGKey(0)))
    fresh = None
    if head is None:
      fresh = train_lib.init_params(model_cfg, config.seq_len,
                                    jax.random.PRNGKey(config.seed))["lm_head"]
      head = jax.tree.map(np.asarray, fresh)
    params["lm_head"] = head
    differences = checkpoints.tree_differences(params, expected)
    if differences:
      raise ValueError(f"--src={src} does not map onto the encoder: "
                       + "; ".join(differences))
    ignored = [n for n in t.unused() if "pooler" not in n and
               not n.endswith("position_ids") and "decoder.bias" not in n]
    if ignored:
      raise ValueError(f"--src={src} has tensors this importer cannot map: "
                       f"{', '.join(ignored[:5])}")
    summary = {"src": src, "model_type": hf["model_type"],
               "layers": model_cfg.num_layers, "hidden": model_cfg.hidden,
               "vocab_size": tokenizer.vocab_size, "dropped_rows": rows - len(old_id),
               "lm_head": "fresh" if fresh is not None else "imported"}
    write_import(tmp, config, params, summary)
  logging.info("imported %s into %s: %s", src, workdir, summary)
  return summary


# --------------------------------------------------------------------------
# Parity: the import against transformers on the same text.
# --------------------------------------------------------------------------

PARITY_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "  leading,   inner   and trailing spaces  ", "tabs\tand\nnew lines",
    "naïve café ﬁ ① Ｆｕｌｌ-width", "emoji 😀 and 中文, 1999, 2,000.5 and 3.14",
    "don't ‘quote’ “me”: UPPER lower MiXeD!?;:()[]{}<>",
)


def parity(src: str, workdir: str, texts=PARITY_TEXTS) -> dict:
  """Largest differences between the import and transformers' model of `src`:
  token ids (re-indexed back), last hidden states and, where the checkpoint has an
  MLM head, logits. Needs torch and transformers."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import model as model_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import pretrained as pretrained_lib  # pylint: disable=g-import-not-at-top
  run = pretrained_lib.load_pretrained(workdir, encoder_only=False, scan_layers=False)
  with open(os.path.join(workdir, MARKER), encoding="utf-8") as f:
    has_head = json.load(f)["lm_head"] == "imported"
  theirs_tok = transformers.AutoTokenizer.from_pretrained(src)
  vocab = theirs_tok.get_vocab()
  old_id = np.asarray([vocab[run.tokenizer.id_to_piece(i)]
                       for i in range(run.tokenizer.vocab_size)])
  rows = [[run.tokenizer.cls_id, *run.tokenizer.encode_one(t), run.tokenizer.sep_id]
          for t in texts]
  ids_differ = sum(list(old_id[r]) != theirs_tok(t, split_special_tokens=True)[
      "input_ids"] for t, r in zip(texts, rows))
  ids = np.zeros((len(rows), max(map(len, rows))), np.int32)
  for i, row in enumerate(rows):
    ids[i, :len(row)] = row
  valid = ids != run.tokenizer.pad_id
  cfg = run.model_cfg
  # Jitted: run op by op, the model compiles each of its operations on its own.
  hidden = np.asarray(jax.jit(model_lib.Encoder(cfg).apply)(
      {"params": model_lib.encoder_params(run.params)}, jnp.asarray(ids)))
  model_class = (transformers.AutoModelForMaskedLM if has_head
                 else transformers.AutoModel)
  theirs = model_class.from_pretrained(src).eval()
  with torch.no_grad():
    out = theirs(input_ids=torch.tensor(old_id[ids]),
                 attention_mask=torch.tensor(valid.astype(np.int64)),
                 output_hidden_states=True)
  result = {"texts": len(texts), "ids_differ": int(ids_differ),
            "hidden_max_abs_diff": float(np.abs(
                hidden - out.hidden_states[-1].numpy())[valid].max())}
  if has_head:
    logits = np.asarray(jax.jit(model_lib.LMHead(cfg).apply)(
        {"params": run.params["lm_head"]}, jnp.asarray(hidden),
        run.params["token_embed"]["embedding"]))
    result["logits_max_abs_diff"] = float(np.abs(
        logits - out.logits.numpy()[..., old_id])[valid].max())
  return result


# --------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------


def _define_flags() -> None:
  flags.DEFINE_string("src", None, "A local transformers BERT/RoBERTa checkpoint")
  flags.DEFINE_string("workdir", None, "A new directory for the workdir")
  flags.DEFINE_bool("check", False, "Then compare the import with transformers' "
                    "model of --src on tricky text (needs torch and transformers)")
  flags.mark_flags_as_required(["src", "workdir"])


def main():
  FLAGS = flags.FLAGS
  summary = import_checkpoint(FLAGS.src, FLAGS.workdir)
  workdir = os.path.abspath(FLAGS.workdir)
  print(f"imported a {summary['model_type']} encoder ({summary['layers']} layers, "
        f"hidden {summary['hidden']}, {summary['vocab_size']} tokens; MLM head "
        f"{summary['lm_head']}) into {workdir}\n"
        f"  fine-tune:  --config.init_from={workdir}\n"
        f"  continue pretraining (objective mlm, maelm or 3ml; a new --workdir):\n"
        f"    python -m maelm_jax.main {continue_flags(workdir)}")
  if FLAGS.check:
    result = parity(FLAGS.src, workdir)
    print("parity with transformers: " + json.dumps(result))
    worst = max(result["hidden_max_abs_diff"], result.get("logits_max_abs_diff", 0))
    if result["ids_differ"] or worst > PARITY_TOLERANCE:
      sys.exit(f"error: the import differs from transformers' model of {FLAGS.src} "
               f"(tolerance {PARITY_TOLERANCE}); please report it with the line above")


# `python -m` and the maelm-import command (setup.py's console scripts).
console = cli.command(main, _define_flags)

if __name__ == "__main__":
  console()

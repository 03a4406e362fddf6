"""SentencePiece tokenizer with the fixed special-token layout the models assume.

Every tokenizer this module trains or accepts has the same five special pieces at
the same ids, so model code can use the constants below without asking the
tokenizer:

  id 0 [PAD]   padding (never produced by packing; kept for fine-tuning batches)
  id 1 [UNK]   characters outside the trained alphabet
  id 2 [CLS]   first token of every pretraining row
  id 3 [SEP]   document separator and last token of every row
  id 4 [MASK]  the corruption token of MLM / MAE-LM / 3ML

[CLS], [SEP] and [MASK] are SentencePiece *control* symbols: they exist in the
vocabulary but the encoder never produces them from raw text, so a document that
literally contains the string "[MASK]" cannot smuggle mask tokens into the data.

`load_or_train_tokenizer` is the entry point used by training: it reuses the
tokenizer saved in the workdir (so restarts and evaluation see the same ids) and
only trains one when there is none yet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from absl import logging
import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from maelm_jax.core import storage
from maelm_jax.data import text as text_lib

# The layout (core/special_tokens.py), re-exported for the tokenizer's users.
from maelm_jax.core.special_tokens import (  # noqa: E402,F401  pylint: disable=g-multiple-import
    CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID, SEP_ID, SPECIAL_TOKENS, UNK_ID)

MODEL_TYPES = ("unigram", "bpe")
TOKENIZER_FILENAME = "tokenizer.model"

# SentencePiece silently skips training lines longer than `max_sentence_length`
# bytes (and fails with an opaque "!sentences_.empty()" when it skips all of
# them), so `train_tokenizer` cuts text into sentences, and sentences into
# word-aligned chunks, no longer than this.
_MAX_TRAINING_LINE_BYTES = 4096
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_VOCAB_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\).*?<=\s*(\d+)")
_WAIT_POLL_S = 0.5


class _ProjectIds:
  """What every tokenizer of the project shares: the five roles at ids 0..4, and
  the check `decode` makes of the ids it is given."""

  pad_id = PAD_ID
  unk_id = UNK_ID
  cls_id = CLS_ID
  sep_id = SEP_ID
  mask_id = MASK_ID
  path: str
  vocab_size: int

  def _printable_ids(self, ids: Iterable[int] | np.ndarray) -> list[int]:
    """`ids` as ints, [PAD] [CLS] [SEP] [MASK] left out; out-of-range ids raise."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f"token ids {bad[:5]} are outside [0, {self.vocab_size}) "
                       f"for the tokenizer at {self.path!r}")
    return [i for i in ids if i not in (PAD_ID, CLS_ID, SEP_ID, MASK_ID)]

  def __repr__(self) -> str:
    return f"{type(self).__name__}(path={self.path!r}, vocab_size={self.vocab_size})"

  # Both kinds wrap a native handle (SentencePiece's C++, tokenizers' Rust): a
  # pickle carries the file's contents instead, so a tokenizer can travel to
  # grain's worker processes.
  def __getstate__(self):
    return {"path": self.path, "contents": self._contents()}

  def __setstate__(self, state):
    self._load(state["path"], state["contents"])

  def _contents(self):
    raise NotImplementedError

  def _load(self, path: str, contents) -> None:
    raise NotImplementedError


class Tokenizer(_ProjectIds):
  """A SentencePiece model with [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0..4.

  Attributes:
    path: the `.model` file it was loaded from.
    vocab_size: number of pieces, special ones included (the embedding size).
    pad_id, unk_id, cls_id, sep_id, mask_id: 0, 1, 2, 3, 4.
  """

  def __init__(self, model_path: str):
    model_path = os.fspath(model_path)
    if not os.path.isfile(model_path):
      raise FileNotFoundError(
          f"no SentencePiece model at {model_path!r}; pass the path of an "
          "existing .model file (--config.tokenizer.path) or leave it empty to "
          "train one into the workdir")
    with open(model_path, "rb") as f:
      model_proto = f.read()
    self._init_from_proto(model_path, model_proto)

  def _init_from_proto(self, path: str, model_proto: bytes) -> None:
    self.path = path
    self._model_proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    self.vocab_size = self._sp.get_piece_size()
    pieces = tuple(self._sp.id_to_piece(i)
                   for i in range(min(NUM_SPECIAL, self.vocab_size)))
    if pieces != SPECIAL_TOKENS or not all(
        self._sp.is_control(i) for i in (CLS_ID, SEP_ID, MASK_ID)):
      raise ValueError(
          f"tokenizer at {path!r} does not have the special pieces this project "
          f"needs: ids 0..{NUM_SPECIAL - 1} are {pieces}, expected "
          f"{SPECIAL_TOKENS} with [CLS] [SEP] [MASK] as control symbols. Train "
          "one with maelm_jax.data.tokenizer.train_tokenizer (or leave "
          "--config.tokenizer.path empty to train one into the workdir)")

  @property
  def model_type(self) -> str:
    """"unigram" or "bpe" (read from the model's trainer spec)."""
    proto = sentencepiece_model_pb2.ModelProto.FromString(self._model_proto)
    return sentencepiece_model_pb2.TrainerSpec.ModelType.Name(
        proto.trainer_spec.model_type).lower()

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text, without [CLS]/[SEP]; runs on all cores."""
    if isinstance(texts, (str, bytes)):
      raise TypeError(
          "Tokenizer.encode takes a list of texts and returns a list of id "
          "lists; wrap a single text as encode([text]) or use encode_one(text)")
    return self._sp.encode(list(texts), out_type=int)

  def encode_one(self, text: str) -> list[int]:
    """Token ids of one text (the per-document fast path of the pipeline)."""
    return self._sp.encode(text, out_type=int)

  def encode_with_masks(self, text: str) -> list[int]:
    """Token ids of `text` where each "[MASK]" typed in it is the mask token, as a
    fill-mask user means it (`encode` keeps it as text, so that a corpus cannot
    smuggle masks in). The text around each mask is encoded as SentencePiece
    encodes it in place: the first part as a text; a later part as a new word
    when a space starts it, else as the rest of a word (no "▁": "of [MASK]." is
    ▁of [MASK] .). The export's tokenizer gives the same ids
    (interop/export_hf.fast_tokenizer)."""
    ids: list[int] = []
    for i, part in enumerate(text.split(SPECIAL_TOKENS[MASK_ID])):
      if i:
        ids.append(MASK_ID)
      if not part.strip():
        continue
      if i == 0 or part[0].isspace():
        ids += self._sp.encode(part, out_type=int)
      else:
        ids += self._word_rest().encode(part, out_type=int)
    return ids

  def _word_rest(self) -> spm.SentencePieceProcessor:
    """This model without its word-start prefix (the text after a [MASK])."""
    if getattr(self, "_sp_word_rest", None) is None:
      proto = sentencepiece_model_pb2.ModelProto.FromString(self._model_proto)
      proto.normalizer_spec.add_dummy_prefix = False
      self._sp_word_rest = spm.SentencePieceProcessor(
          model_proto=proto.SerializeToString())
    return self._sp_word_rest

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    """Text of `ids`; [PAD] [CLS] [SEP] [MASK] are dropped, [UNK] shows as ⁇."""
    # SentencePiece already renders control pieces as ""; the explicit filter
    # keeps that guarantee independent of the library's behaviour.
    return self._sp.decode(self._printable_ids(ids))

  def id_to_piece(self, token_id: int) -> str:
    return self._sp.id_to_piece(int(token_id))

  def word_starts(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """bool per id: the piece begins a word (SentencePiece's "▁"), or is special."""
    return np.asarray([int(i) < NUM_SPECIAL or
                       self._sp.id_to_piece(int(i)).startswith(SP_WORD_START)
                       for i in np.asarray(ids).reshape(-1)], bool)

  def _contents(self) -> bytes:
    return self._model_proto

  def _load(self, path: str, contents: bytes) -> None:
    self._init_from_proto(path, contents)


# --------------------------------------------------------------------------
# A Hugging Face `tokenizers` tokenizer (tokenizer.json: BPE, WordPiece, Unigram),
# as imported checkpoints bring it. `import_hf_tokenizer` re-indexes it so that the
# five roles sit at ids 0..4, like every tokenizer of this project.
# --------------------------------------------------------------------------

HF_TOKENIZER_FILENAME = "tokenizer.json"
TOKENIZER_FILENAMES = (TOKENIZER_FILENAME, HF_TOKENIZER_FILENAME)
SP_WORD_START = "\u2581"
# The names each role goes by (BERT's, RoBERTa's / fairseq's, XLNet's).
ROLE_NAMES = {PAD_ID: ("[PAD]", "<pad>"), UNK_ID: ("[UNK]", "<unk>"),
              CLS_ID: ("[CLS]", "<s>", "<cls>"), SEP_ID: ("[SEP]", "</s>", "<sep>"),
              MASK_ID: ("[MASK]", "<mask>")}
_ROLE_KEYS = {PAD_ID: "pad_token", UNK_ID: "unk_token", CLS_ID: "cls_token",
              SEP_ID: "sep_token", MASK_ID: "mask_token"}


class HFTokenizer(_ProjectIds):
  """A `tokenizers` tokenizer.json whose ids 0..4 are the five roles.

  The same interface as `Tokenizer`; `model_type` is the json's model ("bpe",
  "wordpiece", "unigram"). Make one from a checkpoint's own tokenizer.json with
  `import_hf_tokenizer`.
  """

  def __init__(self, path: str):
    path = os.fspath(path)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"no tokenizer.json at {path!r}")
    with open(path, encoding="utf-8") as f:
      self._init_from_json(path, f.read())

  def _init_from_json(self, path: str, text: str) -> None:
    import tokenizers  # pylint: disable=g-import-not-at-top
    self.path, self._json = path, text
    self._tok = tokenizers.Tokenizer.from_str(text)
    # A literal "<mask>" / "[CLS]" in a document is text, as with SentencePiece's
    # control symbols: special tokens come only from the pipeline.
    self._tok.encode_special_tokens = True
    # A checkpoint's tokenizer.json may carry truncation or padding settings (for
    # its model's inputs); rows are cut and padded by the pipeline, never here.
    self._tok.no_truncation()
    self._tok.no_padding()
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    pieces = tuple(self._tok.id_to_token(i) for i in range(NUM_SPECIAL))
    if any(p not in ROLE_NAMES[i] for i, p in enumerate(pieces)):
      raise ValueError(
          f"tokenizer at {path!r} has {pieces} at ids 0..{NUM_SPECIAL - 1}; this "
          "project needs pad, unk, cls, sep, mask there. Bring a Hugging Face "
          "checkpoint in with `python -m maelm_jax.interop.import_hf --src=DIR "
          "--workdir=W`, which re-indexes its tokenizer")
    model = json.loads(text)["model"]
    self._model_type = model["type"].lower()
    # How a piece says "I begin a word": WordPiece marks the *other* pieces.
    self._continuation = (model.get("continuing_subword_prefix") or "##"
                          if self._model_type == "wordpiece" else None)
    vocab = self._tok.get_vocab()
    self._start = "\u0120" if sum(p.startswith("\u0120") for p in vocab) > sum(
        p.startswith(SP_WORD_START) for p in vocab) else SP_WORD_START

  @property
  def model_type(self) -> str:
    return self._model_type

  def encode(self, texts: Sequence[str]) -> list[list[int]]:
    if isinstance(texts, (str, bytes)):
      raise TypeError("HFTokenizer.encode takes a list of texts; use encode_one")
    return [e.ids for e in self._tok.encode_batch(list(texts),
                                                  add_special_tokens=False)]

  def encode_one(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids of `text` and each one's [start, end) characters in `text` (the
    `tokenizers` alignment, through any normaliser)."""
    encoding = self._tok.encode(text, add_special_tokens=False)
    return encoding.ids, [tuple(o) for o in encoding.offsets]

  def decode(self, ids: Iterable[int] | np.ndarray) -> str:
    return self._tok.decode(self._printable_ids(ids), skip_special_tokens=False)

  def id_to_piece(self, token_id: int) -> str:
    return self._tok.id_to_token(int(token_id))

  def word_starts(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """bool per id: the piece begins a word, or is special. A piece right after a
    special one begins a word too (byte-level BPE marks no space there)."""
    ids = [int(i) for i in np.asarray(ids).reshape(-1)]
    starts = []
    for n, i in enumerate(ids):
      piece = self._tok.id_to_token(i) or ""
      if i < NUM_SPECIAL or (n and ids[n - 1] < NUM_SPECIAL) or n == 0:
        starts.append(True)
      elif self._continuation is not None:
        starts.append(not piece.startswith(self._continuation))
      else:
        starts.append(piece.startswith(self._start))
    return np.asarray(starts, bool)

  def _contents(self) -> str:
    return self._json

  def _load(self, path: str, contents: str) -> None:
    self._init_from_json(path, contents)


def open_tokenizer(path: str) -> Tokenizer | HFTokenizer:
  """The tokenizer at `path`: a SentencePiece `.model` or a `tokenizer.json`."""
  return HFTokenizer(path) if os.fspath(path).endswith(".json") else Tokenizer(path)


def own_name(path: str) -> str:
  """The name a tokenizer file gets in a workdir: tokenizer.model / .json."""
  return (HF_TOKENIZER_FILENAME if os.fspath(path).endswith(".json")
          else TOKENIZER_FILENAME)


def workdir_tokenizer_path(workdir: str) -> str:
  """The workdir's tokenizer file (tokenizer.model or tokenizer.json); the
  SentencePiece name when it has neither yet; a bucket workdir's is in its
  mirror (core/storage.py), since SentencePiece reads local files only."""
  workdir = storage.local(workdir)
  for name in TOKENIZER_FILENAMES:
    path = os.path.join(workdir, name)
    if os.path.isfile(path):
      return path
  return os.path.join(workdir, TOKENIZER_FILENAME)


def _role_names(src_dir: str) -> dict[int, str]:
  """Each role's token name from the checkpoint's tokenizer_config.json or
  special_tokens_map.json, where they say it."""
  names = {}
  for filename in ("special_tokens_map.json", "tokenizer_config.json"):
    path = os.path.join(src_dir, filename)
    if not os.path.isfile(path):
      continue
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
    for role, key in _ROLE_KEYS.items():
      value = saved.get(key)
      if isinstance(value, dict):
        value = value.get("content")
      if isinstance(value, str) and role not in names:
        names[role] = value
  return names


def _reindexed(node, new_id: dict[str, int]):
  """`node` (a post-processor) with every special token's id looked up anew."""
  if isinstance(node, list):
    if len(node) == 2 and isinstance(node[0], str) and isinstance(node[1], int):
      return [node[0], new_id[node[0]]]  # RobertaProcessing / BertProcessing.
    return [_reindexed(n, new_id) for n in node]
  if isinstance(node, dict):
    out = {k: _reindexed(v, new_id) for k, v in node.items()}
    if isinstance(node.get("ids"), list) and isinstance(node.get("tokens"), list):
      out["ids"] = [new_id[t] for t in node["tokens"]]  # TemplateProcessing.
    return out
  return node


def import_hf_tokenizer(src_dir: str, dst_path: str) -> np.ndarray:
  """Writes `src_dir`'s tokenizer.json to `dst_path` with the roles at ids 0..4.

  Returns `old_id`: `old_id[new]` is the id the checkpoint used for the token that
  has id `new` now, for re-indexing embedding rows. The other tokens keep their
  order. Raises ValueError naming a role no token plays.
  """
  text, old_id = _reindexed_json(src_dir)
  tmp = f"{dst_path}.tmp-{uuid.uuid4().hex}"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, dst_path)
  HFTokenizer(dst_path)  # The roles are where the project needs them.
  return old_id


def project_order_text(path: str) -> str:
  """The tokenizer.json at `path` (any file name) as this project reads it: the
  file itself where ids 0..4 are already pad, unk, cls, sep, mask, else
  re-indexed as imports are (`import_hf_tokenizer`; role names from a
  tokenizer_config.json / special_tokens_map.json beside it). Pretraining from
  scratch with a Hugging Face tokenizer stores this text in its workdir."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  with open(path, encoding="utf-8") as f:
    text = f.read()
  tok = tokenizers.Tokenizer.from_str(text)
  if all(tok.id_to_token(i) in ROLE_NAMES[i] for i in range(NUM_SPECIAL)):
    return text
  src_dir = os.path.dirname(os.path.abspath(path))
  if os.path.basename(path) == HF_TOKENIZER_FILENAME:
    return _reindexed_json(src_dir)[0]
  with tempfile.TemporaryDirectory() as tmp:  # _reindexed_json reads a folder.
    shutil.copyfile(path, os.path.join(tmp, HF_TOKENIZER_FILENAME))
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
      if os.path.isfile(os.path.join(src_dir, name)):
        shutil.copyfile(os.path.join(src_dir, name), os.path.join(tmp, name))
    return _reindexed_json(tmp)[0]


def _reindexed_json(src_dir: str) -> tuple[str, np.ndarray]:
  """(`src_dir`'s tokenizer.json with the roles at ids 0..4, old_id)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  src = os.path.join(src_dir, HF_TOKENIZER_FILENAME)
  if not os.path.isfile(src):
    raise FileNotFoundError(
        f"{src_dir} has no tokenizer.json; save the checkpoint's fast tokenizer "
        "there (AutoTokenizer.from_pretrained(...).save_pretrained(DIR))")
  with open(src, encoding="utf-8") as f:
    spec = json.load(f)
  original = tokenizers.Tokenizer.from_str(json.dumps(spec))
  vocab = original.get_vocab(with_added_tokens=True)
  named = _role_names(src_dir)
  roles = []
  for role in range(NUM_SPECIAL):
    candidates = [named[role]] if role in named else list(ROLE_NAMES[role])
    found = [c for c in candidates if c in vocab]
    if not found:
      raise ValueError(
          f"{src}: no token plays {SPECIAL_TOKENS[role]} (looked for "
          f"{' / '.join(candidates)}); this project needs pad, unk, cls, sep and "
          "mask tokens")
    roles.append(found[0])
  if len(set(roles)) < NUM_SPECIAL:
    raise ValueError(f"{src}: one token plays two roles: {roles}")
  by_old_id = sorted(vocab, key=vocab.get)
  order = roles + [t for t in by_old_id if t not in roles]
  new_id = {t: i for i, t in enumerate(order)}
  model = spec["model"]
  if isinstance(model["vocab"], dict):
    model["vocab"] = {t: new_id[t] for t in sorted(model["vocab"], key=new_id.get)}
  else:  # Unigram: a list of [piece, score], in id order.
    scores = dict((p, sc) for p, sc in model["vocab"])
    model["vocab"] = [[t, scores[t]] for t in order if t in scores]
    if model.get("unk_id") is not None:
      model["unk_id"] = new_id[by_old_id[model["unk_id"]]]
  for added in spec.get("added_tokens") or []:
    added["id"] = new_id[added["content"]]
  spec["added_tokens"] = sorted(spec.get("added_tokens") or [], key=lambda a: a["id"])
  if spec.get("post_processor"):
    spec["post_processor"] = _reindexed(spec["post_processor"], new_id)
  text = json.dumps(spec, ensure_ascii=False)
  imported = tokenizers.Tokenizer.from_str(text)
  old_id = np.asarray([vocab[t] for t in order], np.int64)
  sample = ["Hello world, it's 1999.", "naïve café 中文 😀", "a [MASK] <mask> text"]
  for a, b in zip(original.encode_batch(sample), imported.encode_batch(sample)):
    if list(old_id[b.ids]) != a.ids:  # A field this function does not know.
      raise ValueError(f"{src}: re-indexed ids disagree with the original on "
                       f"{a.tokens}; this tokenizer.json has a layout "
                       "import_hf does not handle")
  return text, old_id


# Tokenizer training reads its sentences, then builds the vocabulary in C++; a
# line this often says how far the reading is, so a long training is not silent.
_PROGRESS_EVERY_S = 10.0


def _with_progress(lines: Iterator[str], max_sentences: int) -> Iterator[str]:
  """`lines`, logging sentences and megabytes read every _PROGRESS_EVERY_S and
  when the reading ends (what follows is SentencePiece's own work)."""
  start = last = time.monotonic()
  count = size = 0
  for line in lines:
    count += 1
    size += len(line)
    now = time.monotonic()
    if now - last >= _PROGRESS_EVERY_S:
      last = now
      logging.info("tokenizer: read %d sentences (%.0f MB) in %.0fs; it samples "
                   "%d of them", count, size / 1e6, now - start, max_sentences)
    yield line
  logging.info("tokenizer: read all %d sentences (%.0f MB) in %.0fs; SentencePiece "
               "is now building the vocabulary from at most %d of them", count,
               size / 1e6, time.monotonic() - start, max_sentences)


def _training_lines(texts: Iterable[str], max_bytes: int) -> Iterator[str]:
  """Splits texts into sentence lines of at most `max_bytes` UTF-8 bytes.

  SentencePiece never lets a piece cross whitespace (split_by_whitespace), so
  cutting at sentence ends and spaces loses no statistics it would have used.
  """
  for text in texts:
    if not isinstance(text, str):
      raise TypeError(f"tokenizer training texts must be str, got {type(text)}")
    for line in text_lib.text_lines(text):
      for sentence in SENTENCE_END.split(line.strip()):
        if not sentence:
          continue
        if len(sentence.encode("utf-8")) <= max_bytes:
          yield sentence
          continue
        chunk, chunk_bytes = [], 0
        for word in sentence.split():
          # A single "word" longer than the limit (base64, a URL list...) is cut
          # by characters; 4 bytes per character is the UTF-8 worst case.
          while len(word.encode("utf-8")) > max_bytes:
            yield word[:max_bytes // 4]
            word = word[max_bytes // 4:]
          word_bytes = len(word.encode("utf-8")) + 1
          if chunk and chunk_bytes + word_bytes > max_bytes:
            yield " ".join(chunk)
            chunk, chunk_bytes = [], 0
          chunk.append(word)
          chunk_bytes += word_bytes
        if chunk:
          yield " ".join(chunk)


def train_tokenizer(texts: Iterable[str], model_prefix: str, *, vocab_size: int,
                    model_type: str = "unigram", max_sentences: int = 2_000_000,
                    seed: int = 0) -> Tokenizer:
  """Trains a SentencePiece model on `texts`; writes `<model_prefix>.model/.vocab`.

  Deterministic for a given `seed` and input. Files are written under a
  temporary name and renamed into place, so a reader polling for
  `<model_prefix>.model` never sees a partial file.

  Args:
    texts: documents or lines; split internally into sentences.
    model_prefix: output path without extension.
    vocab_size: number of pieces including the 5 special ones. Must be reachable
      on `texts` (no soft limit: a silently smaller vocabulary would make the
      model's embedding size disagree with the config).
    model_type: "unigram" or "bpe".
    max_sentences: SentencePiece samples at most this many sentences (seeded).
    seed: seed of that sampling.

  Returns:
    The trained tokenizer, loaded from `<model_prefix>.model`.
  """
  if model_type not in MODEL_TYPES:
    raise ValueError(f"tokenizer model_type={model_type!r} is not supported; "
                     f"use one of {MODEL_TYPES} (--config.tokenizer.model_type)")
  if vocab_size <= NUM_SPECIAL:
    raise ValueError(f"tokenizer vocab_size={vocab_size} leaves no room next to "
                     f"the {NUM_SPECIAL} special tokens; use e.g. 8000 "
                     "(--config.tokenizer.vocab_size)")
  model_prefix = os.fspath(model_prefix)
  out_dir = os.path.dirname(os.path.abspath(model_prefix))
  os.makedirs(out_dir, exist_ok=True)
  tmp_prefix = f"{model_prefix}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"

  # The sentences go to a file, and SentencePiece builds the vocabulary in a
  # child process: in C++ for tens of seconds to hours, it would hold a Ctrl-C
  # of this process until it returned; the child is killed at once instead.
  try:
    with open(tmp_prefix + ".txt", "w", encoding="utf-8", newline="\n") as f:
      for sentence in _with_progress(
          _training_lines(texts, _MAX_TRAINING_LINE_BYTES), max_sentences):
        f.write(sentence.replace("\n", " ").replace("\r", " ") + "\n")
    message = _run_trainer(seed=seed, input=tmp_prefix + ".txt",
                           model_prefix=tmp_prefix, model_type=model_type,
                           vocab_size=vocab_size, input_sentence_size=max_sentences)
  except BaseException as e:  # A failure, or Ctrl-C: no temporary file stays.
    _remove(tmp_prefix, (".txt", ".model", ".vocab"))
    if isinstance(e, KeyboardInterrupt):
      logging.warning("tokenizer: stopped by Ctrl-C before it was built; nothing "
                      "of it is kept (the next start trains it again)")
    raise
  _remove(tmp_prefix, (".txt",))
  if message is not None:
    _remove(tmp_prefix, (".model", ".vocab"))
    too_high = _VOCAB_TOO_HIGH.search(message)
    if too_high:
      limit = int(too_high.group(2))
      raise ValueError(
          f"the tokenizer training text is too small for vocab_size={vocab_size}: "
          f"SentencePiece can build at most {limit} pieces from it. Set a smaller "
          f"--config.tokenizer.vocab_size (at most {limit}, and leave headroom), "
          "or train on more text")
    if "sentences_.empty()" in message or "no sentences" in message.lower():
      raise ValueError(
          "the tokenizer training text is empty: the data source yielded no "
          "non-blank documents; check --config.data.source")
    raise RuntimeError(f"SentencePiece training failed: {message}")
  try:
    # The trainer records its output prefix and input file in the model; ours
    # are random temporary names, so clear them to keep the file a pure
    # function of the text.
    with open(tmp_prefix + ".model", "rb") as f:
      proto = sentencepiece_model_pb2.ModelProto.FromString(f.read())
    proto.trainer_spec.ClearField("model_prefix")
    proto.trainer_spec.ClearField("input")
    with open(tmp_prefix + ".model", "wb") as f:
      f.write(proto.SerializeToString())
    os.replace(tmp_prefix + ".vocab", model_prefix + ".vocab")
    os.replace(tmp_prefix + ".model", model_prefix + ".model")
  finally:  # Ctrl-C after the trainer returned: its files are not kept half moved.
    _remove(tmp_prefix, (".model", ".vocab"))
  return Tokenizer(model_prefix + ".model")


def _remove(prefix: str, suffixes: Sequence[str]) -> None:
  for suffix in suffixes:
    if os.path.exists(prefix + suffix):
      os.remove(prefix + suffix)


# The child: SentencePiece's trainer on the sentence file, with the settings
# every maelm_jax tokenizer shares. Its error, if any, is its stderr's last line.
_TRAINER = """
import json, sys
import sentencepiece as spm
args = json.loads(sys.stdin.read())
spm.set_random_generator_seed(args.pop("seed"))
try:
  spm.SentencePieceTrainer.train(**args)
except Exception as e:
  sys.stderr.write("\\n" + " ".join(str(e).split()) + "\\n")
  sys.exit(1)
"""


def _run_trainer(seed: int, **args) -> str | None:
  """Runs SentencePiece's trainer in a child process; its error message, or
  None. Ctrl-C (KeyboardInterrupt here) kills the child before it propagates."""
  args.update(
      seed=seed, character_coverage=0.9995, shuffle_input_sentence=True,
      max_sentence_length=_MAX_TRAINING_LINE_BYTES, num_threads=os.cpu_count() or 1,
      pad_id=PAD_ID, pad_piece=SPECIAL_TOKENS[PAD_ID],
      unk_id=UNK_ID, unk_piece=SPECIAL_TOKENS[UNK_ID], bos_id=-1, eos_id=-1,
      control_symbols=list(SPECIAL_TOKENS[CLS_ID:]), minloglevel=2)
  child = subprocess.Popen([sys.executable, "-c", _TRAINER], stdin=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    _, stderr = child.communicate(json.dumps(args))
  except BaseException:
    child.kill()
    child.wait()
    raise
  if child.returncode == 0:
    return None
  lines = [line for line in stderr.splitlines() if line.strip()]
  return lines[-1] if lines else f"the trainer exited {child.returncode}"


def _check_matches(tokenizer: Tokenizer | HFTokenizer, vocab_size: int,
                   model_type: str | None) -> Tokenizer:
  if tokenizer.vocab_size != vocab_size:
    raise ValueError(
        f"tokenizer at {tokenizer.path} has {tokenizer.vocab_size} pieces but "
        f"config.tokenizer.vocab_size is {vocab_size}; set "
        f"--config.tokenizer.vocab_size={tokenizer.vocab_size} or use a fresh "
        "workdir to train a new tokenizer")
  if model_type is not None and tokenizer.model_type != model_type:
    raise ValueError(
        f"tokenizer at {tokenizer.path} is a {tokenizer.model_type!r} model but "
        f"config.tokenizer.model_type is {model_type!r}; set "
        f"--config.tokenizer.model_type={tokenizer.model_type} or use a fresh "
        "workdir to train a new tokenizer")
  return tokenizer


def load_or_train_tokenizer(
    workdir: str, training_texts: Callable[[], Iterable[str]], *,
    vocab_size: int, model_type: str = "unigram", path: str | None = None,
    max_sentences: int = 2_000_000, seed: int = 0, is_writer: bool = True,
    wait_timeout_s: float = 3600.0) -> Tokenizer | HFTokenizer:
  """Returns the run's tokenizer: the given one, the workdir's, or a new one.

  Order: an explicit `path` wins; else `<workdir>/tokenizer.model` is reused
  (restarts and evaluation must see the ids the model was trained with); else
  one is trained on `training_texts()` and saved there. The result must have
  `vocab_size` pieces because the model's embedding table is sized from the
  config.

  Args:
    workdir: run directory (a filesystem shared by all processes).
    training_texts: called only when training is needed (it may be expensive).
    vocab_size: expected number of pieces.
    model_type: "unigram" or "bpe", for training and for checking a reused one.
    path: explicit `.model` file to use instead of the workdir's ("" = None).
    max_sentences: see `train_tokenizer`.
    seed: see `train_tokenizer`.
    is_writer: whether this process may train; in a multi-process run pass
      `jax.process_index() == 0` so one process trains and the others wait.
    wait_timeout_s: how long a non-writer waits for the writer's file.
  """
  if path:
    if not os.path.isfile(path):
      raise FileNotFoundError(
          f"--config.tokenizer.path={path!r} does not exist; point it at a "
          "tokenizer .model file (e.g. <old workdir>/tokenizer.model) or leave "
          "it empty to train one into the workdir")
    return _check_matches(open_tokenizer(path), vocab_size, model_type=None)

  existing = workdir_tokenizer_path(workdir)
  if os.path.isfile(existing):
    logging.info("Reusing tokenizer %s", existing)
    tokenizer = open_tokenizer(existing)
    return _check_matches(tokenizer, vocab_size, model_type if isinstance(
        tokenizer, Tokenizer) else None)
  if model_type not in MODEL_TYPES:
    raise ValueError(f"tokenizer model_type={model_type!r} is not supported; "
                     f"use one of {MODEL_TYPES} (--config.tokenizer.model_type)")
  model_path = os.path.join(workdir, TOKENIZER_FILENAME)

  if is_writer:
    logging.info("Training a %d-piece %s tokenizer into %s", vocab_size,
                 model_type, model_path)
    start = time.monotonic()
    tokenizer = train_tokenizer(
        training_texts(), os.path.join(workdir, TOKENIZER_FILENAME[:-len(".model")]),
        vocab_size=vocab_size, model_type=model_type,
        max_sentences=max_sentences, seed=seed)
    logging.info("Trained tokenizer in %.1fs", time.monotonic() - start)
    storage.push(workdir)  # A bucket workdir: the other processes read it there.
    return _check_matches(tokenizer, vocab_size, model_type)

  deadline = time.monotonic() + wait_timeout_s
  while not storage.fetch(model_path):  # A bucket workdir: from the bucket.
    if time.monotonic() > deadline:
      raise TimeoutError(
          f"waited {wait_timeout_s:.0f}s for process 0 to write {model_path}; "
          "check process 0's log for a tokenizer training error, and that the "
          "workdir is on a filesystem all processes share")
    time.sleep(_WAIT_POLL_S)
  return _check_matches(Tokenizer(model_path), vocab_size, model_type)

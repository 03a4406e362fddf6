"""Document sources: one config string picks local text, a TFDS corpus or pydoc.

`open_source(spec, split)` returns a `DocumentSource`, a grain random-access data
source whose elements are documents (whitespace-normalised `str`). Spec forms:

  text:<glob>[,<glob>...]   local .jsonl[.gz|.xz|.bz2] files (a document is
                            obj[text_field]) and plain text, .gz/.xz/.bz2
                            compressed or not (a document is a paragraph;
                            Project Gutenberg boilerplate is stripped). Any
                            other suffix is read as plain UTF-8 text.
  tfds:<name>[/<config>][:<version>]
                            a TFDS dataset prepared as ArrayRecord, read with
                            `tfds.data_source` (no TensorFlow needed).
  arrayrecord:<dir>[,...]   a corpus prepared by `python -m maelm_jax.data.prepare_data`
                            (or a glob of its shards): read lazily by record,
                            as text or as token ids (see `prepared.py`).
  pydoc:                    the English documentation CPython ships in
                            `pydoc_data.topics` (a small always-available corpus).

`parquet:<glob>` and `hfdisk:<dir>` are inputs of `prepare_data` only: a
training run is told to prepare them first.

Held-out split: a corpus without its own validation split is divided by document
index, document i going to "eval" iff i % stride == stride // 2 with
stride = max(2, round(1 / eval_fraction)). The rule is a pure function of the
index, so train and eval are disjoint, cover the corpus, and every process and
every restart agrees on them without storing anything.

`text:` and `pydoc:` corpora are read into memory once per process (as one
UTF-8 blob, ~1x the text size); that suits corpora up to a few GB. Larger ones
belong in ArrayRecord (`arrayrecord:` after `prepare_data`, or a TFDS dataset),
which is read lazily by record: memory flat in the corpus size.
"""

from __future__ import annotations

import bz2
from collections.abc import Iterable, Iterator, Sequence
import functools
import glob
import gzip
import importlib
import json
import lzma
import os
import re
from typing import Any, Protocol
import zlib

from absl import logging
import grain
import numpy as np

from maelm_jax.core import progress as progress_lib
from maelm_jax.data import text as text_lib
from maelm_jax.data.text import NOT_TEXT_FRACTION, text_lines  # noqa: F401  (also sources.X)

TRAIN = "train"
EVAL = "eval"
SPLITS = (TRAIN, EVAL)

_SPEC_HELP = (
    "use one of:\n"
    "  text:<glob>[,<glob>...]   e.g. text:/data/books/*.txt.xz,/data/web/*.jsonl.gz\n"
    "  tfds:<name>[/<config>][:<version>]   e.g. tfds:wikipedia/20230601.en or "
    "tfds:c4/en:3.1.0\n"
    "  arrayrecord:<dir>          a corpus prepared by python -m "
    "maelm_jax.data.prepare_data --out=<dir>\n"
    "  pydoc:                    the English docs shipped with CPython (default)")

_GUTENBERG_START = re.compile(r"^\s*\*{3}\s*START OF\b", re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\s*\*{3}\s*END OF\b", re.IGNORECASE)
_JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.xz", ".jsonl.bz2")


def normalize_whitespace(text: str) -> str:
  """Collapses every whitespace run (newlines included) to one space."""
  return " ".join(text.split())


# --------------------------------------------------------------------------
# The held-out rule.


def held_out_stride(eval_fraction: float) -> int:
  """Every `stride`-th document is held out; see the module docstring."""
  if not 0.0 < eval_fraction < 1.0:
    raise ValueError(f"eval_fraction={eval_fraction} must be in (0, 1), e.g. 0.01 "
                     "(--config.data.eval_fraction)")
  return max(2, round(1.0 / eval_fraction))


def split_size(num_documents: int, split: str, stride: int) -> int:
  """Number of documents of `split` in a corpus of `num_documents`."""
  offset = stride // 2
  num_eval = 0 if num_documents <= offset else (
      (num_documents - offset - 1) // stride + 1)
  return num_eval if split == EVAL else num_documents - num_eval


def split_to_corpus_index(index: int, split: str, stride: int) -> int:
  """Corpus index of the `index`-th document of `split` (O(1), no tables)."""
  offset = stride // 2
  if split == EVAL:
    return index * stride + offset
  block, within = divmod(index, stride - 1)
  return block * stride + within + (within >= offset)


# --------------------------------------------------------------------------
# Document collections (the whole corpus, before the split).


class _Documents(Protocol):

  def __len__(self) -> int: ...

  def __getitem__(self, index: int) -> str: ...


class _PackedTexts:
  """Documents held as one UTF-8 blob plus offsets.

  Two objects per corpus instead of one `str` per document: a fraction of the
  memory of a list, and pickled to grain's worker processes in one memcpy.
  """

  def __init__(self, documents: Iterable[str]):
    encoded = [d.encode("utf-8") for d in documents]
    self._offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=self._offsets[1:])
    self._blob = b"".join(encoded)

  def __len__(self) -> int:
    return len(self._offsets) - 1

  def __getitem__(self, index: int) -> str:
    start, stop = self._offsets[index], self._offsets[index + 1]
    return self._blob[start:stop].decode("utf-8")


class _TfdsTexts:
  """The `text_field` of each record of a `tfds.data_source`, as `str`."""

  def __init__(self, data_source: Any, text_field: str, description: str):
    self._data_source = data_source
    self._text_field = text_field
    self._description = description

  def __len__(self) -> int:
    return len(self._data_source)

  def _text(self, record: Any) -> str:
    try:
      text = record[self._text_field]
    except KeyError:
      raise ValueError(
          f"{self._description} records have no field {self._text_field!r}; "
          f"their fields are {sorted(record)}. Set --config.data.text_field to "
          "the one holding the text") from None
    if isinstance(text, bytes):
      text = text.decode("utf-8", errors="replace")
    return normalize_whitespace(str(text))

  def __getitem__(self, index: int) -> str:
    return self._text(self._data_source[index])


class _DecodedDocuments:
  """Token-id documents as text, decoded by the tokenizer they were made with."""

  def __init__(self, documents: _Documents, tokenizer_path: str):
    from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    self._documents = documents
    self._tokenizer = tokenizer_lib.open_tokenizer(tokenizer_path)

  def __len__(self) -> int:
    return len(self._documents)

  def __getitem__(self, index: int) -> str:
    return self._tokenizer.decode(self._documents[index])


# --------------------------------------------------------------------------
# The grain data source.


class DocumentSource(grain.sources.RandomAccessDataSource):
  """One split of a corpus: `len`, `[i] -> str` and a deterministic repr.

  The repr names the corpus and split and never a memory address: grain's
  DataLoader stores it in checkpoints and checks it on restore, so it must be
  the same in every process and every run.
  """

  def __init__(self, documents: _Documents, *, description: str, split: str,
               stride: int | None):
    """`stride=None`: `documents` already is the split (e.g. tfds validation)."""
    self._documents = documents
    self._description = description
    self._split = split
    self._stride = stride
    self._len = (len(documents) if stride is None
                 else split_size(len(documents), split, stride))

  @property
  def split(self) -> str:
    return self._split

  def __len__(self) -> int:
    return self._len

  @property
  def token_ids_tokenizer(self) -> str | None:
    """For a corpus prepared as token ids, the tokenizer file they come from
    (its documents are int32 arrays); None for text."""
    return getattr(self._documents, "tokenizer_path", None)

  def as_text(self) -> "DocumentSource":
    """This split with every document as text (token ids decoded by their own
    tokenizer): for the readers that need words, not the pretraining rows."""
    if self.token_ids_tokenizer is None:
      return self
    return DocumentSource(_DecodedDocuments(self._documents, self.token_ids_tokenizer),
                          description=self._description, split=self._split,
                          stride=self._stride)

  def _corpus_index(self, index: int) -> int:
    index = int(index)
    if index < 0:
      index += self._len
    if not 0 <= index < self._len:
      raise IndexError(f"document {index} out of range for {self!r}")
    if self._stride is None:
      return index
    return split_to_corpus_index(index, self._split, self._stride)

  def __getitem__(self, index: int) -> str:
    return self._documents[self._corpus_index(index)]

  def __repr__(self) -> str:
    held_out = "" if self._stride is None else f", held_out=1/{self._stride}"
    return (f"DocumentSource({self._description}, split={self._split!r}"
            f"{held_out}, num_documents={self._len})")


# --------------------------------------------------------------------------
# Parsing.


def paragraphs(lines: Iterable[str]) -> Iterator[str]:
  """Paragraphs (blank-line separated), each whitespace-normalised."""
  current: list[str] = []
  for line in lines:
    if line.strip():
      current.append(line)
    elif current:
      yield normalize_whitespace(" ".join(current))
      current = []
  if current:
    yield normalize_whitespace(" ".join(current))


def strip_gutenberg_boilerplate(lines: Sequence[str]) -> Sequence[str]:
  """Lines between the `*** START OF` and `*** END OF` markers, if present.

  Project Gutenberg files wrap the book in a licence header and footer that
  would otherwise repeat in the corpus once per book.
  """
  start = next((i for i, l in enumerate(lines) if _GUTENBERG_START.match(l)), None)
  begin = 0 if start is None else start + 1
  end = next((i for i in range(begin, len(lines)) if _GUTENBERG_END.match(lines[i])),
             len(lines))
  return lines[begin:end]


# A file with NUL bytes, or with more than this share of its bytes not UTF-8,
# is not text (a binary file, another encoding): it is skipped with a warning,
# or refused under data.on_bad_text='stop'. Fewer bad bytes (a stray latin-1
# character) are replaced by U+FFFD, with a warning naming the file and line.
BAD_TEXT_POLICIES = ("warn", "stop")


def _read_bytes(path: str) -> bytes:
  """The file's bytes, decompressed by suffix; a corrupt or truncated archive
  is named with the file."""
  opener = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}.get(
      os.path.splitext(path)[1], open)
  try:
    with opener(path, "rb") as f:
      return f.read()
  except (OSError, EOFError, lzma.LZMAError, zlib.error) as error:
    kind = os.path.splitext(path)[1] if opener is not open else "text"
    raise ValueError(
        f"{path} cannot be read ({type(error).__name__}: {error}); a corrupt or "
        f"truncated {kind} file? Repair it or leave it out of --config.data.source"
    ) from None


def _decode(path: str, data: bytes, on_bad_text: str) -> str | None:
  """UTF-8 text of `data`, or None for a file skipped as not text
  (`text.Utf8Reader`: the rule `prepare_data` applies too)."""
  reader = text_lib.Utf8Reader(path)
  try:
    text = reader.decode(data)
    reader.check()
  except text_lib.NotText as not_text:
    message = text_lib.not_text_message(path, str(not_text), "--config.data.source")
    if on_bad_text == "stop":
      raise ValueError(message) from None
    logging.warning("%s; skipped (--config.data.on_bad_text=stop makes this an "
                    "error)", message)
    return None
  warning = reader.warning("; --config.data.on_bad_text=stop refuses such files")
  if warning:
    logging.warning("%s", warning)
  return text


def json_records(path: str, text: str) -> Iterator[tuple[str, dict]]:
  """(`path:line`, object) of each non-blank line of a JSON Lines text; a line
  that is not a JSON object is named in the error."""
  for line_number, line in enumerate(text_lines(text), 1):
    if line.strip():
      where = f"{path}:{line_number}"
      yield where, json_object(where, line)


def json_object(where: str, line: str) -> dict:
  """The JSON object of one JSON Lines line; `where` (path:line) names a bad one."""
  try:
    obj = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"{where} is not valid JSON ({e.msg}); .jsonl files need "
                     "one JSON object per line") from None
  if not isinstance(obj, dict):
    raise ValueError(f"{where} holds a JSON {type(obj).__name__}, not an "
                     "object; .jsonl files need one JSON object per line")
  return obj


def jsonl_document(where: str, obj: dict, text_field: str,
                   flag: str = "--config.data.text_field") -> str:
  """The whitespace-normalised document of a JSON Lines record ("" if blank)."""
  try:
    text_value = obj[text_field]
  except KeyError:
    raise ValueError(
        f"{where} has no field {text_field!r} (its fields are "
        f"{sorted(obj)}); set {flag} to the field that holds the document "
        "text") from None
  if not isinstance(text_value, str):
    raise ValueError(f"{where}: field {text_field!r} is a "
                     f"{type(text_value).__name__}, expected a string")
  return normalize_whitespace(text_value)


def _jsonl_documents(path: str, text_field: str, on_bad_text: str) -> Iterator[str]:
  text = _decode(path, _read_bytes(path), on_bad_text)
  for where, obj in json_records(path, text or ""):
    if text_value := jsonl_document(where, obj, text_field):
      yield text_value


def _plain_text_documents(path: str, on_bad_text: str) -> Iterator[str]:
  text = _decode(path, _read_bytes(path), on_bad_text)
  return paragraphs(strip_gutenberg_boilerplate(text_lines(text or "")))


def text_files(patterns: str) -> list[str]:
  """Sorted, de-duplicated files matching comma-separated glob `patterns`."""
  files = set()
  for pattern in filter(None, (p.strip() for p in patterns.split(","))):
    expanded = os.path.expanduser(pattern)
    matches = glob.glob(expanded, recursive=True)
    if not matches:
      raise FileNotFoundError(
          f"text source pattern {pattern!r} matches no file; check the path in "
          "--config.data.source (globs such as /data/*.txt.xz are allowed, "
          "several separated by commas)")
    for match in matches:
      if os.path.isdir(match):
        raise IsADirectoryError(
            f"text source pattern {pattern!r} matches the directory {match!r}; "
            f"use a glob for its files, e.g. {os.path.join(match, '*.txt')}")
      files.add(match)
  if not files:
    raise ValueError(f"text source {patterns!r} names no files; {_SPEC_HELP}")
  return sorted(files)


@functools.lru_cache(maxsize=4)
def _read_text_corpus(files: tuple[tuple[str, int, int], ...],
                      text_field: str, on_bad_text: str = "warn") -> _PackedTexts:
  """Parses `files` ((path, mtime_ns, size) triples) into documents.

  Cached because a run opens the same corpus twice (train and eval); the
  modification times in the key make an edited file read afresh.
  """
  on_disk = progress_lib.Progress(f"text: reading {len(files)} files", unit="MB",
                                  total=sum(size for _, _, size in files) / 1e6)

  def documents():
    for path, _, size in files:
      if path.endswith(_JSONL_SUFFIXES):
        yield from _jsonl_documents(path, text_field, on_bad_text)
      else:
        yield from _plain_text_documents(path, on_bad_text)
      on_disk.update(on_disk.done + size / 1e6)  # Compressed MB, as on disk.

  packed = _PackedTexts(documents())
  on_disk.finish()
  return packed


def _text_documents(patterns: str, text_field: str,
                    on_bad_text: str = "warn") -> tuple[_PackedTexts, str]:
  if on_bad_text not in BAD_TEXT_POLICIES:
    raise ValueError(f"data.on_bad_text={on_bad_text!r} must be one of "
                     f"{BAD_TEXT_POLICIES}")
  files = text_files(patterns)
  stats = [os.stat(path) for path in files]
  packed = _read_text_corpus(
      tuple((path, st.st_mtime_ns, st.st_size) for path, st in zip(files, stats)),
      text_field, on_bad_text)
  description = f"text:{patterns} ({len(files)} files)"
  if not len(packed):
    raise ValueError(f"{description} contains no text: every file is empty or "
                     "blank. Check --config.data.source")
  return packed, description


@functools.lru_cache(maxsize=1)
def _pydoc_documents() -> tuple[_PackedTexts, str]:
  from pydoc_data import topics  # pylint: disable=g-import-not-at-top
  # Topics share whole sections (the `if` statement appears under "if" and
  # "compound"): keep each paragraph once, so no held-out paragraph was trained on.
  documents = dict.fromkeys(p for key in sorted(topics.topics)
                            for p in paragraphs(text_lines(topics.topics[key])))
  return _PackedTexts(iter(documents)), "pydoc:"


# --------------------------------------------------------------------------
# TFDS.


def _register_tfds_builder(name: str) -> None:
  """Imports `tensorflow_datasets.text.<name>` so the builder is registered.

  TFDS registers some text builders (c4, wikipedia, glue) only when their module
  is imported; other datasets need no import, so a missing module is fine.
  """
  base = name.split("/", 1)[0].split(":", 1)[0]
  try:
    importlib.import_module(f"tensorflow_datasets.text.{base}")
  except ImportError:
    pass


def open_tfds_split(name: str, split: str, data_dir: str | None) -> Any:
  """A random-access `tfds.data_source` (ArrayRecord) of one split; its records
  are dicts of numpy values. Used by the fine-tuning readers (glue, squad)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  _register_tfds_builder(name)
  try:
    return tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds reports a missing dataset in many ways.
    raise FileNotFoundError(
        f"could not open tfds {name!r} split {split!r} (data_dir={data_dir!r}): {e}. "
        f"Prepare it once with `tfds build {name} --file_format=array_record "
        "--data_dir=DIR` and pass --config.data.tfds_data_dir=DIR") from e


def tfds_records(name: str, split: str, data_dir: str | None) -> Iterator[dict]:
  """Every record of one tfds split, in order (`open_tfds_split`)."""
  records = open_tfds_split(name, split, data_dir)
  for i in range(len(records)):
    yield records[i]


def tfds_text(value: Any) -> str:
  """A tfds text feature (bytes) as str."""
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _tfds_source(name: str, split: str, eval_fraction: float, text_field: str,
                 data_dir: str | None) -> DocumentSource:
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  _register_tfds_builder(name)
  data_dir_flag = (f"--config.data.tfds_data_dir={data_dir}" if data_dir else
                   "--config.data.tfds_data_dir=<dir> (default: $TFDS_DATA_DIR "
                   "or ~/tensorflow_datasets)")
  build_hint = (
      f"prepare it as ArrayRecord first, e.g. `tfds build {name.split(':')[0]} "
      f"--file_format=array_record --data_dir={data_dir or '<dir>'}` (or copy "
      f"a prepared copy there), then pass {data_dir_flag}")
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError as e:
    raise ValueError(
        f"TFDS has no dataset {name!r} (neither registered nor prepared in "
        f"data_dir={data_dir!r}). Check the name in --config.data.source "
        f"(e.g. tfds:wikipedia/20230601.en); for a custom dataset, {build_hint}"
    ) from e

  has_validation = "validation" in builder.info.splits
  tfds_split = "validation" if (split == EVAL and has_validation) else "train"
  try:
    data_source = tfds.data_source(name, split=tfds_split, data_dir=data_dir,
                                   download=False)
  except Exception as e:  # pylint: disable=broad-except
    # tfds reports a missing dataset as an unrelated-sounding file-format error.
    if not builder.is_prepared():
      raise FileNotFoundError(
          f"TFDS dataset {name!r} is not prepared in {builder.data_dir!r}; "
          f"{build_hint}") from e
    raise RuntimeError(
        f"could not open TFDS dataset {name!r} split {tfds_split!r} from "
        f"{builder.data_dir!r} as a random-access source ({e}). It must be "
        f"prepared in the ArrayRecord format: {build_hint}") from e

  description = f"tfds:{name}[{tfds_split}] text_field={text_field!r}"
  texts = _TfdsTexts(data_source, text_field, description=f"tfds:{name}")
  if tfds_split == "validation" or (split == TRAIN and has_validation):
    return DocumentSource(texts, description=description, split=split, stride=None)
  return DocumentSource(texts, description=description, split=split,
                        stride=held_out_stride(eval_fraction))


# --------------------------------------------------------------------------
# Entry point.


def open_source(spec: str, split: str, *, eval_fraction: float = 0.01,
                text_field: str = "text",
                tfds_data_dir: str | None = None,
                on_bad_text: str = "warn") -> DocumentSource:
  """Opens split `split` ("train" or "eval") of the corpus named by `spec`.

  Args:
    spec: "text:<glob>[,...]", "tfds:<name>[/<config>][:<version>]",
      "arrayrecord:<dir>[,...]" or "pydoc:".
    split: "train" or "eval" (held out; see the module docstring).
    eval_fraction: fraction of documents held out when the corpus has no
      validation split of its own.
    text_field: JSON / TFDS feature holding the document text.
    tfds_data_dir: TFDS data_dir ("" or None: the TFDS default).
    on_bad_text: a `text:` file that is not UTF-8 text is skipped with a
      warning ("warn") or refused ("stop"); see `NOT_TEXT_FRACTION`.

  Returns:
    A `DocumentSource` of whitespace-normalised, non-empty documents (TFDS
    documents are not filtered, so may be empty).
  """
  if split not in SPLITS:
    raise ValueError(f"split={split!r} must be one of {SPLITS}")
  stride = held_out_stride(eval_fraction)
  scheme, sep, rest = spec.partition(":")
  scheme = scheme.strip().lower()

  if scheme == "tfds" and sep and rest.strip():
    source = _tfds_source(rest.strip(), split, eval_fraction, text_field,
                          tfds_data_dir or None)
  elif scheme == "text" and sep and rest.strip():
    documents, description = _text_documents(rest.strip(), text_field, on_bad_text)
    source = DocumentSource(documents, description=description, split=split,
                            stride=stride)
  elif scheme == "arrayrecord" and sep and rest.strip():
    from maelm_jax.data import prepared  # pylint: disable=g-import-not-at-top
    if "://" in rest:
      raise ValueError(f"--config.data.source={spec}: a prepared corpus is read with "
                       "local file I/O (ArrayRecord opens local files only); use a "
                       "local or mounted path (e.g. gcsfuse). Workdirs can be gs://")
    documents = prepared.PreparedDocuments(rest.strip())
    description = (f"arrayrecord:{rest.strip()} ({len(documents.paths)} shards, "
                   f"{documents.format}, sha256 {documents.checksum[:16]})")
    source = DocumentSource(documents, description=description, split=split,
                            stride=stride)
  elif scheme in ("parquet", "hfdisk") and sep and rest.strip():
    raise ValueError(
        f"{scheme}: corpora are read after one preparation step: `python -m "
        f"maelm_jax.data.prepare_data --source={spec} --out=DIR`, then "
        "--config.data.source=arrayrecord:DIR")
  elif scheme == "pydoc" and not rest.strip():
    documents, description = _pydoc_documents()
    source = DocumentSource(documents, description=description, split=split,
                            stride=stride)
  else:
    raise ValueError(f"data source {spec!r} is not understood; {_SPEC_HELP}")

  if not len(source):
    raise ValueError(
        f"{source!r} is empty: the corpus is too small to hold out every "
        f"{stride}th document, or has no documents. Use a larger corpus or a "
        "larger --config.data.eval_fraction")
  return source

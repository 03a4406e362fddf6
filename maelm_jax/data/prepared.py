"""Prepared corpora: ArrayRecord shards of documents, read lazily by record.

`python -m maelm_jax.data.prepare_data` writes a corpus directory; the source spec
`arrayrecord:<dir or glob>` reads it back. The layout:

  DIR/shard-00000-of-00008.array_record   one shard per input unit (a file of
                                          the source, or a block of records of
                                          a tfds/pydoc corpus); a record is one
                                          document: its whitespace-normalised
                                          UTF-8 text, or with --tokenizer its
                                          token ids as little-endian int32
  DIR/corpus.json                         written last, once every shard is in:
                                          the source spec, the format, every
                                          shard's documents, bytes and SHA-256,
                                          a checksum of the whole, the held-out
                                          rule's split counts
  DIR/tokenizer.model (or .json)          with --tokenizer: the ids' tokenizer

Document i of the corpus is document i of the shards taken in name order, so
the held-out rule (`sources.split_to_corpus_index`) stays a pure function of the
document index, and a prepared corpus gives the same documents in the same
order as the `text:` spec it was prepared from.

Reading is lazy: `grain.sources.ArrayRecordDataSource` opens each shard's index
and reads a record only when it is asked for, so a process's memory does not
grow with the corpus and each process touches only the records of its share.
Opening checks every shard's size against `corpus.json` (a truncated or
half-copied shard is named, before any compilation); `verify_checksums` reads
them whole.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from typing import Any

import numpy as np

METADATA_FILE = "corpus.json"
SHARD_SUFFIX = ".array_record"
FORMAT_VERSION = 1
TEXT = "text"
TOKEN_IDS = "token_ids"
FORMATS = (TEXT, TOKEN_IDS)
TOKEN_DTYPE = np.dtype("<i4")
# group_size:1 makes every record its own compressed chunk, so reading one
# document reads (and decompresses) only that document: what random access by
# a shuffled sampler needs (grain's advice for ArrayRecord data sources).
WRITER_OPTIONS = "group_size:1"


def shard_name(index: int, count: int) -> str:
  return f"shard-{index:05d}-of-{count:05d}{SHARD_SUFFIX}"


def file_sha256(path: str, chunk_bytes: int = 1 << 22) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(chunk_bytes):
      digest.update(chunk)
  return digest.hexdigest()


def corpus_checksum(shards: list[dict[str, Any]]) -> str:
  """One SHA-256 over the shards' names and SHA-256s, in order."""
  digest = hashlib.sha256()
  for shard in shards:
    digest.update(f"{shard['file']}:{shard['sha256']}\n".encode())
  return digest.hexdigest()


def encode_record(document: str | np.ndarray) -> bytes:
  if isinstance(document, str):
    return document.encode("utf-8")
  return np.asarray(document, TOKEN_DTYPE).tobytes()


def read_metadata(directory: str) -> dict[str, Any]:
  path = os.path.join(directory, METADATA_FILE)
  if not os.path.exists(path):
    hint = (" (its preparation did not finish: run the same prepare_data command "
            "again, it resumes)" if os.path.isdir(os.path.join(directory, ".parts"))
            else "")
    raise FileNotFoundError(
        f"{directory} has no {METADATA_FILE}, so it is not a prepared corpus{hint}; "
        "make one with `python -m maelm_jax.data.prepare_data --source=SPEC "
        f"--out={directory}`")
  with open(path) as f:
    try:
      metadata = json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON ({e.msg}); it is written last "
                       "and atomically, so the file was edited or damaged: "
                       "prepare the corpus again into a new --out") from None
  if metadata.get("format_version") != FORMAT_VERSION:
    raise ValueError(f"{path} has format_version {metadata.get('format_version')!r}"
                     f", this code reads {FORMAT_VERSION}; prepare the corpus "
                     "again with this version")
  return metadata


def tokenizer_file(directory: str, metadata: dict[str, Any]) -> str | None:
  """The tokenizer a token-id corpus was prepared with (None for text)."""
  if metadata["format"] != TOKEN_IDS:
    return None
  return os.path.join(directory, metadata["tokenizer"]["file"])


def _shard_paths(pattern: str) -> list[str]:
  """A corpus directory's shards, or the shards a glob names (sorted)."""
  expanded = os.path.expanduser(pattern)
  if os.path.isdir(expanded):
    return sorted(glob.glob(os.path.join(expanded, "*" + SHARD_SUFFIX)))
  return sorted(p for p in glob.glob(expanded, recursive=True)
                if p.endswith(SHARD_SUFFIX))


class PreparedDocuments:
  """The documents of prepared shards: `len`, `[i] -> str | int32 array`.

  Shards may come from several prepared directories (a comma-separated spec),
  all of one format and, for token ids, one tokenizer.
  """

  def __init__(self, patterns: str):
    import grain  # pylint: disable=g-import-not-at-top

    paths: list[str] = []
    for pattern in filter(None, (p.strip() for p in patterns.split(","))):
      matched = _shard_paths(pattern)
      if not matched:
        raise FileNotFoundError(
            f"arrayrecord source {pattern!r} matches no {SHARD_SUFFIX} file; give "
            "the directory `python -m maelm_jax.data.prepare_data --out=DIR` wrote "
            "(arrayrecord:DIR) or a glob of its shards")
      paths.extend(p for p in matched if p not in paths)
    if not paths:
      raise ValueError(f"arrayrecord source {patterns!r} names no shards")
    self.format, self.tokenizer_path, tokenizer_sha = None, None, None
    checksums, skipped = [], []
    for directory in dict.fromkeys(os.path.dirname(p) for p in paths):
      metadata = read_metadata(directory)
      by_file = {s["file"]: s for s in metadata["shards"]}
      if self.format not in (None, metadata["format"]):
        raise ValueError(f"{patterns!r} mixes corpora of formats {self.format!r} "
                         f"and {metadata['format']!r}; prepare them alike")
      self.format = metadata["format"]
      if self.format == TOKEN_IDS:
        sha = metadata["tokenizer"]["sha256"]
        if tokenizer_sha not in (None, sha):
          raise ValueError(f"{patterns!r} mixes corpora tokenized with different "
                           "tokenizers; prepare them with the same --tokenizer")
        tokenizer_sha = sha
        self.tokenizer_path = self.tokenizer_path or tokenizer_file(directory, metadata)
      for path in (p for p in paths if os.path.dirname(p) == directory):
        shard = by_file.get(os.path.basename(path))
        if shard is None:
          raise ValueError(f"{path} is not listed in {directory}/{METADATA_FILE}: "
                           "a shard of another corpus copied in? Remove it")
        size = os.path.getsize(path)
        if size != shard["file_bytes"]:
          raise ValueError(
              f"{path} is {size} bytes, {METADATA_FILE} says {shard['file_bytes']}: "
              "truncated or half-copied. Copy it again, or rerun the prepare_data "
              f"command for {directory}, which rewrites damaged shards")
        checksums.append(shard["sha256"])
        if not shard["documents"]:
          skipped.append(path)  # A skipped input file (not text): never read.
    paths = [p for p in paths if p not in skipped]
    if not paths:
      raise ValueError(f"arrayrecord source {patterns!r} holds no documents")
    self.paths = paths
    self.tokenizer_sha256 = tokenizer_sha
    self.checksum = hashlib.sha256("".join(checksums).encode()).hexdigest()
    self._source = grain.sources.ArrayRecordDataSource(paths)
    self._len = len(self._source)

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, index: int) -> str | np.ndarray:
    record = self._source[int(index)]
    if self.format == TEXT:
      return record.decode("utf-8")
    return np.frombuffer(record, TOKEN_DTYPE)


def verify_checksums(directory: str) -> list[str]:
  """Shards of a prepared directory whose SHA-256 differs from corpus.json."""
  metadata = read_metadata(directory)
  return [s["file"] for s in metadata["shards"]
          if not os.path.exists(os.path.join(directory, s["file"]))
          or file_sha256(os.path.join(directory, s["file"])) != s["sha256"]]

"""Pretraining input pipeline: documents -> full, fixed-length token rows.

Layout (RoBERTa FULL-SENTENCES): documents are tokenized and concatenated into
one stream with a [SEP] after each document; the stream is cut into bodies of
`seq_len - 2` tokens and every row is `[CLS] body [SEP]`. Rows cross document
boundaries and contain no padding, so no compute is spent on [PAD]; the partial
row left at the very end of a finite stream is dropped.

The pipeline is a grain dataset graph:

  MapDataset.source(DocumentSource)
    [stream::num_streams]            one of this process's streams
    .shuffle(seed)                   reshuffled every epoch by .repeat()
    .repeat()
    .batch(DOCS_PER_CHUNK, list)     documents are tokenized in groups ...
    .map(TokenizeDocuments)          ... into stream chunks `d1 [SEP] d2 [SEP]`
  .to_iter_dataset()
    PackRowsIterDataset              stream chunks -> [CLS] ... [SEP] rows
    .batch(global_batch / num_streams, drop_remainder=True)
  ZipIterDataset(this process's streams) -> concatenated local batch
    [.mp_prefetch(num_workers)]

Tokenizing a group of documents per grain element matters for speed: grain
spends tens of microseconds per element, as long as SentencePiece needs for a
whole paragraph, and a batched SentencePiece call runs on all cores.

The iterator is checkpointable: `get_state()` is a small JSON-able dict and
`set_state()` on a fresh iterator of the same pipeline resumes with exactly the
batches that would have followed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
import math
import os
import threading
import time
from typing import Any

from absl import flags
from absl import logging
import grain
import numpy as np

from maelm_jax.data import tokenizer as tokenizer_lib

# Documents per grain element (one batched SentencePiece call each).
DOCS_PER_CHUNK = 64
# Chunks tokenized ahead in background threads. Kept small: grain 0.2.18's
# prefetch iterator scans its whole buffer on every element.
_PREFETCH_THREADS = 2
_PREFETCH_CHUNKS = 4
# Consecutive empty chunks after which the input is deemed to have no text
# (rather than looping forever over an endlessly repeated empty corpus).
_MAX_EMPTY_CHUNKS = 10_000


def document_ids(tokenizer: tokenizer_lib.Tokenizer,
                 documents: Sequence[str] | Sequence[np.ndarray]):
  """Token ids of each document: text is encoded, and a corpus prepared as
  token ids (`prepare_data --tokenizer`) is used as it is."""
  if documents and not isinstance(documents[0], str):
    return documents
  return tokenizer.encode(documents)


class TokenizeDocuments(grain.transforms.Map):
  """A list of documents -> one int32 stream chunk `d1 [SEP] d2 [SEP] ...`.

  Documents that tokenize to nothing are skipped (they would only add a
  second [SEP]); the chunk may therefore be empty. Documents prepared as token
  ids skip tokenization.
  """

  def __init__(self, tokenizer: tokenizer_lib.Tokenizer):
    self._tokenizer = tokenizer

  def map(self, documents: Sequence[str] | Sequence[np.ndarray]) -> np.ndarray:
    stream: list[int] = []
    for ids in document_ids(self._tokenizer, documents):
      if len(ids):
        stream.extend(ids)
        stream.append(self._tokenizer.sep_id)
    return np.asarray(stream, dtype=np.int32)

  def __repr__(self) -> str:
    return f"TokenizeDocuments({self._tokenizer!r})"


class _PackRowsIterator(grain.DatasetIterator):
  """Iterator of `PackRowsIterDataset`.

  State is the parent state *before* the chunk the next row starts in, plus
  how many tokens of that chunk are already used. Restoring re-reads that one
  chunk, so saving is O(1) and no token data is ever stored in a checkpoint.
  """

  def __init__(self, parent: grain.DatasetIterator, *, seq_len: int,
               cls_id: int, sep_id: int, complete_docs: bool = False):
    super().__init__(parent)
    self._seq_len = seq_len
    self._cls_id = cls_id
    self._sep_id = sep_id
    self._complete_docs = complete_docs
    self._exhausted = False
    # The chunk the next row starts in, the parent state from before it was
    # read, and how many of its tokens are used.
    self._chunk: np.ndarray | None = None
    self._chunk_parent_state: dict[str, Any] | None = None
    self._chunk_offset = 0

  def _next_chunk(self) -> bool:
    """Loads the next non-empty chunk; False at the end of the parent."""
    for _ in range(_MAX_EMPTY_CHUNKS):
      parent_state = self._parent.get_state()
      try:
        chunk = next(self._parent)
      except StopIteration:
        self._exhausted = True
        return False
      chunk = np.asarray(chunk, dtype=np.int32).reshape(-1)
      if chunk.size:
        self._chunk = chunk
        self._chunk_parent_state = parent_state
        self._chunk_offset = 0
        return True
    raise ValueError(
        f"the input produced {_MAX_EMPTY_CHUNKS} empty token chunks in a row: "
        "its documents contain no text the tokenizer keeps. Check "
        "--config.data.source and --config.data.text_field")

  def __next__(self) -> dict[str, np.ndarray]:
    if self._exhausted:
      raise StopIteration
    row = np.empty(self._seq_len, np.int32)
    row[0] = self._cls_id
    row[-1] = self._sep_id
    filled, end = 1, self._seq_len - 1
    while filled < end:
      if self._chunk is None and not self._next_chunk():
        # The stream ended inside this row: drop the partial row. The state
        # stays "exhausted", so restoring it also ends the iteration.
        raise StopIteration
      available = self._chunk[self._chunk_offset:]
      take = min(end - filled, len(available))
      if self._complete_docs:
        if filled == 1 and available[0] == self._sep_id:
          # The [SEP] of a document that filled the previous row to the end.
          self._advance(1)
          continue
        ends = np.flatnonzero(available[:take] == self._sep_id)
        take = int(ends[0]) + 1 if ends.size else take
      row[filled:filled + take] = available[:take]
      filled += take
      self._advance(take)
      if self._complete_docs and row[filled - 1] == self._sep_id:
        # The document ended: its [SEP] closes the row, padding fills the rest.
        row[filled:] = tokenizer_lib.PAD_ID
        break
    return {"input_ids": row}

  def _advance(self, num_tokens: int) -> None:
    self._chunk_offset += num_tokens
    if self._chunk_offset == len(self._chunk):
      self._chunk = None

  def get_state(self) -> dict[str, Any]:
    if self._chunk is None:
      return {"parent": self._parent.get_state(), "offset": 0}
    return {"parent": self._chunk_parent_state, "offset": self._chunk_offset}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["parent"])
    self._chunk = None
    self._exhausted = False
    offset = int(state["offset"])
    if offset:
      if not self._next_chunk() or offset >= len(self._chunk):
        raise ValueError(
            f"cannot restore packing state {state}: the data at that position "
            "is not what the checkpoint saw. It was written by a pipeline over "
            "different data (source, tokenizer, seq_len or process count "
            "changed); resume with the original settings or start a fresh "
            "workdir")
      self._chunk_offset = offset

  def __str__(self) -> str:
    return f"PackRowsDatasetIterator(seq_len={self._seq_len})"


class PackRowsIterDataset(grain.IterDataset):
  """Cuts a stream of 1-D token chunks into `[CLS] ... [SEP]` rows.

  The parent's chunks are concatenated and each row takes the next
  `seq_len - 2` tokens, framed by [CLS] and [SEP]; elements are
  `{"input_ids": int32[seq_len]}`. A partial last row is dropped.

  With `complete_docs` (`data.rows=complete_doc`, the MAE-LM release's
  `--sample-break-mode complete_doc`) a row never crosses a document's end: it
  stops at the document's [SEP] and is padded; a document longer than a row
  continues in the next (cut by token count, where fairseq cuts between
  sentences). Every row is then `[CLS] tokens of one document [SEP] [PAD]...`.
  Training then masks each row's share of its own tokens (masking.py, per-row
  counts), inside the same static shapes.

  grain's ConcatThenSplitIterDataset is not used: it pads the final partial
  row, emits segment/position features, knows nothing of [CLS]/[SEP] framing,
  and restores by replaying elements since its last internal checkpoint.
  """

  def __init__(self, parent: grain.IterDataset, *, seq_len: int, cls_id: int,
               sep_id: int, complete_docs: bool = False):
    super().__init__(parent)
    if seq_len < 3:
      raise ValueError(f"seq_len={seq_len} leaves no room for tokens between "
                       "[CLS] and [SEP]; use at least 3 (--config.seq_len)")
    self._seq_len = seq_len
    self._cls_id = cls_id
    self._sep_id = sep_id
    self._complete_docs = complete_docs

  def __iter__(self) -> _PackRowsIterator:
    return _PackRowsIterator(self._parent.__iter__(), seq_len=self._seq_len,
                             cls_id=self._cls_id, sep_id=self._sep_id,
                             complete_docs=self._complete_docs)

  def __str__(self) -> str:
    return (f"PackRowsIterDataset(seq_len={self._seq_len}, "
            f"cls_id={self._cls_id}, sep_id={self._sep_id})")


def make_pretrain_dataset(
    source, tokenizer: tokenizer_lib.Tokenizer, *, seq_len: int,
    batch_size: int, seed: int, shuffle: bool = True, repeat: bool = True,
    process_index: int = 0, process_count: int = 1, num_streams: int = 0,
    num_workers: int = 0, complete_docs: bool = False) -> grain.IterDataset:
  """Batches of packed pretraining rows for this process.

  Process-count invariance: the documents are dealt to `num_streams` disjoint
  streams (document i goes to stream i % num_streams), each shuffled and packed
  on its own; rows of the GLOBAL batch come from the streams in contiguous
  blocks of `global_batch / num_streams`. A process runs only the streams of
  its own rows, so for a fixed `num_streams` the global batch is the same
  whatever the number of processes (any divisor of `num_streams`): a run can
  move between 1 process x 8 devices and 2 processes x 4 devices and see the
  same data.

  Args:
    source: a grain random-access source of documents (`sources.open_source`).
    tokenizer: the run's tokenizer ([CLS]/[SEP] ids come from it).
    seq_len: row length including [CLS] and [SEP].
    batch_size: rows per batch on THIS process (global batch // process_count).
    seed: shuffle seed; the same seed gives the same batches.
    shuffle: shuffle documents (globally within this process's share), with a
      new order every epoch when `repeat`.
    repeat: loop forever; False ends after one pass (the partial last batch is
      dropped). `shuffle=False, repeat=False` is the fixed evaluation stream.
    process_index, process_count: this process runs streams
      `[process_index * S / P, (process_index + 1) * S / P)`, so processes
      never share a document.
    num_streams: S above; 0 means one stream per process. Must be a multiple
      of process_count and divide the global batch.
    num_workers: >0 tokenizes and packs in that many worker processes (grain
      `mp_prefetch`; each packs its own slice of the documents, so the batches
      depend on `num_workers`, deterministically).
    complete_docs: rows never cross a document's end (`PackRowsIterDataset`).

  Returns:
    A grain IterDataset of `{"input_ids": int32[batch_size, seq_len]}`.
  """
  if seq_len < 3:
    raise ValueError(f"seq_len={seq_len} leaves no room for tokens between "
                     "[CLS] and [SEP]; use at least 3 (--config.seq_len)")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be >= 1 (it is this "
                     "process's share of --config.batch_size)")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must be in "
                     f"[0, process_count={process_count})")
  num_streams = num_streams or process_count
  global_batch = batch_size * process_count
  if num_streams % process_count or global_batch % num_streams:
    raise ValueError(
        f"data.num_streams={num_streams} must be a multiple of the "
        f"{process_count} processes and divide the global batch "
        f"{global_batch}; set --config.data.num_streams accordingly")
  if len(source) < num_streams:
    raise ValueError(
        f"{source!r} has {len(source)} documents, fewer than the "
        f"{num_streams} data streams that each need a share; use a larger "
        "corpus (--config.data.source) or fewer --config.data.num_streams")
  if not 0 <= seed < 2**32:
    raise ValueError(f"seed={seed} must be in [0, 2**32)")
  if num_workers < 0:
    raise ValueError(f"num_workers={num_workers} must be >= 0")

  streams_per_process = num_streams // process_count
  rows_per_stream = global_batch // num_streams
  first = process_index * streams_per_process
  streams = [
      _packed_stream(source, tokenizer, stream, num_streams, seq_len=seq_len,
                     rows=rows_per_stream, seed=seed, shuffle=shuffle,
                     repeat=repeat, complete_docs=complete_docs)
      for stream in range(first, first + streams_per_process)]
  if len(streams) == 1:
    it = streams[0]
  else:
    # Non-strict: a finite (eval) pass ends when its first stream runs dry.
    it = grain.experimental.ZipIterDataset(streams, strict=False).map(
        _concatenate_batches)
  if num_workers > 0:
    # Grain reads its absl debug flags when starting workers; outside an
    # absl.app (tests, notebooks) they are unparsed and reading them raises.
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=num_workers),
                        worker_init_fn=exit_with_parent)
  return it


def exit_with_parent(worker_index: int, worker_count: int) -> None:
  """Grain worker start-up: end the worker when the training process is gone.

  A trainer killed with SIGKILL (a preempted VM, the OOM killer, kill -9) cannot
  stop its workers, and grain's stay blocked on their queues for good, ~200 MB
  each (found by `maelm_jax.tools.chaos`); every relaunch after a kill would leave
  more. The worker polls its parent (it is reparented when the trainer dies).
  """
  del worker_index, worker_count
  parent = os.getppid()

  def watch():
    while os.getppid() == parent:
      time.sleep(PARENT_POLL_S)
    os._exit(0)  # pylint: disable=protected-access

  threading.Thread(target=watch, name="exit_with_parent", daemon=True).start()


PARENT_POLL_S = 0.5


def _packed_stream(source, tokenizer, stream: int, num_streams: int, *,
                   seq_len: int, rows: int, seed: int, shuffle: bool,
                   repeat: bool, complete_docs: bool = False) -> grain.IterDataset:
  """Batches of `rows` packed rows from documents `[stream::num_streams]`."""
  ds = grain.MapDataset.source(source)
  ds = ds[stream::num_streams]
  if shuffle:
    ds = ds.shuffle(seed=(seed + 7919 * stream) % 2**32)
  if repeat:
    ds = ds.repeat()  # Reseeds the shuffle each epoch: every epoch differs.
  ds = ds.batch(DOCS_PER_CHUNK, batch_fn=list)
  ds = ds.map(TokenizeDocuments(tokenizer))
  it = ds.to_iter_dataset(grain.ReadOptions(
      num_threads=_PREFETCH_THREADS, prefetch_buffer_size=_PREFETCH_CHUNKS))
  it = PackRowsIterDataset(it, seq_len=seq_len, cls_id=tokenizer.cls_id,
                           sep_id=tokenizer.sep_id, complete_docs=complete_docs)
  return it.batch(rows, drop_remainder=True)


def _concatenate_batches(batches):
  return {key: np.concatenate([b[key] for b in batches], axis=0)
          for key in batches[0]}


def estimate_num_sequences(source, tokenizer: tokenizer_lib.Tokenizer,
                           seq_len: int, max_docs: int | None = None) -> int:
  """Rows of `seq_len` one pass over `source` yields (before batching).

  Exact when all documents are tokenized (`max_docs=None`); with `max_docs`
  it tokenizes that many documents spread evenly over the source and
  extrapolates. Used to fail early when a corpus is smaller than one batch.
  """
  if seq_len < 3:
    raise ValueError(f"seq_len={seq_len} must be at least 3")
  num_docs = len(source)
  if max_docs is None or max_docs >= num_docs:
    indices = range(num_docs)
  else:
    indices = np.linspace(0, num_docs - 1, num=max(1, max_docs)).astype(np.int64)
    indices = np.unique(indices)
  stream_len = 0
  chunk = 1024
  indices = list(indices)
  for start in range(0, len(indices), chunk):
    texts = [source[int(i)] for i in indices[start:start + chunk]]
    stream_len += sum(len(ids) + 1 for ids in document_ids(tokenizer, texts)
                      if len(ids))
  if len(indices) < num_docs:
    stream_len = math.floor(stream_len * num_docs / max(1, len(indices)))
  return stream_len // (seq_len - 2)


def training_texts(source, max_chars: int = 50_000_000, seed: int = 0
                   ) -> Iterator[str]:
  """Documents for tokenizer training: a seeded permutation, up to `max_chars`.

  Walks the source in a pseudo-random order (grain's O(1)-memory index
  shuffle, so it works for corpora of any size, lazily read ones included) and
  stops once `max_chars` characters have been yielded, so a huge corpus
  contributes a sample spread across all of it rather than its first files:
  each file of a multi-glob spec in proportion to its documents. The sample's
  size is logged.
  """
  if getattr(source, "token_ids_tokenizer", None):
    source = source.as_text()
  num_docs = len(source)
  total = taken = 0
  for i in range(num_docs):
    if total >= max_chars:
      break
    index = i if num_docs == 1 else grain.experimental.index_shuffle(
        i, max_index=num_docs - 1, seed=seed, rounds=4)
    text = source[int(index)]
    if text:
      total += len(text)
      taken += 1
      yield text
  logging.info("tokenizer training sample: %s documents (%s characters) of %s, "
               "drawn uniformly at random (seed %d)", f"{taken:,}", f"{total:,}",
               f"{num_docs:,}", seed)

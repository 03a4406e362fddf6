"""Tests for maelm_jax.data.pipeline: packing, determinism, sharding, checkpointing."""

import itertools
import json

import grain
import numpy as np
import pytest

from maelm_jax.data import pipeline
from maelm_jax.data import sources
from maelm_jax.data import tokenizer as tokenizer_lib

CLS, SEP, PAD = tokenizer_lib.CLS_ID, tokenizer_lib.SEP_ID, tokenizer_lib.PAD_ID


class ListSource:
  """A minimal random-access document source."""

  def __init__(self, documents, name="list"):
    self._documents = list(documents)
    self._name = name

  def __len__(self):
    return len(self._documents)

  def __getitem__(self, index):
    return self._documents[index]

  def __repr__(self):
    return f"ListSource({self._name}, n={len(self)})"


@pytest.fixture(scope="module")
def pydoc_train():
  return sources.open_source("pydoc:", "train")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory, pydoc_train):
  prefix = tmp_path_factory.mktemp("tok") / "sp"
  return tokenizer_lib.train_tokenizer(
      pipeline.training_texts(pydoc_train), str(prefix), vocab_size=600)


@pytest.fixture(scope="module")
def numbered_docs(pydoc_train):
  """200 distinct documents of 3..70 words; the "Doc <i>" prefix makes each
  recognisable in the token stream."""
  words = " ".join(pydoc_train[i] for i in range(300)).split()
  return [f"Doc {i}: " + " ".join(words[7 * i:7 * i + 3 + (i * 37) % 68])
          for i in range(200)]


def _stream(batches):
  """Row bodies (without [CLS]/[SEP]) of all batches, concatenated."""
  return np.concatenate([b["input_ids"][:, 1:-1].reshape(-1) for b in batches])


def _documents_in(stream, tokenizer, docs):
  """Indices of the complete documents in `stream`, in order."""
  by_tokens = {tuple(ids): i for i, ids in enumerate(tokenizer.encode(docs))}
  pieces = np.split(stream, np.flatnonzero(stream == SEP))
  found = [tuple(p[1:]) if k else tuple(p) for k, p in enumerate(pieces)][:-1]
  return [by_tokens[p] for p in found]  # KeyError: a corrupted document.


def _take(dataset, n):
  return list(itertools.islice(iter(dataset), n))


# --------------------------------------------------------------------------
# The two stages on their own.


def test_tokenize_documents_builds_a_sep_terminated_stream(tokenizer):
  documents = ["first document", "", "   ", "second one"]
  chunk = pipeline.TokenizeDocuments(tokenizer).map(documents)
  first, second = tokenizer.encode(["first document", "second one"])
  # Documents that tokenize to nothing add no second [SEP].
  assert chunk.dtype == np.int32
  assert chunk.tolist() == first + [SEP] + second + [SEP]
  assert pipeline.TokenizeDocuments(tokenizer).map(["", " "]).shape == (0,)


def _packed(chunks, seq_len, complete_docs=False):
  parent = grain.MapDataset.source(
      ListSource([np.asarray(c, np.int32) for c in chunks])).to_iter_dataset()
  return pipeline.PackRowsIterDataset(parent, seq_len=seq_len, cls_id=CLS,
                                      sep_id=SEP, complete_docs=complete_docs)


def _rows_and_states(dataset):
  """Every row of one pass, and the iterator's state (through JSON, as a
  checkpoint stores it) before each row and after the last."""
  iterator = iter(dataset)
  states, rows = [], []
  while True:
    states.append(json.loads(json.dumps(iterator.get_state())))
    try:
      rows.append(next(iterator)["input_ids"])
    except StopIteration:
      return rows, states


def test_packing_layout_exactly():
  chunks = [[5, 6, 7, SEP], [8, SEP], [], [9, 10, 11, 12, 13, SEP, 14, SEP]]
  rows = [r["input_ids"].tolist() for r in _packed(chunks, seq_len=5)]
  # Stream: 5 6 7 S 8 S 9 10 11 12 13 S 14 S; bodies of 3; "14 S" is dropped.
  assert rows == [[CLS, 5, 6, 7, SEP], [CLS, SEP, 8, SEP, SEP],
                  [CLS, 9, 10, 11, SEP], [CLS, 12, 13, SEP, SEP]]


def test_packing_chunk_longer_than_several_rows():
  rows = [r["input_ids"].tolist() for r in _packed([list(range(10, 22))], seq_len=6)]
  assert rows == [[CLS, 10, 11, 12, 13, SEP], [CLS, 14, 15, 16, 17, SEP],
                  [CLS, 18, 19, 20, 21, SEP]]


def test_packing_resumes_exactly_from_every_position():
  rng = np.random.default_rng(0)
  chunks = [rng.integers(5, 100, rng.integers(0, 12)) for _ in range(40)]
  dataset = _packed(chunks, seq_len=7)
  rows, states = _rows_and_states(dataset)
  assert len(rows) == sum(map(len, chunks)) // 5
  np.testing.assert_array_equal(
      np.concatenate(rows).reshape(-1, 7)[:, 1:-1].reshape(-1),
      np.concatenate(chunks)[:5 * len(rows)])
  for k, state in enumerate(states):
    restored = iter(dataset)
    restored.set_state(state)
    rest = [r["input_ids"] for r in restored]
    assert len(rest) == len(rows) - k
    np.testing.assert_array_equal(np.reshape(rest, (-1, 7)),
                                  np.reshape(rows[k:], (-1, 7)))


def test_complete_doc_rows_never_cross_a_document_layout_exactly():
  PAD = 0
  chunks = [[5, 6, 7, SEP], [8, SEP], [], [9, 10, 11, 12, 13, SEP, 14, 15, 16, SEP]]
  rows = [r["input_ids"].tolist() for r in _packed(chunks, seq_len=5,
                                                   complete_docs=True)]
  # Documents 5 6 7 | 8 | 9..13 | 14 15 16. "5 6 7" fills a row exactly (its [SEP]
  # is the row's); "9..13" is cut by length and its tail "12 13" padded.
  assert rows == [[CLS, 5, 6, 7, SEP], [CLS, 8, SEP, PAD, PAD],
                  [CLS, 9, 10, 11, SEP], [CLS, 12, 13, SEP, PAD],
                  [CLS, 14, 15, 16, SEP]]


def test_complete_doc_rows_resume_exactly_and_hold_every_token():
  rng = np.random.default_rng(1)
  docs = [rng.integers(5, 100, rng.integers(1, 12)) for _ in range(60)]
  chunks = [np.concatenate([np.append(d, SEP) for d in docs[i:i + 3]])
            for i in range(0, 60, 3)]
  dataset = _packed(chunks, seq_len=8, complete_docs=True)
  rows, states = _rows_and_states(dataset)
  rows = np.stack(rows)
  # Each row: [CLS], tokens of one document, [SEP], then only padding.
  for row in rows:
    body = row[1:].tolist()
    end = body.index(SEP)
    assert all(t >= 5 for t in body[:end]) and all(t == 0 for t in body[end + 1:])
  # Read back in order, the rows are the documents (the last partial row aside).
  tokens = [t for row in rows for t in row[1:] if t >= 5]
  assert tokens == np.concatenate(docs)[:len(tokens)].tolist()
  assert len(tokens) > 0.9 * sum(map(len, docs))
  for k in range(0, len(states), 7):
    restored = iter(dataset)
    restored.set_state(states[k])
    np.testing.assert_array_equal(np.stack([r["input_ids"] for r in restored]),
                                  rows[k:])


def test_packing_rejects_tiny_rows():
  with pytest.raises(ValueError, match="at least 3"):
    _packed([[5]], seq_len=2)


# --------------------------------------------------------------------------
# make_pretrain_dataset.


def test_rows_are_full_cls_sep_sequences(pydoc_train, tokenizer):
  dataset = pipeline.make_pretrain_dataset(pydoc_train, tokenizer, seq_len=24,
                                           batch_size=8, seed=0)
  for batch in _take(dataset, 20):
    ids = batch["input_ids"]
    assert set(batch) == {"input_ids"}
    assert ids.shape == (8, 24) and ids.dtype == np.int32
    assert (ids[:, 0] == CLS).all() and (ids[:, -1] == SEP).all()
    assert not (ids == PAD).any()
    assert not (ids[:, 1:] == CLS).any()
    assert ((ids >= 0) & (ids < tokenizer.vocab_size)).all()


def test_rows_reproduce_the_document_stream(numbered_docs, tokenizer):
  source = ListSource(numbered_docs)
  batches = list(pipeline.make_pretrain_dataset(
      source, tokenizer, seq_len=18, batch_size=3, seed=0, shuffle=False,
      repeat=False))
  expected = np.concatenate([np.append(ids, SEP)
                             for ids in tokenizer.encode(numbered_docs)])
  num_rows = len(expected) // 16
  assert len(batches) == num_rows // 3  # Partial row and batch dropped.
  stream = _stream(batches)
  np.testing.assert_array_equal(stream, expected[:len(stream)])
  assert pipeline.estimate_num_sequences(source, tokenizer, 18) == num_rows


def test_same_seed_same_batches_other_seed_other_batches(pydoc_train, tokenizer):
  def first(seed):
    return _stream(_take(pipeline.make_pretrain_dataset(
        pydoc_train, tokenizer, seq_len=32, batch_size=4, seed=seed), 5))
  np.testing.assert_array_equal(first(1), first(1))
  assert not np.array_equal(first(1), first(2))
  unshuffled = _stream(_take(pipeline.make_pretrain_dataset(
      pydoc_train, tokenizer, seq_len=32, batch_size=4, seed=1, shuffle=False), 5))
  assert not np.array_equal(first(1), unshuffled)


def test_every_epoch_is_a_new_permutation(numbered_docs, tokenizer):
  docs = numbered_docs[:30]
  source = ListSource(docs)
  epoch_tokens = sum(len(ids) + 1 for ids in tokenizer.encode(docs))
  rows_needed = 3 * epoch_tokens // 14 + 1
  stream = _stream(_take(pipeline.make_pretrain_dataset(
      source, tokenizer, seq_len=16, batch_size=1, seed=7), rows_needed))
  order = _documents_in(stream, tokenizer, docs)
  epochs = [order[:30], order[30:60]]
  for epoch in epochs:
    assert sorted(epoch) == list(range(30))  # Each epoch: every document once.
  assert epochs[0] != epochs[1]
  assert epochs[0] != list(range(30))


def test_process_shares_are_disjoint_and_cover_the_documents(numbered_docs, tokenizer):
  source = ListSource(numbered_docs)

  def docs_of(process_index, shuffle):
    batches = list(pipeline.make_pretrain_dataset(
        source, tokenizer, seq_len=20, batch_size=2, seed=3, shuffle=shuffle,
        repeat=False, process_index=process_index, process_count=2))
    return _documents_in(_stream(batches), tokenizer, numbered_docs)

  for process_index in (0, 1):
    # Unshuffled: exactly documents process_index, +2, +4, ... in order (up to
    # the dropped tail).
    found = docs_of(process_index, shuffle=False)
    assert found == list(range(process_index, 200, 2))[:len(found)]
    assert len(found) >= 90
  first, second = docs_of(0, shuffle=True), docs_of(1, shuffle=True)
  assert not set(first) & set(second)
  assert all(i % 2 == 0 for i in first) and all(i % 2 == 1 for i in second)
  assert first != sorted(first)
  assert len(set(first) | set(second)) >= 180  # Only the dropped tails miss.


def test_checkpoint_restore_gives_identical_batches(pydoc_train, tokenizer):
  def make():
    return pipeline.make_pretrain_dataset(pydoc_train, tokenizer, seq_len=40,
                                          batch_size=4, seed=11)
  iterator = iter(make())
  for _ in range(7):
    next(iterator)
  state = json.loads(json.dumps(iterator.get_state()))  # JSON-able (orbax).
  expected = [next(iterator)["input_ids"] for _ in range(6)]
  restored = iter(make())  # A fresh pipeline, as after a restart.
  restored.set_state(state)
  got = [next(restored)["input_ids"] for _ in range(6)]
  np.testing.assert_array_equal(np.stack(got), np.stack(expected))


def test_eval_stream_is_finite_and_fixed(tokenizer):
  held_out = sources.open_source("pydoc:", "eval")
  def run():
    return list(pipeline.make_pretrain_dataset(
        held_out, tokenizer, seq_len=64, batch_size=2, seed=0, shuffle=False,
        repeat=False))
  first, second = run(), run()
  assert len(first) == pipeline.estimate_num_sequences(held_out, tokenizer, 64) // 2
  assert len(first) > 2
  np.testing.assert_array_equal(_stream(first), _stream(second))


def test_estimate_with_a_document_sample(pydoc_train, tokenizer):
  exact = pipeline.estimate_num_sequences(pydoc_train, tokenizer, 64)
  sampled = pipeline.estimate_num_sequences(pydoc_train, tokenizer, 64, max_docs=300)
  assert exact > 100
  assert 0.7 * exact < sampled < 1.3 * exact


def test_training_texts(pydoc_train):
  texts = list(pipeline.training_texts(pydoc_train, max_chars=20_000))
  assert texts == list(pipeline.training_texts(pydoc_train, max_chars=20_000))
  assert sum(map(len, texts)) >= 20_000
  assert sum(map(len, texts[:-1])) < 20_000  # Stops at the budget.
  prefix = [pydoc_train[i] for i in range(len(texts))]
  assert texts != prefix  # Spread over the corpus, not its first documents.
  everything = list(pipeline.training_texts(pydoc_train))
  assert sorted(everything) == sorted(pydoc_train[i] for i in range(len(pydoc_train)))


@pytest.mark.parametrize("kwargs, match", [
    (dict(seq_len=2), "seq_len=2"),
    (dict(batch_size=0), "batch_size=0"),
    (dict(process_index=2, process_count=2), r"process_index=2.*\[0, process_count=2\)"),
    (dict(seed=-1), "seed=-1"),
])
def test_bad_arguments(tokenizer, kwargs, match):
  args = dict(seq_len=16, batch_size=2, seed=0) | kwargs
  with pytest.raises(ValueError, match=match):
    pipeline.make_pretrain_dataset(ListSource(["a b", "c d"]), tokenizer, **args)


def test_fewer_documents_than_processes(tokenizer):
  with pytest.raises(ValueError, match="has 2 documents, fewer than the 4 data streams"):
    pipeline.make_pretrain_dataset(ListSource(["a b", "c d"]), tokenizer, seq_len=16,
                                   batch_size=1, seed=0, process_index=0,
                                   process_count=4)


def test_global_batch_is_the_same_for_any_process_count(numbered_docs, tokenizer):
  """With a fixed num_streams, 1, 2 or 4 processes see the same global batches:
  what lets a run move between 1x8 and 2x4 devices with identical losses."""
  source = ListSource(numbered_docs)

  def global_batches(process_count, num_batches=6):
    per_process = []
    for index in range(process_count):
      it = iter(pipeline.make_pretrain_dataset(
          source, tokenizer, seq_len=20, batch_size=8 // process_count, seed=4,
          process_index=index, process_count=process_count, num_streams=4))
      per_process.append([next(it)["input_ids"] for _ in range(num_batches)])
    return [np.concatenate([p[step] for p in per_process])
            for step in range(num_batches)]

  single = global_batches(1)
  assert single[0].shape == (8, 20)
  for process_count in (2, 4):
    for a, b in zip(single, global_batches(process_count)):
      np.testing.assert_array_equal(a, b)
  # Each stream owns a block of 2 rows; streams hold disjoint documents.
  blocks = [_documents_in(_stream([{"input_ids": b[2 * s:2 * s + 2]}
                                   for b in single]), tokenizer, numbered_docs)
            for s in range(4)]
  for s, docs in enumerate(blocks):
    assert docs and all(i % 4 == s for i in docs)


def test_num_streams_must_fit_processes_and_batch(tokenizer):
  with pytest.raises(ValueError, match="num_streams=3 must be a multiple of the 2"):
    pipeline.make_pretrain_dataset(ListSource(["a b"] * 10), tokenizer, seq_len=16,
                                   batch_size=2, seed=0, process_index=0,
                                   process_count=2, num_streams=3)


def test_worker_processes(numbered_docs, tokenizer):
  source = ListSource(numbered_docs)

  def run():
    dataset = pipeline.make_pretrain_dataset(source, tokenizer, seq_len=20,
                                             batch_size=2, seed=5, num_workers=2)
    iterator = iter(dataset)
    batches = [next(iterator)["input_ids"] for _ in range(12)]
    iterator.close()
    return np.stack(batches)

  first = run()
  np.testing.assert_array_equal(first, run())
  assert (first[..., 0] == CLS).all() and (first[..., -1] == SEP).all()
  assert not (first == PAD).any()


def test_gutenberg_corpus(shared_data, tmp_path):
  books = shared_data / "corpus" / "gutenberg"
  if not any(books.glob("*.txt.xz")):
    pytest.skip(f"no Gutenberg books in {books}")
  spec = f"text:{books}/*.txt.xz"
  train = sources.open_source(spec, "train")
  held_out = sources.open_source(spec, "eval")
  assert len(train) > 50_000 and len(held_out) > 500
  samples = [train[i] for i in range(0, len(train), 97)]
  assert not any("PROJECT GUTENBERG EBOOK" in d.upper() for d in samples)
  assert not any("*** START OF" in d or "*** END OF" in d for d in samples)

  tok = tokenizer_lib.train_tokenizer(
      pipeline.training_texts(train, max_chars=1_500_000), str(tmp_path / "sp"),
      vocab_size=2000)
  assert tok.decode(tok.encode(["It was the best of times."])[0]) == (
      "It was the best of times.")
  batches = _take(pipeline.make_pretrain_dataset(
      train, tok, seq_len=128, batch_size=16, seed=0), 10)
  ids = np.stack([b["input_ids"] for b in batches])
  assert ids.shape == (10, 16, 128)
  assert (ids[..., 0] == CLS).all() and (ids[..., -1] == SEP).all()
  assert not (ids == PAD).any()
  # Real English: most tokens are ordinary pieces, [UNK] is rare.
  assert (ids == tokenizer_lib.UNK_ID).mean() < 0.001


def test_corpus_without_tokens_fails_instead_of_hanging(tokenizer, monkeypatch):
  monkeypatch.setattr(pipeline, "_MAX_EMPTY_CHUNKS", 50)
  # shuffle=False: grain's index shuffle is slow on tiny (3-document) domains.
  dataset = pipeline.make_pretrain_dataset(ListSource(["", " ", "\t"]), tokenizer,
                                           seq_len=16, batch_size=1, seed=0,
                                           shuffle=False)
  with pytest.raises(ValueError, match="contain no text"):
    next(iter(dataset))


KILLED_TRAINER = r"""
import os, signal, sys
from maelm_jax.data import pipeline, sources, tokenizer as tokenizer_lib
tokenizer = tokenizer_lib.open_tokenizer(sys.argv[1])


def pipeline_children():
  children = []
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      stat = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(stat[1]) == os.getpid():  # stat[1]: the parent's pid.
      children.append(int(entry))
  return children


dataset = pipeline.make_pretrain_dataset(sources.open_source("pydoc:", "train"),
                                         tokenizer, seq_len=32, batch_size=2,
                                         seed=0, num_workers=1)
iterator = iter(dataset)
next(iterator)
print(" ".join(str(p) for p in pipeline_children()), flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # A trainer killed without warning.
"""


def test_workers_exit_when_the_trainer_is_killed(tokenizer, tmp_path):
  """kill -9 of the trainer cannot stop grain's worker processes; before
  `pipeline.exit_with_parent` they stayed blocked for good (~200 MB each) and
  every relaunch after a kill left more."""
  import os, subprocess, sys, time  # pylint: disable=import-outside-toplevel,multiple-imports
  # Output to files, not pipes: orphans holding a pipe would keep run() waiting.
  with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
    returncode = subprocess.run([sys.executable, "-c", KILLED_TRAINER, tokenizer.path],
                                stdout=out, stderr=err, timeout=300).returncode
  assert returncode == -9, (tmp_path / "err").read_text()[-2000:]
  children = [int(p) for p in (tmp_path / "out").read_text().split()]
  assert children  # The worker (and multiprocessing's resource tracker).
  deadline = time.time() + 20
  alive = lambda pid: os.path.exists(f"/proc/{pid}") and "Z" != open(
      f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
  while any(alive(p) for p in children) and time.time() < deadline:
    time.sleep(0.2)
  left = [p for p in children if alive(p)]
  for pid in left:
    os.kill(pid, 9)
  assert not left, f"processes of the killed trainer still running: {left}"

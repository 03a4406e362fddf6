"""Tests for maelm_jax.data.tokenizer on the English docs CPython ships (pydoc_data)."""

import os
import pathlib
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
import unicodedata

from pydoc_data import topics
import pytest

from maelm_jax.data import tokenizer as tokenizer_lib

REPO = pathlib.Path(__file__).resolve().parents[1]

VOCAB = 800


def _pydoc_paragraphs():
  return [" ".join(p.split()) for key in sorted(topics.topics)
          for p in re.split(r"\n\s*\n", topics.topics[key]) if p.strip()]


@pytest.fixture(scope="module")
def paragraphs():
  return _pydoc_paragraphs()


@pytest.fixture(scope="module")
def unigram(tmp_path_factory, paragraphs):
  prefix = tmp_path_factory.mktemp("unigram") / "sp"
  return tokenizer_lib.train_tokenizer(paragraphs, str(prefix), vocab_size=VOCAB)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, paragraphs):
  prefix = tmp_path_factory.mktemp("bpe") / "sp"
  return tokenizer_lib.train_tokenizer(paragraphs, str(prefix), vocab_size=VOCAB,
                                       model_type="bpe")


@pytest.fixture(params=["unigram", "bpe"])
def tokenizer(request):
  return request.getfixturevalue(request.param)


def test_special_ids_and_pieces(tokenizer):
  assert tokenizer_lib.SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
  assert tokenizer_lib.NUM_SPECIAL == 5
  ids = (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id,
         tokenizer.mask_id)
  assert ids == (0, 1, 2, 3, 4)
  assert [tokenizer.id_to_piece(i) for i in ids] == list(tokenizer_lib.SPECIAL_TOKENS)
  assert tokenizer.vocab_size == VOCAB


def test_model_type_is_recorded(unigram, bpe):
  assert unigram.model_type == "unigram"
  assert bpe.model_type == "bpe"


def test_round_trip_of_corpus_paragraphs(tokenizer, paragraphs):
  sample = paragraphs[::25]
  encoded = tokenizer.encode(sample)
  assert len(encoded) == len(sample)
  # SentencePiece applies NFKC ("…" -> "..."), and characters outside the
  # 99.95% coverage become [UNK]; everything else must decode back exactly.
  exact = [tokenizer.decode(ids) == unicodedata.normalize("NFKC", text)
           for ids, text in zip(encoded, sample) if tokenizer.unk_id not in ids]
  assert len(exact) >= 0.9 * len(sample)
  assert all(exact)
  assert any("…" in text for text in sample)  # The NFKC case is exercised.


def test_round_trip_normalises_whitespace(tokenizer):
  text = "The   interpreter\nreads a file of\tstatements and executes them. "
  (ids,) = tokenizer.encode([text])
  assert tokenizer.unk_id not in ids
  assert tokenizer.decode(ids) == " ".join(text.split())
  assert tokenizer.encode_one(text) == ids


def test_literal_special_strings_are_plain_text(tokenizer):
  text = "x = a[MASK] + b[CLS] or [SEP] [PAD]"
  (ids,) = tokenizer.encode([text])
  assert not {0, 2, 3, 4} & set(ids), ids
  assert len(ids) > 10  # Spelled out piece by piece, not one special id each.


def test_decode_drops_special_tokens(unigram):
  (ids,) = unigram.encode(["the function returns a list"])
  framed = [unigram.cls_id, *ids, unigram.mask_id, unigram.sep_id,
            unigram.pad_id, unigram.pad_id]
  assert unigram.decode(framed) == "the function returns a list"
  with pytest.raises(ValueError, match=rf"outside \[0, {VOCAB}\)"):
    unigram.decode([5, VOCAB])


def test_encode_rejects_a_bare_string(unigram):
  with pytest.raises(TypeError, match="encode_one"):
    unigram.encode("a string, not a list")


def test_pickle_round_trip(unigram):
  clone = pickle.loads(pickle.dumps(unigram))
  assert clone.vocab_size == unigram.vocab_size and clone.path == unigram.path
  texts = ["pickled tokenizers encode the same"]
  assert clone.encode(texts) == unigram.encode(texts)


def test_training_is_deterministic(tmp_path, paragraphs):
  texts = paragraphs[:400]
  a = tokenizer_lib.train_tokenizer(texts, str(tmp_path / "a"), vocab_size=300, seed=3)
  b = tokenizer_lib.train_tokenizer(texts, str(tmp_path / "b"), vocab_size=300, seed=3)
  assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
  assert a.encode(texts[:5]) == b.encode(texts[:5])
  assert sorted(os.listdir(tmp_path)) == ["a.model", "a.vocab", "b.model", "b.vocab"]


def test_training_says_how_far_the_reading_is(tmp_path, paragraphs, monkeypatch):
  """Tokenizer training is not silent: progress lines while the sentences are
  read, then one line saying SentencePiece builds the vocabulary."""
  messages = []
  monkeypatch.setattr(tokenizer_lib.logging, "info",
                      lambda fmt, *args: messages.append(fmt % args))
  monkeypatch.setattr(tokenizer_lib, "_PROGRESS_EVERY_S", 0.0)  # Every sentence.
  texts = paragraphs[:200]
  tokenizer_lib.train_tokenizer(texts, str(tmp_path / "sp"), vocab_size=300,
                                max_sentences=1000)
  expected = sum(1 for _ in tokenizer_lib._training_lines(texts, 4096))
  progress = [int(re.search(r"read (\d+) sentences", m).group(1)) for m in messages
              if re.match(r"tokenizer: read \d+ sentences", m)]
  assert progress == list(range(1, expected + 1))
  assert messages[-1].startswith(f"tokenizer: read all {expected} sentences")
  assert "building the vocabulary from at most 1000 of them" in messages[-1]


def test_long_paragraphs_are_split_for_training(tmp_path, paragraphs):
  # One 40+ kB line: SentencePiece would skip it (max_sentence_length) and fail
  # with "no sentences"; train_tokenizer must cut it into sentences.
  text = " ".join(paragraphs[:300])
  assert len(text.encode()) > 40_000
  tok = tokenizer_lib.train_tokenizer([text], str(tmp_path / "long"), vocab_size=300)
  assert tok.vocab_size == 300
  words_without_spaces = "x" * 20_000  # A single 20 kB "word" is cut too.
  tok = tokenizer_lib.train_tokenizer([text, words_without_spaces],
                                      str(tmp_path / "word"), vocab_size=300)
  assert tok.vocab_size == 300


def test_unknown_model_type(tmp_path):
  with pytest.raises(ValueError, match=r"'wordpiece'.*\('unigram', 'bpe'\)"):
    tokenizer_lib.train_tokenizer(["a b c"], str(tmp_path / "t"), vocab_size=100,
                                  model_type="wordpiece")


def test_too_little_text_for_the_vocab_size(tmp_path, paragraphs):
  with pytest.raises(ValueError, match=r"too small for vocab_size=5000.*at most (\d+)") as e:
    tokenizer_lib.train_tokenizer(paragraphs[:20], str(tmp_path / "t"), vocab_size=5000)
  assert "--config.tokenizer.vocab_size" in str(e.value)
  limit = int(re.search(r"at most (\d+)", str(e.value)).group(1))
  assert 100 < limit < 5000
  assert os.listdir(tmp_path) == []  # No temporary files left behind.


def test_ctrl_c_during_training_leaves_no_temporary_files(tmp_path, paragraphs,
                                                          monkeypatch):
  """Ctrl-C while reading the text, or while SentencePiece builds the vocabulary
  (C++: the interrupt is raised once it returns, its files written)."""
  def interrupted(texts):
    yield from texts[:5]
    raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    tokenizer_lib.train_tokenizer(interrupted(paragraphs), str(tmp_path / "t"),
                                  vocab_size=100)
  assert os.listdir(tmp_path) == []
  proto_class = tokenizer_lib.sentencepiece_model_pb2.ModelProto
  def interrupt_after_training(data):
    raise KeyboardInterrupt
  monkeypatch.setattr(proto_class, "FromString", interrupt_after_training)
  with pytest.raises(KeyboardInterrupt):
    tokenizer_lib.train_tokenizer(paragraphs, str(tmp_path / "t"), vocab_size=100)
  assert os.listdir(tmp_path) == []


def test_empty_text(tmp_path):
  with pytest.raises(ValueError, match="empty"):
    tokenizer_lib.train_tokenizer(["", "   "], str(tmp_path / "t"), vocab_size=100)


def test_not_a_maelm_tokenizer(tmp_path, paragraphs):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  spm.SentencePieceTrainer.train(sentence_iterator=iter(paragraphs[:300]),
                                 model_prefix=str(tmp_path / "plain"),
                                 vocab_size=200, minloglevel=2)
  with pytest.raises(ValueError, match=r"special pieces.*\[CLS\]"):
    tokenizer_lib.Tokenizer(str(tmp_path / "plain.model"))


class _Texts:
  """A `training_texts` callable that counts its calls."""

  def __init__(self, texts):
    self.texts = texts
    self.calls = 0

  def __call__(self):
    self.calls += 1
    return iter(self.texts)


def test_load_or_train_trains_once_then_reuses(tmp_path, paragraphs):
  workdir = tmp_path / "run"
  texts = _Texts(paragraphs[:400])
  first = tokenizer_lib.load_or_train_tokenizer(str(workdir), texts, vocab_size=300)
  model = workdir / "tokenizer.model"
  assert first.path == str(model) and texts.calls == 1
  assert sorted(os.listdir(workdir)) == ["tokenizer.model", "tokenizer.vocab"]
  mtime = model.stat().st_mtime_ns

  second = tokenizer_lib.load_or_train_tokenizer(str(workdir), texts, vocab_size=300)
  assert texts.calls == 1  # Not asked for text again: no retraining.
  assert model.stat().st_mtime_ns == mtime
  assert second.encode(paragraphs[:3]) == first.encode(paragraphs[:3])


def test_load_or_train_vocab_size_mismatch(tmp_path, unigram):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "tokenizer.model").write_bytes(open(unigram.path, "rb").read())
  with pytest.raises(ValueError) as e:
    tokenizer_lib.load_or_train_tokenizer(str(workdir), _Texts([]), vocab_size=1234)
  message = str(e.value)
  assert f"has {VOCAB} pieces but config.tokenizer.vocab_size is 1234" in message
  assert f"--config.tokenizer.vocab_size={VOCAB}" in message
  assert "fresh workdir" in message
  with pytest.raises(ValueError, match="--config.tokenizer.model_type=unigram"):
    tokenizer_lib.load_or_train_tokenizer(str(workdir), _Texts([]), vocab_size=VOCAB,
                                          model_type="bpe")


def test_load_or_train_explicit_path(tmp_path, bpe):
  texts = _Texts([])
  tok = tokenizer_lib.load_or_train_tokenizer(str(tmp_path), texts, vocab_size=VOCAB,
                                              path=bpe.path)
  assert tok.path == bpe.path and texts.calls == 0
  assert not (tmp_path / "tokenizer.model").exists()
  with pytest.raises(FileNotFoundError, match="missing.model"):
    tokenizer_lib.load_or_train_tokenizer(str(tmp_path), texts, vocab_size=VOCAB,
                                          path=str(tmp_path / "missing.model"))
  with pytest.raises(ValueError, match=f"has {VOCAB} pieces"):
    tokenizer_lib.load_or_train_tokenizer(str(tmp_path), texts, vocab_size=64,
                                          path=bpe.path)


def test_non_writer_waits_for_the_writers_file(tmp_path, unigram):
  texts = _Texts([])
  with pytest.raises(TimeoutError, match="process 0"):
    tokenizer_lib.load_or_train_tokenizer(str(tmp_path), texts, vocab_size=VOCAB,
                                          is_writer=False, wait_timeout_s=0.2)

  def write_later():
    time.sleep(0.3)
    data = open(unigram.path, "rb").read()
    (tmp_path / "tmp").write_bytes(data)
    os.replace(tmp_path / "tmp", tmp_path / "tokenizer.model")

  writer = threading.Thread(target=write_later)
  writer.start()
  tok = tokenizer_lib.load_or_train_tokenizer(str(tmp_path), texts, vocab_size=VOCAB,
                                              is_writer=False, wait_timeout_s=30)
  writer.join()
  assert tok.vocab_size == VOCAB and texts.calls == 0


# "[MASK]" before punctuation, mid-word, at either end, twice, after a space
# before punctuation, in a text with extra spaces.
MASKED_TEXTS = ("the worst of [MASK].", "The cat sat on the[MASK]s mat.",
                "un[MASK]able results", "The value is [MASK]", "[MASK] returns None",
                "a [MASK] [MASK] b", "the list [MASK] .", "  call   [MASK]( x )  ",
                "[MASK]")


def test_a_typed_mask_is_the_mask_token_with_the_words_around_it_kept(unigram):
  pieces = lambda ids: [unigram.id_to_piece(i) for i in ids]
  assert pieces(unigram.encode_with_masks("the worst of [MASK].")) == (
      pieces(unigram.encode_one("the worst of")) + ["[MASK]", "."])
  assert unigram.encode_with_masks("no mask here") == unigram.encode_one("no mask here")
  # The mask stands where a word was: the words after it are as in the sentence.
  whole = unigram.encode_one("the value of the list is returned")
  masked = unigram.encode_with_masks("the value of [MASK] list is returned")
  assert masked.count(tokenizer_lib.MASK_ID) == 1
  slot = masked.index(tokenizer_lib.MASK_ID)
  assert masked[:slot] == whole[:slot] and masked[slot + 1:] == whole[slot + 1:]


def test_the_export_tokenizer_splits_text_around_mask_as_the_project(tokenizer,
                                                                      tmp_path):
  """The first-day report: the export gave `▁of [MASK] ▁ .` for "of [MASK].",
  so fill-mask answered "the worst of the ." and one guess was empty."""
  transformers = pytest.importorskip("transformers")
  from maelm_jax.interop import export_hf  # pylint: disable=import-outside-toplevel
  export_hf.write_tokenizer(tokenizer.path, str(tmp_path), max_length=128)
  exported = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  for text in MASKED_TEXTS:
    want = [tokenizer_lib.CLS_ID, *tokenizer.encode_with_masks(text),
            tokenizer_lib.SEP_ID]
    got = exported(text)["input_ids"]
    assert got == want, (text, exported.convert_ids_to_tokens(got),
                         [tokenizer.id_to_piece(i) for i in want])
  # Without a [MASK], as before: SentencePiece's own ids.
  text = "  Hello   world, it's [1999].  "
  assert exported(text)["input_ids"][1:-1] == tokenizer.encode_one(text)


# The child starts with SIGINT handled as from a terminal: a test run started in
# the background of a script inherits SIGINT ignored, and passes that on.
_BUILD_A_BIG_VOCABULARY = """
import itertools, random, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from absl import logging
from maelm_jax.data import tokenizer
logging.set_verbosity(logging.INFO)
rng = random.Random(0)
words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 12)))
         for _ in range(60000)]
weights = list(itertools.accumulate(1 / (i + 1) for i in range(len(words))))
texts = (" ".join(rng.choices(words, cum_weights=weights, k=12)) + "."
         for _ in range(100000))
tokenizer.train_tokenizer(texts, sys.argv[1], vocab_size=16000)
"""


def test_ctrl_c_while_sentencepiece_builds_stops_within_seconds(tmp_path):
  """SentencePiece builds the vocabulary in C++ for about 40 s here (100,000
  random sentences, 16,000 pieces, 2 cores): Ctrl-C then stops the process
  within seconds, not when the trainer returns, says that nothing of the
  tokenizer is kept, and leaves no file behind."""
  process = subprocess.Popen(
      [sys.executable, "-c", _BUILD_A_BIG_VOCABULARY, str(tmp_path / "t")],
      cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lines = []
  for line in process.stderr:  # Until the reading ends and the trainer starts.
    lines.append(line)
    if "SentencePiece is now building" in line:
      break
  time.sleep(1.0)
  assert process.poll() is None, "".join(lines)
  process.send_signal(signal.SIGINT)
  started = time.monotonic()
  rest = process.communicate(timeout=120)[1]
  seconds = time.monotonic() - started
  assert process.returncode != 0 and "KeyboardInterrupt" in rest, rest[-2000:]
  assert "stopped by Ctrl-C before it was built; nothing of it is kept" in rest
  assert seconds < 10, seconds
  assert os.listdir(tmp_path) == []

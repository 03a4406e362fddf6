"""studies/linear_probe.py: the word-vector probes and the corpus baseline."""

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "studies"))
import linear_probe  # noqa: E402


def test_ppmi_svd_puts_words_of_the_same_contexts_together():
  # Pieces 1 and 2 occur between the same neighbours (5 _ 6), 3 and 4 between
  # others (7 _ 8); nothing else distinguishes them.
  rng = np.random.default_rng(0)
  documents = []
  for _ in range(400):
    a, b = (1, 2) if rng.random() < 0.5 else (3, 4)
    word = a if rng.random() < 0.5 else b
    left, right = (5, 6) if a == 1 else (7, 8)
    documents.append([9, left, word, right, 9])
  vectors = linear_probe.ppmi_svd_vectors(documents, vocab_size=10, dim=4)
  unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True).clip(1e-9)
  assert vectors.shape == (10, 4)
  assert unit[1] @ unit[2] > 0.99 and unit[3] @ unit[4] > 0.99
  assert abs(unit[1] @ unit[3]) < 0.1
  assert not vectors[0].any()  # Never seen: no co-occurrence, a zero row.


class _SplitTokenizer:
  def encode(self, texts):
    return [[int(t) for t in text.split()] for text in texts]


def test_word_vector_probe_reads_a_label_carried_by_the_words():
  # Pieces 0-4 are "positive", 5-9 "negative"; one dimension says which.
  rng = np.random.default_rng(1)
  table = rng.normal(size=(10, 8))
  informative = table.copy()
  informative[:, 0] = np.where(np.arange(10) < 5, 3.0, -3.0)

  def sentences(n):
    labels = rng.integers(0, 2, n)
    texts = [" ".join(str(rng.integers(0, 5) + 5 * (1 - y)) for _ in range(4))
             for y in labels]
    return texts, labels

  train, dev = sentences(300), sentences(200)
  tok = _SplitTokenizer()
  assert linear_probe.word_vector_accuracy(informative, tok, train, dev) > 0.95
  # A single random direction, unrelated to the label: far from it (0.65 here).
  noise = rng.normal(size=(10, 1))
  uninformative = np.c_[noise, noise]  # One direction, unrelated to the label.
  assert linear_probe.word_vector_accuracy(uninformative, tok, train, dev) < 0.8

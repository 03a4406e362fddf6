"""The plateau baselines and the corpus report against hand-computed tables."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maelm_jax.run import baselines, train_lib
from maelm_jax.data import corpus_report
from maelm_jax.modeling import masking, model as model_lib
from tests import helpers
from tests.helpers import tiny_config

V = 10  # ids 0..4 special, 5..9 words.


def test_ngram_tables_match_hand_counts():
  # [CLS] 5 6 5 6 7 [SEP] and [CLS] 5 6 8 [SEP] [PAD]
  rows = [np.array([[2, 5, 6, 5, 6, 7, 3], [2, 5, 6, 8, 3, 0, 0]])]
  tables = baselines.count_ngrams(rows, V, max_tokens=10**6)
  # Maskable unigrams: 5 x3, 6 x3, 7 x1, 8 x1, 9 x0 -> add-one: 4,4,2,2,1 of 13.
  expected = np.log(np.array([4, 4, 2, 2, 1]) / 13)
  np.testing.assert_allclose(tables.unigram_log_probs[5:], expected, rtol=1e-6)
  assert np.all(np.isneginf(tables.unigram_log_probs[:5]))
  assert tables.num_tokens == 8
  assert tables.unigram_argmax == 5  # 5 and 6 tie; the smaller id wins.
  # Successors: [CLS] -> 5 (x2); 5 -> 6 (x3); 6 -> 5, 7, 8 (x1 each: smallest, 5);
  # 7 and 8 are followed only by [SEP], never a target: they fall back to unigram.
  assert tables.bigram_next[2] == 5
  assert tables.bigram_next[5] == 6
  assert tables.bigram_next[6] == 5
  assert tables.bigram_next[7] == 5 and tables.bigram_next[9] == 5


def test_ngram_counting_stops_near_max_tokens():
  rows = (np.full((1, 6), 5 + i % 5) for i in range(100))
  tables = baselines.count_ngrams(rows, V, max_tokens=12)
  assert tables.num_tokens == 15  # Three rows of 5 maskable tokens.


def test_baseline_step_scores_exactly_the_masked_positions_of_eval():
  config = tiny_config("mlm", seq_len=16)
  cfg = model_lib.ModelConfig.from_config(config.model, V, 4)
  rng = np.random.RandomState(0)
  ids = rng.randint(5, V, (4, 16)).astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  # Tables: the unigram favours 7; every word's successor is (id + 1) wrapped.
  log_probs = np.full(V, -np.inf, np.float32)
  log_probs[5:] = np.log([0.1, 0.2, 0.4, 0.2, 0.1])
  bigram_next = np.array([5, 5, 5, 5, 5, 6, 7, 8, 9, 5], np.int32)
  eval_rng = jax.random.PRNGKey(3)
  step = jax.jit(baselines.make_baseline_step(cfg))
  out = jax.device_get(step({"input_ids": ids}, eval_rng, 1, log_probs, bigram_next))

  masks = train_lib.draw_eval_masks(cfg, jnp.asarray(ids), eval_rng, 1)
  is_mask = np.zeros(ids.shape, bool)
  is_mask[np.arange(4)[:, None], np.asarray(masks.masked_positions)] = True
  pos = np.argwhere(is_mask)
  targets = ids[is_mask]
  left = ids[pos[:, 0], pos[:, 1] - 1]
  assert out["mask_weight"] == len(targets) == 4 * cfg.mask_counts(16).num_mask
  assert out["unigram_correct"] == np.sum(targets == 7)
  np.testing.assert_allclose(out["unigram_loss_sum"], -log_probs[targets].sum(),
                             rtol=1e-5)
  assert out["bigram_correct"] == np.sum(bigram_next[left] == targets)


def test_selected_is_masked_marks_the_mask_group_only():
  ids = jnp.asarray(np.random.RandomState(1).randint(5, 100, (3, 40)), jnp.int32)
  counts = masking.MaskCounts.create(40, 0.5, 0.2, 0.1, drop_masked=True)
  masks = helpers.draw_masks(None, ids, 100, seed=0, counts=counts)
  flags = np.asarray(masking.selected_is_masked(masks))
  assert flags.sum(axis=1).tolist() == [counts.num_mask] * 3
  selected = np.asarray(masks.selected_positions)
  for row in range(3):
    assert set(selected[row][flags[row] == 1]) == set(
        np.asarray(masks.masked_positions)[row])


@pytest.mark.parametrize("metrics,verdict", [
    (dict(acc=0.05, loss=6.7), "ON THE UNIGRAM PLATEAU"),
    (dict(acc=0.055, loss=6.5), "leaving the plateau"),
    (dict(acc=0.10, loss=5.9), "left the plateau"),
    (dict(acc=0.20, loss=5.0), "learned"),
])
def test_plateau_status_names_where_the_run_stands(metrics, verdict):
  line = baselines.plateau_status({
      "eval/mask_accuracy": metrics["acc"], "eval/mask_loss": metrics["loss"],
      "eval/unigram_accuracy": 0.05, "eval/unigram_loss": 6.7,
      "eval/bigram_accuracy": 0.15})
  assert line.startswith(verdict)
  assert "unigram 5.0%" in line and "bigram 15.0%" in line


class _FakeTokenizer:
  def encode(self, texts):
    return [[0] * (2 * len(t.split())) for t in texts]  # Two pieces per word.


def test_corpus_report_counts_duplicates_words_and_pieces():
  long_a = "the same paragraph of text appears twice in this corpus"
  long_b = "a different paragraph that appears only one time here"
  docs = [long_a, long_b, long_a, "Note:", "Note:",
          "first line of a new document here\n" + long_b]
  stats = corpus_report.report(docs, _FakeTokenizer())
  assert stats["documents"] == 6
  # long_a twice: one duplicate of 6 documents ("Note:" is too short to count).
  assert stats["duplicate_document_share"] == pytest.approx(1 / 6)
  # Lines >= 32 chars: a, b, a, first line, b -> duplicates a and b: 2 of 5.
  assert stats["duplicate_line_share"] == pytest.approx(2 / 5)
  words = sum(len(d.split()) for d in docs)
  assert stats["words"] == words and stats["tokens"] == 2 * words
  assert stats["pieces_per_word"] == pytest.approx(2.0)
  assert corpus_report.describe(stats, "train")[-1].startswith("WARNING: over 10%")
  clean = corpus_report.report([long_a, long_b], _FakeTokenizer())
  assert clean["duplicate_document_share"] == 0.0
  assert len(corpus_report.describe(clean, "train")) == 1  # No warning.

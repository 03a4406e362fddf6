"""Static-shape masking invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maelm_jax.modeling import masking
from tests.helpers import random_ids

VOCAB = 50


@functools.lru_cache(maxsize=None)
def _jitted_draw(counts):
  """`masking.draw_masks` for `counts` as one program, compiled once a shape:
  run op by op, its few dozen operations were compiled one by one."""
  return jax.jit(lambda key, ids: masking.draw_masks(key, ids, counts, mask_id=4,
                                                     vocab_size=VOCAB))


def draw(ids, ratio=0.15, replace=0.0, keep=0.0, drop=True, seed=0):
  counts = masking.MaskCounts.create(ids.shape[1], ratio, replace, keep, drop)
  masks = _jitted_draw(counts)(jax.random.PRNGKey(seed), jnp.asarray(ids))
  return counts, jax.tree.map(np.asarray, masks)


@pytest.mark.parametrize("ratio,replace,keep", [(0.15, 0.0, 0.0), (0.5, 0.1, 0.1),
                                                (0.3, 0.2, 0.0)])
def test_counts_are_exact_and_sets_disjoint(ratio, replace, keep):
  ids = random_ids(16, 64, VOCAB)
  counts, m = draw(ids, ratio, replace, keep)
  k = int(round(ratio * 62))
  assert counts.num_selected == k
  assert counts.num_random == round(k * replace)
  assert counts.num_mask + counts.num_random + counts.num_keep == k
  assert m.selected_positions.shape == (16, k)
  assert m.encoder_ids.shape == (16, 64 - counts.num_mask)
  for row in range(16):
    sel = m.selected_positions[row]
    assert len(set(sel)) == k and np.all(np.diff(sel) > 0)
    masked, visible = set(m.masked_positions[row]), set(m.encoder_positions[row])
    assert masked <= set(sel)
    assert not masked & visible
    assert masked | visible == set(range(64))
    assert np.all(np.diff(m.encoder_positions[row]) > 0)


def test_special_tokens_and_padding_never_selected():
  ids = random_ids(32, 40, VOCAB, num_pad=10)
  ids[:, 12] = 3  # A document separator inside the row.
  _, m = draw(ids, ratio=0.5)
  picked = np.take_along_axis(ids, m.selected_positions, axis=1)
  assert np.all(picked >= 5)
  assert np.all(m.selected_weights == 1.0)
  np.testing.assert_array_equal(m.targets, picked)


def test_short_rows_get_zero_weight_not_special_targets():
  ids = random_ids(4, 32, VOCAB, num_pad=25)  # Only 5 maskable tokens, K = 15.
  counts, m = draw(ids, ratio=0.5)
  assert counts.num_selected == 15
  np.testing.assert_array_equal(m.selected_weights.sum(axis=1), [5, 5, 5, 5])


@pytest.mark.parametrize("seed", range(4))
def test_short_rows_drop_padding_then_separators_never_cls(seed):
  # A short document's row: [CLS], 11 [SEP], 3 tokens, [SEP] at L=16. 3ML removes 5 slots
  # but only 3 are maskable; it used to remove [CLS] (position 0) as well.
  row = np.array([2] + [3] * 11 + [7, 8, 9, 3])
  padded = np.array([2, 7, 3, 8, 3, 9, 3] + [0] * 9)  # Enough padding to drop.
  ids = np.stack([row, padded] * 4)
  counts, m = draw(ids, ratio=0.5, replace=0.1, keep=0.1, drop=True, seed=seed)
  assert counts.num_mask == 5 and counts.encoder_len == 11
  for r in range(len(ids)):
    dropped = set(m.masked_positions[r])
    assert 0 in m.encoder_positions[r], f"row {r} dropped [CLS]"
    tokens = set(np.flatnonzero(ids[r] >= 5))
    assert tokens <= dropped  # Every real token goes before any special.
    np.testing.assert_array_equal(
        m.encoder_ids[r], np.take_along_axis(ids[r], m.encoder_positions[r], 0))
  # With padding in the row, only padding leaves besides the tokens: every
  # [SEP] and the [CLS] stay in front of the encoder.
  for r in range(1, len(ids), 2):
    assert (m.encoder_ids[r] == 0).sum() == 9 - 2
    assert (m.encoder_ids[r] == 3).sum() == 3 and m.encoder_ids[r][0] == 2
  # MLM in the same corner keeps every special visible, with weight 0.
  _, mlm = draw(ids, ratio=0.5, replace=0.1, keep=0.1, drop=False, seed=seed)
  specials = ids < 5
  np.testing.assert_array_equal(mlm.encoder_ids[specials], ids[specials])


def test_deterministic_for_a_key_and_different_across_rows_and_keys():
  ids = np.tile(random_ids(1, 64, VOCAB), (8, 1))  # Identical rows.
  _, a = draw(ids, seed=3)
  _, b = draw(ids, seed=3)
  _, c = draw(ids, seed=4)
  np.testing.assert_array_equal(a.selected_positions, b.selected_positions)
  assert len({tuple(r) for r in a.selected_positions}) == 8
  assert not np.array_equal(a.selected_positions, c.selected_positions)


def test_mlm_corruption_80_10_10_in_place():
  ids = random_ids(8, 128, VOCAB)
  counts, m = draw(ids, ratio=0.15, replace=0.1, keep=0.1, drop=False)
  assert m.encoder_ids.shape == ids.shape
  np.testing.assert_array_equal(m.encoder_positions[0], np.arange(128))
  is_mask = m.encoder_ids == 4
  assert np.all(is_mask.sum(axis=1) == counts.num_mask)
  for row in range(8):
    np.testing.assert_array_equal(np.flatnonzero(is_mask[row]), m.masked_positions[row])
  unselected = np.ones_like(ids, bool)
  np.put_along_axis(unselected, m.selected_positions, False, axis=1)
  np.testing.assert_array_equal(m.encoder_ids[unselected], ids[unselected])
  # Random replacements are ordinary tokens; at most num_random positions change.
  changed = (m.encoder_ids != ids) & ~is_mask
  assert np.all(changed.sum(axis=1) <= counts.num_random)
  assert changed.sum() > 0
  assert np.all(m.encoder_ids >= 2)


def test_3ml_drops_only_mask_group_random_tokens_stay_visible():
  ids = random_ids(8, 64, VOCAB)
  counts, m = draw(ids, ratio=0.5, replace=0.1, keep=0.1, drop=True)
  # Random-replaced and kept tokens stay: the encoder sees more than L - K.
  assert counts.encoder_len == 64 - counts.num_mask > 64 - counts.num_selected
  assert not np.any(m.encoder_ids == 4)
  original_at_visible = np.take_along_axis(ids, m.encoder_positions, axis=1)
  changed = (m.encoder_ids != original_at_visible).sum(axis=1)
  assert np.all(changed <= counts.num_random) and changed.sum() > 0
  # Every selected-but-visible slot is in the encoder input.
  for row in range(8):
    visible_selected = set(m.selected_positions[row]) - set(m.masked_positions[row])
    assert len(visible_selected) == counts.num_random + counts.num_keep
    assert visible_selected <= set(m.encoder_positions[row])


def test_gather_then_unpermute_round_trip():
  ids = random_ids(4, 48, VOCAB)
  _, m = draw(ids, ratio=0.3)
  x = np.random.RandomState(1).randn(4, 48, 8).astype(np.float32)
  fill = np.arange(8, dtype=np.float32) + 100
  visible = np.take_along_axis(x, m.encoder_positions[..., None], axis=1)
  full = masking.unpermute_to_full_length(jnp.asarray(visible),
                                          jnp.asarray(m.encoder_positions),
                                          jnp.asarray(fill),
                                          jnp.asarray(m.masked_positions))
  is_masked = np.zeros((4, 48), bool)
  np.put_along_axis(is_masked, m.masked_positions, True, axis=1)
  expected = np.where(is_masked[..., None], fill, x)
  np.testing.assert_array_equal(np.asarray(full), expected)


def test_too_much_replacement_is_an_error():
  with pytest.raises(ValueError, match="keep_prob"):
    masking.MaskCounts.create(64, 0.5, 0.7, 0.4, True)


# ----------------------------------------------------------------- per-row counts
# data.rows=complete_doc: rows of one document padded to L.


def draw_per_row(ids, ratio, replace, keep, drop, seed=0):
  counts = masking.MaskCounts.create(ids.shape[1], ratio, replace, keep, drop,
                                     per_row=True)
  masks = _jitted_draw(counts)(jax.random.PRNGKey(seed), jnp.asarray(ids))
  return counts, jax.tree.map(np.asarray, masks)


def document_rows(seq_len, seed=0):
  """One row per document length 0..L-2: `[CLS] tokens [SEP] [PAD]..`."""
  rows = [random_ids(1, seq_len, VOCAB, seed=seed + m, num_pad=seq_len - 2 - m)[0]
          for m in range(seq_len - 1)]
  return np.stack(rows)


@pytest.mark.parametrize("ratio,replace,keep,drop", [(0.15, 0.1, 0.1, False),
                                                     (0.15, 0.1, 0.1, True),
                                                     (0.5, 0.1, 0.1, True)])
def test_per_row_full_rows_select_exactly_as_fixed_counts(ratio, replace, keep, drop):
  ids = random_ids(16, 64, VOCAB)
  for seed in range(3):
    _, fixed = draw(ids, ratio, replace, keep, drop, seed=seed)
    _, per_row = draw_per_row(ids, ratio, replace, keep, drop, seed=seed)
    for name in ("selected_positions", "selected_weights", "targets", "encoder_ids",
                 "encoder_positions", "masked_positions"):
      np.testing.assert_array_equal(getattr(per_row, name), getattr(fixed, name),
                                    err_msg=name)


@pytest.mark.parametrize("ratio,replace,keep,drop", [(0.15, 0.1, 0.1, False),
                                                     (0.15, 0.1, 0.1, True),
                                                     (0.5, 0.1, 0.1, True),
                                                     (0.3, 0.2, 0.0, True)])
def test_per_row_counts_follow_each_documents_length(ratio, replace, keep, drop):
  seq_len = 48
  ids = document_rows(seq_len)
  counts, m = draw_per_row(ids, ratio, replace, keep, drop, seed=1)
  _, fixed = draw(ids, ratio, replace, keep, drop, seed=1)
  k = counts.num_selected
  p_random, p_keep = counts.num_random / k, counts.num_keep / k
  for row in range(len(ids)):
    tokens = ids[row] >= 5
    m_row = int(tokens.sum())
    weights = m.selected_weights[row]
    sel = m.selected_positions[row]
    assert len(set(sel)) == k and np.all(np.diff(sel) > 0)
    # The row's share of its tokens, rounded at random (up with probability
    # frac(ratio * m)), and never a special.
    want = int(weights.sum())
    assert np.floor(ratio * m_row) <= want <= min(np.floor(ratio * m_row) + 1, k)
    assert np.all(tokens[sel[weights == 1]])
    np.testing.assert_array_equal(m.targets[row], ids[row][sel])
    masked = m.masked_positions[row]
    masked_tokens = set(masked) & set(np.flatnonzero(tokens))
    picked = set(sel[weights == 1])
    assert masked_tokens <= picked
    n_random = round(want * p_random)
    n_keep = min(round(want * p_keep), want - n_random)
    assert len(masked_tokens) == want - n_random - n_keep <= counts.num_mask
    if drop:
      # The removed slots are the masked tokens and fillers; padding goes first,
      # [CLS] never, and the encoder sees every other position in order.
      visible = m.encoder_positions[row]
      assert set(masked) | set(visible) == set(range(seq_len))
      assert 0 in visible
      assert not masked_tokens & set(visible)
      fillers = set(masked) - masked_tokens
      pads = set(np.flatnonzero(ids[row] == 0))
      assert fillers <= pads or pads <= fillers
      encoder_tokens = m.encoder_ids[row]
      original = ids[row][visible]
      changed = encoder_tokens != original
      assert changed.sum() <= n_random
      assert np.all(tokens[visible[changed]])  # Only tokens get random ids.
      assert set(visible[changed]) <= picked
    else:
      is_mask = m.encoder_ids[row] == 4
      assert set(np.flatnonzero(is_mask)) == masked_tokens
      changed = (m.encoder_ids[row] != ids[row]) & ~is_mask
      assert set(np.flatnonzero(changed)) <= picked and changed.sum() <= n_random
      np.testing.assert_array_equal(m.encoder_ids[row][~tokens], ids[row][~tokens])
  # Without per-row counts a short document is masked far above the ratio.
  short = [r for r in range(len(ids)) if 5 <= (ids[r] >= 5).sum() <= seq_len // 4]
  share = lambda masks: np.mean([masks.selected_weights[r].sum() / (ids[r] >= 5).sum()
                                 for r in short])
  assert abs(share(m) - ratio) < 0.1 and share(fixed) >= min(2 * ratio, 1.0)


def test_per_row_short_documents_are_masked_at_the_ratio_in_expectation():
  # The release's int(0.15 * len + U[0, 1)): a 3-token document is masked once
  # in about 45% of draws, where round(0.45) would never mask it.
  ids = np.stack([random_ids(1, 32, VOCAB, seed=s, num_pad=27)[0] for s in range(64)])
  assert np.all((ids >= 5).sum(axis=1) == 3)
  picked = [draw_per_row(ids, 0.15, 0.0, 0.0, True, seed=s)[1].selected_weights.sum()
            for s in range(8)]
  share = np.sum(picked) / (8 * 64 * 3)
  assert abs(share - 0.15) < 0.03, share


def test_per_row_masks_the_ratio_of_a_batch_of_documents():
  # Rows of random document lengths: predicted tokens / tokens is the ratio.
  rng = np.random.RandomState(0)
  ids = np.stack([random_ids(1, 128, VOCAB, seed=s, num_pad=int(rng.randint(0, 120)))[0]
                  for s in range(64)])
  _, m = draw_per_row(ids, 0.15, 0.1, 0.1, True)
  share = m.selected_weights.sum() / (ids >= 5).sum()
  assert abs(share - 0.15) < 0.01, share


def test_training_masks_per_row_for_complete_doc_rows():
  from configs import pretrain
  from maelm_jax.run import config_lib, train
  config = config_lib.resolve(pretrain.get_config("objective=maelm,size=tiny"))
  assert not train.pretraining_model_config(config, 600, 4).mask_counts(64).per_row
  config.data.rows = "complete_doc"
  counts = train.pretraining_model_config(config, 600, 4).mask_counts(64)
  assert counts.per_row and counts.mask_ratio == config.model.mask_ratio

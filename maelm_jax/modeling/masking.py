"""Static-shape masking for the MLM / MAE-LM / 3ML family.

Every sequence selects exactly `num_selected` (K) positions for prediction, so every
array in the train step has a shape known at trace time and XLA compiles one program
for the whole run. The K selected positions split into three groups of fixed size:

  * `num_mask`   – become `[MASK]` (MLM) or are removed from the encoder (MAE-LM, 3ML);
  * `num_random` – replaced by a random token and left in the encoder input;
  * `num_keep`   – left unchanged in the encoder input.

Selection follows MAE for images: draw a uniform score per position, give special
tokens and padding scores above every maskable one (`_special_drop_rank`), `argsort`,
and take the first K. The remaining
positions are the visible ones. Each index set is sorted, so position lookups and
relative-position buckets see ascending positions, and everything is gathered with
`take_along_axis` (no dynamic shapes, no scatter).

A deliberate difference from the official MAE-LM release (fairseq), which masks
`int(0.15 * len + U[0, 1))` positions of each row, special tokens included: here
every row masks exactly `round(mask_ratio * (L - 2))` positions and never a special
token, so K (and the encoder's length under MAE-LM / 3ML) is the same for every row
and the step compiles once.

Rows of one document padded to L (`data.rows=complete_doc`, the release's rows)
hold m < L - 2 tokens, and K of them would mask far above the ratio (all of a
short document). With `per_row` the shapes stay K, but a row selects
`floor(mask_ratio * m + u)` of its tokens, u ~ U[0, 1) per row (the release's
`int(0.15 * len + U[0, 1))`: the ratio in expectation, short documents too),
split into the three groups in the run's proportions, and fills each group's
remaining slots with weight-0 positions: padding first, then separators, then
unselected tokens, which are then neither corrupted nor predicted. Fillers leave
the encoder under MAE-LM / 3ML (padding was invisible to it anyway), and the
model keeps them out of the decoder's attention (`slot_is_token`). A full row
selects exactly as without `per_row`, bit for bit.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from maelm_jax.core.special_tokens import CLS_ID, NUM_SPECIAL, PAD_ID


@dataclasses.dataclass(frozen=True)
class MaskCounts:
  """Per-sequence counts, fixed for the run (static shapes)."""

  seq_len: int
  num_selected: int  # K: positions the head predicts.
  num_mask: int  # selected positions that become [MASK] / leave the encoder.
  num_random: int  # selected positions replaced by a random token.
  num_keep: int  # selected positions left unchanged.
  drop_masked: bool  # MAE-LM / 3ML: [MASK] positions are removed from the encoder.
  mask_ratio: float = 0.0  # What per_row scales each row's count by.
  per_row: bool = False  # Select floor(mask_ratio * tokens in the row + u) (above).

  @property
  def encoder_len(self) -> int:
    """Length of the sequence the encoder actually runs on."""
    return self.seq_len - self.num_mask if self.drop_masked else self.seq_len

  @classmethod
  def create(cls, seq_len: int, mask_ratio: float, random_replace_prob: float,
             keep_prob: float, drop_masked: bool,
             per_row: bool = False) -> "MaskCounts":
    # A packed pretraining row is `[CLS] t_1 .. t_{L-2} [SEP]`: L-2 maskable tokens.
    maskable = seq_len - 2
    num_selected = max(1, int(round(mask_ratio * maskable)))
    num_random = int(round(num_selected * random_replace_prob))
    num_keep = int(round(num_selected * keep_prob))
    num_mask = num_selected - num_random - num_keep
    if num_mask < 0:
      raise ValueError(
          f"random_replace_prob ({random_replace_prob}) + keep_prob ({keep_prob}) "
          "exceeds 1; lower them so that some selected tokens become [MASK].")
    return cls(seq_len, num_selected, num_mask, num_random, num_keep, drop_masked,
               mask_ratio, per_row)

  def row_counts(self, num_tokens: jax.Array, key: jax.Array
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """[B] counts of ([MASK], random, keep) tokens of rows of `num_tokens` maskable
    tokens: floor(mask_ratio * num_tokens + u) selected (u uniform per row), split
    as `create` splits K (Python's rounding, from a table); a full row gets
    exactly the run's counts."""
    full = num_tokens >= self.seq_len - 2
    draw = jax.random.uniform(key, num_tokens.shape)
    selected = jnp.clip(jnp.floor(self.mask_ratio * num_tokens + draw), 0,
                        self.num_selected).astype(jnp.int32)
    # The split of every possible count, computed once in Python as `create` does.
    split = [(round(n * self.num_random / self.num_selected),
              round(n * self.num_keep / self.num_selected))
             for n in range(self.num_selected + 1)]
    split = [(r, min(k, n - r)) for n, (r, k) in enumerate(split)]
    split = [(min(n - r - k, self.num_mask), r, k) for n, (r, k) in enumerate(split)]
    masked, random, kept = (jnp.asarray([s[i] for s in split], jnp.int32)[selected]
                            for i in range(3))
    as_int = lambda x, whole: jnp.where(full, whole, x).astype(jnp.int32)
    return (as_int(masked, self.num_mask),
            as_int(random, self.num_random), as_int(kept, self.num_keep))


@dataclasses.dataclass(frozen=True)
class Masks:
  """Index sets for one batch; every array has a static shape [B, ·]."""

  selected_positions: jax.Array  # [B, K] int32, ascending: where the head predicts.
  selected_weights: jax.Array  # [B, K] f32: 1 where the selected token was maskable.
  targets: jax.Array  # [B, K] int32: the original ids at selected_positions.
  encoder_ids: jax.Array  # [B, Le] int32: what the encoder reads.
  encoder_positions: jax.Array  # [B, Le] int32: original positions of encoder_ids.
  masked_positions: jax.Array  # [B, num_mask] int32, ascending: [MASK] / removed slots.


jax.tree_util.register_dataclass(
    Masks,
    data_fields=[f.name for f in dataclasses.fields(Masks)],
    meta_fields=[])


def maskable(input_ids: jax.Array) -> jax.Array:
  """Special tokens ([PAD] [UNK] [CLS] [SEP] [MASK]) are never selected."""
  return input_ids >= NUM_SPECIAL


def _special_drop_rank(input_ids: jax.Array) -> jax.Array:
  """Scores of non-maskable positions, all above every maskable one's [0, 1).

  They matter only in a row with fewer maskable tokens than K (the corpus's last
  row, a run of tiny documents). MLM then selects a few specials with weight 0 and
  leaves them visible. MAE-LM and 3ML must still remove exactly `num_mask` slots
  (the encoder's length is static), so the order below decides what goes: padding
  first (the encoder ignores it anyway), then separators and other specials, and
  `[CLS]` never while anything else is left; `jnp.argsort` is stable, so ties go
  left to right.
  """
  return jnp.select([input_ids == PAD_ID, input_ids == CLS_ID],
                    [jnp.float32(2.0), jnp.float32(jnp.inf)], jnp.float32(3.0))


def _sorted_with(positions: jax.Array, flags: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`positions` [B, n] in ascending order, and `flags` permuted alongside."""
  index = jnp.argsort(positions, axis=-1)
  return (jnp.take_along_axis(positions, index, axis=-1),
          jnp.take_along_axis(flags, index, axis=-1))


def _per_row_order(order: jax.Array, num_tokens: jax.Array, counts: MaskCounts,
                   key: jax.Array) -> tuple[jax.Array, jax.Array]:
  """`order` rearranged for per-row counts, and which of its first K slots are real.

  `order` [B, L] lists a row's m maskable positions in random order, then its
  padding, separators and `[CLS]`. The result's slots 0..K-1 are the three groups
  ([MASK] | random | keep) of the run's static sizes; each group takes its share
  of the row's selection from the random order, and its other slots take
  fillers: padding and separators first (order[m:]), then the unselected tokens
  (order[n:m], n the row's selection); slots K.. take the fillers left. For a
  full row (n = K) the first K slots are order's own.
  """
  seq_len = order.shape[1]
  n_mask, n_random, n_keep = (x[:, None] for x in counts.row_counts(num_tokens, key))
  m, n = num_tokens[:, None], n_mask + n_random + n_keep
  k, k_mask, k_random = counts.num_selected, counts.num_mask, counts.num_random
  slot = jnp.arange(seq_len)[None, :]
  in_random = (slot >= k_mask) & (slot < k_mask + k_random)
  in_keep = (slot >= k_mask + k_random) & (slot < k)
  # Each slot's group: where its tokens start in the random order, how many it
  # has, its first slot, and how many fillers the groups before it took.
  group_start = jnp.where(in_random, n_mask, jnp.where(in_keep, n_mask + n_random, 0))
  group_tokens = jnp.where(in_random, n_random, jnp.where(in_keep, n_keep, n_mask))
  group_slot = jnp.where(in_random, k_mask, jnp.where(in_keep, k_mask + k_random, 0))
  fillers_before = jnp.where(in_random, k_mask - n_mask,
                             jnp.where(in_keep, k_mask - n_mask + k_random - n_random,
                                       0))
  offset = slot - group_slot
  is_token = (slot < k) & (offset < group_tokens)
  filler = jnp.where(slot < k, fillers_before + offset - group_tokens,
                     k - n + (slot - k))
  from_filler = jnp.where(filler < seq_len - m, m + filler, n + filler - (seq_len - m))
  source = jnp.where(is_token, group_start + offset, from_filler)
  return jnp.take_along_axis(order, source, axis=-1), is_token[:, :k]


def draw_masks(key: jax.Array, input_ids: jax.Array, counts: MaskCounts, *,
               mask_id: int, vocab_size: int) -> Masks:
  """Selects and corrupts positions; see the module docstring."""
  batch, seq_len = input_ids.shape
  if seq_len != counts.seq_len:
    raise ValueError(f"batch has length {seq_len} but masks were sized for "
                     f"{counts.seq_len}")
  score_key, token_key = jax.random.split(key)
  can_mask = maskable(input_ids)
  scores = jnp.where(can_mask, jax.random.uniform(score_key, (batch, seq_len)),
                     _special_drop_rank(input_ids))
  # The order is random among maskable positions; its first K entries are selected
  # and, in that random order, split into [MASK] / random / keep groups.
  order = jnp.argsort(scores, axis=-1, stable=True).astype(jnp.int32)
  k, k_mask, k_random = counts.num_selected, counts.num_mask, counts.num_random
  if counts.per_row:
    # Its own key: the scores and random tokens stay those of fixed counts.
    order, slot_real = _per_row_order(order, can_mask.sum(axis=-1), counts,
                                      jax.random.fold_in(score_key, 1))
  else:  # [B, K]: which selected slots hold a token (not a special or padding).
    slot_real = jnp.take_along_axis(can_mask, order[:, :k], axis=-1)
  selected_positions, selected_real = _sorted_with(order[:, :k], slot_real)
  masked_positions, masked_real = _sorted_with(order[:, :k_mask],
                                               slot_real[:, :k_mask])
  random_positions = order[:, k_mask:k_mask + k_random]

  targets = jnp.take_along_axis(input_ids, selected_positions, axis=-1)
  selected_weights = selected_real.astype(jnp.float32)

  corrupted = input_ids
  rows = jnp.arange(batch)[:, None]
  if k_random:
    random_tokens = jax.random.randint(token_key, (batch, k_random), NUM_SPECIAL,
                                       vocab_size, dtype=input_ids.dtype)
    # Only maskable slots were drawn unless the row had fewer than K of them (or
    # per_row filled the group); never overwrite a special or a filler token.
    keep_special = ~slot_real[:, k_mask:k_mask + k_random]
    original = jnp.take_along_axis(input_ids, random_positions, axis=-1)
    corrupted = corrupted.at[rows, random_positions].set(
        jnp.where(keep_special, original, random_tokens))

  if counts.drop_masked:
    encoder_positions = jnp.sort(order[:, k_mask:], axis=-1)
    encoder_ids = jnp.take_along_axis(corrupted, encoder_positions, axis=-1)
  else:
    encoder_positions = jnp.broadcast_to(
        jnp.arange(seq_len, dtype=jnp.int32), (batch, seq_len))
    is_masked = jnp.zeros((batch, seq_len), bool).at[rows, masked_positions].set(
        masked_real)
    encoder_ids = jnp.where(is_masked, mask_id, corrupted)
  return Masks(selected_positions=selected_positions,
               selected_weights=selected_weights,
               targets=targets,
               encoder_ids=encoder_ids,
               encoder_positions=encoder_positions,
               masked_positions=masked_positions)


def slot_is_token(masks: Masks) -> jax.Array:
  """[B, num_mask] bool: which masked / removed slots hold a selected token; the
  others fill a row's static count (padding, a separator) and must not be read."""
  index = jax.vmap(jnp.searchsorted)(masks.selected_positions, masks.masked_positions)
  return jnp.take_along_axis(masks.selected_weights, index, axis=-1) > 0


def selected_is_masked(masks: Masks) -> jax.Array:
  """[B, K] float 1/0: which selected slots are in the [MASK] / dropped group
  (the others were replaced by a random token or kept, and stay visible)."""
  batch, k = masks.selected_positions.shape
  if masks.masked_positions.shape[1] == k:  # Every selected slot is masked.
    return jnp.ones((batch, k), jnp.float32)
  hits = masks.selected_positions[:, :, None] == masks.masked_positions[:, None, :]
  return hits.any(axis=-1).astype(jnp.float32)


def unpermute_to_full_length(encoder_out: jax.Array, encoder_positions: jax.Array,
                             fill: jax.Array, masked_positions: jax.Array) -> jax.Array:
  """Puts encoder outputs back at their original slots and `fill` at the others.

  The MAE way: concatenate [encoder outputs ; fill rows] and gather with the inverse
  of the permutation that produced them. A gather keeps TPUs on their fast path,
  where a scatter into a zero buffer would not.

  Args:
    encoder_out: [B, Le, D] outputs at `encoder_positions`.
    encoder_positions: [B, Le] original positions, ascending.
    fill: [D] vector placed at every masked slot (the [MASK] embedding).
    masked_positions: [B, Km] the removed positions; Le + Km == L.
  Returns:
    [B, L, D].
  """
  batch, _, dim = encoder_out.shape
  num_masked = masked_positions.shape[1]
  fill_rows = jnp.broadcast_to(fill.astype(encoder_out.dtype), (batch, num_masked, dim))
  stacked = jnp.concatenate([encoder_out, fill_rows], axis=1)
  stacked_positions = jnp.concatenate([encoder_positions, masked_positions], axis=1)
  inverse = jnp.argsort(stacked_positions, axis=-1)
  return jnp.take_along_axis(stacked, inverse[..., None], axis=1)

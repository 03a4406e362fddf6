"""The plateau and the baselines a masked-LM run must beat, on held-out text.

A small masked LM first learns the unigram distribution: it predicts the most
frequent piece (`,` or `the`) at every masked slot and sits there, sometimes
for thousands of steps, before it starts to read the context. Top-1 accuracy
over all selected tokens hides that for MLM and 3ML, which also predict the
kept tokens (a copy). So every run scores its `[MASK]`ed / dropped positions
alone (`eval/mask_*`) against three context-free references, computed once at
start-up on the *same* held-out positions from tables counted on training rows:

  eval/unigram_accuracy  always predict the most frequent maskable piece;
  eval/unigram_loss      cross-entropy of the (add-one smoothed) unigram
                         distribution: the loss of the plateau;
  eval/bigram_accuracy   predict the most frequent successor of the original
                         left neighbour: a model that reads one token of
                         context, and a bar a learning run passes.

Everything here is plain numpy except `make_baseline_step`, which draws the
evaluation masks exactly as `train_lib.make_eval_step` does.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from maelm_jax.modeling import masking
from maelm_jax.core.special_tokens import NUM_SPECIAL

# A run is "past the unigram baseline" once its [MASK] accuracy is this many
# times the unigram accuracy, and "below the plateau" once its [MASK] loss is
# this far (nats) under the unigram cross-entropy.
ACCURACY_MARGIN = 1.25
LOSS_MARGIN = 0.1


@dataclasses.dataclass(frozen=True)
class NgramTables:
  """Context-free predictors counted on training rows."""

  unigram_log_probs: np.ndarray  # float32 [V]; -inf at special tokens.
  bigram_next: np.ndarray  # int32 [V]: the most frequent maskable successor of
  #   each id (the unigram argmax for ids never seen as a left neighbour).
  num_tokens: int  # maskable tokens counted.

  @property
  def unigram_argmax(self) -> int:
    return int(np.argmax(self.unigram_log_probs))


def count_ngrams(rows, vocab_size: int, max_tokens: int) -> NgramTables:
  """Unigram and left-neighbour bigram tables from packed rows.

  Args:
    rows: an iterable of int arrays [B, L] (`[CLS] ... [SEP]` rows).
    vocab_size: V.
    max_tokens: stop after about this many maskable tokens.
  Only maskable tokens (id >= NUM_SPECIAL, the ones ever predicted) are counted
  as unigrams and as the right side of a pair; the left side may be anything
  ([CLS] included), as it is in the rows the model sees.
  """
  unigram = np.zeros(vocab_size, np.int64)
  pair_codes = []
  counted = 0
  for batch in rows:
    batch = np.asarray(batch, np.int64)
    right = batch[:, 1:]
    left = batch[:, :-1]
    target = right >= NUM_SPECIAL
    unigram += np.bincount(right[target], minlength=vocab_size)[:vocab_size]
    pair_codes.append(left[target] * vocab_size + right[target])
    counted += int(target.sum())
    if counted >= max_tokens:
      break
  if counted == 0:
    raise ValueError("no maskable tokens to count the baselines on; the training "
                     "split is empty or holds only special tokens")
  smoothed = unigram[NUM_SPECIAL:] + 1.0
  log_probs = np.full(vocab_size, -np.inf, np.float64)
  log_probs[NUM_SPECIAL:] = np.log(smoothed / smoothed.sum())

  codes, counts = np.unique(np.concatenate(pair_codes), return_counts=True)
  lefts, rights = codes // vocab_size, codes % vocab_size
  # Per left id, the right id of the largest count; ties go to the smaller id.
  order = np.lexsort((rights, -counts, lefts))
  first = np.ones(len(order), bool)
  first[1:] = lefts[order][1:] != lefts[order][:-1]
  bigram_next = np.full(vocab_size, int(np.argmax(log_probs)), np.int32)
  bigram_next[lefts[order][first]] = rights[order][first]
  return NgramTables(log_probs.astype(np.float32), bigram_next, counted)


def make_baseline_step(model_cfg):
  """baseline_step(batch, eval_rng, batch_index, log_probs, bigram_next) -> sums
  of the three baselines over the held-out `[MASK]` positions that
  `train_lib.make_eval_step` scores for the same batch index."""
  from maelm_jax.run import train_lib  # pylint: disable=g-import-not-at-top

  def baseline_step(batch, eval_rng, batch_index, log_probs, bigram_next):
    ids = batch["input_ids"]
    masks = train_lib.draw_eval_masks(model_cfg, ids, eval_rng, batch_index)
    weights = masks.selected_weights * masking.selected_is_masked(masks)
    targets = masks.targets
    left = jnp.take_along_axis(ids, jnp.maximum(masks.selected_positions - 1, 0),
                               axis=1)
    unigram_nll = -jnp.where(weights > 0, log_probs[targets], 0.0)
    return {
        "unigram_loss_sum": (unigram_nll * weights).sum(),
        "unigram_correct": ((targets == jnp.argmax(log_probs)) * weights).sum(),
        "bigram_correct": ((bigram_next[left] == targets) * weights).sum(),
        "mask_weight": weights.sum(),
    }

  return baseline_step


def baseline_metrics(totals: dict) -> dict[str, float]:
  weight = max(totals["mask_weight"], 1.0)
  return {"eval/unigram_accuracy": totals["unigram_correct"] / weight,
          "eval/unigram_loss": totals["unigram_loss_sum"] / weight,
          "eval/bigram_accuracy": totals["bigram_correct"] / weight}


def plateau_status(metrics: dict) -> str:
  """One plain sentence on where a run stands against the baselines."""
  acc, loss = metrics["eval/mask_accuracy"], metrics["eval/mask_loss"]
  uni_acc, uni_loss = metrics["eval/unigram_accuracy"], metrics["eval/unigram_loss"]
  bigram = metrics["eval/bigram_accuracy"]
  numbers = (f"[MASK] accuracy {acc:.1%} (unigram {uni_acc:.1%}, bigram "
             f"{bigram:.1%}), loss {loss:.3f} (unigram {uni_loss:.3f})")
  if acc > bigram and acc >= ACCURACY_MARGIN * uni_acc:
    verdict = "learned: above the bigram baseline"
  elif acc >= ACCURACY_MARGIN * uni_acc:
    verdict = "left the plateau: above unigram, below bigram accuracy"
  elif loss <= uni_loss - LOSS_MARGIN:
    verdict = ("leaving the plateau: loss below the unigram cross-entropy, "
               "accuracy still at unigram")
  else:
    verdict = ("ON THE UNIGRAM PLATEAU: it predicts the most frequent pieces "
               "whatever the context")
  return f"{verdict}; {numbers}"

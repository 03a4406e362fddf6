"""The official GLUE metrics, in numpy.

They match scikit-learn (accuracy_score, f1_score, matthews_corrcoef) and scipy
(pearsonr, spearmanr), which the GLUE evaluation uses, without depending on
either. Values are fractions (0.83, not 83).

Degenerate inputs: a correlation with a constant vector is undefined; it is
reported as 0.0 (sklearn's choice for Matthews), so a model that collapsed to one
output reads as uninformative rather than turning the results into NaN.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def accuracy(predictions, labels) -> float:
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  _check_same_length(predictions, labels)
  return float(np.mean(predictions == labels)) if len(labels) else 0.0


def f1_score(predictions, labels, positive: int = 1) -> float:
  """F1 of the positive class (MRPC: paraphrase, QQP: duplicate)."""
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  _check_same_length(predictions, labels)
  true_pos = np.sum((predictions == positive) & (labels == positive))
  false_pos = np.sum((predictions == positive) & (labels != positive))
  false_neg = np.sum((predictions != positive) & (labels == positive))
  denominator = 2 * true_pos + false_pos + false_neg
  return float(2 * true_pos / denominator) if denominator else 0.0


def matthews_corrcoef(predictions, labels) -> float:
  """Matthews correlation (CoLA), multi-class form (Gorodkin 2004) as sklearn."""
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  _check_same_length(predictions, labels)
  classes, encoded = np.unique(np.concatenate([labels, predictions]),
                               return_inverse=True)
  true_ids, pred_ids = encoded[:len(labels)], encoded[len(labels):]
  confusion = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(confusion, (true_ids, pred_ids), 1)
  true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
  correct, total = np.trace(confusion), confusion.sum()
  numerator = correct * total - true_counts @ pred_counts
  denominator = np.sqrt((total**2 - pred_counts @ pred_counts) *
                        (total**2 - true_counts @ true_counts))
  return float(numerator / denominator) if denominator else 0.0


def pearson_corrcoef(x, y) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  _check_same_length(x, y)
  dx, dy = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
  return float(np.sum(dx * dy) / denominator) if denominator else 0.0


def rankdata(x) -> np.ndarray:
  """Ranks 1..n, ties sharing the mean of their ranks (scipy's 'average')."""
  x = np.asarray(x)
  order = np.argsort(x, kind="mergesort")
  sorted_x = x[order]
  # Each run of equal values gets the mean of the ranks it spans.
  run_starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
  run_ends = np.r_[run_starts[1:], len(x)]
  mean_rank = (run_starts + 1 + run_ends) / 2.0
  ranks = np.empty(len(x), np.float64)
  ranks[order] = np.repeat(mean_rank, run_ends - run_starts)
  return ranks


def spearman_corrcoef(x, y) -> float:
  """Pearson correlation of the tie-averaged ranks (STS-B)."""
  _check_same_length(np.asarray(x), np.asarray(y))
  return pearson_corrcoef(rankdata(x), rankdata(y))


def _check_same_length(a: np.ndarray, b: np.ndarray) -> None:
  if a.shape != b.shape or a.ndim != 1:
    raise ValueError(f"predictions {a.shape} and labels {b.shape} must be 1-D "
                     "and of the same length")


METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "accuracy": accuracy,
    "f1": f1_score,
    "matthews_corr": matthews_corrcoef,
    "pearson": pearson_corrcoef,
    "spearman": spearman_corrcoef,
}


def compute(names, predictions, labels) -> dict[str, float]:
  """{name: METRICS[name](predictions, labels)} for each of `names`."""
  return {name: METRICS[name](predictions, labels) for name in names}

"""The official SQuAD metrics (evaluate-v1.1.py and evaluate-v2.0.py), reimplemented.

Answers are compared after the official normalisation (lower case, punctuation
and the articles a/an/the removed, whitespace collapsed). A question scores the
maximum over its gold answers of exact match and of token-level F1; the totals
are percentages (the official scripts' scale, 0-100).

v2.0 adds unanswerable questions (no gold answers): the right prediction is the
empty string, and scores are also split into HasAns_* and NoAns_*. Whether to
answer is decided by a threshold on the model's no-answer score (the "na_prob"
of the official script); `best_thresholds` finds the threshold that maximises
EM and F1 on the dev set, exactly as the official script does.

The two versions differ in two details, both kept: v1.1 scores an empty
prediction against an empty gold answer as F1 0 (v2.0: 1), and v2.0 drops gold
answers that normalise to nothing.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Sequence

VERSIONS = ("1.1", "2.0")
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
  """Lower text and remove punctuation, articles and extra whitespace."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
  return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str, version: str = "2.0") -> float:
  pred_tokens = normalize_answer(prediction).split()
  gold_tokens = normalize_answer(gold).split()
  if version == "2.0" and (not pred_tokens or not gold_tokens):
    # An unanswerable question is right (1) only when both are empty.
    return float(pred_tokens == gold_tokens)
  common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision = num_same / len(pred_tokens)
  recall = num_same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def gold_texts(answers: Sequence[str], version: str) -> list[str]:
  """The answers a prediction is compared with; [''] for unanswerable (v2.0)."""
  if version == "1.1":
    return list(answers) or [""]
  texts = [a for a in answers if normalize_answer(a)]
  return texts or [""]


def question_scores(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                    version: str) -> tuple[dict[str, float], dict[str, float]]:
  """Per question id: (exact match, F1), each the max over its gold answers.

  A question without a prediction scores 0 (the v1.1 script's rule).
  """
  if version not in VERSIONS:
    raise ValueError(f"SQuAD version {version!r}: use one of {VERSIONS}")
  exact, f1_scores = {}, {}
  for qid, answers in gold.items():
    prediction = predictions.get(qid)
    if prediction is None:
      exact[qid] = f1_scores[qid] = 0.0
      continue
    texts = gold_texts(answers, version)
    exact[qid] = max(exact_match(prediction, a) for a in texts)
    f1_scores[qid] = max(f1(prediction, a, version) for a in texts)
  return exact, f1_scores


def _mean_percent(scores: Mapping[str, float], qids: Sequence[str]) -> float:
  return 100.0 * sum(scores[q] for q in qids) / len(qids) if qids else 0.0


def evaluate(gold: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
             version: str) -> dict[str, float]:
  """`exact_match` and `f1` over all questions (percent); for v2.0 also the
  official HasAns_/NoAns_ exact, f1 and total.

  Args:
    gold: question id -> gold answer texts ([] for an unanswerable question).
    predictions: question id -> predicted text ('' = no answer).
    version: "1.1" or "2.0".
  """
  exact, f1_scores = question_scores(gold, predictions, version)
  qids = list(gold)
  out = {"exact_match": _mean_percent(exact, qids),
         "f1": _mean_percent(f1_scores, qids), "total": len(qids)}
  missing = sum(1 for q in qids if q not in predictions)
  if missing:
    out["missing_predictions"] = missing
  if version == "2.0":
    has_ans = [q for q in qids if gold[q]]
    no_ans = [q for q in qids if not gold[q]]
    for name, subset in (("HasAns", has_ans), ("NoAns", no_ans)):
      if subset:
        out[f"{name}_exact"] = _mean_percent(exact, subset)
        out[f"{name}_f1"] = _mean_percent(f1_scores, subset)
        out[f"{name}_total"] = len(subset)
  return out


def _best_threshold(answer_scores: Mapping[str, float], no_answer_score: Mapping[str, float],
                    has_answer: Mapping[str, bool], answered: Mapping[str, bool]):
  """The official `find_best_thresh`: sweep the threshold up through the sorted
  no-answer scores, starting from "abstain everywhere"."""
  score = best = sum(1 for q in answer_scores if not has_answer[q])
  best_threshold = 0.0
  for qid in sorted(answer_scores, key=lambda q: no_answer_score[q]):
    if has_answer[qid]:
      score += answer_scores[qid]
    elif answered[qid]:
      score -= 1
    if score > best:
      best, best_threshold = score, no_answer_score[qid]
  return 100.0 * best / len(answer_scores), best_threshold


def best_thresholds(gold: Mapping[str, Sequence[str]], answers: Mapping[str, str],
                    no_answer_scores: Mapping[str, float]) -> dict[str, float]:
  """`best_exact`, `best_exact_thresh`, `best_f1`, `best_f1_thresh` (v2.0).

  Args:
    gold: question id -> gold answer texts ([] = unanswerable).
    answers: the model's best non-null answer for every question.
    no_answer_scores: how much the model prefers no answer (null score minus the
      best span's score); a question is left unanswered when its score exceeds
      the threshold.
  """
  exact, f1_scores = question_scores(gold, answers, "2.0")
  has_answer = {q: bool(gold[q]) for q in gold}
  answered = {q: bool(answers.get(q)) for q in gold}
  best_exact, exact_thresh = _best_threshold(exact, no_answer_scores, has_answer,
                                             answered)
  best_f1, f1_thresh = _best_threshold(f1_scores, no_answer_scores, has_answer,
                                       answered)
  return {"best_exact": best_exact, "best_exact_thresh": exact_thresh,
          "best_f1": best_f1, "best_f1_thresh": f1_thresh}

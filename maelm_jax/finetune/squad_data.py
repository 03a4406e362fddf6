"""SQuAD v1.1/v2.0: reading, sliding-window features and span decoding.

Reading: the official JSON files (`train-v1.1.json`, `dev-v2.0.json`, ...) or tfds
`squad/v1.1` / `squad/v2.0` (ArrayRecord, read with `tfds.data_source`).

Character alignment. A Hugging Face tokenizer.json gives each token's characters
(`tokenizers` offsets) on the whole context, as pretraining tokenized its text;
the spaces a byte-level BPE piece carries ("Ġword") are trimmed off its span.
SentencePiece has no offsets API, so the context is split
into whitespace-separated words (as BERT's run_squad does), each word is
tokenized on its own (SentencePiece never merges across whitespace, so this is
the same segmentation as tokenizing the whole context), and each token gets the
character span of its piece inside the word; an [UNK] piece spans the characters
between its neighbours. When the pieces do not spell the word (normalisation
changed a character, e.g. "½" -> "1⁄2"), every token of that word gets the whole
word's span: answers then snap to word boundaries, the original BERT behaviour. Predicted spans are cut from the original context text, so the
answer keeps its original spelling, case and punctuation.

Features. Each question becomes one or more windows
`[CLS] question [SEP] context[window] [SEP] [PAD]...` of `max_seq_len` tokens;
windows start every `doc_stride` context tokens. A context token seen by several
windows belongs to the one where it has the most context on both sides
(`is_max_context`), and only there may an answer start. Training targets are the
answer's first and last token in the window, or [CLS] (position 0) when the
window does not contain the whole answer or the question has none (v2.0).

Decoding. Per window, the `n_best` highest start and end logits over context
tokens are paired; pairs with end >= start and length <= `max_answer_len` are
scored start + end logit, and the best over all windows of a question is its
answer. The no-answer score is the [CLS] start + end logit (the smallest over the
windows); v2.0 answers "" when it beats the best span by more than
`null_score_diff_threshold`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Sequence

from absl import logging
import numpy as np

from maelm_jax.data import sources


@dataclasses.dataclass(frozen=True)
class SquadExample:
  qid: str
  question: str
  context: str
  answers: tuple[str, ...]  # All gold answers; () when unanswerable (v2.0).
  answer_starts: tuple[int, ...]  # Character offsets of `answers` in `context`.
  is_impossible: bool = False
  title: str = ""


def read_squad_json(path: str) -> list[SquadExample]:
  """Questions of an official SQuAD JSON file, in file order."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"SQuAD file {path!r} not found; pass the official "
                            "JSON (e.g. dev-v1.1.json) via --config.data.eval_file "
                            "/ --config.data.train_file")
  try:
    with open(path, encoding="utf-8") as f:
      dataset = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise ValueError(f"{path} is not a UTF-8 JSON file ({error}); pass the "
                     "official SQuAD JSON") from None
  if not isinstance(dataset, dict) or "data" not in dataset:
    raise ValueError(f"{path} is not a SQuAD file: expected a JSON object with a "
                     "'data' list of articles (the official format)")
  examples = []
  where = "data"
  try:
    for a, article in enumerate(dataset["data"]):
      where = f"data[{a}]"
      for p, paragraph in enumerate(article["paragraphs"]):
        where = f"data[{a}].paragraphs[{p}]"
        context = paragraph["context"]
        for q, qa in enumerate(paragraph["qas"]):
          where = f"data[{a}].paragraphs[{p}].qas[{q}]"
          answers = qa.get("answers", [])
          examples.append(SquadExample(
              qid=str(qa["id"]), question=qa["question"], context=context,
              answers=tuple(x["text"] for x in answers),
              answer_starts=tuple(int(x["answer_start"]) for x in answers),
              is_impossible=bool(qa.get("is_impossible", False)),
              title=article.get("title", "")))
  except (KeyError, TypeError) as error:
    raise ValueError(
        f"{path}: {where} (after {len(examples)} questions) lacks the field "
        f"{error} of the official SQuAD format (data[].paragraphs[].context, "
        ".qas[].id/question/answers[].text/answer_start)") from None
  return examples


def read_squad_tfds(version: str, split: str, *,
                    data_dir: str | None = None) -> list[SquadExample]:
  """tfds `squad/v<version>` split "train" or "validation"."""
  _text = sources.tfds_text
  examples = []
  for r in sources.tfds_records(f"squad/v{version}", split, data_dir):
    answers = r["answers"]
    examples.append(SquadExample(
        qid=_text(r["id"]), question=_text(r["question"]), context=_text(r["context"]),
        answers=tuple(_text(t) for t in answers["text"]),
        answer_starts=tuple(int(s) for s in answers["answer_start"]),
        is_impossible=bool(r.get("is_impossible", False)), title=_text(r.get("title", ""))))
  return examples


def gold_answers(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
  """Question id -> gold answer texts, the input of `squad_metrics.evaluate`."""
  return {e.qid: [] if e.is_impossible else list(e.answers) for e in examples}


# --------------------------------------------------------------------------
# Context tokens with character spans.


@dataclasses.dataclass(frozen=True)
class ContextTokens:
  ids: np.ndarray  # int32 [T]
  char_spans: np.ndarray  # int32 [T, 2]: [start, end) of each token in the context.


class _PieceTable:
  """The text of every vocabulary piece, looked up once per tokenizer."""

  def __init__(self, tokenizer):
    self.texts = ([] if hasattr(tokenizer, "encode_with_offsets") else
                  [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)])


_WORD = re.compile(r"\S+")
_WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁".


def piece_offsets(word: str, texts: Sequence[str], is_unknown: Sequence[bool]
                  ) -> list[tuple[int, int]] | None:
  """[start, end) of each piece inside `word`, or None when they do not spell it.

  `texts` are the pieces' strings without the leading "▁". An [UNK] piece covers
  the characters between its neighbours; a bare "▁" piece (empty text) stands for
  the piece after it.
  """
  spans: list[list[int] | None] = []
  position = 0
  for text, unknown in zip(texts, is_unknown):
    if unknown:
      spans.append(None)
      continue
    after_unknown = bool(spans) and spans[-1] is None
    found = word.find(text, position + after_unknown) if after_unknown else (
        position if word.startswith(text, position) else -1)
    if found < 0:
      return None
    spans.append([found, found + len(text)])
    position = found + len(text)
  if position != len(word) and not (spans and spans[-1] is None):
    return None
  # [UNK] pieces take the gap up to the next known piece (or the word's end).
  for i, span in enumerate(spans):
    if span is None:
      begin = spans[i - 1][1] if i else 0
      following = [sp for sp in spans[i + 1:] if sp is not None]
      spans[i] = [begin, following[0][0] if following else len(word)]
      if spans[i][0] >= spans[i][1]:
        return None  # An [UNK] with nothing left to stand for.
  for i in range(len(spans) - 2, -1, -1):
    if spans[i][0] == spans[i][1]:
      spans[i] = list(spans[i + 1])
  if spans and spans[-1][0] == spans[-1][1]:
    return None
  return [tuple(span) for span in spans]


def tokenize_context(context: str, tokenizer, pieces: _PieceTable | None = None
                     ) -> ContextTokens:
  """Token ids of `context` and the character span of each token."""
  if hasattr(tokenizer, "encode_with_offsets"):  # A Hugging Face tokenizer.json.
    return _tokenize_with_offsets(context, tokenizer)
  pieces = pieces or _PieceTable(tokenizer)
  words = [(m.start(), m.end()) for m in _WORD.finditer(context)]
  word_ids = tokenizer.encode([context[s:e] for s, e in words]) if words else []
  ids, spans = [], []
  for (word_start, word_end), token_ids in zip(words, word_ids):
    texts = [pieces.texts[t] for t in token_ids]
    if texts:
      texts[0] = texts[0].removeprefix(_WORD_BOUNDARY)
    offsets = piece_offsets(context[word_start:word_end], texts,
                            [t == tokenizer.unk_id for t in token_ids])
    if offsets is None:  # Normalisation changed the text: word granularity.
      offsets = [(0, word_end - word_start)] * len(token_ids)
    ids.extend(token_ids)
    spans.extend((word_start + a, word_start + b) for a, b in offsets)
  return ContextTokens(np.asarray(ids, np.int32).reshape(-1),
                       np.asarray(spans, np.int32).reshape(-1, 2))


def _tokenize_with_offsets(context: str, tokenizer) -> ContextTokens:
  ids, offsets = tokenizer.encode_with_offsets(context)
  spans = []
  for start, end in offsets:
    while start < end and context[start].isspace():
      start += 1
    while end > start and context[end - 1].isspace():
      end -= 1
    spans.append((start, end))  # A piece of only spaces: empty, overlaps nothing.
  return ContextTokens(np.asarray(ids, np.int32).reshape(-1),
                       np.asarray(spans, np.int32).reshape(-1, 2))


def locate_answer(context: str, text: str, start: int) -> tuple[int, int] | None:
  """[start, end) of `text` in `context`, trusting `start` when it matches and
  otherwise taking the occurrence nearest to it (a few annotations are off)."""
  if not text:
    return None
  if context[start:start + len(text)] == text:
    return start, start + len(text)
  occurrences = [m.start() for m in re.finditer(re.escape(text), context)]
  if not occurrences:
    return None
  nearest = min(occurrences, key=lambda o: abs(o - start))
  return nearest, nearest + len(text)


def answer_token_span(tokens: ContextTokens, char_start: int,
                      char_end: int) -> tuple[int, int] | None:
  """First and last context token overlapping characters [char_start, char_end)."""
  starts, ends = tokens.char_spans[:, 0], tokens.char_spans[:, 1]
  overlapping = np.flatnonzero((ends > char_start) & (starts < char_end))
  if not len(overlapping):
    return None
  return int(overlapping[0]), int(overlapping[-1])


# --------------------------------------------------------------------------
# Sliding-window features.


@dataclasses.dataclass
class SquadFeatures:
  """Model inputs and the bookkeeping that maps windows back to examples."""

  input_ids: np.ndarray  # int32 [F, L]
  start_positions: np.ndarray  # int32 [F]; 0 ([CLS]) = no answer in this window.
  end_positions: np.ndarray  # int32 [F]
  example_index: np.ndarray  # int32 [F]: which example a window belongs to.
  context_token_index: np.ndarray  # int32 [F, L]: context token or -1.
  is_max_context: np.ndarray  # bool [F, L]
  contexts: list[ContextTokens]  # Per example (shared by a paragraph's questions).

  def __len__(self) -> int:
    return len(self.input_ids)


def window_starts(num_tokens: int, window: int, stride: int) -> list[int]:
  """Start offsets of windows of `window` tokens every `stride` tokens; the last
  window reaches the end of the context."""
  starts = [0]
  while starts[-1] + window < num_tokens:
    starts.append(starts[-1] + min(window, stride))
  return starts


def max_context_mask(starts: Sequence[int], window: int, num_tokens: int) -> np.ndarray:
  """bool [num_windows, num_tokens]: the window where each token has the most
  context, scored min(left, right) + 0.01 * window length (BERT's rule)."""
  scores = np.full((len(starts), num_tokens), -np.inf)
  positions = np.arange(num_tokens)
  for w, start in enumerate(starts):
    end = min(start + window, num_tokens)
    inside = (positions >= start) & (positions < end)
    left, right = positions - start, end - 1 - positions
    scores[w] = np.where(inside, np.minimum(left, right) + 0.01 * (end - start), -np.inf)
  mask = np.zeros_like(scores, bool)
  if num_tokens:
    mask[np.argmax(scores, axis=0), positions] = True
  return mask


def make_features(examples: Sequence[SquadExample], tokenizer, *, max_seq_len: int,
                  doc_stride: int, max_query_len: int,
                  training: bool) -> SquadFeatures:
  """Windows of every example; with `training`, start/end targets too.

  Training examples whose answer cannot be found in the context are skipped
  (and counted in the log); evaluation keeps every question.
  """
  pieces = _PieceTable(tokenizer)
  cache: dict[str, ContextTokens] = {}
  questions = tokenizer.encode([e.question for e in examples])
  cls, sep, pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id

  rows, targets, owners, ctx_index, max_ctx, contexts = [], [], [], [], [], []
  unanswerable_skipped = 0
  for example, question_ids in zip(examples, questions):
    if example.context not in cache:
      cache[example.context] = tokenize_context(example.context, tokenizer, pieces)
    tokens = cache[example.context]
    answer = None
    if training and not example.is_impossible:
      located = (locate_answer(example.context, example.answers[0],
                               example.answer_starts[0]) if example.answers else None)
      answer = located and answer_token_span(tokens, *located)
      if answer is None:
        unanswerable_skipped += 1
        continue
    example_index = len(contexts)
    contexts.append(tokens)

    question_ids = question_ids[:max_query_len]
    offset = len(question_ids) + 2  # Feature position of the first context token.
    window = max_seq_len - len(question_ids) - 3
    starts = window_starts(len(tokens.ids), window, doc_stride)
    best = max_context_mask(starts, window, len(tokens.ids))
    for w, start in enumerate(starts):
      end = min(start + window, len(tokens.ids))
      ids = np.full(max_seq_len, pad, np.int32)
      ids[:offset + end - start + 1] = ([cls] + question_ids + [sep] +
                                        tokens.ids[start:end].tolist() + [sep])
      index = np.full(max_seq_len, -1, np.int32)
      index[offset:offset + end - start] = np.arange(start, end)
      is_max = np.zeros(max_seq_len, bool)
      is_max[offset:offset + end - start] = best[w, start:end]
      target = (0, 0)
      if answer is not None and start <= answer[0] and answer[1] < end:
        target = (answer[0] - start + offset, answer[1] - start + offset)
      rows.append(ids)
      targets.append(target)
      owners.append(example_index)
      ctx_index.append(index)
      max_ctx.append(is_max)
  if unanswerable_skipped:
    logging.warning("skipped %d of %d training questions whose answer text is not "
                    "in the context", unanswerable_skipped, len(examples))
  targets = np.asarray(targets, np.int32).reshape(-1, 2)
  return SquadFeatures(
      input_ids=np.asarray(rows, np.int32).reshape(-1, max_seq_len),
      start_positions=targets[:, 0], end_positions=targets[:, 1],
      example_index=np.asarray(owners, np.int32),
      context_token_index=np.asarray(ctx_index, np.int32).reshape(-1, max_seq_len),
      is_max_context=np.asarray(max_ctx, bool).reshape(-1, max_seq_len),
      contexts=contexts)


# --------------------------------------------------------------------------
# Decoding.


@dataclasses.dataclass
class DecodedAnswers:
  best_text: dict[str, str]  # The best non-empty span of every question.
  no_answer_score: dict[str, float]  # Null score minus the best span's score.
  best_score: dict[str, float]


def best_spans_per_window(start_logits: np.ndarray, end_logits: np.ndarray,
                          features: SquadFeatures, n_best: int,
                          max_answer_len: int):
  """Best valid (score, start, end) of each window, vectorised over windows.

  Returns float [F] scores (-inf when a window has no valid span) and int [F]
  start and end feature positions.
  """
  is_context = features.context_token_index >= 0
  starts = np.where(is_context & features.is_max_context, start_logits, -np.inf)
  ends = np.where(is_context, end_logits, -np.inf)
  k = min(n_best, starts.shape[1])
  top_starts = np.argsort(-starts, axis=1, kind="stable")[:, :k]  # [F, k]
  top_ends = np.argsort(-ends, axis=1, kind="stable")[:, :k]
  scores = (np.take_along_axis(starts, top_starts, 1)[:, :, None] +
            np.take_along_axis(ends, top_ends, 1)[:, None, :])  # [F, k, k]
  length = top_ends[:, None, :] - top_starts[:, :, None] + 1
  valid = (length >= 1) & (length <= max_answer_len) & np.isfinite(scores)
  scores = np.where(valid, scores, -np.inf).reshape(len(scores), -1)
  best = np.argmax(scores, axis=1)
  rows = np.arange(len(scores))
  return (scores[rows, best], top_starts[rows, best // k], top_ends[rows, best % k])


def decode(examples: Sequence[SquadExample], features: SquadFeatures,
           start_logits: np.ndarray, end_logits: np.ndarray, *, n_best: int = 20,
           max_answer_len: int = 30) -> DecodedAnswers:
  """The best span of every example (see the module docstring)."""
  if len(start_logits) != len(features):
    raise ValueError(f"{len(start_logits)} logit rows for {len(features)} features")
  start_logits = np.asarray(start_logits, np.float32)
  end_logits = np.asarray(end_logits, np.float32)
  window_score, window_start, window_end = best_spans_per_window(
      start_logits, end_logits, features, n_best, max_answer_len)
  null_scores = start_logits[:, 0] + end_logits[:, 0]

  best_score = np.full(len(examples), -np.inf)
  best_window = np.full(len(examples), -1)
  null_score = np.full(len(examples), np.inf)
  for f, owner in enumerate(features.example_index):
    if window_score[f] > best_score[owner]:
      best_score[owner], best_window[owner] = window_score[f], f
    null_score[owner] = min(null_score[owner], null_scores[f])

  out = DecodedAnswers({}, {}, {})
  for i, example in enumerate(examples):
    f = best_window[i]
    text = ""
    if f >= 0:
      first = features.context_token_index[f, window_start[f]]
      last = features.context_token_index[f, window_end[f]]
      spans = features.contexts[i].char_spans
      text = example.context[spans[first, 0]:spans[last, 1]]
    out.best_text[example.qid] = text
    out.best_score[example.qid] = float(best_score[i])
    out.no_answer_score[example.qid] = float(null_score[i] - best_score[i])
  return out


def final_predictions(decoded: DecodedAnswers, version: str,
                      null_score_diff_threshold: float = 0.0) -> dict[str, str]:
  """Question id -> answer text; for v2.0 "" where no answer is preferred."""
  if version == "1.1":
    return dict(decoded.best_text)
  return {qid: "" if decoded.no_answer_score[qid] > null_score_diff_threshold else text
          for qid, text in decoded.best_text.items()}

"""What a run is about to train on, in a few numbers, before it spends compute.

Duplicated text (scraped boilerplate, repeated headers, the same document
twice) is a known cause of runs that never leave the unigram plateau, and a
tokenizer that splits words into many pieces makes every masked slot harder.
`report` reads a sample of documents spread over the split and returns the
documents, characters, words and tokens (estimated for the whole split), the
pieces per word, and the share of duplicated documents and lines;
`train.train_and_evaluate` logs it and writes `corpus_report.json`.
"""

from __future__ import annotations

import hashlib

import numpy as np

from maelm_jax.data import sources

# Documents and lines shorter than this are too generic ("Note:", "CHAPTER I.",
# "* * *") to count as duplicated text.
MIN_LINE_CHARS = 32
DUPLICATE_WARNING = 0.1


def _key(text: str) -> bytes:
  return hashlib.blake2b(" ".join(text.split()).lower().encode(), digest_size=12
                         ).digest()


def report(source, tokenizer, max_documents: int = 20_000,
           max_chars: int = 20_000_000) -> dict:
  """Statistics of `source` (a `sources.DocumentSource`) from a seeded random
  sample of up to `max_documents` documents taken at even strides across it,
  read until `max_chars` characters (long-document corpora such as Wikipedia
  would otherwise spend most of a run's start-up here)."""
  num_docs = len(source)
  if num_docs == 0:
    raise ValueError(f"{source!r} has no documents")
  indices = np.unique(np.linspace(0, num_docs - 1,
                                  num=min(num_docs, max_documents)).astype(np.int64))
  token_ids = getattr(source, "token_ids_tokenizer", None)  # Prepared as ids.
  texts, tokens, chars = [], 0, 0
  for index in np.random.RandomState(0).permutation(indices):
    if chars >= max_chars:
      break
    document = source[int(index)]
    if token_ids:
      tokens += len(document)
      document = tokenizer.decode(document)  # Words and lines.
    texts.append(document)
    chars += len(document)
  if not token_ids:
    tokens = sum(len(ids) for ids in tokenizer.encode(texts))
  words = sum(len(t.split()) for t in texts)
  seen_docs, duplicate_docs = set(), 0
  seen_lines, lines, duplicate_lines = set(), 0, 0
  for text in texts:
    if len(text.strip()) >= MIN_LINE_CHARS:  # "Note:" twice is no duplication.
      key = _key(text)
      duplicate_docs += key in seen_docs
      seen_docs.add(key)
    for line in sources.text_lines(text):
      if len(line.strip()) < MIN_LINE_CHARS:
        continue
      lines += 1
      key = _key(line)
      duplicate_lines += key in seen_lines
      seen_lines.add(key)
  scale = num_docs / len(texts)
  return {
      "documents": num_docs,
      "documents_sampled": len(texts),
      "characters": int(chars * scale),
      "words": int(words * scale),
      "tokens": int(tokens * scale),
      "pieces_per_word": tokens / max(words, 1),
      "duplicate_document_share": duplicate_docs / len(texts),
      "duplicate_line_share": duplicate_lines / max(lines, 1),
      "empty_document_share": sum(not t.strip() for t in texts) / len(texts),
  }


def describe(stats: dict, split: str) -> list[str]:
  """Log lines for `stats`; the last ones are warnings when something looks off."""
  estimated = "" if stats["documents_sampled"] == stats["documents"] else (
      f" (estimated from {stats['documents_sampled']:,} documents)")
  out = [f"corpus ({split}): {stats['documents']:,} documents, "
         f"{stats['words']:,} words, {stats['tokens']:,} tokens{estimated}; "
         f"{stats['pieces_per_word']:.2f} pieces per word; duplicated: "
         f"{stats['duplicate_document_share']:.1%} of documents, "
         f"{stats['duplicate_line_share']:.1%} of lines"]
  if max(stats["duplicate_document_share"],
         stats["duplicate_line_share"]) > DUPLICATE_WARNING:
    out.append("WARNING: over 10% of the text is duplicated; deduplicate the corpus "
               "(repeated text is a known cause of runs stuck on the unigram plateau)")
  if stats["pieces_per_word"] > 2.0:
    out.append(f"WARNING: {stats['pieces_per_word']:.1f} pieces per word; the "
               "tokenizer splits words finely (raise tokenizer.vocab_size or train "
               "it on this corpus)")
  return out

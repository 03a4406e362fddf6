r"""Linear probe of frozen encoders on SST-2: ridge regression on the `[CLS]`
vector and on the mean of the token vectors, trained on the first `--train`
sentences of SST-2 train, scored on all of dev. Tells whether pretrained
representations carry more of the task than random ones, without fine-tuning.
Also prints the geometry of the input embeddings (mean pairwise cosine of
frequent and of rare pieces), where tied output embeddings show collapse, and
probes the word vectors alone: the average of a sentence's input embeddings (and
of the LM head's own output embeddings when untied).

`--corpus_baseline=GLOB` adds a bag-of-pieces ridge classifier on the same
training sentences (what fine-tuning can learn with no pretrained knowledge at
all), and what the pretraining text itself offers word vectors: 128-dimensional
PPMI-SVD vectors (Levy & Goldberg 2014: positive PMI of pieces within 5 of each
other, weighted 1/distance, context counts smoothed ^0.75, truncated SVD) counted
on those files with the first workdir's tokenizer, next to random vectors of the
same size.

  python studies/linear_probe.py --data=<data> runs/helps/pretrain_maelm \
      runs/helps/random_init_maelm
  python studies/linear_probe.py --data=<data> W \
      --corpus_baseline='<data>/corpus/gutenberg/*.txt.xz'

`--data` is the folder of the downloaded data: SST-2 in `<data>/glue/SST-2`.
"""

import argparse
import csv
import dataclasses
import glob
import lzma
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from maelm_jax.run import pretrained as pretrained_lib  # noqa: E402
from maelm_jax.modeling import model as model_lib  # noqa: E402

MISSING_DATA = ("--data is required: the folder of the downloaded data "
                "(glue/SST-2)")


def read(path, limit):
  rows = list(csv.reader(open(path), delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
  rows = rows[:limit]
  return [r[0] for r in rows], np.array([int(r[1]) for r in rows])


def features(pretrained, texts, seq_len=64, batch=256):
  tok, params = pretrained.tokenizer, jax.device_put(pretrained.params)
  encode = jax.jit(lambda ids: model_lib.Encoder(pretrained.model_cfg).apply(
      {"params": params}, ids))
  out = []
  for i in range(0, len(texts), batch):
    rows = [[tok.cls_id] + ids[:seq_len - 2] + [tok.sep_id]
            for ids in tok.encode(texts[i:i + batch])]
    arr = np.zeros((batch, seq_len), np.int32)
    for j, ids in enumerate(rows):
      arr[j, :len(ids)] = ids
    hidden = np.asarray(encode(jnp.asarray(arr)))[:len(rows)]
    words = (arr[:len(rows)] > 4)[..., None]  # Not special tokens.
    out.append(np.concatenate(
        [hidden[:, 0], (hidden * words).sum(1) / np.maximum(words.sum(1), 1)], 1))
  return np.concatenate(out)


def ridge_accuracy(train_x, train_y, dev_x, dev_y, alpha=10.0):
  mean, std = train_x.mean(0), train_x.std(0) + 1e-6
  a = np.c_[(train_x - mean) / std, np.ones(len(train_x))]
  b = np.c_[(dev_x - mean) / std, np.ones(len(dev_x))]
  w = np.linalg.solve(a.T @ a + alpha * np.eye(a.shape[1]), a.T @ (2.0 * train_y - 1))
  return float(((b @ w > 0) == dev_y).mean())


def embedding_cosines(pretrained, samples: int = 300) -> tuple[float, float]:
  """Mean pairwise cosine of the input embeddings of `samples` frequent pieces
  (ids 5..500) and of `samples` rare ones (ids 4000..V): SentencePiece orders
  pieces by score, so ids follow frequency. Near 0 for random vectors; near 1
  when the pieces have collapsed into one direction."""
  table = np.asarray(pretrained.params["token_embed"]["embedding"])
  unit = table / np.linalg.norm(table, axis=1, keepdims=True)
  rng = np.random.default_rng(0)
  out = []
  for low, high in ((5, 500), (min(4000, len(table) // 2), len(table))):
    ids = rng.choice(np.arange(low, high), min(samples, high - low), replace=False)
    cos = unit[ids] @ unit[ids].T
    out.append(float((cos.sum() - len(ids)) / (len(ids) * (len(ids) - 1))))
  return out[0], out[1]


def word_vector_accuracy(table, tokenizer, train, dev) -> float:
  """Ridge probe on the average of each sentence's piece vectors (rows of
  `table`): what the word vectors alone say about the task."""
  table = np.asarray(table, np.float64)

  def average(texts):
    return np.stack([table[ids].mean(0) if ids else np.zeros(table.shape[1])
                     for ids in tokenizer.encode(texts)])

  return ridge_accuracy(average(train[0]), train[1], average(dev[0]), dev[1])


def ppmi_svd_vectors(ids_per_document, vocab_size: int, dim: int = 128,
                     window: int = 5) -> np.ndarray:
  """Word vectors from co-occurrence counts (Levy & Goldberg 2014): symmetric
  counts within `window` pieces, weighted 1/distance; positive PMI with context
  counts raised to 0.75; rows of U sqrt(S) of the truncated SVD."""
  counts = np.zeros((vocab_size, vocab_size))
  for ids in ids_per_document:
    ids = np.asarray(ids, np.int64)
    for d in range(1, window + 1):
      np.add.at(counts, (ids[:-d], ids[d:]), 1.0 / d)
      np.add.at(counts, (ids[d:], ids[:-d]), 1.0 / d)
  rows = counts.sum(1)
  context = rows ** 0.75
  expected = np.outer(rows, context / context.sum())
  with np.errstate(divide="ignore", invalid="ignore"):
    pmi = np.log(counts / np.where(expected > 0, expected, 1.0))
  ppmi = np.where(np.isfinite(pmi) & (pmi > 0), pmi, 0.0)
  u, sv, _ = np.linalg.svd(ppmi, full_matrices=False)
  return u[:, :dim] * np.sqrt(sv[:dim])


def corpus_documents(pattern: str, tokenizer):
  for path in sorted(glob.glob(pattern)):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
      paragraphs = [p for p in f.read().split("\n\n") if p.strip()]
    yield [i for ids in tokenizer.encode(paragraphs) for i in ids]


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("workdirs", nargs="+")
  p.add_argument("--data", default="",
                 help="the folder of the downloaded data (glue/SST-2)")
  p.add_argument("--train", type=int, default=6000)
  p.add_argument("--corpus_baseline", default="",
                 help="glob of the pretraining text: add PPMI-SVD word vectors")
  args = p.parse_args()
  if not args.data:
    raise SystemExit(MISSING_DATA)
  sst2 = pathlib.Path(args.data) / "glue" / "SST-2"
  train_x, train_y = read(sst2 / "train.tsv", args.train)
  dev_x, dev_y = read(sst2 / "dev.tsv", None)
  if args.corpus_baseline:
    tokenizer = pretrained_lib.load_pretrained(args.workdirs[0],
                                            read_params=False).tokenizer
    vectors = ppmi_svd_vectors(corpus_documents(args.corpus_baseline, tokenizer),
                               tokenizer.vocab_size)
    bag = lambda texts: np.stack([np.bincount(ids, minlength=tokenizer.vocab_size) > 0
                                  for ids in tokenizer.encode(texts)]).astype(np.float64)
    # The fine-tuning baseline of no representation at all: a linear model on
    # which pieces a sentence has (no standardising: ridge on raw indicators).
    a, b = np.c_[bag(train_x), np.ones(len(train_x))], np.c_[bag(dev_x), np.ones(len(dev_x))]
    w = np.linalg.solve(a.T @ a + 10.0 * np.eye(a.shape[1]), a.T @ (2.0 * train_y - 1))
    print(f"bag of pieces ({tokenizer.vocab_size} indicators, ridge, {len(train_x)} "
          f"training sentences): SST-2 dev accuracy {((b @ w > 0) == dev_y).mean():.3f}",
          flush=True)
    random_vectors = np.random.default_rng(0).normal(size=vectors.shape)
    for name, table in (("PPMI-SVD of the corpus", vectors),
                        ("random", random_vectors)):
      print(f"{name} word vectors ({table.shape[1]} dims): SST-2 dev accuracy "
            f"{word_vector_accuracy(table, tokenizer, (train_x, train_y), (dev_x, dev_y)):.3f}",
            flush=True)
  for workdir in args.workdirs:
    full = pretrained_lib.load_pretrained(workdir, scan_layers=False, encoder_only=False)
    tables = {"input embeddings": full.params["token_embed"]["embedding"]}
    if "embedding" in full.params.get("lm_head", {}):
      tables["output embeddings (untied LM head)"] = full.params["lm_head"]["embedding"]
    for name, table in tables.items():
      print(f"{workdir} {name}, sentence average: SST-2 dev accuracy "
            f"{word_vector_accuracy(table, full.tokenizer, (train_x, train_y), (dev_x, dev_y)):.3f}",
            flush=True)
    # The encoder's own collections, from the params already read.
    pretrained = dataclasses.replace(full, params={
        c: full.params[c] for c in model_lib.ENCODER_COLLECTIONS})
    frequent, rare = embedding_cosines(pretrained)
    print(f"{workdir}: input embeddings, mean pairwise cosine: frequent pieces "
          f"{frequent:.3f}, rare pieces {rare:.3f}", flush=True)
    f_train, f_dev = features(pretrained, train_x), features(pretrained, dev_x)
    d = f_train.shape[1] // 2
    for name, cols in (("cls", slice(0, d)), ("mean", slice(d, 2 * d))):
      x = f_dev[:, cols]  # How much the vector differs between sentences.
      print(f"{workdir} {name}: between-sentence std (rms over dims) "
            f"{np.sqrt(x.var(0).mean()):.3f}, norm of the mean vector "
            f"{np.linalg.norm(x.mean(0)):.2f}", flush=True)
    for name, cols in (("cls", slice(0, d)), ("mean", slice(d, 2 * d))):
      print(f"{workdir} {name}: SST-2 dev accuracy "
            f"{ridge_accuracy(f_train[:, cols], train_y, f_dev[:, cols], dev_y):.3f}",
            flush=True)


if __name__ == "__main__":
  main()

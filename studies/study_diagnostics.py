r"""The figures behind studies/does-pretraining-pay.md and studies/fine-tuning-protocol.md
that are not a run's output.

  python studies/study_diagnostics.py corpus --data=<data>  # read time, peak RSS, tokenizer sample mix
  python studies/study_diagnostics.py weights --data=<data> --pretrained=W --step=3000 --control=C
  python studies/study_diagnostics.py blimp_nats --data=<data> --workdir=W
  python studies/study_diagnostics.py transplant --data=<data> --pretrained=W --step=3000 \
      --control=C --cut=2000 --sweep_dir=DIR

`--data` is the folder of the downloaded data (`<data>/corpus/wikipedia`,
`<data>/corpus/imdb`, `<data>/glue`, `<data>/blimp`), which every command reads.

corpus      the shared Wikipedia + IMDB spec: seconds and peak RSS to open both
            splits, and the share of the tokenizer's training sample (and of the
            corpus) that is IMDB, by characters.
weights     RMS of every encoder tensor, pretrained against the control (the
            initialisation); mean pairwise cosine of input embeddings per id band;
            the share of SST-2's first 4,000 training sentences' tokens with id >= cut.
blimp_nats  nats per masked token of BLiMP's good sentences by token PLL, alone and
            packed eight to a row (does the model read short sentences?).
transplant  SST-2 fine-tuning (the studies' protocol, rates 1e-4 and 3e-4, 3 seeds) of
            the pretrained encoder whose pieces from id `cut` on get the control's
            random directions at their own norms.
"""

import argparse
import pathlib
import resource
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from maelm_jax.run import pretrained as pretrained_lib  # noqa: E402

MISSING_DATA = ("--data is required: the folder of the downloaded data "
                "(corpus/wikipedia, corpus/imdb, glue/SST-2, blimp)")
IMDB_DOCUMENTS = 50_000  # imdb/ sorts before wikipedia/: corpus indices 0..49,999.


def corpus(args):
  import grain  # pylint: disable=g-import-not-at-top
  from maelm_jax.data import sources  # pylint: disable=g-import-not-at-top
  data = pathlib.Path(args.data)  # The shared Wikipedia + IMDB corpus:
  corpus_spec = f"text:{data}/corpus/wikipedia/*.jsonl.xz,{data}/corpus/imdb/*.jsonl.xz"
  start = time.perf_counter()
  train = sources.open_source(corpus_spec, "train")
  sources.open_source(corpus_spec, "eval")
  print(f"both splits open in {time.perf_counter() - start:.1f}s, peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB")
  stride = sources.held_out_stride(0.01)
  is_imdb = lambda i: sources.split_to_corpus_index(i, "train", stride) < IMDB_DOCUMENTS
  total = imdb = 0
  for i in range(len(train)):
    n = len(train[i])
    total, imdb = total + n, imdb + n * is_imdb(i)
  # The tokenizer's sample, drawn as pipeline.training_texts draws it.
  sample = sample_imdb = docs = 0
  for i in range(len(train)):
    if sample >= 50_000_000:  # training_texts' default max_chars.
      break
    index = int(grain.experimental.index_shuffle(i, max_index=len(train) - 1, seed=0,
                                                 rounds=4))
    n = len(train[index])
    docs, sample, sample_imdb = docs + 1, sample + n, sample_imdb + n * is_imdb(index)
  print(f"corpus {total:,} characters, IMDB {100 * imdb / total:.1f}%; tokenizer "
        f"sample {docs:,} documents, {sample:,} characters, IMDB "
        f"{100 * sample_imdb / sample:.1f}%")


def weights(args):
  from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  import csv  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  collections = ("token_embed", "encoder")
  pre, _ = pretrained_lib.restore_params(args.pretrained, args.step, collections)
  init, _ = pretrained_lib.restore_params(args.control, None, collections)
  flat = lambda t: {jax.tree_util.keystr(k): np.asarray(v)
                    for k, v in jax.tree_util.tree_flatten_with_path(t)[0]}
  init = flat(init)
  for name, value in flat(pre).items():
    if name.endswith("['kernel']") or name.endswith("['embedding']"):
      rms = lambda x: float(np.sqrt(np.mean(np.square(x))))
      print(f"{name:70s} RMS {rms(value):.4f} / init {rms(init[name]):.4f} = "
            f"{rms(value) / rms(init[name]):.1f}x")
  table = flat(pre)["['token_embed']['embedding']"]
  unit = table / np.linalg.norm(table, axis=1, keepdims=True)
  rng = np.random.default_rng(0)
  for low, high in ((5, 500), (500, 1000), (1000, 2000), (2000, 3000), (3000, 4000),
                    (4000, 6000), (6000, len(table))):
    ids = rng.choice(np.arange(low, high), 300, replace=False)
    cos = unit[ids] @ unit[ids].T
    print(f"ids {low}-{high}: mean pairwise cosine {(cos.sum() - 300) / (300 * 299):.3f}")
  tokenizer = tokenizer_lib.Tokenizer(f"{args.pretrained}/tokenizer.model")
  with open(pathlib.Path(args.data) / "glue" / "SST-2" / "train.tsv") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:4001]
  ids = np.concatenate([np.asarray(x) for x in tokenizer.encode([r[0] for r in rows])])
  print(f"SST-2 (first 4,000 training sentences): {len(ids):,} tokens, "
        f"{100 * (ids >= args.cut).mean():.1f}% with id >= {args.cut}")


def blimp_nats(args):
  from maelm_jax.evaluate import blimp  # pylint: disable=g-import-not-at-top
  pairs = blimp.read_pairs(str(pathlib.Path(args.data) / "blimp"), 10)
  run = blimp.load_run(args.workdir, None)
  rows = blimp.sentence_ids(run.tokenizer, [p.good for p in pairs])
  packed = [np.asarray([2] + [t for r in rows[i:i + 8] for t in [*r[1:-1], 3]],
                       np.int32)[:128] for i in range(0, len(rows) - 8, 8)]
  for name, batch in (("alone", rows), ("packed 8 to a row", packed)):
    starts = [blimp.word_starts(run.tokenizer, r) for r in batch]
    pll = blimp.pseudo_log_likelihoods(run.model_cfg, run.params, batch, starts,
                                       variant="token")
    print(f"{name}: {-pll.sum() / sum(len(r) - 2 for r in batch):.3f} nats per token")


def transplant(args):
  from maelm_jax.finetune import sweep  # pylint: disable=g-import-not-at-top
  control = np.asarray(pretrained_lib.restore_params(args.control, None, ("token_embed",))[
      0]["token_embed"]["embedding"])
  original = pretrained_lib.read_pretrained_params

  def swapped(workdir, pretrained, **kwargs):
    loaded = original(workdir, pretrained, **kwargs)
    table = np.array(loaded.params["token_embed"]["embedding"])
    norms = np.linalg.norm(table[args.cut:], axis=1, keepdims=True)
    rand = control[args.cut:]
    table[args.cut:] = rand / np.linalg.norm(rand, axis=1, keepdims=True) * norms
    loaded.params["token_embed"]["embedding"] = table
    return loaded

  pretrained_lib.read_pretrained_params = swapped  # The fine-tuning loop reads it here.
  overrides = {"init_from": args.pretrained, "init_step": args.step,
               "data.dir": str(pathlib.Path(args.data) / "glue"), "dtype": "float32",
               "batch_size": 32,
               "pooling": "mean", "num_epochs": 2, "max_seq_len": 64,
               "data.max_train_examples": 4000, "log_every": 25}
  sweep.run_grid(sweep.grid_configs(str(REPO / "configs" / "glue.py"), ["sst2"],
                                    overrides, [1e-4, 3e-4], [1, 2, 3]), args.sweep_dir)
  print(sweep.format_report(sweep.write_report(args.sweep_dir, "last")))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("what", choices=["corpus", "weights", "blimp_nats", "transplant"])
  parser.add_argument("--pretrained")
  parser.add_argument("--control")
  parser.add_argument("--workdir")
  parser.add_argument("--step", type=int, default=None)
  parser.add_argument("--cut", type=int, default=2000)
  parser.add_argument("--sweep_dir")
  parser.add_argument("--data", default="",
                      help="the folder of the downloaded data (corpus/wikipedia, "
                      "corpus/imdb, glue/, blimp/)")
  args = parser.parse_args()
  if not args.data:
    raise SystemExit(MISSING_DATA)
  globals()[args.what](args)


if __name__ == "__main__":
  main()

r"""Does the exported fast tokenizer give the project's ids? Counts, on real text,
the lines where `export_hf.fast_tokenizer` and SentencePiece disagree.

  python studies/export_tokenizer_check.py --data=<data> --tokenizer=runs/run/tokenizer.model

Text: the first 3,000 lines of six of the Gutenberg books and the SST-2 dev
sentences in `--data`, the folder of the downloaded data (`<data>/corpus/gutenberg`,
`<data>/glue/SST-2`; each when present), and every
sentence of the embedded pydoc corpus. A line that differs is also checked for being the same pieces in
another order (a tie SentencePiece breaks with float32 sums).
"""

import argparse
import collections
import glob
import lzma
import pathlib

import sentencepiece as spm

from maelm_jax.interop import export_hf
from maelm_jax.data import sources

MISSING_DATA = ("--data is required: the folder of the downloaded data "
                "(corpus/gutenberg, glue/SST-2)")


def texts_by_corpus(data: pathlib.Path) -> dict[str, list[str]]:
  corpora = {}
  books = sorted(glob.glob(str(data / "corpus" / "gutenberg" / "*.txt.xz")))[:6]
  if books:
    corpora["books"] = [line for path in books
                        for line in lzma.open(path, "rt").read().split("\n")[:3000]]
  sst2 = data / "glue" / "SST-2" / "dev.tsv"
  if sst2.exists():
    corpora["sst2_dev"] = [line.split("\t")[0] for line in sst2.read_text().splitlines()[1:]]
  pydoc = sources.open_source("pydoc:", "train")
  corpora["pydoc"] = [s for i in range(len(pydoc)) for s in pydoc[i].split(". ") if s]
  return corpora


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--tokenizer", required=True, help="a SentencePiece .model")
  parser.add_argument("--data", default="",
                      help="the folder of the downloaded data (corpus/gutenberg, "
                      "glue/SST-2)")
  args = parser.parse_args()
  if not args.data:
    raise SystemExit(MISSING_DATA)
  fast = export_hf.fast_tokenizer(args.tokenizer)
  sp = spm.SentencePieceProcessor(model_file=args.tokenizer)
  for name, texts in texts_by_corpus(pathlib.Path(args.data)).items():
    differ = reordered = 0
    for text in texts:
      ours, theirs = sp.encode(text), fast.encode(text, add_special_tokens=False).ids
      if ours != theirs:
        differ += 1
        reordered += collections.Counter(ours) == collections.Counter(theirs)
    print(f"{name:9s} {len(texts):6d} lines  {differ:4d} differ  "
          f"({reordered} of them the same pieces reordered)")


if __name__ == "__main__":
  main()

r"""Do good word vectors alone make a tiny encoder better on SST-2?

Fine-tunes SST-2 from a random initialisation (a `pretraining_helps.py` random-init
workdir) twice per seed: as it is, and with its token embeddings replaced by
PPMI-SVD word vectors of the pretraining text (`linear_probe.ppmi_svd_vectors`,
the same tokenizer, rescaled to the initial embeddings' standard deviation).
Nothing else changes, so the difference is what distributional word vectors of
the corpus give fine-tuning: an upper bound on what a pretrained encoder's
embedding table alone can add at this size and data.

  python studies/word_vector_init.py --data=<data> --init=runs/helps/random_init_maelm \
      --glue_dir=runs/helps/glue --out=runs/word_vector_init

The pretraining text: `--corpus`, default the books in
`<data>/corpus/gutenberg/*.txt.xz` (`--data`, the folder of the downloaded data).

Same fine-tuning protocol as `pretraining_helps.py --finetune_lr=1e-3
--finetune_config.pooling=mean` (SST-2: 8,000 training sentences, 2 epochs,
length 64, batch 32, last epoch scored).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "studies"))
sys.path.insert(0, str(REPO / "configs"))

import numpy as np  # noqa: E402

import glue  # noqa: E402
import linear_probe  # noqa: E402
from maelm_jax.run import pretrained as pretrained_lib  # noqa: E402
from maelm_jax.finetune import run  # noqa: E402

MISSING_DATA = ("--data is required: the folder of the downloaded data "
                "(corpus/gutenberg), or give --corpus")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--init", required=True, help="a random-init pretraining workdir")
  p.add_argument("--glue_dir", required=True, help="GLUE root with SST-2/")
  p.add_argument("--out", required=True)
  p.add_argument("--data", default="",
                 help="the folder of the downloaded data (corpus/gutenberg)")
  p.add_argument("--corpus", default="",
                 help="glob of the pretraining text (default: "
                 "<data>/corpus/gutenberg/*.txt.xz)")
  p.add_argument("--seeds", default="1,2,3")
  p.add_argument("--sst2_examples", type=int, default=8000)
  args = p.parse_args()
  if not args.corpus:
    if not args.data:
      raise SystemExit(MISSING_DATA)
    args.corpus = str(pathlib.Path(args.data) / "corpus" / "gutenberg" / "*.txt.xz")

  tokenizer = pretrained_lib.load_pretrained(args.init, read_params=False).tokenizer
  vectors = linear_probe.ppmi_svd_vectors(
      linear_probe.corpus_documents(args.corpus, tokenizer), tokenizer.vocab_size)
  read_params = pretrained_lib.read_pretrained_params
  use_vectors = {"on": False}

  def with_corpus_vectors(workdir, pretrained, **kwargs):
    pretrained = read_params(workdir, pretrained, **kwargs)
    if use_vectors["on"]:
      table = np.asarray(pretrained.params["token_embed"]["embedding"])
      pretrained.params["token_embed"]["embedding"] = (
          vectors / vectors.std() * table.std()).astype(table.dtype)
    return pretrained

  pretrained_lib.read_pretrained_params = with_corpus_vectors  # What run.run reads.
  scores = {"random init": [], "random init + corpus PPMI-SVD embeddings": []}
  for seed in [int(s) for s in args.seeds.split(",")]:
    for name in scores:
      use_vectors["on"] = name != "random init"
      config = glue.get_config("task=sst2")
      config.unlock()
      config.init_from, config.data.dir = args.init, args.glue_dir
      config.dtype, config.batch_size, config.num_epochs = "float32", 32, 2
      config.max_seq_len, config.pooling, config.learning_rate = 64, "mean", 1e-3
      config.data.max_train_examples, config.seed = args.sst2_examples, seed
      tag = "ppmi" if use_vectors["on"] else "random"
      result = run.run(config, os.path.join(args.out, f"{tag}_seed{seed}"))
      scores[name].append(100 * result["accuracy"])
      print(f"{name}, seed {seed}: SST-2 dev accuracy {scores[name][-1]:.1f}",
            flush=True)
  summary = {name: {"median": statistics.median(s), "seeds": s}
             for name, s in scores.items()}
  with open(os.path.join(args.out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  for name, s in summary.items():
    print(f"{name}: median {s['median']:.1f} ({', '.join(f'{x:.1f}' for x in s['seeds'])})")


if __name__ == "__main__":
  main()

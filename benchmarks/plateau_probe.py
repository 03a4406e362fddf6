r"""Pretraining probes on the 31 Gutenberg books: does a recipe leave the unigram
plateau, and when? Prints held-out `[MASK]`-only loss/accuracy every
`--eval_every` steps next to the run's unigram and bigram baselines.

  python benchmarks/plateau_probe.py --name=maelm_fast --config_arg=objective=maelm
  python benchmarks/plateau_probe.py --name=mlm_normal_init \
      --config_arg=objective=mlm --set model.relative_bias_init=normal
  python benchmarks/plateau_probe.py --name=maelm_paper \
      --config_arg=objective=maelm,recipe=paper

Settings: `configs/pretrain.py` (`--config_arg`, default the fast recipe), batch 32 x 128,
fp32 (faster than bf16 on CPU), every `--set key=value` applied on top. One
8000-piece tokenizer is trained on the books once (`--tokenizer`) and shared by
every probe, so their numbers are comparable. The run goes to /tmp/probe_<name>;
each eval line is also appended to `--out` as JSON.
"""

import argparse
import ast
import json
import pathlib
import shutil
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "configs")]

import pretrain  # noqa: E402  (configs/pretrain.py)
from maelm_jax import pipeline, sources, tokenizer as tokenizer_lib, train  # noqa: E402

BOOKS = REPO.parent / "shared" / "data" / "corpus" / "gutenberg"


def books_tokenizer(path: pathlib.Path, source_spec: str, vocab_size: int) -> str:
  """Trains the shared tokenizer on the training split once."""
  if not path.exists():
    path.parent.mkdir(parents=True, exist_ok=True)
    source = sources.open_source(source_spec, "train", eval_fraction=0.01)
    tokenizer_lib.load_or_train_tokenizer(
        str(path.parent), lambda: pipeline.training_texts(source),
        vocab_size=vocab_size, model_type="unigram", path=None,
        max_sentences=300_000, seed=0, is_writer=True)
  return str(path)


def apply_overrides(config, items):
  for item in items:
    key, value = item.split("=", 1)
    *parents, leaf = key.split(".")
    target = config
    for name in parents:
      target = target[name]
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      pass  # A plain string, e.g. pre.
    target[leaf] = value


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--name", required=True)
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--eval_every", type=int, default=200)
  p.add_argument("--config_arg", default="objective=maelm,size=tiny",
                 help="the configs/pretrain.py argument, e.g. objective=mlm,recipe=paper")
  p.add_argument("--source", default=f"text:{BOOKS}/*.txt.xz")
  p.add_argument("--tokenizer", default="/tmp/probe_tokenizer/tokenizer.model")
  p.add_argument("--out", default="/tmp/probe_results.jsonl")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="config override, e.g. model.ln_type=pre")
  args = p.parse_args()
  config = pretrain.get_config(args.config_arg)
  config.unlock()
  config.data.source = args.source
  config.tokenizer.vocab_size = 8000
  config.tokenizer.path = books_tokenizer(pathlib.Path(args.tokenizer), args.source,
                                          8000)
  config.total_steps = args.steps
  config.batch_size = 32
  config.seq_len = 128
  config.model.dtype = "float32"
  config.eval_every = config.log_every = config.checkpoint_every = args.eval_every
  config.eval_batches = 10
  apply_overrides(config, args.set)
  workdir = pathlib.Path(f"/tmp/probe_{args.name}")
  shutil.rmtree(workdir, ignore_errors=True)
  start = time.time()
  train.train_and_evaluate(config, str(workdir))
  with open(args.out, "a") as out:
    for line in open(workdir / "metrics.jsonl"):
      record = json.loads(line)
      if "eval/mask_loss" in record:
        record.update(name=args.name, overrides=args.set,
                      wall_min=round((time.time() - start) / 60, 1))
        out.write(json.dumps(record) + "\n")
        print(args.name, record["step"], *(round(record.get(k, -1), 4) for k in (
            "eval/mask_loss", "eval/mask_accuracy", "eval/unigram_loss",
            "eval/unigram_accuracy", "eval/bigram_accuracy")), flush=True)


if __name__ == "__main__":
  main()

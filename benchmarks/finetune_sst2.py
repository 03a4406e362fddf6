r"""Pretrain a tiny MAE-LM on real books, fine-tune it on GLUE SST-2, score the dev set.

The question it answers: does a model pretrained by maelm-jax, fine-tuned by
`maelm_jax.finetune`, land well above the majority-class baseline on real GLUE
data, and above the same fine-tuning from a random initialisation?

  python benchmarks/finetune_sst2.py                 # defaults: ~15 min on 2 cores
  python benchmarks/finetune_sst2.py --dry_run       # smoke test, ~2 min

Steps (everything through the project's public entry points):
  1. pretrain: `train.train_and_evaluate` with configs/pretrain.py
     (objective=maelm, size=tiny) on the Project Gutenberg books in
     ../shared/data/corpus/gutenberg (a SentencePiece tokenizer is trained on them);
  2. fine-tune: `finetune.run.run` with configs/glue.py:task=sst2 on
     ../shared/data/glue/SST-2 (a fixed random subset of the training set, all 872
     dev sentences scored);
  3. control: the same fine-tuning from a "pretraining" of one step at learning
     rate 0 (warm-up starts at 0), i.e. the random initialisation with the same
     tokenizer;
  4. baseline: the majority class of the training set, predicted for every dev
     sentence.

Writes its markdown section into `--results` (default benchmarks/RESULTS.md)
between `<!-- finetune_sst2:start -->` and `<!-- finetune_sst2:end -->`, and
`summary.json` into the workdir.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "configs"))

import jax  # noqa: E402

import glue  # noqa: E402  (configs/glue.py)
import pretrain  # noqa: E402  (configs/pretrain.py)
from maelm_jax import train  # noqa: E402
from maelm_jax.finetune import glue_data, run  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
START, END = "<!-- finetune_sst2:start -->", "<!-- finetune_sst2:end -->"


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", default="/tmp/maelm_finetune_sst2")
  p.add_argument("--corpus", default=f"text:{SHARED}/corpus/gutenberg/*.txt.xz")
  p.add_argument("--glue_dir", default=str(SHARED / "glue"))
  p.add_argument("--pretrain_steps", type=int, default=1500)
  p.add_argument("--pretrain_lr", type=float, default=1e-3)
  p.add_argument("--vocab_size", type=int, default=8000)
  p.add_argument("--train_examples", type=int, default=20_000,
                 help="SST-2 training subset (0: all 67,349)")
  p.add_argument("--epochs", type=int, default=2)
  p.add_argument("--finetune_lr", type=float, default=1e-4)
  p.add_argument("--max_seq_len", type=int, default=64)
  p.add_argument("--no_control", action="store_true",
                 help="skip the fine-tuning from random initialisation")
  p.add_argument("--results", default=str(REPO / "benchmarks" / "RESULTS.md"))
  p.add_argument("--dry_run", action="store_true",
                 help="tiny settings, results not written (smoke test)")
  args = p.parse_args(argv)
  if args.dry_run:
    args.pretrain_steps, args.train_examples, args.epochs = 20, 512, 1
    args.vocab_size = 2000
  return args


def pretrain_config(args, steps: int, learning_rate: float):
  config = pretrain.get_config("objective=maelm,size=tiny")
  config.unlock()
  config.data.source = args.corpus
  config.data.eval_fraction = 0.01
  config.tokenizer.vocab_size = args.vocab_size
  config.tokenizer.max_sentences = 300_000  # Enough for 8k pieces; trains in ~1 min.
  config.total_steps = steps
  config.warmup_steps = min(100, steps)  # steps=1: one step at learning rate 0.
  config.batch_size = 32
  config.seq_len = 128
  config.learning_rate = learning_rate
  config.log_every = 100
  config.eval_every = max(steps // 3, 1)
  config.eval_batches = 10
  config.checkpoint_every = steps
  config.model.dtype = "float32"  # Faster than bf16 on CPU.
  return config


def finetune_config(args, init_from: str):
  config = glue.get_config("task=sst2")
  config.init_from = init_from
  config.data.dir = args.glue_dir
  config.data.max_train_examples = args.train_examples
  config.max_seq_len = args.max_seq_len
  config.num_epochs = args.epochs
  config.learning_rate = args.finetune_lr
  config.dtype = "float32"
  config.log_every = 100
  return config


def majority_baseline(glue_dir: str) -> tuple[str, float]:
  data = glue_data.GlueData(glue_data.get_task("sst2"), "tsv", glue_dir)
  train_labels = [e.label for e in data.train()]
  majority = max(set(train_labels), key=train_labels.count)
  dev = data.dev(data.task.eval_splits[0])
  return data.task.labels[majority], sum(e.label == majority for e in dev) / len(dev)


def timed(fn, *args):
  start = time.perf_counter()
  out = fn(*args)
  return out, time.perf_counter() - start


def load_average() -> str:
  try:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())
  except OSError:
    return "n/a"


def main(argv=None):
  args = parse_args(argv)
  started, wall = datetime.datetime.now(), time.perf_counter()
  load_before = load_average()
  os.makedirs(args.workdir, exist_ok=True)
  pretrained_dir = os.path.join(args.workdir, "pretrain")
  random_dir = os.path.join(args.workdir, "random_init")

  pretrain_metrics, pretrain_s = timed(
      train.train_and_evaluate,
      pretrain_config(args, args.pretrain_steps, args.pretrain_lr), pretrained_dir)
  finetuned, finetune_s = timed(run.run, finetune_config(args, pretrained_dir),
                                os.path.join(args.workdir, "sst2"))
  control = control_s = None
  if not args.no_control:
    # One step at the warm-up's learning rate of 0 saves the initial weights and
    # reuses the pretraining run's tokenizer (copied, so both see the same ids).
    os.makedirs(random_dir, exist_ok=True)
    with open(os.path.join(pretrained_dir, "tokenizer.model"), "rb") as src, \
        open(os.path.join(random_dir, "tokenizer.model"), "wb") as dst:
      dst.write(src.read())
    train.train_and_evaluate(pretrain_config(args, 1, args.pretrain_lr), random_dir)
    control, control_s = timed(run.run, finetune_config(args, random_dir),
                               os.path.join(args.workdir, "sst2_random_init"))
  majority_label, majority_accuracy = majority_baseline(args.glue_dir)
  total_s = time.perf_counter() - wall

  summary = {
      "date": started.isoformat(timespec="seconds"),
      "command": "python " + " ".join(shlex.quote(a) for a in
                                      ["benchmarks/finetune_sst2.py"] + sys.argv[1:]),
      "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
      "jax": jax.__version__, "device": str(jax.devices()[0]),
      "load_average_before": load_before, "load_average_after": load_average(),
      "pretrain": {"steps": args.pretrain_steps, "seconds": pretrain_s,
                   "held_out_masked_token_accuracy": pretrain_metrics.get("eval/accuracy"),
                   "held_out_masked_token_loss": pretrain_metrics.get("eval/loss")},
      "finetune": {"seconds": finetune_s, "last": finetuned["accuracy"],
                   "best": finetuned["best"]["accuracy"],
                   "history": finetuned["history"]},
      "random_init": None if control is None else {
          "seconds": control_s, "last": control["accuracy"],
          "best": control["best"]["accuracy"], "history": control["history"]},
      "majority": {"label": majority_label, "accuracy": majority_accuracy},
      "total_seconds": total_s, "args": vars(args),
  }
  with open(os.path.join(args.workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  section = format_section(summary)
  print("\n" + section, flush=True)
  if not args.dry_run:
    write_section(args.results, section)
    print(f"\nwritten to {args.results}")


def format_section(s: dict) -> str:
  a = s["args"]
  train_size = a["train_examples"] or 67_349
  lines = [
      START,
      "## Fine-tuning: SST-2 dev accuracy of a tiny pretrained MAE-LM",
      "",
      f"Run {s['date']} on a 2-core CPU VM ({s['machine']}, JAX {s['jax']}, "
      f"{s['device']}); load average {s['load_average_before']} before, "
      f"{s['load_average_after']} after (other work shared the cores). "
      f"Total wall time {s['total_seconds'] / 60:.1f} min.",
      "",
      "```sh",
      s["command"],
      "```",
      "",
      f"* Pretraining: MAE-LM tiny (2 layers, hidden 128), {a['pretrain_steps']} steps "
      f"of 32 × 128 tokens on the 31 Gutenberg books in `../shared/data`, "
      f"{a['vocab_size']}-piece tokenizer; {s['pretrain']['seconds'] / 60:.1f} min. "
      f"Held-out masked-token accuracy "
      f"{_pct(s['pretrain']['held_out_masked_token_accuracy'])}.",
      f"* Fine-tuning: `configs/glue.py:task=sst2`, {train_size:,} training sentences, "
      f"{a['epochs']} epochs, batch 32, peak learning rate {a['finetune_lr']:g}, "
      f"max_seq_len {a['max_seq_len']}; all 872 dev sentences scored after each epoch.",
      "",
      "| model | SST-2 dev accuracy (last epoch) | best epoch | fine-tuning time |",
      "|---|---|---|---|",
      f"| tiny MAE-LM, pretrained | **{_pct(s['finetune']['last'])}** | "
      f"{_pct(s['finetune']['best'])} | {s['finetune']['seconds'] / 60:.1f} min |",
  ]
  if s["random_init"]:
    r = s["random_init"]
    lines.append(f"| same encoder, random init (no pretraining) | {_pct(r['last'])} | "
                 f"{_pct(r['best'])} | {r['seconds'] / 60:.1f} min |")
  lines += [
      f"| majority class of train (`{s['majority']['label']}`) | "
      f"{_pct(s['majority']['accuracy'])} | – | – |",
      "",
      END,
  ]
  return "\n".join(lines)


def _pct(x) -> str:
  return "n/a" if x is None else f"{100 * x:.1f}%"


def write_section(path: str, section: str) -> None:
  text = pathlib.Path(path).read_text() if os.path.exists(path) else ""
  if START in text and END in text:
    text = text[:text.index(START)] + section + text[text.index(END) + len(END):]
  else:
    text = (text.rstrip() + "\n\n" if text.strip() else "") + section + "\n"
  pathlib.Path(path).write_text(text)


if __name__ == "__main__":
  main()

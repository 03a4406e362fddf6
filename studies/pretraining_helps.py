r"""Does pretraining here help downstream? A tiny encoder pretrained on the 31
Gutenberg books against the same architecture from random initialisation, on
SST-2, QNLI and CoLA, medians over fine-tuning seeds.

  python studies/pretraining_helps.py --data=<data>                  # ~90 min on 2 cores
  python studies/pretraining_helps.py --data=<data> --objective=mlm --pretrain_steps=6000
  python studies/pretraining_helps.py --data=<data> --dry_run        # smoke test, ~3 min

`<data>` is the folder of the downloaded data: the books in
`<data>/corpus/gutenberg/*.txt.xz` and GLUE's SST-2, CoLA and QNLI in `<data>/glue`.

Steps (everything through the project's public entry points):
  1. pretrain: `python -m maelm_jax.main --config=configs/pretrain.py:objective=...`
     (the default recipe, size tiny, batch 32 x 128, fp32) on the books, with an
     8000-piece tokenizer trained on them; an existing `--pretrain_workdir` is
     resumed (and reused as is once finished);
  2. control: a one-step "pretraining" at learning rate 0 (the warm-up starts at
     0) with the same tokenizer: the random initialisation, saved as a workdir;
  3. fine-tune both with `maelm_jax.finetune.sweep` (configs/glue.py) over
     `--seeds`, the same hyper-parameters for both:
       SST-2: a fixed random `--sst2_examples` subset of train, all 872 dev
              sentences scored;
       QNLI:  its train set is not in `<data>`, so a fixed random half of
              QNLI dev (2,731 pairs) trains and the other half (2,732) is scored;
       CoLA:  all of train, all of dev (Matthews correlation);
  4. report the median over seeds of each run's *last* epoch (no selection on the
     scored set), per task and initialisation, and the gain.

Writes its section of `--results` (default studies/pretraining-on-the-books.md,
between `<!-- pretraining_helps:start -->` and `<!-- pretraining_helps:end -->`) and
`summary.json` in `--workdir`. Needs `--data`, the downloaded data (not part of the
project).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from maelm_jax.core import workdir as workdir_lib  # noqa: E402
from maelm_jax.run import config_lib  # noqa: E402

MISSING_DATA = ("--data is required: the folder of the downloaded data "
                "(corpus/gutenberg, glue/SST-2, glue/CoLA, glue/QNLI)")
START, END = "<!-- pretraining_helps:start -->", "<!-- pretraining_helps:end -->"
TASKS = ("sst2", "qnli", "cola")


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--workdir", default="runs/pretraining_helps")
  p.add_argument("--pretrain_workdir", default="",
                 help="default: <workdir>/pretrain_<objective>")
  p.add_argument("--objective", default="maelm", choices=("mlm", "maelm", "3ml"))
  p.add_argument("--pretrain_steps", type=int, default=6000)
  p.add_argument("--data", default="",
                 help="the folder of the downloaded data (corpus/gutenberg, glue/)")
  p.add_argument("--corpus", default="",
                 help="default: text:<data>/corpus/gutenberg/*.txt.xz")
  p.add_argument("--tokenizer", default="",
                 help="a tokenizer.model to use (default: train one on the books)")
  p.epilog = ("Also --config.KEY=VALUE (the pretraining config, e.g. "
              "--config.model.keep_prob=0.0) and --finetune_config.KEY=VALUE (the "
              "fine-tuning config, e.g. --finetune_config.pooling=mean), as python -m "
              "maelm_jax.main takes them.")
  p.add_argument("--seeds", default="1,2,3")
  p.add_argument("--finetune_lr", type=float, default=1e-4)
  p.add_argument("--sst2_examples", type=int, default=8000)
  p.add_argument("--epochs", default="sst2=2,qnli=3,cola=2")
  p.add_argument("--max_seq_len", default="sst2=64,qnli=128,cola=48")
  p.add_argument("--results",
                 default=str(REPO / "studies" / "pretraining-on-the-books.md"))
  p.add_argument("--dry_run", action="store_true",
                 help="tiny settings, results not written (smoke test)")
  argv = sys.argv[1:] if argv is None else list(argv)
  try:
    argv, pretrain_overrides = config_lib.split_overrides(argv)
    argv, finetune_overrides = config_lib.split_overrides(argv, "--finetune_config.")
    for key, value in pretrain_overrides:
      config_lib.typed_set(config_lib.load_config_module(
          str(REPO / "configs" / "pretrain.py")).get_config(None), key, value)
    for key, value in finetune_overrides:
      config_lib.typed_set(config_lib.load_config_module(
          str(REPO / "configs" / "glue.py")).get_config(None), key, value)
  except (KeyError, ValueError) as error:
    p.error(str(error.args[0]))
  args = p.parse_args(argv)
  if not args.data:
    raise SystemExit(MISSING_DATA)
  # Absolute: the runs start in the checkout and glue/ links to it.
  args.data = str(pathlib.Path(args.data).expanduser().resolve())
  args.corpus = args.corpus or f"text:{args.data}/corpus/gutenberg/*.txt.xz"
  # As the results record them: KEY=VALUE.
  args.override = [f"{k}={v}" for k, v in pretrain_overrides]
  args.finetune_override = [f"{k}={v}" for k, v in finetune_overrides]
  if args.dry_run:
    args.pretrain_steps, args.sst2_examples, args.seeds = 20, 256, "1"
    args.epochs = "sst2=1,qnli=1,cola=1"
  args.pretrain_workdir = args.pretrain_workdir or os.path.join(
      args.workdir, f"pretrain_{args.objective}")
  return args


def per_task(spec: str) -> dict[str, int]:
  return {k: int(v) for k, v in (item.split("=") for item in spec.split(","))}


def run(cmd: list[str], log_path: str) -> None:
  print("+", shlex.join(cmd), flush=True)
  with open(log_path, "a") as log:
    done = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
  if done.returncode:
    raise SystemExit(f"failed ({done.returncode}): {shlex.join(cmd)}; see {log_path}")


def pretrain(args, workdir: str, steps: int, extra: list[str]) -> dict:
  cmd = [sys.executable, "-m", "maelm_jax.main",
         f"--config=configs/pretrain.py:objective={args.objective},size=tiny",
         f"--workdir={workdir}", f"--config.data.source={args.corpus}",
         "--config.tokenizer.vocab_size=8000",
         f"--config.total_steps={steps}", "--config.batch_size=32",
         "--config.seq_len=128", "--config.model.dtype=float32",
         "--config.eval_batches=10", *extra,
         *(f"--config.{item}" for item in args.override)]
  if args.tokenizer:
    cmd.append(f"--config.tokenizer.path={args.tokenizer}")
  else:  # Enough sentences for 8k pieces; trains in about a minute.
    cmd.append("--config.tokenizer.max_sentences=300000")
  run(cmd, workdir + ".log")
  evals = workdir_lib.read_metrics(workdir, lambda r: "eval/mask_loss" in r)
  return evals[-1] if evals else {}


def qnli_halves(glue_root: pathlib.Path, data: pathlib.Path) -> None:
  """QNLI dev split in two fixed halves: train.tsv and dev.tsv of a GLUE dir."""
  from maelm_jax import compare  # pylint: disable=g-import-not-at-top
  compare.split_in_halves(str(data / "glue" / "QNLI" / "dev.tsv"),
                          str(glue_root / "QNLI"))


def glue_root(workdir: str, data: pathlib.Path) -> str:
  root = pathlib.Path(workdir) / "glue"
  root.mkdir(parents=True, exist_ok=True)
  for task in ("SST-2", "CoLA"):
    link = root / task
    if not link.exists():
      link.symlink_to(data / "glue" / task)
  if not (root / "QNLI" / "dev.tsv").exists():
    qnli_halves(root, data)
  return str(root)


def finetune(args, init_from: str, sweep_dir: str, data_dir: str) -> dict:
  epochs, lengths = per_task(args.epochs), per_task(args.max_seq_len)
  for task in TASKS:
    cmd = [sys.executable, "-m", "maelm_jax.finetune.sweep",
           "--config=configs/glue.py", f"--tasks={task}", f"--seeds={args.seeds}",
           f"--learning_rates={args.finetune_lr}", f"--sweep_dir={sweep_dir}",
           "--select=last", f"--config.init_from={init_from}",
           f"--config.data.dir={data_dir}", "--config.dtype=float32",
           "--config.batch_size=32", f"--config.num_epochs={epochs[task]}",
           f"--config.max_seq_len={lengths[task]}", "--config.log_every=100",
           *(f"--config.{item}" for item in args.finetune_override)]
    if task == "sst2":
      cmd.append(f"--config.data.max_train_examples={args.sst2_examples}")
    run(cmd, sweep_dir + ".log")
  with open(os.path.join(sweep_dir, "report.json")) as f:
    return json.load(f)


def scores(report: dict, task: str) -> tuple[float, list[float]]:
  entry = report["tasks"][task]
  by_lr = next(iter(entry["by_learning_rate"].values()))
  main = entry["main_metric"]
  return entry["median"][main], by_lr[main]


def main(argv=None):
  args = parse_args(argv)
  started, wall = datetime.datetime.now(), time.perf_counter()
  os.makedirs(args.workdir, exist_ok=True)
  data_dir = glue_root(args.workdir, pathlib.Path(args.data))

  t0 = time.perf_counter()
  pretrained = pretrain(args, args.pretrain_workdir, args.pretrain_steps,
                        ["--config.eval_every=500", "--config.log_every=100",
                         "--config.checkpoint_every=500"])
  pretrain_min = (time.perf_counter() - t0) / 60
  random_dir = os.path.join(args.workdir, f"random_init_{args.objective}")
  os.makedirs(random_dir, exist_ok=True)
  tokenizer = os.path.join(args.pretrain_workdir, "tokenizer.model")
  pretrain(argparse.Namespace(**{**vars(args), "tokenizer": tokenizer}), random_dir,
           1, ["--config.eval_every=1", "--config.checkpoint_every=1"])

  reports = {}
  for name, init_from in (("pretrained", args.pretrain_workdir),
                          ("random_init", random_dir)):
    reports[name] = finetune(args, init_from,
                             os.path.join(args.workdir, f"finetune_{name}_"
                                          f"{args.objective}"), data_dir)
  summary = {
      "date": started.isoformat(timespec="seconds"),
      "command": shlex.join(["python", "studies/pretraining_helps.py",
                             *sys.argv[1:]]),
      "machine": f"{platform.machine()}, {os.cpu_count()} cores",
      "pretrain_minutes": pretrain_min, "pretrained_eval": pretrained,
      "total_minutes": (time.perf_counter() - wall) / 60,
      "tasks": {task: {name: dict(zip(("median", "seeds"), scores(rep, task)))
                       for name, rep in reports.items()} for task in TASKS},
      "args": vars(args),
  }
  with open(os.path.join(args.workdir, f"summary_{args.objective}.json"), "w") as f:
    json.dump(summary, f, indent=2)
  section = format_section(summary)
  print("\n" + section, flush=True)
  if not args.dry_run:
    write_section(args.results, section)
    print(f"\nwritten to {args.results}")


def format_section(s: dict) -> str:
  a, ev = s["args"], s["pretrained_eval"]
  overrides = "".join(f", {item}" for item in a.get("override", []))
  metric = {"sst2": "accuracy", "qnli": "accuracy", "cola": "Matthews corr."}
  lines = [
      START,
      f"## Does pretraining help downstream? Tiny {a['objective']} vs random init",
      "",
      f"Run {s['date']} on a {s['machine']} CPU VM; total {s['total_minutes']:.0f} "
      "min (other work shared the cores).",
      "",
      "```sh",
      s["command"],
      "```",
      "",
      f"* Pretraining: `configs/pretrain.py:objective={a['objective']},size=tiny` "
      f"(default recipe{overrides}), {a['pretrain_steps']} steps of 32 × 128 tokens "
      "on the 31 "
      f"books, 8000-piece tokenizer, {s['pretrain_minutes']:.0f} min of this run "
      "(0 if the workdir was already trained). Held-out `[MASK]` accuracy "
      f"{ev.get('eval/mask_accuracy', float('nan')):.1%} (unigram "
      f"{ev.get('eval/unigram_accuracy', float('nan')):.1%}, bigram "
      f"{ev.get('eval/bigram_accuracy', float('nan')):.1%}), loss "
      f"{ev.get('eval/mask_loss', float('nan')):.3f} (unigram "
      f"{ev.get('eval/unigram_loss', float('nan')):.3f}).",
      "* Fine-tuning: `configs/glue.py`"
      + "".join(f", {o}" for o in a.get("finetune_override", [])) +
      f", lr {a['finetune_lr']:g}, batch 32, epochs "
      f"{a['epochs']}, max_seq_len {a['max_seq_len']}, SST-2 on a fixed "
      f"{a['sst2_examples']:,}-sentence subset of train; QNLI trained on a fixed "
      "half of its dev set and scored on the other half; the last epoch of each run "
      f"is scored; seeds {a['seeds']}.",
      "",
      "| task (metric) | pretrained (median) | random init (median) | gain | "
      "pretrained seeds | random-init seeds |",
      "|---|--:|--:|--:|---|---|",
  ]
  for task, entry in s["tasks"].items():
    p, r = entry["pretrained"], entry["random_init"]
    fmt = lambda xs: ", ".join(f"{100 * x:.1f}" for x in xs)
    # The better median in bold (both on a tie).
    bold = lambda x, other: f"**{100 * x:.1f}**" if x >= other else f"{100 * x:.1f}"
    lines.append(f"| {task} ({metric[task]}) | {bold(p['median'], r['median'])} | "
                 f"{bold(r['median'], p['median'])} | "
                 f"{100 * (p['median'] - r['median']):+.1f} | "
                 f"{fmt(p['seeds'])} | {fmt(r['seeds'])} |")
  lines += ["", END]
  return "\n".join(lines)


def write_section(path: str, section: str) -> None:
  text = pathlib.Path(path).read_text() if os.path.exists(path) else ""
  if START in text and END in text:
    text = text[:text.index(START)] + section + text[text.index(END) + len(END):]
  else:
    text = (text.rstrip() + "\n\n" if text.strip() else "") + section + "\n"
  pathlib.Path(path).write_text(text)


if __name__ == "__main__":
  main()

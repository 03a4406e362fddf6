r"""Pretraining probes on the 31 Gutenberg books: does a recipe leave the unigram
plateau, and when? Prints held-out `[MASK]`-only loss/accuracy every
`--eval_every` steps next to the run's unigram and bigram baselines.

  python studies/plateau_probe.py --data=<data> --name=maelm_fast --config_arg=objective=maelm
  python studies/plateau_probe.py --data=<data> --name=mlm_normal_init \
      --config_arg=objective=mlm --config.model.relative_bias_init=normal
  python studies/plateau_probe.py --data=<data> --name=maelm_paper \
      --config_arg=objective=maelm,recipe=paper

  python studies/plateau_probe.py --plot=docs/plateau_recipes.png \
      --names=mlm_fast,maelm_fast,maelm_paper

Settings: `configs/pretrain.py` (`--config_arg`, default the fast recipe), batch 32 x 128,
fp32 (faster than bf16 on CPU), every `--config.KEY=VALUE` applied on top (as
`python -m maelm_jax.main` takes them; records before 2026-11-27 name them `--set`). The
text: `--source`, default the books in `<data>/corpus/gutenberg` (`--data`, the folder
of the downloaded data; not needed with `--source` or `--plot`). One
8000-piece tokenizer is trained on the books once (`--tokenizer`) and shared by
every probe, so their numbers are comparable. The run goes to probe_<name> in the
system's temporary directory; each eval line is also appended to `--out` as JSON.
"""

import argparse
import json
import pathlib
import shutil
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "configs")]

import pretrain  # noqa: E402  (configs/pretrain.py)
from maelm_jax.data import pipeline, sources, tokenizer as tokenizer_lib  # noqa: E402
from maelm_jax.run import config_lib, train  # noqa: E402
from maelm_jax.core import workdir as workdir_lib  # noqa: E402

MISSING_DATA = ("--data is required: the folder of the downloaded data "
                "(corpus/gutenberg), or give --source")


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


def train_flops_per_step(workdir: pathlib.Path) -> float:
  """The FLOP model's training FLOPs per step of the run in `workdir`."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import flops, model as model_lib  # pylint: disable=g-import-not-at-top
  config = ml_collections.ConfigDict(workdir_lib.read_config(str(workdir)))
  vocab = tokenizer_lib.open_tokenizer(
      tokenizer_lib.workdir_tokenizer_path(str(workdir))).vocab_size
  cfg = model_lib.ModelConfig.from_config(config.model, vocab, 4)
  return flops.train_flops_per_step(cfg, config.seq_len, config.batch_size)


def probe_workdir(name: str) -> pathlib.Path:
  """Where probe `name` runs: scratch, started afresh by each probe."""
  return pathlib.Path(tempfile.gettempdir()) / f"probe_{name}"


def flops_per_step_of(name: str, rows) -> float:
  """Training FLOPs per step of probe `name`: as recorded in its results, else from
  its workdir (results written before the figure was recorded)."""
  recorded = rows[-1].get("train_flops_per_step")
  return recorded if recorded else train_flops_per_step(probe_workdir(name))


def plot(results: str, names: list[str], path: str,
         title: str = "tiny, 31 books, batch 32 x 128") -> None:
  """[MASK] accuracy against step and against training FLOPs, one line per probe."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  records = [json.loads(line) for line in open(results)]
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
  baselines = {}
  for i, name in enumerate(names):
    rows = sorted((r for r in records if r["name"] == name), key=lambda r: r["step"])
    if not rows:
      print(f"no records of {name} in {results}")
      continue
    per_step = flops_per_step_of(name, rows)
    steps = [r["step"] for r in rows]
    accuracy = [100 * r["eval/mask_accuracy"] for r in rows]
    style = "--" if "paper" in name or "normal" in name or "nodec" in name else "-"
    axes[0].plot(steps, accuracy, style, marker="o", ms=3, color=f"C{i}", label=name)
    axes[1].plot([s * per_step / 1e12 for s in steps], accuracy, style, marker="o",
                 ms=3, color=f"C{i}", label=name)
    baselines = rows[-1]
  for ax, xlabel in zip(axes, ("step", "training FLOPs (10^12, flops.py)")):
    for key, style, label in (("eval/unigram_accuracy", "--", "unigram"),
                              ("eval/bigram_accuracy", ":", "bigram")):
      if key in baselines:
        ax.axhline(100 * baselines[key], linestyle=style, color="gray", label=label)
    ax.set(xlabel=xlabel, ylabel="held-out [MASK] accuracy (%)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.suptitle(f"{title} (studies/plateau_probe.py)")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  print("wrote", path)


def crossing_step(rows, margin: float):
  """The step at which [MASK] accuracy / unigram accuracy first reaches `margin`,
  linearly interpolated between the two evaluations around it (None: never)."""
  previous = None
  for r in rows:
    ratio = r["eval/mask_accuracy"] / r["eval/unigram_accuracy"]
    if ratio >= margin:
      if previous is None:
        return float(r["step"])
      (step0, ratio0) = previous
      return step0 + (margin - ratio0) / (ratio - ratio0) * (r["step"] - step0)
    previous = (r["step"], ratio)
  return None


def table(results: str, names: list[str]) -> str:
  """Markdown: per probe, when it left the unigram plateau, passed bigram and reached
  twice unigram, in steps and in training FLOPs (baselines.ACCURACY_MARGIN is
  "left"; the demo's bar is 2x unigram and above bigram)."""
  from maelm_jax.run import baselines  # pylint: disable=g-import-not-at-top
  records = [json.loads(line) for line in open(results)]
  lines = ["| probe | GFLOP/step | left plateau at step (TFLOP) | interpolated (TFLOP) "
           "| above bigram at step (TFLOP) | [MASK] acc / loss at the end "
           "| unigram acc / loss | bigram acc | 2x unigram, interpolated (TFLOP) |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
  for name in names:
    rows = sorted((r for r in records if r["name"] == name), key=lambda r: r["step"])
    if not rows:
      continue
    per_step = flops_per_step_of(name, rows)
    left = next((r["step"] for r in rows if r["eval/mask_accuracy"] >=
                 baselines.ACCURACY_MARGIN * r["eval/unigram_accuracy"]), None)
    above = next((r["step"] for r in rows
                  if r["eval/mask_accuracy"] > r["eval/bigram_accuracy"]), None)
    crossing = crossing_step(rows, baselines.ACCURACY_MARGIN)
    at = lambda step: ("never" if step is None else
                       f"{step:.0f} ({step * per_step / 1e12:.2f})")
    last = rows[-1]
    lines.append(
        f"| {name} | {per_step / 1e9:.1f} | {at(left)} | {at(crossing)} | {at(above)} | "
        f"{100 * last['eval/mask_accuracy']:.1f}% / {last['eval/mask_loss']:.2f} "
        f"(step {last['step']}) | {100 * last['eval/unigram_accuracy']:.1f}% / "
        f"{last['eval/unigram_loss']:.2f} | {100 * last['eval/bigram_accuracy']:.1f}% | "
        f"{at(crossing_step(rows, 2.0))} |")
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--name", default="probe")
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--eval_every", type=int, default=200)
  p.add_argument("--config_arg", default="objective=maelm,size=tiny",
                 help="the configs/pretrain.py argument, e.g. objective=mlm,recipe=paper")
  p.add_argument("--data", default="",
                 help="the folder of the downloaded data (corpus/gutenberg)")
  p.add_argument("--source", default="",
                 help="default: text:<data>/corpus/gutenberg/*.txt.xz")
  p.add_argument("--tokenizer", default="runs/probe_tokenizer/tokenizer.model")
  p.add_argument("--out", default="runs/probe_results.jsonl")
  p.add_argument("--plot", default="",
                 help="only draw the probes --names from --out into this PNG and "
                 "print their table")
  p.add_argument("--names", default="")
  p.add_argument("--title", default="tiny, 31 books, batch 32 x 128",
                 help="the plot's title, e.g. to name an override the probes share")
  argv, overrides = config_lib.split_overrides(sys.argv[1:])
  args = p.parse_args(argv)
  if args.plot:
    plot(args.out, args.names.split(","), args.plot, args.title)
    print(table(args.out, args.names.split(",")))
    return
  if not args.source:
    if not args.data:
      raise SystemExit(MISSING_DATA)
    books = pathlib.Path(args.data) / "corpus" / "gutenberg"
    args.source = f"text:{books}/*.txt.xz"
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
  for key, value in overrides:
    config_lib.typed_set(config, key, value)
  workdir = probe_workdir(args.name)
  shutil.rmtree(workdir, ignore_errors=True)
  start = time.time()
  train.train_and_evaluate(config, str(workdir))
  # Recorded with the results, so the table and plot need no temporary workdir.
  per_step = train_flops_per_step(workdir)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  with open(args.out, "a") as out:
    for record in workdir_lib.read_metrics(str(workdir)):
      if "eval/mask_loss" in record:
        record.update(name=args.name, overrides=[f"{k}={v}" for k, v in overrides],
                      train_flops_per_step=per_step,
                      wall_min=round((time.time() - start) / 60, 1))
        out.write(json.dumps(record) + "\n")
        print(args.name, record["step"], *(round(record.get(k, -1), 4) for k in (
            "eval/mask_loss", "eval/mask_accuracy", "eval/unigram_loss",
            "eval/unigram_accuracy", "eval/bigram_accuracy")), flush=True)


if __name__ == "__main__":
  main()

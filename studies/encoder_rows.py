r"""One JSON row per pretrained encoder: its compute, held-out `[MASK]` accuracy,
BLiMP and GLUE (median, low, high over seeds), readable without the prose around
them (`studies/results/*.json`); and, from those rows, the table and the figure of
studies/does-pretraining-pay.md ("Every encoder by one protocol").

  python studies/encoder_rows.py --encoders=mlm_8x256=W1,maelmx_8x256=W2 \
      --blimp=BLIMP_OUT/blimp.json [--scores=SCORE_OUT/scores.json] \
      --device='one NVIDIA H200' --command='python studies/run_study.py --config=studies/configs/pair_8x256.py ...' \
      --out=studies/results/device_encoders.json
  python studies/encoder_rows.py --out=studies/results/device_encoders.json \
      --markdown --plot=docs/device_encoders.png

W: a pretraining workdir (a slim copy is enough: config.json and metrics.jsonl);
`--blimp`: `maelm_jax.evaluate.blimp`'s blimp.json scoring them (models named as the
workdirs' folders); `--scores`: `studies/score_encoders.py`'s scores.json. A task
nobody scored is null. Rows already in --out stay (a rescored one in its place). Rows of
one pretraining at several points (half way, the end) share a `run`.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.collect_rows import write_rows  # noqa: E402
from maelm_jax.core import workdir as workdir_lib  # noqa: E402
from maelm_jax.finetune import glue_data  # noqa: E402
from maelm_jax.modeling.model import SIZES  # noqa: E402

TASKS = ("sst2", "qnli", "cola")
TASK_TITLES = {"sst2": "SST-2", "qnli": "QNLI-half", "cola": "CoLA MCC"}


def encoder_row(name: str, workdir: str, blimp: dict, scores: dict,
                run: str = "") -> dict:
  config = workdir_lib.read_config(workdir)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    metrics = [json.loads(line) for line in f if line.strip()]
  evals = [m for m in metrics if "eval/mask_accuracy" in m]
  last_step = max(m["step"] for m in metrics)
  # A run stopped between log steps (SIGTERM) saved a later step than it logged.
  checkpoint_dir = os.path.join(workdir, "checkpoints")
  if os.path.isdir(checkpoint_dir):
    last_step = max([last_step] + [int(d) for d in os.listdir(checkpoint_dir)
                                   if d.isdigit()])
  model = config["model"]
  size = SIZES[model.get("size", "tiny")]  # (layers, hidden, ...): keys left at 0.
  flops_per_step = config["total_flops"] / config["total_steps"]
  glue = (scores.get(name) or {}).get("glue", {})
  scored = blimp.get(os.path.basename(os.path.normpath(workdir))) or {}
  row = {
      "name": name, "run": run or name, "objective": model["objective"],
      "decoder_type": model.get("decoder_type"),
      "shape": f"{model.get('num_layers') or size[0]}x{model.get('hidden') or size[1]}",
      "batch_size": config["batch_size"], "seq_len": config["seq_len"],
      "steps": last_step, "schedule_steps": config["total_steps"],
      "flops": flops_per_step * last_step,
      "tokens": last_step * config["batch_size"] * config["seq_len"],
      "heldout_mask_accuracy": evals[-1]["eval/mask_accuracy"] if evals else None,
      "heldout_mask_loss": evals[-1].get("eval/mask_loss") if evals else None,
      # [MASK] accuracies compare at one masking rate (3ML's own is 50%).
      "heldout_mask_rate": model.get("mask_ratio", 0.15),
      "dtype": model.get("dtype"),
      "blimp": scored.get("mean"), "blimp_pairs": scored.get("pairs"),
      # What a recipe comparison (the BabyLM knobs) varies; the defaults when unset.
      "recipe": {"seed": config.get("seed", 0),
                 "learning_rate": config.get("learning_rate"),
                 "relative_updates": config.get("relative_updates", False),
                 "mlp_activation": model.get("mlp_activation", "gelu"),
                 "normformer": model.get("normformer", False),
                 "mask_ratio_start": model.get("mask_ratio_start", 0.0)},
  }
  for task in TASKS:
    row[task] = None if glue.get(task) is None else in_points(task, glue[task])
  return row


def in_points(task: str, entry: dict) -> dict:
  """score_encoders' entry of a task (`median`: every metric's median over the
  seeds; `seed_range`: the task's main metric's, as fractions) as the row's
  {median, low, high} of the main metric in points (accuracy %, MCC x 100)."""
  median = entry["median"][glue_data.get_task(task).main_metric]
  low, high = entry["seed_range"]
  return {"median": 100 * median, "low": 100 * low, "high": 100 * high,
          "learning_rate": entry["learning_rate"]}


OBJECTIVE_TITLES = {"mlm": "MLM", "maelm": "MAE-LM", "3ml": "3ML"}


def describe(row: dict) -> str:
  """"MAE-LM (cross), 8 x 128, batch 128, float32" and the row's note."""
  title = OBJECTIVE_TITLES.get(row["objective"], row["objective"])
  if row.get("decoder_type") not in (None, "none"):
    title += f" ({row['decoder_type']})"
  if row.get("flops") == 0:
    title = "untrained control"
  layers, hidden = row["shape"].split("x")
  text = f"{title}, {layers} x {hidden}"
  if row.get("flops"):
    text += f", batch {row['batch_size']}"
  if row.get("dtype"):
    text += f", {row['dtype']}"
  if row.get("schedule_steps") and row["steps"] < row["schedule_steps"]:
    text += f", {100 * row['steps'] / row['schedule_steps']:.0f}% of its schedule"
  return text + (f", {row['note']}" if row.get("note") else "")


def _flops(value) -> str:
  if not value:
    return "-"
  return f"{value / 1e15:.2f} PFLOP" if value >= 1e15 else f"{value / 1e12:.0f} TFLOP"


def _scored(entry) -> str:
  return "" if entry is None else (
      f"{entry['median']:.1f} ({entry['low']:.1f} to {entry['high']:.1f})")


def markdown(rows) -> list[str]:
  """The table of studies/does-pretraining-pay.md: one line a row, in the file's order."""
  lines = ["| encoder | where | pretraining | tokens | held-out [MASK] acc | BLiMP | "
           + " | ".join(TASK_TITLES.values()) + " |",
           "|---|---|--:|--:|--:|--:|" + "--:|" * len(TASKS)]
  for r in rows:
    acc = r.get("heldout_mask_accuracy")
    acc = "" if acc is None else f"{100 * acc:.1f}%" + (
        f" (at {100 * r['heldout_mask_rate']:.0f}%)"
        if r.get("heldout_mask_rate", 0.15) != 0.15 else "")
    tokens = f"{r['tokens'] / 1e6:.0f} M" if r.get("tokens") else "-"
    blimp = "" if r.get("blimp") is None else f"{r['blimp']:.1f}"
    where = r["device"].split(" (")[0].replace("NVIDIA ", "")
    lines.append(f"| {describe(r)} | {where} | "
                 f"{_flops(r.get('flops'))} | {tokens} | {acc} | {blimp} | "
                 + " | ".join(_scored(r.get(t)) for t in TASKS) + " |")
  return lines


def blimp_interval(mean: float, pairs: int) -> float:
  """Half the 95% binomial interval of a BLiMP mean over `pairs` pairs (points):
  what a score of this many pairs can tell apart."""
  p = mean / 100
  return 196 * (p * (1 - p) / pairs) ** 0.5


def plot(rows, path: str) -> dict:
  """BLiMP, held-out [MASK] accuracy (at 15% masking) and each GLUE task against
  pretraining FLOPs (log axis), one line a run, CPU runs hollow, GPU runs filled;
  error bars: BLiMP's 95% interval, GLUE's seed range (lowest to highest); each
  untrained control a dashed line. Returns what it drew: {panel: {run: (x, y)}}."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  panels = {"blimp": "BLiMP, 36 paradigms (%)",
            "heldout_mask_accuracy": "held-out [MASK] accuracy at 15% (%)",
            **{t: f"{TASK_TITLES[t]} (median of 3 seeds)" for t in TASKS}}
  fig, grid = plt.subplots(2, 3, figsize=(15, 8))
  axes = dict(zip(panels, grid.flat))
  drawn = {title: {} for title in panels.values()}
  runs = {}
  for row in rows:
    runs.setdefault(row.get("run") or row["name"], []).append(row)
  trained = [name for name, rs in runs.items() if any(r.get("flops") for r in rs)]
  for color, name in enumerate(trained):
    points = sorted(runs[name], key=lambda r: r["flops"])
    cpu = "CPU" in points[0]["device"]
    style = dict(color=f"C{color % 10}", marker="s" if cpu else "o", capsize=2,
                 markerfacecolor="white" if cpu else f"C{color % 10}",
                 ls=":" if color >= 10 else "-")
    for key, title in panels.items():
      got = [r for r in points if r.get(key) is not None
             and (key != "heldout_mask_accuracy" or r.get("heldout_mask_rate", 0.15) == 0.15)]
      if not got:
        continue
      x = [r["flops"] / 1e12 for r in got]
      if key == "blimp":
        y = [r["blimp"] for r in got]
        err = [blimp_interval(r["blimp"], r.get("blimp_pairs") or 7200) for r in got]
      elif key == "heldout_mask_accuracy":
        y, err = [100 * r[key] for r in got], None
      else:
        y = [r[key]["median"] for r in got]
        err = [[m - r[key]["low"] for r, m in zip(got, y)],
               [r[key]["high"] - m for r, m in zip(got, y)]]
      axes[key].errorbar(x, y, yerr=err, label=f"{name} ({describe(points[-1])})",
                         **style)
      drawn[title][name] = (x, y)
  controls = [name for name in runs if name not in trained]
  for dashes, name in enumerate(controls):  # No FLOPs: a horizontal line each.
    rs = runs[name]
    for key, title in panels.items():
      value = rs[0].get(key)
      if value is not None and key != "heldout_mask_accuracy":
        value = value if key == "blimp" else value["median"]
        axes[key].axhline(value, color="gray", lw=1, ls=("--", ":", "-.")[dashes % 3],
                          label=describe(rs[0]))
        drawn[title][name] = ([], [value])
  for key, title in panels.items():
    ax = axes[key]
    ax.set(title=title, xlabel="pretraining TFLOPs", xscale="log")
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(alpha=0.3)
  legend = grid.flat[len(panels)]  # The sixth panel holds the legend.
  legend.axis("off")
  legend.legend(*axes["blimp"].get_legend_handles_labels(), loc="center", fontsize=6.5)
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)
  return drawn


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--encoders", default="", help="name=workdir,... (or run:name=workdir,"
                 " a row of that run)")
  p.add_argument("--blimp", default="", help="maelm_jax.evaluate.blimp's blimp.json")
  p.add_argument("--scores", default="", help="score_encoders.py's scores.json")
  p.add_argument("--device", default="", help="where they were pretrained")
  p.add_argument("--command", default="", help="the command that pretrained them")
  p.add_argument("--out", required=True)
  p.add_argument("--markdown", action="store_true", help="print --out's table")
  p.add_argument("--plot", default="", help="draw --out's rows to this PNG")
  args = p.parse_args(argv)
  if not args.encoders:
    with open(args.out) as f:
      rows = json.load(f)
    if args.markdown:
      print("\n".join(markdown(rows)))
    if args.plot:
      plot(rows, args.plot)
    return 0
  blimp = {}
  if args.blimp:
    with open(args.blimp) as f:
      blimp = json.load(f)["models"]
  scores = {}
  if args.scores:
    with open(args.scores) as f:
      scores = json.load(f)
  rows = []
  for item in args.encoders.split(","):
    name, workdir = item.split("=", 1)
    run, _, name = name.rpartition(":")
    row = encoder_row(name, workdir, blimp, scores, run)
    row.update(device=args.device, command=args.command)
    rows.append(row)
  if os.path.exists(args.out):  # A rescored row keeps its place; new ones go last.
    with open(args.out) as f:
      kept = json.load(f)
    new = {r["name"]: r for r in rows}
    rows = ([new.pop(r["name"], r) for r in kept] + list(new.values()))
  write_rows(args.out, rows)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())

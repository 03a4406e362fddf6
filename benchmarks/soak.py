r"""Hours of running: does a long run leak memory or slow down?

  python benchmarks/soak.py --workdir=/tmp/soak --steps=5000 --plot=docs/soak.png

Runs `python -m maelm_jax.main` (tiny MAE-LM, CPython's docs by default, so
the data repeats for many epochs) for --steps with everything a long run does:
a log record every 100 steps (metrics.jsonl, TensorBoard, the console), an
evaluation every 500, a checkpoint every 100 (3 kept, each with its checksums),
the data iterator saved in every checkpoint. Each time a record appears, the
resident memory of the run (its process and any children, from /proc) is read.
The step time is the run's own throughput over the 100 steps before each record
(evaluation excluded, as the run reports it).

Printed as JSON and written beside the plot: RSS at step 500 and at the end
(target: within +5%), a linear fit of RSS per 1,000 steps, and the median step
time of the second 1,000 steps against the last 1,000 (target: no drift).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from maelm_jax import workdir as workdir_lib  # noqa: E402


def rss_mb(pid: int) -> float:
  """VmRSS of `pid` and its descendants, in MB."""
  parents = {}
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as f:
        parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
      pass
  family, grew = {pid}, True
  while grew:
    more = {p for p, parent in parents.items() if parent in family} - family
    family |= more
    grew = bool(more)
  total = 0
  for p in family:
    try:
      with open(f"/proc/{p}/status") as f:
        total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
      pass
  return total / 1024


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", default="/tmp/soak")
  parser.add_argument("--steps", type=int, default=5000)
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--source", default="pydoc:")
  parser.add_argument("--vocab_size", type=int, default=2000)  # pydoc: holds ~4k.
  parser.add_argument("--checkpoint_every", type=int, default=100)
  parser.add_argument("--eval_every", type=int, default=500)
  parser.add_argument("--plot", default=str(REPO / "docs" / "soak.png"))
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="Another config value, e.g. --set=model.scan_layers=True")
  args = parser.parse_args()
  if os.path.exists(args.workdir) and os.listdir(args.workdir):
    sys.exit(f"--workdir={args.workdir} is not empty; give a new one")
  command = [sys.executable, "-m", "maelm_jax.main", f"--workdir={args.workdir}",
             "--config=configs/pretrain.py:objective=maelm,size=tiny",
             f"--config.data.source={args.source}", f"--config.total_steps={args.steps}",
             f"--config.batch_size={args.batch_size}", "--config.log_every=100",
             f"--config.eval_every={args.eval_every}",
             f"--config.checkpoint_every={args.checkpoint_every}",
             "--config.keep_checkpoints=3",
             f"--config.tokenizer.vocab_size={args.vocab_size}",
             "--config.data.eval_fraction=0.05", "--config.eval_batches=4",
             *(f"--config.{kv}" for kv in args.set)]
  started = time.time()
  with open(os.path.join("/tmp", f"soak_{os.getpid()}.log"), "w") as log:
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log)
  metrics = pathlib.Path(workdir_lib.metrics_path(args.workdir))
  rows, seen = [], 0
  while process.poll() is None:
    time.sleep(0.2)
    if not metrics.exists():
      continue
    lines = metrics.read_text().split("\n")[:-1]
    if len(lines) > seen:
      memory = rss_mb(process.pid)
      for line in lines[seen:]:
        record = json.loads(line)
        step_ms = (args.batch_size * 128 / record["tokens_per_sec"] * 1e3
                   if record.get("tokens_per_sec") else None)
        rows.append({"step": record["step"], "rss_mb": round(memory, 1),
                     "step_ms": step_ms and round(step_ms, 2),
                     "seconds": round(time.time() - started, 1)})
      seen = len(lines)
      print(json.dumps(rows[-1]), flush=True)
  if process.returncode != 0:
    sys.exit(f"the run failed (exit {process.returncode}); see {log.name}")

  steps = np.array([r["step"] for r in rows])
  rss = np.array([r["rss_mb"] for r in rows])
  step_ms = np.array([r["step_ms"] or np.nan for r in rows])
  at = lambda s: rss[np.searchsorted(steps, s)]
  window = lambda lo, hi: float(np.nanmedian(step_ms[(steps > lo) & (steps <= hi)]))
  late = steps >= 500
  slope = np.polyfit(steps[late], rss[late], 1)[0] * 1000
  summary = {
      "command": " ".join(command[1:]), "steps": int(steps[-1]),
      "wall_minutes": round((time.time() - started) / 60, 1),
      "rss_mb_at_500": float(at(500)), "rss_mb_at_end": float(rss[-1]),
      "rss_change_500_to_end": f"{(rss[-1] / at(500) - 1) * 100:+.1f}%",
      "rss_mb_per_1000_steps_fit": round(float(slope), 2),
      "step_ms_median_1000_2000": window(1000, 2000),
      "step_ms_median_last_1000": window(steps[-1] - 1000, steps[-1]),
      "rows": rows}
  summary["step_time_change"] = (f"{(summary['step_ms_median_last_1000'] / summary['step_ms_median_1000_2000'] - 1) * 100:+.1f}%")
  print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=1))
  plot = pathlib.Path(args.plot)
  plot.parent.mkdir(parents=True, exist_ok=True)
  plot.with_suffix(".json").write_text(json.dumps(summary, indent=1))

  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
  top.plot(steps, rss, marker=".")
  top.axhline(at(500) * 1.05, color="grey", ls="--", lw=1, label="+5% of step 500")
  top.set_ylabel("RSS of the run (MB)")
  top.set_ylim(0, max(rss) * 1.15)
  top.legend(loc="lower right")
  bottom.plot(steps, step_ms, marker=".")
  bottom.set_ylabel("step time (ms, per 100 steps)")
  bottom.set_ylim(0, np.nanmax(step_ms) * 1.15)
  bottom.set_xlabel("step")
  fig.suptitle(f"Soak: tiny MAE-LM, {steps[-1]:,} steps, batch {args.batch_size}; "
               f"eval every {args.eval_every}, checkpoint every {args.checkpoint_every}")
  fig.tight_layout()
  fig.savefig(plot, dpi=90)
  print(f"plot: {plot}")


if __name__ == "__main__":
  main()

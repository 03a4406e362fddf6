r"""Hours of running: does a long run leak memory or slow down?

  python benchmarks/soak.py --workdir=runs/soak --steps=5000 --plot=docs/soak.png \
      --json=benchmarks/results/soak/soak.json
  python benchmarks/soak.py --replot=benchmarks/results/soak/soak.json \
      --plot=docs/soak.png   # summary and plot again

Runs `python -m maelm_jax.main` (tiny MAE-LM, CPython's docs by default, so
the data repeats for many epochs) for --steps with everything a long run does:
a log record every 100 steps (metrics.jsonl, TensorBoard, the console), an
evaluation every 500, a checkpoint every 100 (3 kept, each with its checksums),
the data iterator saved in every checkpoint. Each time a record appears, the
resident memory of the run (its process and any children, from /proc) is read.
The step time is the run's own throughput over the 100 steps before each record
(evaluation excluded, as the run reports it).

The run's C allocator is jemalloc (preloaded, as the launchers do: glibc's
arenas hold on to more memory at every save, docs/long-runs-and-faults.md, "Hours of running") unless
--allocator=glibc. The records so far are rewritten beside the plot at each
record, so a soak cut short (a machine taken back) still has its figures:
--replot makes the summary and plot from them.

Printed as JSON and written beside the plot: RSS at step 500 and at the end
(target: within +5%), the lowest RSS of each 1,000 steps (single samples swing
by live save and evaluation buffers), a linear fit of RSS per 1,000 steps, and
the median step time of the second 1,000 steps against the last 1,000 (target:
no drift).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "configs"))

import pretrain  # noqa: E402  (configs/pretrain.py)
from maelm_jax.run import config_lib, host_memory  # noqa: E402
from maelm_jax.core import workdir as workdir_lib  # noqa: E402


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
  parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "soak"))
  parser.add_argument("--steps", type=int, default=5000)
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--source", default="pydoc:")
  parser.add_argument("--vocab_size", type=int, default=2000)  # pydoc: holds ~4k.
  parser.add_argument("--checkpoint_every", type=int, default=100)
  parser.add_argument("--eval_every", type=int, default=500)
  parser.add_argument("--plot", default=None,
                      help="The plot (PNG); default <workdir>/soak.png. An existing one "
                      "is not overwritten.")
  parser.add_argument("--json", default=None,
                      help="Every row and the summary (JSON); default: beside --plot. "
                      "An existing one is not overwritten.")
  parser.add_argument("--allocator", choices=("jemalloc", "glibc"), default="jemalloc",
                      help="The run's C allocator: jemalloc preloaded (as the launchers "
                      "do), or glibc's malloc")
  parser.add_argument("--replot", metavar="SOAK_JSON",
                      help="Only the summary and plot again, from a soak's JSON")
  # --config.KEY=VALUE: another config value, as python -m maelm_jax.main takes it
  # (e.g. --config.model.scan_layers=True); checked against the run's config.
  argv, overrides = config_lib.split_overrides(sys.argv[1:])
  parser.epilog = "Also --config.KEY=VALUE, as python -m maelm_jax.main takes it."
  args = parser.parse_args(argv)
  for key, value in overrides:
    try:
      config_lib.typed_set(pretrain.get_config("objective=maelm,size=tiny"), key, value)
    except (KeyError, ValueError) as error:
      parser.error(str(error.args[0]))
  if args.replot:
    soak = json.loads(pathlib.Path(args.replot).read_text())
    summarize_and_plot(soak, pathlib.Path(args.plot or pathlib.Path(args.replot).with_suffix(".png")),
                       pathlib.Path(args.replot))
    return
  env = dict(os.environ)
  if args.allocator == "jemalloc":
    library = host_memory.find_jemalloc()
    if library is None:
      sys.exit("--allocator=jemalloc: libjemalloc.so.2 not found; install it "
               "(apt install libjemalloc2), set MAELM_JEMALLOC=/path/to/libjemalloc.so.2, "
               "or pass --allocator=glibc")
    env["LD_PRELOAD"] = ":".join(filter(None, [library, env.get("LD_PRELOAD")]))
  else:
    env.pop("LD_PRELOAD", None)
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
             *(f"--config.{k}={v}" for k, v in overrides)]
  plot = pathlib.Path(args.plot or os.path.join(args.workdir, "soak.png"))
  record_path = pathlib.Path(args.json) if args.json else plot.with_suffix(".json")
  for path, flag in ((plot, "--plot"), (record_path, "--json")):
    if path.exists():
      sys.exit(f"{flag}={path} exists already (a soak's figures); give another path")
    path.parent.mkdir(parents=True, exist_ok=True)
  started = time.time()
  with open(os.path.join(tempfile.gettempdir(), f"soak_{os.getpid()}.log"), "w") as log:
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log, env=env)
  metrics = pathlib.Path(workdir_lib.metrics_path(args.workdir))
  rows, seen = [], 0
  soak = {"command": " ".join(command[1:]), "allocator": args.allocator,
          "ld_preload": env.get("LD_PRELOAD", ""), "batch_size": args.batch_size,
          "eval_every": args.eval_every, "checkpoint_every": args.checkpoint_every,
          "rows": rows}
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
      soak["wall_minutes"] = round((time.time() - started) / 60, 1)
      record_path.write_text(json.dumps(soak, indent=1))
  if process.returncode != 0:
    sys.exit(f"the run failed (exit {process.returncode}); see {log.name}")
  summarize_and_plot(soak, plot, record_path)


def summarize_and_plot(record: dict, plot: pathlib.Path, record_path: pathlib.Path) -> None:
  """Adds the summary to `record` (a soak's command and rows), writes it to
  `record_path`, prints it, and draws RSS and step time against the step."""
  rows = record["rows"]

  steps = np.array([r["step"] for r in rows])
  if steps.size == 0 or steps[-1] < 2000:
    sys.exit(f"only {steps[-1] if steps.size else 0} steps recorded: a summary needs 2,000")
  rss = np.array([r["rss_mb"] for r in rows])
  step_ms = np.array([r["step_ms"] or np.nan for r in rows])
  at = lambda s: rss[np.searchsorted(steps, s)]
  window = lambda lo, hi: float(np.nanmedian(step_ms[(steps > lo) & (steps <= hi)]))
  late = steps >= 500
  slope = np.polyfit(steps[late], rss[late], 1)[0] * 1000
  floors = [float(rss[(steps > lo) & (steps <= lo + 1000)].min())
            for lo in range(0, int(steps[-1]), 1000) if ((steps > lo) & (steps <= lo + 1000)).any()]
  summary = {
      "steps": int(steps[-1]),
      "rss_mb_at_500": float(at(500)), "rss_mb_at_end": float(rss[-1]),
      "rss_change_500_to_end": f"{(rss[-1] / at(500) - 1) * 100:+.1f}%",
      "rss_mb_lowest_per_1000_steps": floors,
      "rss_mb_per_1000_steps_fit": round(float(slope), 2),
      "step_ms_median_1000_2000": window(1000, 2000),
      "step_ms_median_last_1000": window(steps[-1] - 1000, steps[-1]),
  }
  summary["step_time_change"] = (f"{(summary['step_ms_median_last_1000'] / summary['step_ms_median_1000_2000'] - 1) * 100:+.1f}%")
  print(json.dumps(summary, indent=1))
  record.update(summary)
  rows = record.pop("rows")
  record["rows"] = rows  # Last in the file, after the figures.
  plot.parent.mkdir(parents=True, exist_ok=True)
  record_path.write_text(json.dumps(record, indent=1))

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
  fig.suptitle(f"Soak: tiny MAE-LM, {steps[-1]:,} steps, batch {record.get('batch_size', 16)}, "
               f"{record.get('allocator', 'glibc')}; eval every {record.get('eval_every', 500)}, "
               f"checkpoint every {record.get('checkpoint_every', 100)}")
  fig.tight_layout()
  fig.savefig(plot, dpi=90)
  print(f"plot: {plot}")


if __name__ == "__main__":
  main()

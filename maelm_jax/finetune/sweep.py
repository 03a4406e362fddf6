r"""Fine-tuning sweeps (tasks x learning rates x seeds) and the papers' report.

  python -m maelm_jax.finetune.sweep --config=configs/glue.py \
      --tasks=rte,mrpc,stsb,cola --learning_rates=1e-5,2e-5,3e-5 --seeds=1,2,3,4,5 \
      --sweep_dir=runs/glue_sweep \
      --config.init_from=runs/maelm_base --config.data.dir=/data/glue

runs every combination one after another in this process, each in
`<sweep_dir>/<task>/lr<lr>_seed<seed>/` (a finished run is skipped only when
its config.json equals this sweep's config for it, so a stopped sweep resumes;
runs made with another config, e.g. another init_from, stop the sweep before
anything runs), then writes and prints the report:

  report.json / report.md   per task and learning rate, the median over seeds of
                            every metric; per task, the learning rate with the
                            best median main metric; and the GLUE average.

This is how the MAE-LM / COCO-LM papers report GLUE dev: the median of 5 seeds
at the best learning rate, Matthews correlation for CoLA, Spearman for STS-B
and accuracy for the rest (MNLI by its matched set; mismatched is reported
beside it), averaged over the eight tasks other than WNLI. Each run's score is
its best epoch (`--select=last` for the final one).

Any `--config.x=...` override applies to every run; `data.dir` may be the GLUE
root, since each run finds its task's directory below it. With
`--config=configs/squad.py:version=2.0` and no `--tasks`, the grid is learning
rates x seeds. `--report_only` rebuilds the report from the runs on disk.

Each run keeps its final checkpoint (`keep_final_checkpoint`) until the grid is
complete; then only the runs at each task's selected learning rate keep theirs
(every seed; what `export_hf` exports), and the others' are deleted.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import statistics
from typing import Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from maelm_jax.core import cli, storage
from maelm_jax.run import config_lib
from maelm_jax.finetune import glue_data

# The GLUE average of the papers: every task but WNLI.
GLUE_AVERAGE_TASKS = ("mnli", "qqp", "qnli", "sst2", "cola", "rte", "mrpc", "stsb")
SELECTIONS = ("best", "last")


def run_name(learning_rate: float, seed: int) -> str:
  return f"lr{learning_rate:g}_seed{seed}"


def grid_configs(config_file: str, tasks: Sequence[str], overrides: dict,
                 learning_rates: Sequence[float], seeds: Sequence[int]):
  """(task name, learning rate, seed, config) for every grid point.

  Each task's config comes from its own `get_config("task=<task>")`, so the
  per-task defaults apply; `overrides` (flattened `a.b` keys) go on top. Empty
  `learning_rates`: each task's default.
  """
  module = config_lib.load_config_module(config_file)
  arg = config_file.split(":", 1)[1] if ":" in config_file else None
  bases = ([(t, module.get_config(f"task={t}")) for t in tasks] if tasks
           else [(None, module.get_config(arg))])
  if not seeds:
    raise ValueError("--seeds needs at least one value, e.g. --seeds=1,2,3,4,5")
  out = []
  for task, base in bases:
    base = base.copy_and_resolve_references()
    base.unlock()
    for key, value in overrides.items():
      config_lib.set_path(base, key, value)
    for learning_rate in learning_rates or [base.learning_rate]:
      for seed in seeds:
        config = base.copy_and_resolve_references()
        config.learning_rate = float(learning_rate)
        config.seed = int(seed)
        config.lock()
        name = task or (config.task if config.mode == "glue" else
                        f"squad_v{config.version}")
        out.append((name, float(learning_rate), int(seed), config))
  return out


def run_grid(points, sweep_dir: str) -> list[str]:
  """Runs each grid point not run yet; returns the run directories."""
  from maelm_jax.finetune import run  # pylint: disable=g-import-not-at-top
  directories = [os.path.join(sweep_dir, task, run_name(learning_rate, seed))
                 for task, learning_rate, seed, _ in points]
  # Before anything runs: a directory holding a run of another config (another
  # init_from, epochs, ...) would mix old results into the report.
  stale = []
  for directory, (_, _, _, config) in zip(directories, points):
    try:
      run.check_same_run(config, directory)
    except ValueError as error:
      stale.append(str(error).split("\nPass")[0])
  if stale:
    raise ValueError(
        f"{len(stale)} run(s) in {sweep_dir} were made with another config, so "
        "their results are not this sweep's:\n" + "\n".join(stale[:3])
        + "\nPass a new --sweep_dir (or remove those runs).")
  for index, (directory, (task, learning_rate, seed, config)) in enumerate(
      zip(directories, points), start=1):
    if os.path.isfile(os.path.join(directory, run.RESULTS_FILE)):
      logging.info("[%d/%d] %s done with this config; skipped", index, len(points),
                   directory)
      continue
    logging.info("[%d/%d] %s lr=%g seed=%d -> %s", index, len(points), task,
                 learning_rate, seed, directory)
    results = run.run(config, directory)
    if results.get("stopped_by"):  # SIGTERM / Ctrl-C: saved; stop the sweep too.
      logging.warning("sweep stopped in %s (saved): run the same command to resume",
                      directory)
      raise SystemExit(130 if results["stopped_by"] == "SIGINT" else 0)
  return directories


# --------------------------------------------------------------------------
# The report.


def _metrics_of(results: dict, selection: str) -> dict[str, float]:
  """The run's metrics at its best epoch or at the end."""
  best = results["best"]
  names = [k for k in best if k not in ("step", "epoch")]
  source = best if selection == "best" else results
  return {name: float(source[name]) for name in names}


def build_report(sweep_dir: str, selection: str = "best") -> dict:
  """Medians over seeds per task and learning rate, best learning rate per task,
  and the GLUE average (see the module docstring)."""
  if selection not in SELECTIONS:
    raise ValueError(f"selection={selection!r}: use one of {SELECTIONS}")
  runs: dict[str, dict[float, list[dict]]] = {}
  main_metric = {}
  paths = sorted(glob.glob(os.path.join(sweep_dir, "*", "*", "eval_results.json")))
  if not paths:
    raise FileNotFoundError(f"no */*/eval_results.json under {sweep_dir}; run the "
                            "sweep first (without --report_only)")
  for path in paths:
    with open(path) as f:
      results = json.load(f)
    task = results["task"]
    main_metric[task] = results["main_metric"]
    runs.setdefault(task, {}).setdefault(float(results["learning_rate"]), []).append(
        {"seed": results["seed"], **_metrics_of(results, selection)})

  tasks = {}
  for task, by_lr in sorted(runs.items()):
    main = main_metric[task]
    table = {}
    for learning_rate, seed_runs in sorted(by_lr.items()):
      names = [k for k in seed_runs[0] if k != "seed"]
      table[f"{learning_rate:g}"] = {
          "median": {n: statistics.median(r[n] for r in seed_runs) for n in names},
          "seeds": sorted(r["seed"] for r in seed_runs),
          main: sorted(r[main] for r in seed_runs)}
    best_lr = max(table, key=lambda lr: table[lr]["median"][main])
    tasks[task] = {"main_metric": main, "learning_rate": float(best_lr),
                   "num_seeds": len(table[best_lr]["seeds"]),
                   "median": table[best_lr]["median"], "by_learning_rate": table}

  averaged = [t for t in GLUE_AVERAGE_TASKS if t in tasks]
  report = {"selection": selection, "tasks": tasks, "glue_average_tasks": averaged}
  if averaged:
    report["glue_average"] = statistics.mean(
        tasks[t]["median"][tasks[t]["main_metric"]] for t in averaged)
  return report


def format_report(report: dict) -> str:
  """Markdown: one row per task at its best learning rate (GLUE values x100)."""
  lines = [f"Median over seeds at the best learning rate ({report['selection']} "
           "epoch of each run). GLUE metrics x100; SQuAD in percent.", "",
           "| task | learning rate | seeds | main metric | metrics (median) |",
           "|---|---|---|---|---|"]
  for task, entry in report["tasks"].items():
    scale = 100.0 if task in glue_data.TASKS else 1.0
    median = entry["median"]
    metrics = ", ".join(f"{k} {v * scale:.2f}" for k, v in median.items())
    lines.append(f"| {task} | {entry['learning_rate']:g} | {entry['num_seeds']} | "
                 f"{entry['main_metric']} {median[entry['main_metric']] * scale:.2f} | "
                 f"{metrics} |")
  if "glue_average" in report:
    missing = [t for t in GLUE_AVERAGE_TASKS if t not in report["glue_average_tasks"]]
    note = f" (missing: {', '.join(missing)})" if missing else ""
    lines += ["", f"GLUE average over {len(report['glue_average_tasks'])} of "
              f"{len(GLUE_AVERAGE_TASKS)} tasks{note}: "
              f"{report['glue_average'] * 100:.2f}"]
  return "\n".join(lines)


def prune_unselected(sweep_dir: str, report: dict) -> list[str]:
  """Deletes the final checkpoints of the runs at learning rates the report did
  not select (each task keeps every seed of its best rate); returns the run
  directories pruned. Their results (eval_results.json, predictions) stay."""
  from maelm_jax.finetune import run  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import checkpoints  # pylint: disable=g-import-not-at-top
  pruned, freed = [], 0
  for path in sorted(glob.glob(os.path.join(sweep_dir, "*", "*", run.RESULTS_FILE))):
    with open(path) as f:
      results = json.load(f)
    task = report["tasks"].get(results["task"])
    directory = checkpoints.checkpoint_dir(os.path.dirname(path))
    if task is None or float(results["learning_rate"]) == task["learning_rate"]:
      continue
    if os.path.isdir(directory):
      freed += sum(os.path.getsize(os.path.join(root, name))
                   for root, _, names in os.walk(directory) for name in names)
      shutil.rmtree(directory)
      pruned.append(os.path.dirname(path))
  if pruned:
    logging.info("kept the checkpoints of each task's selected learning rate; "
                 "deleted %d others (%.1f MB)", len(pruned), freed / 1e6)
  return pruned


def plot_report(report: dict, path: str, label: str = "") -> dict:
  """Each task's main metric against the learning rate (log axis): the median
  over seeds, with a bar from the lowest to the highest seed. The score axis
  runs from 0 (or the lowest seed, when negative) to 100, so seed noise is not
  drawn as a ranking. Returns {task: (learning rates, medians, lows, highs)}."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  drawn = {}
  tasks = report["tasks"]
  fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.4), squeeze=False)
  for ax, (task, entry) in zip(axes.flat, sorted(tasks.items())):
    main = entry["main_metric"]
    rates = sorted(entry["by_learning_rate"], key=float)
    table = [entry["by_learning_rate"][r] for r in rates]
    medians = [100 * t["median"][main] for t in table]
    lows = [100 * min(t[main]) for t in table]
    highs = [100 * max(t[main]) for t in table]
    xs = [float(r) for r in rates]
    drawn[task] = (xs, medians, lows, highs)
    ax.errorbar(xs, medians, yerr=[[m - lo for m, lo in zip(medians, lows)],
                                   [hi - m for m, hi in zip(medians, highs)]],
                fmt="o-", capsize=3, label=label or "median, seed range")
    ax.set(xscale="log", xlabel="peak learning rate", ylabel=f"{main} (x100)",
           title=f"{task} ({len(table[0]['seeds'])} seeds)",
           ylim=(min(0, min(lows) - 5), 100))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return drawn


def write_report(sweep_dir: str, selection: str = "best") -> dict:
  report = build_report(sweep_dir, selection)
  with open(os.path.join(sweep_dir, "report.json"), "w") as f:
    json.dump(report, f, indent=2)
  with open(os.path.join(sweep_dir, "report.md"), "w") as f:
    f.write(format_report(report) + "\n")
  plot_report(report, os.path.join(sweep_dir, "report.png"))
  return report


# --------------------------------------------------------------------------
# Command line.


def _define_flags() -> None:
  """Defined only when run as a program, so importing this module (tests, or
  next to main.py's own --config) defines no flags."""
  config_flags.DEFINE_config_file("config", None, "Fine-tuning config file, e.g. "
                                  "configs/glue.py", lock_config=True)
  flags.DEFINE_list("tasks", [], "GLUE tasks, e.g. rte,mrpc (empty: the config's own)")
  flags.DEFINE_list("learning_rates", [], "Peak learning rates, e.g. 1e-5,2e-5,3e-5 "
                    "(empty: each task's default)")
  flags.DEFINE_list("seeds", ["1", "2", "3", "4", "5"], "Seeds of each setting")
  flags.DEFINE_string("sweep_dir", None, "Where the runs and the report go")
  flags.DEFINE_enum("select", "best", SELECTIONS,
                    "Score runs by their best or last epoch")
  flags.DEFINE_bool("report_only", False, "Only rebuild the report from finished runs")
  flags.mark_flag_as_required("sweep_dir")


def main():
  FLAGS = flags.FLAGS
  storage.check_local(FLAGS.sweep_dir, "--sweep_dir")
  if not FLAGS.report_only:
    if FLAGS.config is None:
      raise app.UsageError("--config is required (e.g. --config=configs/glue.py) "
                           "unless --report_only")
    tasks = [glue_data.get_task(t).name for t in FLAGS.tasks]
    learning_rates = [float(lr) for lr in FLAGS.learning_rates]
    points = grid_configs(config_flags.get_config_filename(FLAGS["config"]), tasks,
                          config_flags.get_override_values(FLAGS["config"]),
                          learning_rates, [int(s) for s in FLAGS.seeds])
    run_grid(points, FLAGS.sweep_dir)
  report = write_report(FLAGS.sweep_dir, FLAGS.select)
  if not FLAGS.report_only:  # The grid is complete: its selection is final.
    prune_unselected(FLAGS.sweep_dir, report)
  print(format_report(report), flush=True)
  print(f"\nreport: {os.path.join(os.path.abspath(FLAGS.sweep_dir), 'report.md')}")


# `python -m` and the maelm-finetune-sweep command (setup.py's console scripts).
console = cli.command(main, _define_flags, stopped="the running run saved; the same "
                      "command goes on from it")

if __name__ == "__main__":
  console()

r"""The papers' comparison in one command: pretrain every objective of a sweep
config at equal compute, fine-tune each encoder, measure its effective rank,
and write one table and one figure.

  python -m maelm_jax.compare --config=configs/compare.py:size=tiny,tflops=20 \
      --out=runs/compare --glue_dir=<data>/glue \
      --config.data.source='text:<data>/corpus/gutenberg/*.txt.xz'

Steps (each resumable: the same command skips what is done and checks that what
is on disk was made with this config):
  1. one tokenizer for every run (`<out>/tokenizer/`, unless
     --config.tokenizer.path is given), so that their numbers are comparable;
  2. pretraining: the sweep (`maelm_jax.sweep`) into `<out>/pretrain/<run>`;
  3. fine-tuning: each encoder on --tasks with the config's `get_finetune`
     protocol (configs/glue.py + overrides), one run per fine-tuning seed, into
     `<out>/finetune/<run>`; QNLI trains on a fixed half of its dev set and is
     scored on the other half (`<out>/glue/QNLI`), SST-2 and CoLA use their own
     train and dev sets; the last epoch of each run is scored;
     With more than one learning rate in the protocol (`learning_rates`), each
     encoder first picks its own: one run per rate and `select_seeds` seed on a
     split carved out of the task's *training* file (`<out>/glue_select`: a
     fixed fifth, at most 1000 rows, scores; the rest trains), never on the
     scored data; its fine-tuning seeds then run at the rate that scored best;
  4. effective rank of every encoder (`maelm_jax.evaluate.analyze`) into `<out>/rank`;
  5. with --blimp_dir, BLiMP (`maelm_jax.evaluate.blimp`) of every encoder into
     `<out>/blimp/<run>`, and with --blimp_curve_pairs, a smaller BLiMP of every
     kept checkpoint, for `curves.png` (BLiMP and held-out [MASK] accuracy
     against pretraining FLOPs);
  6. `<out>/comparison.json`, `comparison.md` (one row per run, one per
     objective: the mean over pretraining seeds of the fine-tuning medians,
     with the range of the fine-tuning seeds) and `comparison.png` (downstream
     score against pretraining FLOPs, one line per objective, each median with
     its seed range).
"""

from __future__ import annotations

import csv
import json
import os
import random
import statistics

from absl import app, flags, logging
from ml_collections import config_flags

from maelm_jax.evaluate import analyze, blimp
from maelm_jax.run import checkpoints, config_lib
from maelm_jax.core import cli, storage
from maelm_jax import sweep
from maelm_jax.core import workdir as workdir_lib
from maelm_jax.finetune import glue_data, sweep as finetune_sweep

# The group of configs/compare.py's `random=1` runs: the untrained control.
UNTRAINED_GROUP = "random"


# --------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------


def split_in_halves(dev_tsv: str, out_dir: str, seed: int = 0) -> None:
  """A GLUE dev.tsv as train.tsv and dev.tsv: two fixed random halves."""
  with open(dev_tsv, newline="") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  header, body = rows[0], rows[1:]
  order = list(range(len(body)))
  random.Random(seed).shuffle(order)
  half = len(body) // 2
  os.makedirs(out_dir, exist_ok=True)
  for name, indices in (("train.tsv", order[:half]), ("dev.tsv", order[half:])):
    with open(os.path.join(out_dir, name), "w", newline="") as f:
      writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None,
                          escapechar=None, lineterminator="\n")
      writer.writerow(header)
      writer.writerows(body[i] for i in sorted(indices))


def glue_root(glue_dir: str, out: str, tasks) -> str:
  """`<out>/glue`: links to --glue_dir's tasks; a task given only its dev.tsv
  (no train.tsv: <data> has QNLI's dev alone) is made of that file's two
  halves, one to train on, one to score."""
  root = os.path.join(out, "glue")
  os.makedirs(root, exist_ok=True)
  for task in tasks:
    folder = glue_data.get_task(task).tsv_dir
    source = os.path.join(os.path.abspath(glue_dir), folder)
    if not os.path.isfile(os.path.join(source, "dev.tsv")):
      raise FileNotFoundError(f"--glue_dir={glue_dir} has no {folder}/dev.tsv;"
                              " pass the GLUE root holding it, or leave the task out "
                              "of --tasks")
    target = os.path.join(root, folder)
    if not os.path.isfile(os.path.join(source, "train.tsv")):
      if not os.path.isfile(os.path.join(target, "dev.tsv")):
        split_in_halves(os.path.join(source, "dev.tsv"), target)
    elif not os.path.exists(target):
      os.symlink(source, target)
  return root


def carve_selection_split(train_tsv: str, out_dir: str, *, header: bool,
                          seed: int = 0, fraction: float = 0.2,
                          max_rows: int = 1000) -> None:
  """A task's training file as the learning-rate selection's train.tsv and
  dev.tsv: a fixed random `fraction` (at most `max_rows`) scores, the rest
  trains. The scored data of the comparison is never read."""
  with open(train_tsv, newline="") as f:
    rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  head, body = (rows[:1], rows[1:]) if header else ([], rows)
  order = list(range(len(body)))
  random.Random(seed).shuffle(order)
  held = min(max_rows, max(1, round(fraction * len(body))))
  if len(body) - held < 2:
    raise ValueError(f"{train_tsv} has {len(body)} rows, too few to carve a "
                     "learning-rate selection split from; give one learning rate")
  os.makedirs(out_dir, exist_ok=True)
  for name, indices in (("dev.tsv", order[:held]), ("train.tsv", order[held:])):
    with open(os.path.join(out_dir, name), "w", newline="") as f:
      writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None,
                          escapechar=None, lineterminator="\n")
      writer.writerows(head + [body[i] for i in sorted(indices)])


def selection_root(data_dir: str, out: str, tasks) -> str:
  """`<out>/glue_select`: each task's selection split (`carve_selection_split`)."""
  root = os.path.join(out, "glue_select")
  for task in tasks:
    folder = glue_data.get_task(task).tsv_dir
    target = os.path.join(root, folder)
    if not os.path.isfile(os.path.join(target, "dev.tsv")):
      carve_selection_split(
          os.path.join(data_dir, folder, "train.tsv"), target,
          header=glue_data.get_task(task).headerless_layout is None)
  return root


def shared_tokenizer(config_file: str, overrides: dict, out: str) -> str:
  """Trains the runs' tokenizer once (the first run's settings and data); a
  corpus prepared as token ids (`prepare_data --tokenizer`) gives its own."""
  from maelm_jax.data import pipeline, sources, tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  config = sweep.expand(config_file, overrides)[0]["config"]
  directory = os.path.join(out, "tokenizer")
  path = os.path.join(directory, tokenizer_lib.TOKENIZER_FILENAME)
  if not os.path.exists(path):
    data = config.data
    source = sources.open_source(data.source, "train", eval_fraction=data.eval_fraction,
                                 text_field=data.text_field,
                                 tfds_data_dir=data.tfds_data_dir or None)
    if source.token_ids_tokenizer:  # A corpus prepared as ids brings its own.
      return source.token_ids_tokenizer
    tokenizer_lib.load_or_train_tokenizer(
        directory, lambda: pipeline.training_texts(source),
        vocab_size=config.tokenizer.vocab_size,
        model_type=config.tokenizer.model_type, path=None,
        max_sentences=config.tokenizer.max_sentences, seed=0, is_writer=True)
  return path


def check_heldout_for_ranks(config_file: str, overrides: dict, num_tokens: int) -> None:
  """The effective rank (the last step, after hours of pretraining and fine-tuning)
  reads `num_tokens` [MASK] slots of the runs' held-out text: too little text is
  said now, with this command's flags."""
  from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  config = sweep.expand(config_file, overrides)[0]["config"]
  try:
    analyze.read_rows(analyze.heldout_text(config.data),
                      tokenizer_lib.open_tokenizer(overrides["tokenizer.path"]),
                      config.seq_len, num_tokens)
  except ValueError as error:
    raise ValueError(f"{str(error).split('; lower')[0]}, which the effective rank "
                     f"reads after the runs: lower --num_tokens (at least the hidden "
                     "size), or give the runs more held-out text "
                     "(--config.data.eval_fraction, --config.data.source)") from error


# --------------------------------------------------------------------------
# Results.
# --------------------------------------------------------------------------


def group_of(name: str) -> str:
  """The objective line a run belongs to: its name without seed (and budget)."""
  stem = name.rsplit("_seed", 1)[0]
  return stem.split("_", 1)[0] if stem.endswith("pct") else stem


def summarize(runs, finetune_reports: dict, ranks: dict, blimp_means=None) -> dict:
  blimp_means = blimp_means or {}
  rows = []
  for run in runs:
    config, name = run["config"], run["name"]
    ev = (workdir_lib.evaluations(run["workdir"]) or [{}])[-1]
    report = finetune_reports.get(name, {"tasks": {}})
    scores = {task: entry["median"][entry["main_metric"]]
              for task, entry in report["tasks"].items()}
    # The fine-tuning seeds' lowest and highest score (reports made before
    # seed ranges were kept: the median alone).
    ranges = {task: entry.get("seed_range", [scores[task]] * 2)
              for task, entry in report["tasks"].items()}
    rank = ranks.get(run["workdir"], {}).get("rank", {})
    rows.append({
        "run": name, "group": group_of(name), "objective": config.model.objective,
        "decoder": config.model.decoder_type, "seed": config.seed,
        "steps": config.total_steps,
        "flops": config_lib.train_flops_per_step(config) * config.total_steps,
        "mask_accuracy": ev.get("eval/mask_accuracy"),
        "mask_loss": ev.get("eval/mask_loss"),
        "unigram_accuracy": ev.get("eval/unigram_accuracy"),
        "bigram_accuracy": ev.get("eval/bigram_accuracy"),
        "blimp": blimp_means.get(name),
        "downstream": scores, "downstream_range": ranges,
        "learning_rates": {task: entry.get("learning_rate")
                           for task, entry in report["tasks"].items()},
        "rank_real_last": (rank.get("real", {}).get("entropy") or [None])[-1]})
  groups = {}
  for row in rows:
    key = (row["group"], row["flops"] // 1e9)
    groups.setdefault(key, []).append(row)
  by_group = []
  for (group, _), members in groups.items():
    tasks = sorted({t for r in members for t in r["downstream"]})
    mean = lambda values: statistics.mean(values) if values else None
    by_group.append({
        "group": group, "flops": statistics.mean(r["flops"] for r in members),
        "pretraining_seeds": len(members),
        "mask_accuracy": mean([r["mask_accuracy"] for r in members
                               if r["mask_accuracy"] is not None]),
        "blimp": mean([r["blimp"] for r in members if r["blimp"] is not None]),
        "downstream": {t: mean([r["downstream"][t] for r in members
                                if t in r["downstream"]]) for t in tasks},
        # Over every fine-tuning seed of every pretraining seed.
        "downstream_spread": {t: [min(r["downstream_range"][t][0] for r in members
                                      if t in r["downstream"]),
                                  max(r["downstream_range"][t][1] for r in members
                                      if t in r["downstream"])]
                              for t in tasks},
        "rank_real_last": mean([r["rank_real_last"] for r in members
                                if r["rank_real_last"] is not None])})
  return {"runs": rows, "groups": by_group}


def format_markdown(summary: dict, tasks) -> str:
  pct = lambda v: "" if v is None else f"{100 * v:.1f}"
  num = lambda v: "" if v is None else f"{v:.1f}"
  head = " | ".join(tasks)
  lines = ["Per objective: the mean over pretraining seeds of each run's median over "
           "fine-tuning seeds, with the lowest and highest fine-tuning seed in "
           "brackets; GLUE metrics x100; BLiMP: mean accuracy over paradigms; "
           "effective rank (entropy) of real tokens at the last layer.", "",
           f"| objective | TFLOPs | seeds | [MASK] acc | BLiMP | {head} | rank |",
           "|---|--:|--:|--:|--:|" + "--:|" * len(tasks) + "--:|"]
  for g in sorted(summary["groups"], key=lambda g: (g["group"], g["flops"])):
    cells = [f"{pct(g['downstream'].get(t))} ({pct(g['downstream_spread'][t][0])}-"
             f"{pct(g['downstream_spread'][t][1])})" if t in g["downstream"] else ""
             for t in tasks]
    rank = "" if g["rank_real_last"] is None else f"{g['rank_real_last']:.1f}"
    lines.append(f"| {g['group']} | {g['flops'] / 1e12:.1f} | {g['pretraining_seeds']} "
                 f"| {pct(g['mask_accuracy'])} | {num(g.get('blimp'))} | "
                 + " | ".join(cells) + f" | {rank} |")
  lines += ["", "Per run (fine-tuning learning rate in brackets):", "",
            f"| run | steps | TFLOPs | [MASK] acc / loss | unigram / bigram acc | BLiMP "
            f"| {head} |", "|---|--:|--:|--:|--:|--:|" + "--:|" * len(tasks)]
  for r in summary["runs"]:
    loss = "" if r["mask_loss"] is None else f"{r['mask_loss']:.3f}"
    rates = r.get("learning_rates", {})
    lines.append(
        f"| {r['run']} | {r['steps']} | {r['flops'] / 1e12:.1f} | "
        f"{pct(r['mask_accuracy'])} / {loss} | {pct(r['unigram_accuracy'])} / "
        f"{pct(r['bigram_accuracy'])} | {num(r.get('blimp'))} | "
        + " | ".join(pct(r["downstream"].get(t)) + (
            f" ({rates[t]:g})" if rates.get(t) else "") for t in tasks) + " |")
  return "\n".join(lines)


def plot(summary: dict, tasks, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  panels = list(tasks) + ["mask_accuracy"]
  if any(g.get("blimp") is not None for g in summary["groups"]):
    panels.append("blimp")
  fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), squeeze=False)
  names = sorted({g["group"] for g in summary["groups"]})

  def value(g, panel):
    if panel == "blimp":
      return g.get("blimp")
    v = g["mask_accuracy"] if panel == "mask_accuracy" else g["downstream"].get(panel)
    return None if v is None else 100 * v

  for color, name in enumerate(names):
    points = sorted((g for g in summary["groups"] if g["group"] == name),
                    key=lambda g: g["flops"])
    for ax, panel in zip(axes[0], panels):
      spread = [g["downstream_spread"].get(panel) for g in points]
      if name == UNTRAINED_GROUP:  # The bar pretraining has to clear: a level line.
        if value(points[0], panel) is not None:
          ax.axhline(value(points[0], panel), color=f"C{color}", ls="--",
                     label="untrained")
          if spread[0]:  # Its fine-tuning seeds' range.
            ax.axhspan(100 * spread[0][0], 100 * spread[0][1], color=f"C{color}",
                       alpha=0.15)
        continue
      xs = [g["flops"] / 1e12 for g in points]
      ys = [value(g, panel) for g in points]
      if any(y is None for y in ys):
        continue
      if all(spread):
        ax.vlines(xs, [100 * s[0] for s in spread], [100 * s[1] for s in spread],
                  color=f"C{color}", alpha=0.5)
      ax.plot(xs, ys, "o-", color=f"C{color}", label=name)
  # From 0, the untrained control's compute: with one budget the axis would
  # otherwise zoom into the runs' rounding (79.99-80.01 TFLOPs).
  right = 1.05 * max(g["flops"] for g in summary["groups"]) / 1e12
  for ax, panel in zip(axes[0], panels):
    ax.set(xlabel="pretraining TFLOPs", title=panel.replace("_", " "), xlim=(0, right))
    # At least 10 points tall: a 2-point axis makes fine-tuning noise look like
    # a ranking.
    low, high = ax.get_ylim()
    if high - low < 10:
      middle = (low + high) / 2
      ax.set_ylim(middle - 5, middle + 5)
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def finetune_encoder(run: dict, tasks, protocol: dict, data_dir: str,
                     select_dir: str, out: str) -> dict:
  """Fine-tunes one encoder by the protocol; returns its report, each task's
  entry at the learning rate its selection picked (`selected_by`)."""
  learning_rates = list(protocol.get("learning_rates") or
                        [protocol["common"]["learning_rate"]])
  sweep_dir = os.path.join(out, "finetune", run["name"])
  chosen = {}
  for task in tasks:
    overrides = {**protocol["common"], **protocol["tasks"].get(task, {}),
                 "init_from": run["workdir"]}
    chosen[task] = learning_rates[0]
    if len(learning_rates) > 1:
      grid_dir = os.path.join(out, "select", run["name"])
      finetune_sweep.run_grid(finetune_sweep.grid_configs(
          protocol["config_file"], [task], {**overrides, "data.dir": select_dir},
          learning_rates,
          protocol.get("select_seeds") or protocol["seeds"][:1]), grid_dir)
      by_rate = finetune_sweep.write_report(grid_dir, "last")["tasks"][task]
      chosen[task] = by_rate["learning_rate"]
    finetune_sweep.run_grid(finetune_sweep.grid_configs(
        protocol["config_file"], [task], {**overrides, "data.dir": data_dir},
        [chosen[task]],
        protocol["seeds"]), sweep_dir)
  report = finetune_sweep.write_report(sweep_dir, "last")
  for task, entry in report["tasks"].items():
    # Only the selected rate counts, even if the directory holds others (a
    # selection that changed): picking among them here would be picking on
    # the scored data.
    at = entry["by_learning_rate"][f"{chosen[task]:g}"]
    entry.update(learning_rate=chosen[task], median=at["median"],
                 num_seeds=len(at["seeds"]),
                 seed_range=[min(at[entry["main_metric"]]),
                             max(at[entry["main_metric"]])],
                 selected_by=("a split of the training data" if len(learning_rates) > 1
                              else "fixed"))
  return report


def blimp_scores(runs, blimp_dir: str, out: str, *, max_pairs: int = 0,
                 all_steps: bool = False) -> dict:
  """BLiMP means (and results) of every run's newest checkpoint, or, with
  `all_steps`, of each kept checkpoint; cached per run and step, so a rerun
  scores only what is new."""
  pairs = blimp.read_pairs(blimp_dir, max_pairs)
  scores = {}
  for run in runs:
    steps = (checkpoints.committed_steps(run["workdir"]) if all_steps
             else [checkpoints.latest_step(run["workdir"])])
    for step in steps:
      path = os.path.join(out, "blimp_curve" if all_steps else "blimp", run["name"],
                          f"step{step}_{max_pairs or 'all'}.json")
      if not os.path.isfile(path):
        loaded = blimp.load_run(run["workdir"], step)
        good, bad = blimp.score_pairs(loaded.model_cfg, loaded.params,
                                      loaded.tokenizer, pairs)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
          json.dump({"step": step, "variant": blimp.DEFAULT_VARIANT,
                     **blimp.aggregate(pairs, good, bad)}, f, indent=2)
        os.replace(path + ".tmp", path)
      with open(path) as f:
        scores.setdefault(run["name"], {})[step] = json.load(f)
  return scores


def mask_accuracy_curve(workdir: str) -> list[tuple[int, float]]:
  """(step, held-out [MASK] accuracy) of every evaluation of a run."""
  return [(r["step"], r["eval/mask_accuracy"]) for r in workdir_lib.evaluations(workdir)]


def plot_curves(runs, curve_scores: dict, path: str, log_flops: bool = False) -> None:
  """BLiMP and held-out [MASK] accuracy against pretraining FLOPs per run (on a
  log axis with `log_flops`, for runs of very different budgets)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
  for color, run in enumerate(runs):
    at = lambda step, config=run["config"]: config_lib.train_flops_until(config, step) / 1e12
    by_step = sorted(curve_scores.get(run["name"], {}).items())
    if by_step:
      # A 95% binomial interval of each point's pairs: what a BLiMP of this many
      # pairs can tell apart.
      half = [196 * (v["mean"] / 100 * (1 - v["mean"] / 100) / v["pairs"]) ** 0.5
              for _, v in by_step]
      axes[0].errorbar([at(s) for s, _ in by_step], [v["mean"] for _, v in by_step],
                       yerr=half, fmt="o-", capsize=2, color=f"C{color}",
                       label=f"{run['name']} ({by_step[0][1]['pairs']} pairs, 95% CI)")
    curve = mask_accuracy_curve(run["workdir"])
    if len(curve) > 1:
      axes[1].plot([at(s) for s, _ in curve], [100 * a for _, a in curve],
                   "-", color=f"C{color}", label=run["name"])
  axes[0].axhline(50, color="gray", ls="--", lw=1, label="chance")
  axes[0].set(title="BLiMP (mean over paradigms)", ylabel="accuracy (%)")
  low, high = axes[0].get_ylim()  # Never zoomed below 40-70: noise is not a trend.
  axes[0].set_ylim(min(low, 40), max(high, 70))
  axes[1].set(title="held-out [MASK] accuracy", ylabel="accuracy (%)")
  for ax in axes:
    ax.set(xlabel="pretraining TFLOPs")
    if log_flops:
      ax.set_xscale("log")
      ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    else:
      ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def compare(config_file: str, out: str, overrides: dict, *, glue_dir: str,
            tasks=("sst2", "qnli", "cola"), num_tokens: int = 4096,
            blimp_dir: str = "", blimp_max_pairs: int = 0,
            blimp_curve_pairs: int = 0, command: str = "") -> dict:
  storage.check_local(out, "--out")
  out = os.path.abspath(out)
  single_dev = [t.name for t in glue_data.TASKS.values()
                if [e.tsv_file for e in t.eval_splits] == ["dev.tsv"]]
  unknown = sorted(set(tasks) - set(single_dev))
  if unknown:
    raise ValueError(f"--tasks: {unknown} not supported (the comparison scores one "
                     f"dev.tsv per task); use some of {sorted(single_dev)}")
  module = config_lib.load_config_module(config_file)
  arg = config_file.split(":", 1)[1] if ":" in config_file else None
  if not hasattr(module, "get_finetune"):
    raise ValueError(f"{config_file.split(':')[0]} defines no get_finetune(arg), the "
                     "fine-tuning protocol (see configs/compare.py)")
  protocol = module.get_finetune(arg)
  if tasks and not os.path.isfile(protocol.get("config_file", "")):
    raise ValueError(f"{config_file.split(':')[0]}: get_finetune must name the "
                     "fine-tuning config its tasks come from, as 'config_file' (e.g. "
                     "the path of configs/glue.py); got "
                     f"{protocol.get('config_file')!r}")
  sweep.expand(config_file, overrides)  # Every config error before any work.
  if blimp_dir:
    blimp.read_pairs(blimp_dir, 1)  # A wrong --blimp_dir before hours of work.
  data_dir = glue_root(glue_dir, out, tasks) if tasks else ""
  select_dir = (selection_root(data_dir, out, tasks)
                if tasks and len(protocol.get("learning_rates") or ()) > 1 else "")

  overrides = dict(overrides)
  if not overrides.get("tokenizer.path"):
    overrides["tokenizer.path"] = shared_tokenizer(config_file, overrides, out)
  check_heldout_for_ranks(config_file, overrides, num_tokens)
  runs = sweep.run_sweep(config_file, os.path.join(out, "pretrain"), overrides)

  blimp_results = (blimp_scores(runs, blimp_dir, out, max_pairs=blimp_max_pairs)
                   if blimp_dir else {})
  if blimp_dir and blimp_curve_pairs:
    curve = blimp_scores(runs, blimp_dir, out, max_pairs=blimp_curve_pairs,
                         all_steps=True)
    plot_curves([r for r in runs if r["config"].total_steps > 1], curve,
                os.path.join(out, "curves.png"))

  reports = {}
  for run in runs:
    if tasks:
      reports[run["name"]] = finetune_encoder(run, tasks, protocol, data_dir,
                                              select_dir, out)

  # Measured anew on each (resumed) call: its runs may have trained on.
  ranks = analyze.analyze([r["workdir"] for r in runs], os.path.join(out, "rank"),
                          num_tokens=num_tokens, overwrite=True)["runs"]
  summary = summarize(runs, reports, ranks,
                      {name: max(by_step.items())[1]["mean"]
                       for name, by_step in blimp_results.items()})
  summary.update(command=command, config=config_file, tasks=list(tasks),
                 finetune=protocol)
  with open(os.path.join(out, "comparison.json"), "w") as f:
    json.dump(summary, f, indent=2, default=str)
  with open(os.path.join(out, "comparison.md"), "w") as f:
    f.write(f"`{command}`\n\n" + format_markdown(summary, tasks) + "\n")
  plot(summary, tasks, os.path.join(out, "comparison.png"))
  return summary


def _define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "A sweep config with get_finetune, "
                                  "e.g. configs/compare.py:size=tiny,tflops=20",
                                  lock_config=False)
  flags.DEFINE_string("out", None, "Where everything goes")
  flags.DEFINE_string("glue_dir", "", "GLUE root with SST-2, CoLA, QNLI (*.tsv)")
  flags.DEFINE_list("tasks", ["sst2", "qnli", "cola"], "Downstream tasks")
  flags.DEFINE_integer("num_tokens", 4096, "Tokens per layer for the effective rank")
  flags.DEFINE_string("blimp_dir", "", "A folder of BLiMP <UID>.jsonl files: adds "
                      "each encoder's BLiMP score (maelm_jax.evaluate.blimp)")
  flags.DEFINE_integer("blimp_max_pairs", 0, "BLiMP pairs per paradigm (0: all)")
  flags.DEFINE_integer("blimp_curve_pairs", 0, "With --blimp_dir: also score every "
                       "kept checkpoint on this many pairs per paradigm (curves.png)")
  flags.mark_flags_as_required(["config", "out"])


def main() -> None:
  FLAGS = flags.FLAGS
  if FLAGS.tasks and not FLAGS.glue_dir:
    raise app.UsageError("--glue_dir is required for --tasks (or pass --tasks=)")
  summary = compare(
      config_flags.get_config_filename(FLAGS["config"]), FLAGS.out,
      config_flags.get_override_values(FLAGS["config"]), glue_dir=FLAGS.glue_dir,
      tasks=FLAGS.tasks, num_tokens=FLAGS.num_tokens, blimp_dir=FLAGS.blimp_dir,
      blimp_max_pairs=FLAGS.blimp_max_pairs,
      blimp_curve_pairs=FLAGS.blimp_curve_pairs,
      command=cli.command_line("maelm_jax.compare"))
  logging.info("wrote %s", os.path.join(os.path.abspath(FLAGS.out), "comparison.md"))
  print(format_markdown(summary, FLAGS.tasks))


# `python -m` and the maelm-compare command (setup.py's console scripts).
console = cli.command(main, _define_flags,
                      stopped="the running run saved; the same command resumes")

if __name__ == "__main__":
  console()

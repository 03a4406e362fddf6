"""A run's figures, drawn from its `metrics.jsonl` by process 0.

- `learning_curve.png` (pretraining, rewritten at every evaluation): held-out
  accuracy and loss on the `[MASK]`ed / dropped positions against the step, with
  the unigram and bigram baselines as flat lines (baselines.py), so whether a run
  learned is visible at a glance; beside them the training loss, the learning
  rate and the throughput of every logged step, so a run with few evaluations is
  still a curve.
- `finetuning_curve.png` (fine-tuning, at every epoch): training loss and
  learning rate per logged step, the dev metrics per epoch.

Each function returns what it drew ({panel: {series: (xs, ys)}}), which the
tests read.

`MAELM_PLOTS=0` in a run's environment: no figures (a run's other outputs are
the same). For many short runs where a figure costs more than its steps (a draw
and matplotlib's import, measured in benchmarks/test-suite-cost.md); the test
suite sets it (tests/conftest.py).
"""

from __future__ import annotations

import os

from maelm_jax.core import workdir as workdir_lib

FILENAME = "learning_curve.png"
FINETUNING_FILENAME = "finetuning_curve.png"


def enabled() -> bool:
  """False where MAELM_PLOTS is 0, false, no or off: the runs draw no figures."""
  return os.environ.get("MAELM_PLOTS", "1").strip().lower() not in ("0", "false", "no",
                                                                   "off")


def _series(records, key, scale=1.0):
  points = [(r["step"], scale * r[key]) for r in records if key in r]
  return [p[0] for p in points], [p[1] for p in points]


def _draw(panels: dict, path: str, title: str, baselines: dict | None = None) -> None:
  """One subplot per panel ({panel: {series: (xs, ys)}}), written atomically."""
  # A Figure of its own, not pyplot's: no global state or GUI backend, and a
  # second less of every run's start-up (pyplot's import).
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  columns = 2
  rows = -(-len(panels) // columns)
  fig = Figure(figsize=(10, 3.6 * rows))
  axes = fig.subplots(rows, columns, squeeze=False)
  for ax, (panel, series) in zip(axes.flat, panels.items()):
    for i, (label, (xs, ys)) in enumerate(series.items()):
      ax.plot(xs, ys, "o-" if len(xs) < 30 else "-", ms=3, color=f"C{i}", label=label)
    for label, (value, style) in (baselines or {}).get(panel, {}).items():
      ax.axhline(value, linestyle=style, color="gray", label=label)
    ax.set(xlabel="step", ylabel=panel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path + ".tmp.png", dpi=100)
  os.replace(path + ".tmp.png", path)


def plot_learning_curve(workdir: str, title: str = "") -> dict | None:
  """Writes `workdir/learning_curve.png`; returns what it drew (None: no
  evaluation yet)."""
  records = workdir_lib.read_metrics(workdir)
  evals = [r for r in records if "eval/mask_accuracy" in r]
  if not evals:
    return None
  panels = {
      "accuracy on held-out [MASK] slots (%)": {
          "model": _series(evals, "eval/mask_accuracy", 100)},
      "loss (nats)": {"held-out [MASK] slots": _series(evals, "eval/mask_loss"),
                      "training (selected positions)": _series(records, "train/loss")},
      "learning rate": {"lr": _series(records, "lr")},
      "throughput (tokens/s)": {"tokens/s": _series(records, "tokens_per_sec")},
  }
  last = evals[-1]
  baselines = {"accuracy on held-out [MASK] slots (%)": {}, "loss (nats)": {}}
  for key, panel, scale, style, label in (
      ("eval/unigram_accuracy", "accuracy on held-out [MASK] slots (%)", 100, "--",
       "unigram (always the most frequent piece)"),
      ("eval/bigram_accuracy", "accuracy on held-out [MASK] slots (%)", 100, ":",
       "bigram (left neighbour)"),
      ("eval/unigram_loss", "loss (nats)", 1, "--", "unigram cross-entropy (plateau)")):
    if key in last:
      baselines[panel][label] = (scale * last[key], style)
  _draw(panels, os.path.join(workdir, FILENAME),
        title or os.path.basename(os.path.abspath(workdir)), baselines)
  return panels


def plot_finetuning_curve(workdir: str, metrics: list[str], title: str = "") -> dict | None:
  """Writes `workdir/finetuning_curve.png`: training loss and learning rate per
  logged step, and each of `metrics` (dev, per epoch); returns what it drew."""
  records = workdir_lib.read_metrics(workdir)
  if not any("train/loss" in r for r in records):
    return None
  panels = {"training loss": {"loss": _series(records, "train/loss")},
            "learning rate": {"lr": _series(records, "lr")}}
  dev = {name: _series(records, f"eval/{name}") for name in metrics}
  if any(xs for xs, _ in dev.values()):
    panels["dev (per epoch)"] = {name: s for name, s in dev.items() if s[0]}
  _draw(panels, os.path.join(workdir, FINETUNING_FILENAME),
        title or os.path.basename(os.path.abspath(workdir)))
  return panels

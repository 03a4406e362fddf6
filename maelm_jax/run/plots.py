"""The learning-curve figure of a pretraining run: `learning_curve.png`.

Held-out accuracy and loss on the `[MASK]`ed / dropped positions against the
step, with the run's unigram and bigram baselines as flat lines (baselines.py),
so whether a run learned is visible at a glance. Rewritten at every evaluation
from `metrics.jsonl`, by process 0.
"""

from __future__ import annotations

import os

from maelm_jax.core import workdir as workdir_lib

FILENAME = "learning_curve.png"


def plot_learning_curve(workdir: str, title: str = "") -> str | None:
  """Writes `workdir/learning_curve.png`; returns its path (None: nothing to plot)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  evals = workdir_lib.evaluations(workdir)
  if not evals:
    return None
  steps = [r["step"] for r in evals]
  fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 3.8))
  acc_ax.plot(steps, [100 * r["eval/mask_accuracy"] for r in evals], "o-",
              color="C0", label="model")
  loss_ax.plot(steps, [r["eval/mask_loss"] for r in evals], "o-", color="C0",
               label="model")
  last = evals[-1]
  for key, ax, scale, style, label in (
      ("eval/unigram_accuracy", acc_ax, 100, "--", "unigram (always the most "
       "frequent piece)"),
      ("eval/bigram_accuracy", acc_ax, 100, ":", "bigram (left neighbour)"),
      ("eval/unigram_loss", loss_ax, 1, "--", "unigram cross-entropy (plateau)")):
    if key in last:
      ax.axhline(scale * last[key], linestyle=style, color="gray", label=label)
  acc_ax.set(xlabel="step", ylabel="accuracy on held-out [MASK] slots (%)")
  loss_ax.set(xlabel="step", ylabel="loss on held-out [MASK] slots (nats)")
  for ax in (acc_ax, loss_ax):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle(title or os.path.basename(os.path.abspath(workdir)))
  fig.tight_layout()
  path = os.path.join(workdir, FILENAME)
  fig.savefig(path + ".tmp.png", dpi=100)
  plt.close(fig)
  os.replace(path + ".tmp.png", path)
  return path

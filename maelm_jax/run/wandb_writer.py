"""Weights & Biases logging, optional: the scalars metrics.jsonl records, the
run's resolved config, and its plots, into one W&B run per workdir.

`--config.wandb_project=NAME` turns it on (pretraining and fine-tuning alike;
`--config.wandb_entity` picks a team). W&B's own variables apply: WANDB_MODE=offline
writes the run under `<workdir>/wandb` for a later `wandb sync`, WANDB_API_KEY logs
in on a machine without `wandb login`. Process 0 logs, as it writes metrics.jsonl.

A resumed workdir continues its W&B run (the id is kept in `<workdir>/wandb_run_id`).
The steps a resume redoes (those after the newest checkpoint) are in W&B's history
already and W&B keeps its first copy; metrics.jsonl keeps the redone ones. Like the
TensorBoard events, W&B is a view: a failure to log warns once and the run goes on.
"""

from __future__ import annotations

import importlib.util
import math
import os
import uuid

from absl import logging


RUN_ID_FILE = "wandb_run_id"


def project(config) -> str:
  return str(config.wandb_project).strip()


def problem(config) -> str | None:
  """Why the config's W&B logging cannot start, in one line with the fix; None
  when it is off or can start. Checked with the config, before any work."""
  if project(config) and importlib.util.find_spec("wandb") is None:
    return (f"wandb_project={project(config)!r} needs the wandb package: pip install "
            "wandb (or the checkout's extra: pip install -e '.[wandb]'), or drop "
            "--config.wandb_project")
  return None


class WandbWriter:
  """One W&B run for a workdir: scalars at their step, plots as images."""

  def __init__(self, workdir: str, config):
    import wandb  # pylint: disable=g-import-not-at-top
    self._wandb = wandb
    id_path = os.path.join(workdir, RUN_ID_FILE)
    if os.path.exists(id_path):
      with open(id_path, encoding="utf-8") as f:
        run_id = f.read().strip()
    else:
      run_id = uuid.uuid4().hex[:12]
      with open(id_path, "w", encoding="utf-8") as f:
        f.write(run_id + "\n")
    entity = str(config.wandb_entity).strip() or None
    self.run = wandb.init(
        project=project(config), entity=entity, id=run_id, resume="allow",
        name=os.path.basename(os.path.normpath(workdir)), dir=workdir,
        config=config.to_dict())
    logging.info("W&B: run %s of project %s (%s)", run_id, project(config),
                 os.environ.get("WANDB_MODE", "online"))

  def write(self, step: int, metrics: dict[str, float]) -> None:
    self.run.log({k: float(v) for k, v in metrics.items() if math.isfinite(float(v))},
                 step=int(step))

  def image(self, step: int, key: str, path: str) -> None:
    self.run.log({key: self._wandb.Image(path)}, step=int(step))

  def close(self) -> None:
    self.run.finish()

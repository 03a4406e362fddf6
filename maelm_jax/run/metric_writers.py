"""metrics.jsonl + TensorBoard (+ W&B when asked) + console, written by process 0 only."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil

from absl import logging

from maelm_jax.core import errors, workdir as workdir_lib
from maelm_jax.run import tensorboard_events, wandb_writer


class MetricWriter:

  def __init__(self, workdir: str, is_main: bool, config=None):
    self.is_main = is_main
    self._jsonl = self._tb = self._wandb = None
    if not is_main:
      return
    if config is not None and wandb_writer.project(config):
      try:
        self._wandb = wandb_writer.WandbWriter(workdir, config)
      except Exception as error:  # pylint: disable=broad-except
        logging.warning("no W&B logging (%s: %s); metrics.jsonl and TensorBoard "
                        "are written", type(error).__name__, error)
    self._jsonl = open(workdir_lib.metrics_path(workdir), "a")
    try:
      self._tb = tensorboard_events.EventFileWriter(os.path.join(workdir, "tensorboard"))
    except OSError as error:  # TensorBoard events are a view; jsonl is the record.
      logging.warning("no TensorBoard events (%s); metrics.jsonl is written", error)

  def write(self, step: int, metrics: dict[str, float]) -> None:
    if not self.is_main:
      return
    record = {"step": int(step)}
    record.update({k: float(v) for k, v in metrics.items()})
    start = self._jsonl.tell()
    try:
      self._jsonl.write(json.dumps(record) + "\n")
      self._jsonl.flush()
    except OSError as error:
      # Never leave half a line: cut the file back to the last whole record.
      # The step's state is in memory and its checkpoint on its own schedule;
      # the run stops here, and the same command redoes the steps after the
      # newest checkpoint, logging each of them once.
      self._jsonl = _reopen_truncated(self._jsonl, start)
      where = os.path.dirname(self._jsonl.name)
      if error.errno == errno.ENOSPC:
        usage = shutil.disk_usage(where)
        raise errors.DiskFull(
            f"no space left on the disk of {where} while logging step {step} to "
            f"metrics.jsonl ({usage.free / 2**20:,.0f} MB free); free space, then "
            "run the same command: it resumes from the newest checkpoint") from None
      raise
    if self._tb is not None:
      try:
        self._tb.write_scalars(int(step), {k: float(v) for k, v in metrics.items()
                                           if math.isfinite(float(v))})
        self._tb.flush()
      except Exception as error:  # pylint: disable=broad-except
        # TensorBoard events are a view of metrics.jsonl: losing them must not
        # stop a run.
        logging.warning("TensorBoard events stopped at step %d (%s: %s); "
                        "metrics.jsonl goes on", step, type(error).__name__, error)
        self._tb = None
    self._to_wandb("the scalars", lambda run: run.write(step, metrics))

  def image(self, step: int, key: str, path: str) -> None:
    """A plot the run drew at `step` (`path`), for the trackers that show images
    (W&B)."""
    if self.is_main:
      self._to_wandb(key, lambda run: run.image(step, key, path))

  def _to_wandb(self, what: str, log) -> None:
    if self._wandb is None:
      return
    try:
      log(self._wandb)
    except Exception as error:  # pylint: disable=broad-except
      # A view of metrics.jsonl, as TensorBoard's events: never stops a run.
      logging.warning("W&B logging stopped at %s (%s: %s); metrics.jsonl goes on",
                      what, type(error).__name__, error)
      self._wandb = None

  def close(self) -> None:
    if self._jsonl is not None:
      self._jsonl.close()
    if self._tb is not None:
      self._tb.close()
    if self._wandb is not None:
      try:
        self._wandb.close()
      except Exception as error:  # pylint: disable=broad-except
        logging.warning("W&B run did not finish cleanly: %s", error)


def _reopen_truncated(file, size: int):
  """`file` (append mode) cut to `size` bytes and opened again for appending."""
  path = file.name
  try:
    file.close()
  except OSError:  # Its buffer could not be flushed: the disk is still full.
    pass
  os.truncate(path, size)
  return open(path, "a")


def truncate_jsonl(path: str, last_step: int) -> None:
  """Drops the records of steps after `last_step` (the step a run resumes from),
  so that no step appears twice. A torn last line (the process died while
  writing it) is dropped too; a broken line elsewhere is named, not guessed at."""
  if not os.path.exists(path):
    return
  with open(path) as f:
    lines = [line for line in f if line.strip()]
  kept = []
  for number, line in enumerate(lines, 1):
    try:
      record = json.loads(line)
    except ValueError:
      if number == len(lines):
        logging.warning("%s: dropping its torn last line (%r)", path, line[:80])
        continue
      raise ValueError(f"{path}, line {number}, is not JSON ({line[:80]!r}); "
                       "delete or repair that line and rerun") from None
    if record["step"] <= last_step:
      kept.append(line if line.endswith("\n") else line + "\n")
  if len(kept) != len(lines):
    with open(path + ".tmp", "w") as f:
      f.writelines(kept)
    os.replace(path + ".tmp", path)


def format_console(step: int, total: int, m: dict[str, float], eta: str = "") -> str:
  """One log line of a step's metrics; `eta`: the time left, when known."""
  parts = [f"step {step}/{total}"]
  for key, fmt in (("train/loss", ".4f"), ("train/accuracy", ".3f"), ("lr", ".2e"),
                   ("tokens_per_sec", ",.0f"), ("mfu", ".2%"), ("eval/loss", ".4f"),
                   ("eval/accuracy", ".3f"), ("eval/mask_loss", ".4f"),
                   ("eval/mask_accuracy", ".3f")):
    if key in m:
      parts.append(f"{key.split('/')[-1] if key.startswith('train/') else key} "
                   f"{format(m[key], fmt)}")
  if eta:
    parts.append(f"ETA {eta}")
  return " | ".join(parts)

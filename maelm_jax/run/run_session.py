"""One run's hold on its workdir, the same for pretraining and fine-tuning.

Both loops (`train.py`, `finetune/run.py`) go through the same steps, owned here:

  1. `claim(config, workdir, mode)`, before anything is written: the directory is
     created or checked writable; a workdir of another mode is refused
     (`workdir.check_mode`), and so is one holding a run of another config, with
     the flags that would resume it as it was saved.
  2. `hold(workdir)`: process 0 holds the workdir's lock (`workdir.Lock`) for the
     whole run; the other processes of the run share the workdir by design.
  3. The loop builds its state and restores its newest readable checkpoint.
  4. `RunSession(workdir, config, manager, restored_step)`, once the run is known
     to fit the workdir (the checkpoints were read, not touched): `config.json` is
     written and `metrics.jsonl` cut back to the step the run goes on from, so
     redone steps are logged once; the metric writer (metrics.jsonl, TensorBoard)
     and the SIGTERM / SIGINT watcher open. The loop asks `stop_requested(step)`
     after each step, saves, and returns `stopped(step)` (one message, the same
     for both loops). Leaving the `with` block, however it is left, waits for the
     last checkpoint to commit and closes all of it.

What is each loop's own stays there: the steps, the evaluation, the data, and
what to save at a stop (pretraining: the state and the data iterator; fine-tuning:
the state and where in the epoch it was).
"""

from __future__ import annotations

import contextlib
import json

from absl import logging
import jax

from maelm_jax.core import storage, workdir as workdir_lib
from maelm_jax.run import checkpoints, config_lib, host_memory, metric_writers, preemption


def claim(config, workdir: str, mode: str) -> None:
  """Everything that can refuse `workdir` for this run, before any write."""
  workdir_lib.create(workdir)
  if mode == "pretrain":
    workdir_lib.check_mode(workdir, mode)
  else:
    workdir_lib.check_mode(workdir, mode, config.init_from)
  checkpoints.tidy_unfinished_steps(workdir, refuse_newer=mode == "pretrain")
  check_same_config(config, workdir, mode)


def check_same_config(config, workdir: str, mode: str) -> None:
  """A workdir holds one run. The same config resumes it (fine-tuning: starts it
  over); another is refused, naming each difference and the flags that resume
  the saved run, so that two runs never mix in one workdir. Pretraining may pass
  `allow_config_change=True` to resume with new values anyway."""
  saved = workdir_lib.read_config(workdir)
  pretraining = mode == "pretrain"
  if saved is None or (pretraining and config.get("allow_config_change", False)):
    return
  current = json.loads(config.to_json_best_effort())
  resumable = (config_lib.RESUMABLE_CHANGES if pretraining
               else config_lib.FINETUNE_RESUMABLE_CHANGES)
  differences = config_lib.config_differences(saved, current, resumable=resumable)
  if not differences:
    return
  as_saved = " ".join(config_lib.resume_flags(saved, current, resumable=resumable))
  raise workdir_lib.WorkdirError(
      f"workdir {workdir} "
      + ("belongs to a run with a different config" if pretraining
         else "holds a fine-tuning run with another config")
      + ":\n  " + "\n  ".join(differences)
      + (f"\nTo resume it as it was saved, add: {as_saved}" if as_saved else "")
      + ("\nOr use a new --workdir, or pass --config.allow_config_change=True to "
         "resume this run with the new values anyway." if pretraining
         else "\nOr pass a new --workdir."))


@contextlib.contextmanager
def hold(workdir: str):
  """Process 0 holds the workdir's lock while the block runs (one live run)."""
  if jax.process_index() != 0:
    yield
    return
  with workdir_lib.Lock(workdir):
    try:
      yield
    finally:  # A bucket workdir's last files, while the run still holds it.
      storage.push(workdir)


@contextlib.contextmanager
def closed_on_error(manager):
  """Closes the checkpoint `manager` if the block raises. From its opening (for
  the restore) until a RunSession owns it, a refused resume, a bad init_from or a
  failed compilation would otherwise leave orbax's threads running, in a notebook
  for as long as the kernel lives."""
  try:
    yield manager
  except BaseException:
    try:
      manager.close()
    except Exception as close_error:  # pylint: disable=broad-except
      # The run's own error is the one to see; this one only in the log.
      logging.warning("closing the checkpoint manager after the error failed: %s",
                      close_error)
    raise


class RunSession:
  """A started run's files, writer and stop signal (see the module docstring)."""

  def __init__(self, workdir: str, config, manager, restored_step: int | None):
    self.workdir, self.manager = workdir, manager
    self.is_main = jax.process_index() == 0
    if self.is_main:
      workdir_lib.write_config(config, workdir)
      # Records after the step the run goes on from are redone.
      metric_writers.truncate_jsonl(workdir_lib.metrics_path(workdir),
                                    restored_step or 0)
    self.writer = metric_writers.MetricWriter(workdir, self.is_main, config)
    if self.is_main:  # The tokenizer and config in the bucket before a checkpoint.
      storage.push(workdir)
    self.page_releaser = host_memory.FreePageReleaser()
    try:
      self.watcher = preemption.PreemptionWatcher(
          manager, config_lib.max_runtime_seconds(config))
    except BaseException:
      self.writer.close()
      raise  # The caller's closed_on_error closes the manager.

  def write(self, step: int, metrics: dict) -> None:
    """Records `metrics` of `step`; under glibc, freed host pages go back to the
    OS at a record once every 30 s (host_memory.FreePageReleaser)."""
    self.writer.write(step, metrics)
    self.page_releaser.maybe_release()
    if self.is_main:
      storage.push(self.workdir, force=False)

  def stop_requested(self, step: int) -> bool:
    """True once a SIGTERM / SIGINT has come (on any process), or max_runtime has
    passed: save and stop."""
    return self.watcher.reached(step)

  def stopped(self, step: int) -> dict:
    """The stop's one message, and the record both loops return for it."""
    signal_name = self.watcher.signal_name or "SIGTERM"
    why = {"SIGINT": "interrupted (Ctrl-C)", "max_runtime": "max_runtime reached"}
    logging.warning("%s: saved a checkpoint at step %d in %s; run the same command "
                    "to resume", why.get(signal_name, "preempted"), step,
                    self.manager.directory)
    return {"preempted_at_step": step, "stopped_by": signal_name}

  def close(self) -> None:
    """The last checkpoint committed, the signal handlers back, the files closed."""
    try:
      self.watcher.close()
      self.manager.wait_until_finished()
      self.manager.close()
    finally:
      self.writer.close()

  def __enter__(self) -> "RunSession":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

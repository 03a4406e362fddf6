"""Deleting an old checkpoint (keep_checkpoints) is safe at any instant: a kill
while a step is pruned never leaves a numbered folder that blocks a start, and a
start finishes what a kill cut short, in one line.

Found from outside: a kill while orbax deleted step 40's files left
`checkpoints/40/state/` without `_CHECKPOINT_METADATA`, and every later start
stopped with "not a finished maelm_jax checkpoint" although 42, 44 and 46 stood
complete beside it."""

import os
import shutil

from absl import logging as absl_logging
import numpy as np
import orbax.checkpoint as ocp
import pytest

from maelm_jax.run import checkpoints, run_session
from tests.helpers import tiny_config

STATE = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64),
         "b": np.ones(64, np.float32), "step": np.int32(0)}


def save_steps(workdir, steps, keep=1):
  config = tiny_config(keep_checkpoints=keep)
  manager = checkpoints.make_manager(str(workdir), config, item_names=("state",))
  for step in steps:
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(STATE)),
                 force=True)
  manager.wait_until_finished()
  manager.close()


def numbered(workdir):
  directory = workdir / "checkpoints"
  return {p.name: checkpoints.is_committed(str(p)) for p in directory.iterdir()
          if p.name.isdigit()}


def test_at_every_instant_of_a_prune_every_numbered_step_is_complete(
    tmp_path, monkeypatch):
  """Each file or folder deletion is an instant a kill can land: before each
  one, every numbered folder in checkpoints/ still has its commit marker."""
  seen = []
  real_unlink, real_rmdir, real_remove = os.unlink, os.rmdir, os.remove

  def watched(real):
    def delete(path, *args, **kwargs):
      if (tmp_path / "checkpoints").is_dir():
        seen.append(numbered(tmp_path))
      return real(path, *args, **kwargs)
    return delete

  monkeypatch.setattr(os, "unlink", watched(real_unlink))
  monkeypatch.setattr(os, "rmdir", watched(real_rmdir))
  monkeypatch.setattr(os, "remove", watched(real_remove))
  save_steps(tmp_path, [1, 2, 3])
  monkeypatch.undo()
  assert numbered(tmp_path) == {"3": True}  # Steps 1 and 2 were pruned.
  assert len(seen) > 10  # The prunes' deletions were watched.
  half_deleted = [s for s in seen if not all(s.values())]
  assert half_deleted == [], half_deleted[:3]


def test_a_prune_killed_midway_leaves_only_a_pruning_folder(tmp_path, monkeypatch):
  save_steps(tmp_path, [1], keep=1)
  calls = []

  def killed(path, *args, **kwargs):
    calls.append(path)
    if len(calls) == 2:
      raise KeyboardInterrupt  # The process dies here.
    return real_remove(path, *args, **kwargs)

  real_remove = os.remove
  monkeypatch.setenv(checkpoints.PRUNE_SECONDS_ENV, "0.01")  # File by file.
  monkeypatch.setattr(os, "remove", killed)
  with pytest.raises(KeyboardInterrupt):
    checkpoints.remove_step(str(tmp_path / "checkpoints" / "1"))
  monkeypatch.undo()
  names = sorted(os.listdir(tmp_path / "checkpoints"))
  assert names == ["1.pruning"]
  assert checkpoints.step_dirs(str(tmp_path)) == {}


def test_a_start_after_a_kill_during_a_prune_goes_on_and_says_so(tmp_path):
  """The report's state: 40 half deleted (only `state/`), 42-46 complete, and a
  `.pruning` folder of this version's prune. The start goes on, removes both,
  says so in one line, and touches nothing else."""
  save_steps(tmp_path, [42, 44, 46], keep=3)
  directory = tmp_path / "checkpoints"
  shutil.copytree(directory / "42" / "state", directory / "40" / "state")
  shutil.copytree(directory / "42", directory / "38.pruning")
  (directory / "38.pruning" / "_CHECKPOINT_METADATA").unlink()
  before = {p: p.read_bytes() for n in ("42", "44", "46")
            for p in (directory / n).rglob("*") if p.is_file()}
  warnings = []
  absl_logging.get_absl_logger().addFilter(
      lambda record: warnings.append(record.getMessage()) or True)
  run_session.claim(tiny_config(), str(tmp_path), "pretrain")
  assert sorted(os.listdir(directory)) == ["42", "44", "46"]
  assert {p: p.read_bytes() for p in before} == before
  said = [w for w in warnings if "unfinished step" in w]
  assert len(said) == 1 and "40" in said[0] and "(46)" in said[0], warnings
  assert checkpoints.latest_step(str(tmp_path)) == 46


def test_an_unfinished_step_newer_than_every_complete_one_still_stops_the_run(
    tmp_path):
  """That one may be a copy by hand or a torn save that the next save would
  collide with: named, and left alone."""
  save_steps(tmp_path, [5], keep=1)
  foreign = tmp_path / "checkpoints" / "9"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(checkpoints.CheckpointMismatch, match="not a finished"):
    run_session.claim(tiny_config(), str(tmp_path), "pretrain")
  assert (foreign / "notes.txt").read_text() == "mine"
  assert checkpoints.latest_step(str(tmp_path)) == 5


def test_the_manager_uses_the_safe_pruner(tmp_path):
  """Pins orbax's private hook that the pruner replaces: an orbax upgrade that
  renames it fails here, not silently in a user's run."""
  manager = checkpoints.make_manager(str(tmp_path), tiny_config(),
                                     item_names=("state",))
  try:
    assert isinstance(manager._checkpoint_deleter, checkpoints.StepPruner)  # pylint: disable=protected-access
  finally:
    manager.close()

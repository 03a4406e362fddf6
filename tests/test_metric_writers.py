"""What the metric writer does when its disk or a tracker fails mid-run
(run/metric_writers.py): metrics.jsonl, the record, never keeps half a line;
TensorBoard and W&B, views of it, stop without stopping the run."""

import errno
import json

import pytest

from maelm_jax.core import errors
from maelm_jax.run import metric_writers


class FullDiskAfter:
  """A file that takes `room` more characters, then fails as a full disk does:
  the part of the write that fitted stays in the file."""

  def __init__(self, file, room: int):
    self._file, self._room = file, room

  def write(self, text):
    if len(text) > self._room:
      self._file.write(text[:self._room])
      self._file.flush()
      self._room = 0
      raise OSError(errno.ENOSPC, "No space left on device")
    self._room -= len(text)
    return self._file.write(text)

  def __getattr__(self, name):
    return getattr(self._file, name)


def records(workdir):
  text = (workdir / "metrics.jsonl").read_text()
  assert text.endswith("\n")
  return [json.loads(line) for line in text.splitlines()]


def test_a_full_disk_while_logging_keeps_whole_lines_and_says_what_to_do(tmp_path):
  writer = metric_writers.MetricWriter(str(tmp_path), is_main=True)
  writer.write(1, {"train/loss": 6.5})
  writer._jsonl = FullDiskAfter(writer._jsonl, room=10)  # pylint: disable=protected-access
  with pytest.raises(errors.DiskFull, match=r"no space left on the disk of .* while "
                     r"logging step 2 to metrics.jsonl \(.* MB free\); free space, "
                     r"then run the same command"):
    writer.write(2, {"train/loss": 6.25})
  # The torn half of step 2's line is gone; step 1's record is whole.
  assert records(tmp_path) == [{"step": 1, "train/loss": 6.5}]
  # The file was reopened where it was cut: the next record follows step 1's.
  writer.write(3, {"train/loss": 6.0})
  writer.close()
  assert [r["step"] for r in records(tmp_path)] == [1, 3]


def test_another_write_error_keeps_whole_lines_and_is_raised_as_it_is(tmp_path):
  writer = metric_writers.MetricWriter(str(tmp_path), is_main=True)
  writer.write(1, {"lr": 1e-3})

  class ReadOnly(FullDiskAfter):
    def write(self, text):
      self._file.write(text[:5])
      self._file.flush()
      raise OSError(errno.EROFS, "Read-only file system")

  writer._jsonl = ReadOnly(writer._jsonl, room=0)  # pylint: disable=protected-access
  with pytest.raises(OSError) as error:
    writer.write(2, {"lr": 2e-3})
  assert error.value.errno == errno.EROFS and not isinstance(error.value, errors.DiskFull)
  assert records(tmp_path) == [{"step": 1, "lr": 1e-3}]
  writer.close()


class Broken:
  """A tracker whose every call fails, as a lost connection does."""

  def __init__(self):
    self.calls = 0

  def __getattr__(self, name):
    def fail(*args, **kwargs):
      self.calls += 1
      raise RuntimeError(f"{name}: connection reset")
    return fail


def test_tensorboard_and_wandb_failures_stop_them_not_the_run(tmp_path, caplog):
  writer = metric_writers.MetricWriter(str(tmp_path), is_main=True)
  writer.write(1, {"train/loss": 6.5})
  tensorboard, wandb = Broken(), Broken()
  writer._tb, writer._wandb = tensorboard, wandb  # pylint: disable=protected-access
  with caplog.at_level("WARNING"):
    writer.write(2, {"train/loss": 6.0})
    writer.image(2, "learning_curve", str(tmp_path / "curve.png"))
    writer.write(3, {"train/loss": 5.5})
    writer.close()
  # Each view failed once, was dropped, and was not asked again.
  assert tensorboard.calls == 1 and wandb.calls == 1
  assert "TensorBoard events stopped at step 2 (RuntimeError: write_scalars: " \
         "connection reset); metrics.jsonl goes on" in caplog.text
  assert "W&B logging stopped at the scalars" in caplog.text
  assert [r["step"] for r in records(tmp_path)] == [1, 2, 3]


def test_a_wandb_run_that_does_not_finish_is_a_warning(tmp_path, caplog):
  writer = metric_writers.MetricWriter(str(tmp_path), is_main=True)
  wandb = Broken()
  writer._wandb = wandb  # pylint: disable=protected-access
  with caplog.at_level("WARNING"):
    writer.close()
  assert wandb.calls == 1 and "W&B run did not finish cleanly: close: " in caplog.text

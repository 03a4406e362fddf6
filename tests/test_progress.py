"""Progress lines (core/progress.py): at most one per interval, with the rate and
the time left at that rate, and one at the end; and the ETA on the step lines."""

from maelm_jax.core import progress
from maelm_jax.run import metric_writers


class Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def test_lines_come_at_most_once_an_interval_with_rate_and_time_left():
  clock, lines = Clock(), []
  p = progress.Progress("blimp mlm", total=7200, unit="pairs", every_s=30,
                        log=lines.append, clock=clock)
  for second in range(1, 91):  # 80 pairs a second for 90 s.
    clock.now = second
    p.update(80 * second)
  assert lines == [
      "blimp mlm: 2,400/7,200 pairs (33%), 80 pairs/s, ETA 1m00s",
      "blimp mlm: 4,800/7,200 pairs (67%), 80 pairs/s, ETA 30s",
      "blimp mlm: 7,200/7,200 pairs (100%), 80 pairs/s, 1m30s"]
  p.finish()  # The end says how long it took.
  assert lines[-1] == "blimp mlm: 7,200/7,200 pairs (100%), 80 pairs/s, 1m30s"


def test_durations_and_eta():
  assert [progress.duration(s) for s in (0, 42, 185, 3720, 90061)] == [
      "0s", "42s", "3m05s", "1h02m", "25h01m"]
  assert progress.eta(done=0, total=10, elapsed=5) == ""  # No rate yet.
  assert progress.eta(done=25, total=100, elapsed=60) == "3m00s"


def test_step_lines_carry_the_eta():
  line = metric_writers.format_console(100, 1000, {"train/loss": 2.5}, eta="4m30s")
  assert line == "step 100/1000 | loss 2.5000 | ETA 4m30s"
  assert "ETA" not in metric_writers.format_console(100, 1000, {"train/loss": 2.5})

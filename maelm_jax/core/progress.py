"""Progress of a long phase, in log lines rather than bars (many hosts write to
one log): `blimp mlm_seed0: 1,234/7,200 pairs (17%), 53 pairs/s, ETA 1m52s`, at
most once every `every_s` seconds, and once at the end.

    progress = Progress("blimp mlm_seed0", total=7200, unit="pairs")
    for ...:
      progress.update(done)
    progress.finish()
"""

from __future__ import annotations

import time
from typing import Callable

from absl import logging


def duration(seconds: float) -> str:
  """42s, 3m05s, 1h02m."""
  seconds = max(0, int(round(seconds)))
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def eta(done: float, total: float, elapsed: float) -> str:
  """Time left at the rate so far; "" before any progress."""
  if done <= 0 or elapsed <= 0 or total <= done:
    return ""
  return duration((total - done) * elapsed / done)


class Progress:
  """Says how far a phase has come; see the module docstring."""

  def __init__(self, what: str, total: float, unit: str = "", every_s: float = 30.0,
               log: Callable[[str], None] = logging.info,
               clock: Callable[[], float] = time.monotonic):
    self.what, self.total, self.unit = what, total, unit
    self.every_s, self.log, self.clock = every_s, log, clock
    self.started = self.last = clock()
    self.done = 0.0

  def line(self) -> str:
    elapsed = self.clock() - self.started
    unit = f" {self.unit}" if self.unit else ""
    share = f" ({self.done / self.total:.0%})" if self.total else ""
    rate = f", {self.done / elapsed:,.0f}{unit}/s" if elapsed > 0 else ""
    left = eta(self.done, self.total, elapsed)
    return (f"{self.what}: {self.done:,.0f}/{self.total:,.0f}{unit}{share}{rate}"
            + (f", ETA {left}" if left else f", {duration(elapsed)}"))

  def update(self, done: float) -> None:
    self.done = done
    now = self.clock()
    if now - self.last >= self.every_s:
      self.last = now
      self.log(self.line())

  def finish(self) -> None:
    self.done = self.total
    self.log(self.line())

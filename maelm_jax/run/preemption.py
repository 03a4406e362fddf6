"""Knowing when to checkpoint and stop: the machine is being taken away
(SIGTERM), the user pressed Ctrl-C (SIGINT), or the run's wall-clock limit
(`max_runtime`) has passed.

Multi-host runs (JAX's coordination service is up) use JAX's preemption sync
point through orbax: SIGTERM on any host is propagated to all, and they agree on
one step at which everyone saves; a SIGINT is turned into a SIGTERM to this
process, so it takes the same path. A single process without the coordination
service has nobody to agree with, so the handlers set a flag that the loop reads
at the next step boundary.

The first SIGINT saves and stops like SIGTERM; a second one, while the save is
still under way, aborts at once (KeyboardInterrupt), as a user pressing Ctrl-C
twice expects. A passed `max_runtime` stops like SIGTERM too (in a multi-host run,
a process past it sends itself SIGTERM, so that all agree on the step).
"""

from __future__ import annotations

import os
import signal
import time

from absl import logging
import jax


class PreemptionWatcher:

  def __init__(self, manager, max_runtime_s: float | None = None):
    self._manager = manager
    self._use_jax = jax.distributed.is_initialized()
    # 'SIGTERM', 'SIGINT' or 'max_runtime' once one came.
    self.signal_name = None
    self._deadline = None if max_runtime_s is None else time.monotonic() + max_runtime_s
    self._previous = {}
    wanted = [signal.SIGINT] if self._use_jax else [signal.SIGTERM, signal.SIGINT]
    for signum in wanted:
      # A SIGINT ignored at start (a background job of a script) stays ignored,
      # as the shell intended; handlers can only be set from the main thread.
      if signal.getsignal(signum) is signal.SIG_IGN:
        continue
      try:
        self._previous[signum] = signal.signal(signum, self._on_signal)
      except ValueError:
        logging.warning("not in the main thread: %s will not save a checkpoint",
                        signal.Signals(signum).name)

  def _on_signal(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if signum == signal.SIGINT:
      if self.signal_name == "SIGINT":  # The second Ctrl-C: abort now.
        raise KeyboardInterrupt
      logging.warning("SIGINT (Ctrl-C): saving a checkpoint at the next step "
                      "boundary, then stopping; press Ctrl-C again to abort "
                      "without saving")
      self.signal_name = "SIGINT"
      if self._use_jax:  # Let JAX agree on the step with the other hosts.
        os.kill(os.getpid(), signal.SIGTERM)
      return
    logging.warning("%s: will checkpoint at the next step boundary and exit", name)
    self.signal_name = self.signal_name or name

  def reached(self, step: int) -> bool:
    """Call after every step; True means: save now and exit."""
    if (self._deadline is not None and self.signal_name is None
        and time.monotonic() >= self._deadline):
      logging.warning("max_runtime passed at step %d: saving a checkpoint, then "
                      "stopping", step)
      self.signal_name = "max_runtime"
      if self._use_jax:  # Let JAX agree on the step with the other hosts.
        os.kill(os.getpid(), signal.SIGTERM)
    if self._use_jax:
      return self._manager.reached_preemption(step)
    return self.signal_name is not None

  def close(self) -> None:
    for signum, previous in self._previous.items():
      if previous is not None:
        signal.signal(signum, previous)
    self._previous = {}

"""Knowing when to checkpoint and stop because the machine is being taken away.

Multi-host runs (JAX's coordination service is up) use JAX's preemption sync
point through orbax: SIGTERM on any host is propagated to all, and they agree on
one step at which everyone saves. A single process without the coordination
service has nobody to agree with, and there JAX's service is absent, so a
SIGTERM handler sets a flag that the loop reads at the next step boundary.
"""

from __future__ import annotations

import signal

from absl import logging
import jax


class PreemptionWatcher:

  def __init__(self, manager):
    self._manager = manager
    self._use_jax = jax.distributed.is_initialized()
    self._signalled = False
    self._previous = None
    if not self._use_jax:
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)

  def _on_sigterm(self, signum, frame):
    del signum, frame
    logging.warning("SIGTERM: will checkpoint at the next step boundary and exit")
    self._signalled = True

  def reached(self, step: int) -> bool:
    """Call after every step; True means: save now and exit."""
    if self._use_jax:
      return self._manager.reached_preemption(step)
    return self._signalled

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


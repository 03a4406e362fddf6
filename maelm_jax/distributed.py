"""Multi-host start-up (placeholder until launch support lands): single process."""


def maybe_initialize() -> None:
  return None

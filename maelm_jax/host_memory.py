"""Hands freed host memory back to the OS (glibc's `malloc_trim`).

Each checkpoint save copies the train state into host buffers on orbax's
threads. glibc keeps the freed pages in its arenas, and the training steps'
own allocations between two saves leave them scattered, so every save raised
a long run's resident memory by ~10 MB for good (`benchmarks/soak.py`;
`benchmarks/RESULTS.md`, "Hours of running"). `malloc_trim(0)` returns every
free whole page, wherever it lies in an arena. Elsewhere (macOS, musl) there is
no such call and this does nothing.
"""

import ctypes


def _find_malloc_trim():
  try:
    return ctypes.CDLL(None).malloc_trim
  except (OSError, AttributeError):
    return None


_MALLOC_TRIM = _find_malloc_trim()


def release_free_pages() -> bool:
  """Returns the C heap's free pages to the OS; False where that is not possible."""
  if _MALLOC_TRIM is None:
    return False
  _MALLOC_TRIM(0)
  return True

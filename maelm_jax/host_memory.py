"""Hands freed host memory back to the OS (glibc's `malloc_trim`).

Checkpoint saves (host copies of the train state on orbax's threads),
evaluations and compilations free host buffers that glibc keeps in its arenas,
between live blocks. `malloc_trim(0)` returns every free whole page, wherever
it lies: a `tiny` run's resident memory is about a third lower with it
(`benchmarks/soak.py`; `benchmarks/RESULTS.md`, "Hours of running"). A slow
rise under glibc remains (gone with jemalloc preloaded, README "Long runs").
Elsewhere (macOS, musl) there is no such call and this does nothing.
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

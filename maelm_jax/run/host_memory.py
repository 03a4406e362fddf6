"""The host's C allocator: which one runs, where jemalloc is, and handing freed
memory back to the OS (glibc's `malloc_trim`).

Checkpoint saves (host copies of the train state on orbax's threads),
evaluations and compilations free host buffers that glibc keeps in its arenas,
between live blocks. `malloc_trim(0)` returns every free whole page, wherever
it lies: a `tiny` run's resident memory is about a third lower with it
(`benchmarks/soak.py`; `benchmarks/soak.md`). Both
loops call it through `FreePageReleaser` (RunSession.write): at a metrics
record, at most once per 30 s, since each call walks the heap. Elsewhere
(macOS, musl) there is no such call and this does nothing.

Under glibc a run's memory still creeps up with every checkpoint save (~12 MB
per 1,000 steps at the default cadence); with jemalloc preloaded it is flat.
The launchers in launch/ preload it where it is installed (`find_jemalloc`, the
same search as launch/jemalloc.sh), and `main` logs which allocator a run has.
"""

import ctypes
import os
import time

# Where distributions install jemalloc's shared library (Debian/Ubuntu on x86-64
# and Arm, Fedora/RHEL, source builds). Kept the same as launch/jemalloc.sh.
JEMALLOC_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)


def find_jemalloc() -> str | None:
  """jemalloc's library: $MAELM_JEMALLOC if set, else the first of
  `JEMALLOC_PATHS` that exists; None where there is none."""
  named = os.environ.get("MAELM_JEMALLOC")
  if named:
    return named if os.path.isfile(named) else None
  return next((path for path in JEMALLOC_PATHS if os.path.isfile(path)), None)


def allocator() -> str:
  """The C allocator this process's `malloc` comes from (dladdr): 'jemalloc' or
  'tcmalloc' (preloaded, as the launchers do), 'glibc', 'system' where that cannot
  be told (macOS, musl), else the library's file name."""
  library = _malloc_library()
  if library is None:  # No dladdr to ask.
    return "glibc" if _MALLOC_TRIM is not None else "system"
  name = os.path.basename(library)
  for known in ("jemalloc", "tcmalloc"):
    if known in name:
      return known
  if name.startswith("libc.so") or name.startswith("libc-"):
    return "glibc" if _MALLOC_TRIM is not None else "system"
  return name


class _DlInfo(ctypes.Structure):
  _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
              ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _malloc_library() -> str | None:
  """The file of the library that `malloc` resolves to here (dladdr), so that a
  jemalloc some package merely loads is not taken for the allocator."""
  try:
    process = ctypes.CDLL(None)
    dladdr, malloc = process.dladdr, process.malloc
  except (OSError, AttributeError):
    return None
  dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
  info = _DlInfo()
  if not dladdr(ctypes.cast(malloc, ctypes.c_void_p), ctypes.byref(info)):
    return None
  return info.dli_fname.decode(errors="replace") if info.dli_fname else None


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


class FreePageReleaser:
  """`release_free_pages`, at most once per `interval_s`, and only under glibc.

  A trim walks the heap: ~19 ms for a `tiny` run's (2-core VM, measured in a run
  logging every step), next to a 120 ms CPU step or a 5 ms GPU step, so at every
  metrics record it would cost a run with a small `log_every` several percent. Once
  per 30 s keeps what it hands back (freed pages wait for the next trim) at a bounded
  cost. Under jemalloc or another preloaded allocator it does nothing: glibc's heap
  is then empty, and that allocator returns memory itself.
  """

  def __init__(self, interval_s: float = 30.0, clock=time.monotonic):
    self.interval_s = interval_s
    self._clock = clock
    self._active = _MALLOC_TRIM is not None and allocator() == "glibc"
    self._next = clock()  # The first call trims.
    self.releases = 0

  def maybe_release(self) -> bool:
    """Trims if the interval has passed since the last trim; True if it did."""
    if not self._active:
      return False
    now = self._clock()
    if now < self._next:
      return False
    release_free_pages()
    self._next = now + self.interval_s
    self.releases += 1
    return True

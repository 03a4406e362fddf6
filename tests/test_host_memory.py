"""host_memory.release_free_pages gives scattered free heap pages back to the OS."""

import ctypes

import pytest

from maelm_jax import host_memory


def _rss_mb() -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(host_memory._MALLOC_TRIM is None,
                    reason="no malloc_trim in this C library (not glibc)")
def test_free_pages_between_live_blocks_go_back_to_the_os():
  libc = ctypes.CDLL(None)
  libc.malloc.restype = ctypes.c_void_p
  libc.free.argtypes = [ctypes.c_void_p]
  libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
  size = 64 * 1024  # Under glibc's mmap threshold: from the heap, as small arrays are.
  blocks = [libc.malloc(size) for _ in range(2000)]  # 128 MB
  try:
    for block in blocks:
      libc.memset(block, 1, size)
    for block in blocks[0::2]:  # Every other block freed: 64 MB of holes that
      libc.free(block)          # glibc keeps, since live blocks sit between them.
    before = _rss_mb()
    assert host_memory.release_free_pages()
    released = before - _rss_mb()
  finally:
    for block in blocks[1::2]:
      libc.free(block)
  assert released > 40, f"only {released:.0f} MB of 64 MB of holes went back"

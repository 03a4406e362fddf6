"""host_memory: freed heap pages go back to the OS; which allocator runs; where
jemalloc is."""

import ctypes
import os
import pathlib
import subprocess
import sys

import pytest

from maelm_jax.run import host_memory

REPO = pathlib.Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.mark.skipif(host_memory.allocator() != "glibc",
                    reason="malloc is not glibc's here (no malloc_trim, or preloaded)")
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


def _print_in_a_fresh_python(expression: str, env_extra: dict) -> str:
  env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MAELM_JEMALLOC")}
  env.update(env_extra)
  out = subprocess.run([sys.executable, "-c", "from maelm_jax import host_memory; "
                        f"print({expression})"], capture_output=True, text=True,
                       env=env, cwd=REPO, timeout=120)
  assert out.returncode == 0, out.stderr
  return out.stdout.strip()


def _allocator_of_a_fresh_python(env_extra: dict) -> str:
  return _print_in_a_fresh_python("host_memory.allocator()", env_extra)


@pytest.mark.skipif(host_memory._MALLOC_TRIM is None, reason="not glibc")
def test_allocator_names_glibc_without_a_preload():
  assert _allocator_of_a_fresh_python({}) == "glibc"


@pytest.mark.skipif(host_memory.find_jemalloc() is None,
                    reason="jemalloc not installed (apt install libjemalloc2)")
def test_allocator_names_a_preloaded_jemalloc():
  assert _allocator_of_a_fresh_python({"LD_PRELOAD": host_memory.find_jemalloc()}) == "jemalloc"


def test_find_jemalloc_takes_the_named_library_or_none(tmp_path, monkeypatch):
  library = tmp_path / "libjemalloc.so.2"
  library.write_bytes(b"")
  monkeypatch.setenv("MAELM_JEMALLOC", str(library))
  assert host_memory.find_jemalloc() == str(library)
  monkeypatch.setenv("MAELM_JEMALLOC", str(tmp_path / "missing.so"))
  assert host_memory.find_jemalloc() is None  # Named but absent: not another one.


@pytest.mark.skipif(host_memory._MALLOC_TRIM is None, reason="no malloc_trim (not glibc)")
def test_the_releaser_trims_at_most_once_per_interval(monkeypatch):
  trims = []
  monkeypatch.setattr(host_memory, "release_free_pages", lambda: trims.append(1) or True)
  monkeypatch.setattr(host_memory, "allocator", lambda: "glibc")
  now = [100.0]
  releaser = host_memory.FreePageReleaser(interval_s=30, clock=lambda: now[0])
  assert releaser.maybe_release()  # The first record trims.
  for now[0] in (101.0, 115.0, 129.9):  # Records within 30 s of it do not:
    assert not releaser.maybe_release()  # a trim walks the heap (~19 ms).
  now[0] = 130.0
  assert releaser.maybe_release()
  now[0] = 200.0
  assert releaser.maybe_release() and not releaser.maybe_release()
  assert len(trims) == releaser.releases == 3


def test_the_releaser_does_nothing_under_another_allocator(monkeypatch):
  trims = []
  monkeypatch.setattr(host_memory, "release_free_pages", lambda: trims.append(1) or True)
  for name in ("jemalloc", "tcmalloc", "system"):
    monkeypatch.setattr(host_memory, "allocator", lambda name=name: name)
    releaser = host_memory.FreePageReleaser(interval_s=0)
    assert not releaser.maybe_release() and not releaser.maybe_release()
  assert trims == []


@pytest.mark.skipif(host_memory.find_jemalloc() is None,
                    reason="jemalloc not installed (apt install libjemalloc2)")
def test_the_releaser_does_nothing_under_jemalloc():
  released = _print_in_a_fresh_python("host_memory.FreePageReleaser().maybe_release()",
                                      {"LD_PRELOAD": host_memory.find_jemalloc()})
  assert released == "False"

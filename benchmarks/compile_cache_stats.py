"""Compile seconds held in a JAX persistent compilation cache, by jitted function.

Each entry of the cache is one program compiled once (a cache miss), and JAX
stores beside it how long its compile took (whole seconds). Pointed at the cache
of a test run, this says how much of the run went to compiling fresh programs and
which jitted functions those were (benchmarks/test-suite-cost.md):

    mkdir -p runs/suite_cache
    JAX_COMPILATION_CACHE_DIR=$PWD/runs/suite_cache make test
    python benchmarks/compile_cache_stats.py runs/suite_cache --top=10
"""

import collections
import os
import re

from absl import app, flags

flags.DEFINE_integer("top", 20, "How many function names to list.")


def entries(cache_dir: str):
  """(jitted function name, compile seconds) of every entry in `cache_dir`."""
  from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
  for name in sorted(os.listdir(cache_dir)):
    if not name.endswith("-cache"):
      continue
    with open(os.path.join(cache_dir, name), "rb") as f:
      raw = f.read()
    _, seconds = compilation_cache.extract_executable_and_time(
        compilation_cache.decompress_executable(raw))
    yield re.sub(r"-[0-9a-f]{32,}-cache$", "", name), seconds


def main(argv):
  if len(argv) != 2:
    raise app.UsageError("usage: compile_cache_stats.py CACHE_DIR [--top=N]")
  by_name = collections.defaultdict(lambda: [0, 0])
  for name, seconds in entries(argv[1]):
    by_name[name][0] += 1
    by_name[name][1] += seconds
  total = sum(s for _, s in by_name.values())
  count = sum(n for n, _ in by_name.values())
  print(f"{count} programs, {total} s of compiles (whole seconds each)")
  for name, (n, seconds) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:flags.FLAGS.top]:
    print(f"{seconds:7d} s {n:5d}  {name}")


if __name__ == "__main__":
  app.run(main)

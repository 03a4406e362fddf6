"""Each Python process's CPU seconds, logged at its exit: where a test suite's
CPU goes by kind of process (the xdist workers, the runs tests start, the
tokenizer trainers...), which per-test CPU logs cannot say
(benchmarks/test-suite-cost.md):

  PYTHONPATH=$PWD/benchmarks/process_cpu MAELM_PROCESS_CPU_LOG=$PWD/procs.jsonl make test
  python benchmarks/process_cpu/sitecustomize.py procs.jsonl   # the summary

Python imports `sitecustomize` at start from its path, so every Python process
the suite starts (with PYTHONPATH kept) logs one line; one killed by a signal
logs nothing.

With MAELM_CACHE_EVENT_LOG=<file> too (or alone), each read and write of JAX's
persistent compilation cache is a line: hit or miss, the program's cache key, its
compile seconds (whole, as JAX stores them), the process and the test it serves.
It says which tests compile which programs and which programs a process made for
another: `python benchmarks/process_cpu/sitecustomize.py --cache <file>`.
"""

import atexit
import json
import os
import resource
import sys
import time


def _log(path):
  own = resource.getrusage(resource.RUSAGE_SELF)
  try:
    with open(path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"argv": getattr(sys, "orig_argv", sys.argv),
                          "cpu": own.ru_utime + own.ru_stime,
                          "test": os.environ.get("PYTEST_CURRENT_TEST")}) + "\n")
  except OSError:
    pass


def _kind(argv):
  """`-m module`, a script's name, or `-c` with its code's first line."""
  if "-m" in argv[:-1]:
    return argv[argv.index("-m") + 1]
  if "-c" in argv[:-1]:
    code = argv[argv.index("-c") + 1]
    if "sys.stdin.readline()" in code:
      return "pytest-xdist worker"  # execnet's bootstrap.
    lines = [l for l in code.splitlines() if l.strip() and not l.startswith("import")]
    return "-c " + (lines[0] if lines else code.splitlines()[0])[:50]
  scripts = [a for a in argv[1:] if not a.startswith("-")]
  return os.path.basename(scripts[0]) if scripts else " ".join(argv)[:50]


def summary(path):
  kinds = {}
  with open(path, encoding="utf-8") as f:
    for line in f:
      record = json.loads(line)
      kind = _kind(record["argv"])
      n, cpu = kinds.get(kind, (0, 0.0))
      kinds[kind] = (n + 1, cpu + record["cpu"])
  for kind, (n, cpu) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
    print(f"{cpu:8.1f} CPU-s {n:5d} processes  {kind}")


def _log_cache_events(module, path):
  """Wraps jax._src.compilation_cache's read and write of an executable."""
  put, get = module.put_executable_and_time, module.get_executable_and_time
  process = _kind(sys.orig_argv)

  def record(kind, key, seconds):
    test = os.environ.get("PYTEST_CURRENT_TEST", "-").rsplit(" (", 1)[0]
    with open(path, "a", encoding="utf-8") as f:
      f.write(json.dumps({"event": kind, "key": key, "seconds": seconds,
                          "pid": os.getpid(), "time": time.time(), "test": test,
                          "process": process}) + "\n")

  def put_logged(cache_key, module_name, executable, backend, compile_time):
    record("miss", cache_key, compile_time)
    return put(cache_key, module_name, executable, backend, compile_time)

  def get_logged(cache_key, *args, **kwargs):
    executable, seconds = get(cache_key, *args, **kwargs)
    if executable is not None:
      record("hit", cache_key, seconds)
    return executable, seconds

  module.put_executable_and_time, module.get_executable_and_time = put_logged, get_logged


class _WrapCacheOnImport:
  """A `sys.meta_path` finder that wraps the cache module when JAX imports it
  (importing JAX here would cost every process the suite starts its import)."""

  def __init__(self, path):
    self.path = path

  def find_spec(self, name, path, target=None):
    del path, target
    if name != "jax._src.compilation_cache":
      return None
    import importlib.util  # pylint: disable=g-import-not-at-top
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    exec_module = spec.loader.exec_module

    def exec_and_wrap(module):
      exec_module(module)
      _log_cache_events(module, self.path)
    spec.loader.exec_module = exec_and_wrap
    return spec


def cache_summary(path):
  """Compile seconds by program name, in the test processes and in the runs
  they start, and the hits each had of programs the other compiled."""
  import collections  # pylint: disable=g-import-not-at-top
  events = [json.loads(line) for line in open(path, encoding="utf-8")]
  in_tests = lambda e: e["process"] in ("pytest-xdist worker", "pytest")
  made_in_tests = {}
  compiled = collections.defaultdict(lambda: [0, 0])
  for e in events:
    if e["event"] == "miss":
      made_in_tests.setdefault(e["key"], in_tests(e))
      entry = compiled[(e["key"].rsplit("-", 1)[0], in_tests(e))]
      entry[0], entry[1] = entry[0] + 1, entry[1] + e["seconds"]
  for (name, tests), (n, seconds) in sorted(compiled.items(), key=lambda kv: -kv[1][1])[:12]:
    print(f"{seconds:6d} s {n:5d} programs  {name}  (in {'tests' if tests else 'runs'})")
  crossed = collections.Counter((made_in_tests[e["key"]], in_tests(e)) for e in events
                                if e["event"] == "hit" and e["key"] in made_in_tests)
  for made, used in ((True, True), (True, False), (False, True), (False, False)):
    print(f"{crossed[(made, used)]:6d} hits in {'tests' if used else 'runs'} of programs "
          f"compiled in {'tests' if made else 'runs'}")


if __name__ == "__main__":
  if sys.argv[1] == "--cache":
    cache_summary(sys.argv[2])
  else:
    summary(sys.argv[1])
else:
  if os.environ.get("MAELM_PROCESS_CPU_LOG"):
    atexit.register(_log, os.environ["MAELM_PROCESS_CPU_LOG"])
  if os.environ.get("MAELM_CACHE_EVENT_LOG"):
    sys.meta_path.insert(0, _WrapCacheOnImport(os.environ["MAELM_CACHE_EVENT_LOG"]))

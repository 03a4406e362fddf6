"""Each Python process's CPU seconds, logged at its exit: where a test suite's
CPU goes by kind of process (the xdist workers, the runs tests start, the
tokenizer trainers...), which per-test CPU logs cannot say
(benchmarks/test-suite-cost.md):

  PYTHONPATH=$PWD/benchmarks/process_cpu MAELM_PROCESS_CPU_LOG=$PWD/procs.jsonl make test
  python benchmarks/process_cpu/sitecustomize.py procs.jsonl   # the summary

Python imports `sitecustomize` at start from its path, so every Python process
the suite starts (with PYTHONPATH kept) logs one line; one killed by a signal
logs nothing.
"""

import atexit
import json
import os
import resource
import sys


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


if __name__ == "__main__":
  summary(sys.argv[1])
elif os.environ.get("MAELM_PROCESS_CPU_LOG"):
  atexit.register(_log, os.environ["MAELM_PROCESS_CPU_LOG"])

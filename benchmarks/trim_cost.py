r"""What handing freed pages back (glibc's malloc_trim) costs a training run.

  python benchmarks/trim_cost.py --interval_s=0  --workdir=runs/trim0   # every record
  python benchmarks/trim_cost.py --interval_s=30 --workdir=runs/trim30  # as run_session

Trains `tiny` MAE-LM in this process (CPython's docs, batch 16 x 128, a record
every step, a checkpoint every 100) with `host_memory.FreePageReleaser` set to
--interval_s and every `release_free_pages` call timed. Prints the calls, their
median / p90 / max time, the run's median step time (its own throughput, which
leaves the record's host work out) and its wall time: the difference in wall
time between the two commands is what the trims cost. Under glibc only (a
preloaded jemalloc makes the releaser do nothing).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import logging  # noqa: E402

from configs import pretrain  # noqa: E402
from maelm_jax.run import host_memory, train  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--interval_s", type=float, default=30.0)
  parser.add_argument("--steps", type=int, default=400)
  args = parser.parse_args()
  if os.path.exists(args.workdir) and os.listdir(args.workdir):
    sys.exit(f"--workdir={args.workdir} is not empty; give a new one")
  logging.set_verbosity(logging.WARNING)

  calls = []
  release = host_memory.release_free_pages

  def timed_release():
    start = time.perf_counter()
    result = release()
    calls.append(time.perf_counter() - start)
    return result

  host_memory.release_free_pages = timed_release
  make_releaser = host_memory.FreePageReleaser
  host_memory.FreePageReleaser = lambda: make_releaser(interval_s=args.interval_s)

  config = pretrain.get_config("objective=maelm,size=tiny")
  config.data.source, config.total_steps, config.batch_size = "pydoc:", args.steps, 16
  config.log_every, config.eval_every, config.checkpoint_every = 1, args.steps // 2, 100
  config.tokenizer.vocab_size, config.data.eval_fraction, config.eval_batches = 2000, 0.05, 4
  started = time.time()
  train.train_and_evaluate(config, args.workdir)
  wall = time.time() - started

  records = [json.loads(line) for line in open(os.path.join(args.workdir, "metrics.jsonl"))]
  step_ms = [config.batch_size * config.seq_len / r["tokens_per_sec"] * 1e3
             for r in records if r.get("tokens_per_sec") and r["step"] > 50]
  late = calls[50:] if len(calls) > 100 else calls  # After compilation.
  ms = sorted(c * 1e3 for c in late) or [float("nan")]
  print(json.dumps({
      "interval_s": args.interval_s, "allocator": host_memory.allocator(),
      "calls": len(calls), "trim_ms_median": round(statistics.median(ms), 2),
      "trim_ms_p90": round(ms[int(0.9 * (len(ms) - 1))], 2), "trim_ms_max": round(ms[-1], 2),
      "step_ms_median": round(statistics.median(step_ms), 2), "wall_s": round(wall, 1)}))


if __name__ == "__main__":
  main()

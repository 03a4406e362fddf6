r"""The largest train batch that fits one device, per size and remat policy.

  # on one 80 GB GPU (the issue's question: base and large at length 512)
  python benchmarks/max_batch.py --sizes=base,large --seq_len=512 --dtype=bfloat16 \
      --scan_layers --verify --out=benchmarks/RESULTS_accelerator.md
  # on this CPU, against a stated budget (XLA:CPU plans memory the same way)
  python benchmarks/max_batch.py --sizes=base --seq_len=512 --memory_gb=16

Method: nothing is allocated while searching. For a batch B the real train step
(`train_lib.jit_steps`: masking, forward, backward, AdamW, state donated) is
lowered and compiled from the abstract sharded state, as resume does, and XLA's
`memory_analysis()` gives the bytes the step needs on the device: temporaries +
arguments + outputs - what donation aliases. B fits when that is at most
`--headroom` of the device's memory (`memory_stats()['bytes_limit']`, what the
allocator may use; or `--memory_gb`). B doubles from `--multiple` until it does
not fit, then bisects in steps of `--multiple`. `--verify` then allocates the
state at the largest B, runs two steps and reports the allocator's peak
(`peak_bytes_in_use`), where the platform reports one (GPU, TPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import compile_time  # noqa: E402
from maelm_jax.modeling import model as model_lib  # noqa: E402
from maelm_jax.core import sharding  # noqa: E402
from maelm_jax.run import train_lib  # noqa: E402


def largest_fitting(fits, multiple: int, max_batch: int) -> int:
  """Largest multiple of `multiple` up to `max_batch` with fits(B), for a monotone
  `fits` (0 when even `multiple` does not fit); O(log) calls of `fits`."""
  top = max_batch // multiple  # everything below counts in units of `multiple`
  if top < 1 or not fits(multiple):
    return 0
  good, bad = 1, None
  while bad is None:  # double until a batch does not fit, or the cap
    trial = min(good * 2, top)
    if trial == good:
      return good * multiple
    if fits(trial * multiple):
      good = trial
    else:
      bad = trial
  while bad - good > 1:  # then bisect
    mid = (good + bad) // 2
    if fits(mid * multiple):
      good = mid
    else:
      bad = mid
  return good * multiple


def step_bytes(cfg, config, seq_len: int, batch: int) -> int:
  """Device bytes of the compiled train step at this batch (see the docstring)."""
  lowered, _ = compile_time.lower_abstract_step(cfg, config, seq_len, batch)
  memory = lowered.compile().memory_analysis()
  if memory is None:
    raise SystemExit(f"{jax.devices()[0].platform} does not report compiled memory "
                     "(memory_analysis() is None); nothing to search on")
  return int(memory.temp_size_in_bytes + memory.argument_size_in_bytes
             + memory.output_size_in_bytes - memory.alias_size_in_bytes)


def device_limit_bytes(memory_gb: float) -> tuple[int, str]:
  if memory_gb:
    return int(memory_gb * 1e9), f"--memory_gb={memory_gb:g}"
  stats = jax.devices()[0].memory_stats() or {}
  if "bytes_limit" not in stats:
    raise SystemExit(f"{jax.devices()[0].device_kind} reports no memory limit: "
                     "give the budget with --memory_gb=N")
  return int(stats["bytes_limit"]), "the device's bytes_limit"


def verify(cfg, config, seq_len: int, batch: int, seed: int = 0) -> dict:
  """Allocate the state at `batch`, run two steps; the allocator's peak bytes."""
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  tx = train_lib.make_optimizer(config)
  state, shardings = train_lib.create_sharded_state(cfg, seq_len, tx, mesh, seed)
  step, _ = train_lib.jit_steps(cfg, seq_len, tx, mesh, shardings)
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, cfg.vocab_size, (batch, seq_len)).astype(np.int32)
  batch_arrays = {"input_ids": jax.device_put(ids, sharding.batch_sharding(mesh))}
  start = time.perf_counter()
  for _ in range(2):
    state, metrics = step(state, batch_arrays, train_lib.learning_rate_knots(config))
  jax.block_until_ready((state, metrics))
  stats = jax.devices()[0].memory_stats() or {}
  return {"ran_s": round(time.perf_counter() - start, 2),
          "peak_bytes_in_use": stats.get("peak_bytes_in_use")}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="base,large")
  p.add_argument("--objectives", default="mlm")
  p.add_argument("--seq_len", type=int, default=512)
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--remat_policies", default=",".join(model_lib.REMAT_POLICIES))
  p.add_argument("--scan_layers", action="store_true")
  p.add_argument("--dropout", type=float, default=None,
                 help="model.dropout and attention_dropout (default: the config's)")
  p.add_argument("--memory_gb", type=float, default=0.0,
                 help="the budget; default: the device's bytes_limit (GPU, TPU)")
  p.add_argument("--headroom", type=float, default=0.95)
  p.add_argument("--multiple", type=int, default=8)
  p.add_argument("--max_batch", type=int, default=4096)
  p.add_argument("--verify", action="store_true",
                 help="run two steps at the largest batch and report the peak")
  p.add_argument("--out", default="", help="markdown file to append a table to")
  p.add_argument("--json", default="", help="JSON lines of every probe")
  args = p.parse_args(argv)
  policies = args.remat_policies.split(",")
  for policy in policies:
    if policy not in model_lib.REMAT_POLICIES:
      raise SystemExit(f"--remat_policies: {policy!r} is not one of "
                       f"{', '.join(model_lib.REMAT_POLICIES)}")
  limit, limit_from = device_limit_bytes(args.memory_gb)
  budget = int(limit * args.headroom)
  device = jax.devices()[0]
  print(f"{device.device_kind}: budget {budget / 1e9:.1f} GB ({args.headroom:.0%} of "
        f"{limit / 1e9:.1f} GB, {limit_from}), jax {jax.__version__}", flush=True)
  started = datetime.datetime.now(datetime.timezone.utc)
  rows = []
  for size in args.sizes.split(","):
    for objective in args.objectives.split(","):
      for policy in policies:
        knobs = {"remat_policy": policy, "scan_layers": args.scan_layers}
        if args.dropout is not None:
          knobs.update(dropout=args.dropout, attention_dropout=args.dropout)
        cfg, config = compile_time.model_config(size, objective, args.dtype,
                                                args.vocab, **knobs)
        probes = {}

        def fits(batch):
          t0 = time.perf_counter()
          probes[batch] = step_bytes(cfg, config, args.seq_len, batch)
          ok = probes[batch] <= budget
          record = {"size": size, "objective": objective, "remat_policy": policy,
                    "batch": batch, "bytes": probes[batch], "fits": ok,
                    "compile_s": round(time.perf_counter() - t0, 1)}
          print(json.dumps(record), flush=True)
          if args.json:
            with open(args.json, "a") as f:
              f.write(json.dumps(record) + "\n")
          return ok

        best = largest_fitting(fits, args.multiple, args.max_batch)
        row = {"size": size, "objective": objective, "remat_policy": policy,
               "batch": best, "bytes": probes.get(best), "probes": len(probes)}
        if args.verify and best:
          row.update(verify(cfg, config, args.seq_len, best))
        rows.append(row)
        print(f"{size} {objective} {policy}: largest batch {best} x {args.seq_len}"
              + (f", {row['bytes'] / 1e9:.1f} GB planned" if best else ""), flush=True)
  table = format_table(args, rows, device, budget, limit_from, started)
  print("\n" + table)
  if args.out:
    with open(args.out, "a") as f:
      f.write("\n" + table)


def format_table(args, rows, device, budget, limit_from, started) -> str:
  command = "python benchmarks/max_batch.py " + " ".join(sys.argv[1:])
  lines = [
      f"## Largest batch per device ({device.device_kind}, length {args.seq_len}, "
      f"{args.dtype})", "",
      f"- Date: {started:%Y-%m-%d %H:%M} UTC; jax {jax.__version__}; "
      f"scan_layers={args.scan_layers}, vocabulary {args.vocab}",
      f"- Command: `{command}`",
      f"- Budget: {budget / 1e9:.1f} GB ({args.headroom:.0%} of {limit_from}); "
      f"batches in multiples of {args.multiple}", "",
      "| size | objective | remat_policy | largest batch | planned GB | "
      "peak GB (2 steps run) |", "|---|---|---|--:|--:|--:|"]
  for r in rows:
    planned = f"{r['bytes'] / 1e9:.2f}" if r.get("bytes") else "-"
    peak = r.get("peak_bytes_in_use")
    lines.append(f"| {r['size']} | {r['objective']} | {r['remat_policy']} | "
                 f"{r['batch']} | {planned} | "
                 f"{'-' if peak is None else f'{peak / 1e9:.2f}'} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  main()

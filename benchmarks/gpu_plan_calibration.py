r"""The GPU roofline against the measured steps: every cell of
benchmarks/results/gpu_throughput.json (steps timed on one H200), planned on a
CPU host for one described H200 (`plan --topology=h200:1`) with the same config,
and the ratio measured / planned.

    pip install -e '.[plan-gpu]'
    python benchmarks/gpu_plan_calibration.py --out=benchmarks/results/gpu_plan_calibration.json

The plan is of the step as the code builds it today; cells measured before a
change to the step (their `variant`, e.g. `before_bias_fix`) are planned as the
step is now, and say so. How steady the ratio is decides how far a planned GPU
speed-up can be trusted (benchmarks/gpu-throughput.md).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from maelm_jax import plan  # noqa: E402  (sets the planner's environment first)
import train_throughput  # noqa: E402

MEASURED = REPO / "benchmarks" / "results" / "gpu_throughput.json"


def scanned(cell) -> bool:
  return "--scan_layers" in cell["command"] or "scanned" in cell["variant"]


def cell_key(cell) -> tuple:
  return (cell["size"], cell["seq_len"], cell["objective"], cell["batch"], scanned(cell))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="benchmarks/results/gpu_plan_calibration.json")
  parser.add_argument("--topology", default="h200:1")
  args = parser.parse_args()
  cells = json.loads(MEASURED.read_text())
  devices, topology = plan.topology_devices(args.topology)
  planned = {}
  for cell in cells:
    key = cell_key(cell)
    if key in planned:
      continue
    size, seq_len, objective, batch, scan = key
    config = train_throughput.build_config(
        objective, size, seq_len, batch, cell["dtype"], attention_impl="auto",
        scan_layers=scan, remat_policy="none", dropout=0.0, attention_dropout=0.0)
    started = time.perf_counter()
    result = plan.plan_built(plan.build(config, devices), topology, devices)
    planned[key] = result
    print(f"{key}: planned {result['estimated_step_seconds'] * 1e3:.1f} ms "
          f"({result['bound_by']}), {time.perf_counter() - started:.0f} s", flush=True)
  rows = []
  for cell in cells:
    result = planned[cell_key(cell)]
    rows.append({
        "size": cell["size"], "seq_len": cell["seq_len"], "objective": cell["objective"],
        "batch": cell["batch"], "scan_layers": scanned(cell), "variant": cell["variant"],
        "measured_step_s": cell["step_s"], "planned_step_s": result["estimated_step_seconds"],
        "ratio": cell["step_s"] / result["estimated_step_seconds"],
        "bound_by": result["bound_by"], "roofline_seconds": result["roofline_seconds"],
        "planned_attention": {k: v["implementation"] for k, v in result["attention"].items()},
        "measured_attention": cell["attention_backend"],
        "hbm_traffic_by_category_per_chip": result["hbm_traffic_by_category_per_chip"],
        "planned_bytes_per_chip": result["bytes_per_chip"]["total"],
        "measured_peak_memory_bytes": cell["peak_memory_bytes"]})
  pathlib.Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
  print("| size | L | objective | batch | scanned | variant | measured | planned (bound by) | ratio |")
  print("|---|--:|---|--:|---|---|--:|--:|--:|")
  for r in rows:
    print(f"| {r['size']} | {r['seq_len']} | {r['objective']} | {r['batch']} | "
          f"{'yes' if r['scan_layers'] else 'no'} | {r['variant']} | "
          f"{r['measured_step_s'] * 1e3:.1f} ms | {r['planned_step_s'] * 1e3:.1f} ms "
          f"({r['bound_by']}) | {r['ratio']:.2f} |")


if __name__ == "__main__":
  main()

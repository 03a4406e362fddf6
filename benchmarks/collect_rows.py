r"""One JSON row per measured cell, from one or more `train_throughput.py --json` files.

The rows that `benchmarks/results/*.json` hold, readable without the tables around
them: size, length, objective, device, dtype, tokens/s, MFU against the spec's peak
and against the measured ceiling, the compiled step's memory, compile time, and the
command that measured it.

  python benchmarks/collect_rows.py run1.json run2.json:after_fix \
      --out=benchmarks/results/gpu_throughput.json
  python benchmarks/collect_rows.py run3.json:unrolled --append --out=...  # add rows

A `:label` after a file is written into its rows as `variant` (which code, which
knob), so that rows of one cell measured before and after a change stay apart.
"""

import argparse
import json
import os

FIELDS = ("size", "seq_len", "objective", "batch", "params", "encoder_len",
          "num_selected", "attention_backend", "device", "dtype", "tokens_per_sec",
          "step_s", "spread", "model_flops", "xla_flops", "mfu_spec",
          "mfu_measured_ceiling", "peak_memory_bytes", "compile_s", "speedup",
          "flop_speedup", "command")


def rows_of(spec: str) -> list[dict]:
  path, _, variant = spec.partition(":")
  with open(path) as f:
    run = json.load(f)
  ceiling = (run.get("ceiling") or {}).get("flops_per_s")
  rows = []
  for cells in run["tables"].values():
    for cell in cells:
      row = {k: cell.get(k) for k in FIELDS}
      row.update(variant=variant or None, date=run["date"], peak_flops_spec=run.get("peak_flops"),
                 measured_ceiling_flops=ceiling, jax=run["machine"]["jax"])
      rows.append(row)
  return rows


def write_rows(path: str, rows: list[dict]) -> None:
  """The rows as a JSON list, one key a line (diffs stay readable)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(rows, f, indent=1)
    f.write("\n")
  print(f"{len(rows)} rows -> {path}")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("files", nargs="+", help="train_throughput.py --json outputs, "
                 "each optionally FILE:LABEL")
  p.add_argument("--out", required=True)
  p.add_argument("--append", action="store_true",
                 help="keep the rows already in --out (a later call's cells)")
  args = p.parse_args(argv)
  rows = []
  if args.append and os.path.exists(args.out):
    with open(args.out) as f:
      rows = json.load(f)
  write_rows(args.out, rows + [row for path in args.files for row in rows_of(path)])
  return 0


if __name__ == "__main__":
  raise SystemExit(main())

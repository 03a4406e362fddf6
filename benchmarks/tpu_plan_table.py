r"""The table users plan TPU runs from: for each objective and size at length 512
on each slice, the largest global batch that fits (fsdp over the slice) under
the default remat policy and the most memory-saving one, with the plan's
estimated step time, MFU and collectives at that batch.

    pip install -e '.[tpu]'
    python benchmarks/tpu_plan_table.py --out=benchmarks/tpu_plan_table.jsonl
    # the configs' own layout (data-parallel, unscanned) at the batches found:
    python benchmarks/tpu_plan_table.py --sizes=base --remat=none --layout=default

Every number is maelm_jax.plan's: the run's own step compiled by libtpu for the
named chips on this CPU host, a compile-time model, not a measurement. The
largest batch is found by bisection on the batch (a multiple of the slice's
chips), starting from the linear estimate one compile gives: compile time, not
a grid, is the cost (about 20-60 s a compile on 2 cores with scanned layers).
Each row is written to --out as it finishes, and a rerun skips the rows already
there (a row searched but without a current estimate gets only the estimate; a
row whose estimate no longer fits, the step having changed since its search, is
searched again);
--markdown prints the table from the file.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "configs"))

from maelm_jax import plan  # noqa: E402  (sets the planner's environment first)
import pretrain  # noqa: E402

OBJECTIVES = {"mlm": {}, "maelm": {}, "3ml": {"model.decoder_type": "cross"}}
REMAT = ("none", "full")  # The default, and the most memory-saving policy.


# How a row lays the step out: 'fsdp' (the search's) fsdp over the slice, layers
# scanned (one compiled layer per stack: fast compiles); 'default' the configs'
# own layout, data-parallel (the weights on every chip) with unscanned layers.
LAYOUTS = ("fsdp", "default")


def make_config(objective, size, batch, remat, chips, seq_len, layout="fsdp"):
  config = pretrain.get_config(f"objective={objective},size={size}")
  config.unlock()
  config.seq_len, config.batch_size = seq_len, batch
  config.mesh_shape = (1, chips, 1) if layout == "fsdp" else (chips, 1, 1)
  config.tokenizer.vocab_size = 32000  # A BERT-sized vocabulary.
  config.model.scan_layers = layout == "fsdp"
  config.model.remat_policy = remat
  for key, value in OBJECTIVES[objective].items():
    node = config
    *parents, name = key.split(".")
    for part in parents:
      node = node[part]
    node[name] = value
  return config


def try_batch(objective, size, batch, remat, devices, topology, seq_len,
              estimate=False, layout="fsdp"):
  config = make_config(objective, size, batch, remat, len(devices), seq_len, layout)
  result = plan.plan_built(plan.build(config, devices), topology, devices,
                           estimate=estimate)
  gc.collect()
  return result


def largest_batch(objective, size, remat, devices, topology, seq_len, log):
  """Bisection on the global batch (multiples of the chip count), from the
  linear estimate one compile gives."""
  chips = len(devices)
  compiles = 0

  def fits(batch):
    nonlocal compiles
    compiles += 1
    started = time.perf_counter()
    result = try_batch(objective, size, batch, remat, devices, topology, seq_len)
    log(f"    batch {batch}: {'fits' if result['fits'] else 'no'} "
        f"({result['bytes_per_chip']['total'] / 1e9:.1f} GB, "
        f"{time.perf_counter() - started:.0f} s)")
    return result

  probe_batch = chips * 8
  probe = fits(probe_batch)
  if not probe["fits"]:
    lo, best, hi = 0, None, probe_batch
  else:
    lo, best = probe_batch, probe
    used = probe["bytes_per_chip"]
    budget = probe["hbm_bytes_per_chip"] * (1 - plan.MARGIN)
    per_row = used["temporaries"] / probe_batch
    guess = int((budget - (used["total"] - used["temporaries"])) / per_row)
    guess = max(probe_batch, guess // chips * chips)
    hi = None
    while hi is None:  # Up from the guess until a batch does not fit.
      result = fits(guess)
      if result["fits"]:
        lo, best, guess = guess, result, max(guess + chips, int(guess * 1.25) // chips * chips)
      else:
        hi = guess
  # To a multiple of the chips, or within 1/16: compiled memory is not quite
  # monotonic in the batch (XLA schedules each program anew), so finer is noise.
  while hi - lo > max(chips, lo // 16):
    middle = (lo + hi) // 2 // chips * chips
    if middle in (lo, hi):
      break
    result = fits(middle)
    if result["fits"]:
      lo, best = middle, result
    else:
      hi = middle
  if lo:
    best = estimate_at(objective, size, remat, devices, topology, seq_len, lo, log) or best
  return lo, best, compiles


def estimate_at(objective, size, remat, devices, topology, seq_len, batch, log,
                layout="fsdp"):
  """The plan's estimate (step time, MFU, what bounds it) at `batch`."""
  try:
    return try_batch(objective, size, batch, remat, devices, topology, seq_len,
                     estimate=True, layout=layout)
  except Exception as error:  # pylint: disable=broad-except
    log(f"    no estimate at batch {batch}: {str(error).splitlines()[0][:200]}")
    return None


# How the estimate counted HBM traffic: rows estimated with an older count are
# estimated again. "hlo_stats": arrays in TPU VMEM counted as HBM traffic and
# loops with u32 counters run once (pessimistic by about 1.3x at `base`);
# before it, XLA's "bytes accessed" (every operand whole).
HBM_COUNT = "hlo_stats-hbm-only"
OLD_COUNTS = ("hlo_stats",)  # Still printed, marked, until estimated again.


# The step a row was estimated with: rows of an earlier step are estimated
# again, at the batch their search found (a smaller step may fit a larger one:
# not searched). Before "maelm_attention": the stock Pallas kernel (its bias per
# row, its statistics block-wide); then the project's kernel
# (`modeling/tpu_attention.py`) without activation constraints (XLA laid fsdp's
# activations out as the weights); then with them (`model._constrain`); now
# with the recipe's rotary positions (no encoder bias; before, a relative bias).
STEP = "maelm_attention+constraints+rope"


def is_current(row) -> bool:
  return ("roofline_seconds" in row and row.get("hbm_count") == HBM_COUNT
          and row.get("step") == STEP)


def is_old_count(row) -> bool:
  """Estimated with an older count, or of the step before the project's kernel."""
  return "roofline_seconds" in row and (
      row.get("hbm_count") in OLD_COUNTS or (row.get("hbm_count") == HBM_COUNT and
                                             not is_current(row)))


def key(row) -> tuple:
  return (row["objective"], row["size"], row["topology"], row["remat"],
          row.get("layout", "fsdp"))


def markdown(rows) -> list[str]:
  """The table: the roofline's step (the largest of its terms, `bound_by`) and,
  beside it, the step if only the FLOPs counted (the best case), with the MFU
  of each."""
  lines = ["| objective | size | slice | remat | layout | batch | memory/chip | "
           "est. step (bound by) | est. tokens/s | est. MFU | FLOP-bound step (MFU) | "
           "collectives per step |",
           "|---|---|---|---|---|--:|--:|--:|--:|--:|--:|---|"]
  order = lambda row: (["base", "large"].index(row["size"]) if row["size"] in ("base", "large")
                       else 2, list(OBJECTIVES).index(row["objective"]), row["topology"],
                       list(REMAT).index(row["remat"]) if row["remat"] in REMAT else 2,
                       row.get("layout", "fsdp") != "fsdp")
  for row in sorted(rows, key=order):
    # fsdp rows: the largest batch that fits; default rows: the fsdp row's batch.
    head = (f"| {row['objective']} | {row['size']} | {row['topology']} | "
            f"{row['remat']} | {row.get('layout', 'fsdp')} | ")
    if row.get("fits") is False:  # Estimated after a change to the step.
      lines.append(head + f"{row['batch']}? | {row['bytes_per_chip'] / 1e9:.1f} GB | "
                   "over the chip now: the step changed since the search; "
                   "search pending | | | | |")
      continue
    if not row["batch"] or not (is_current(row) or is_old_count(row)):
      memory = (f"{row['bytes_per_chip'] / 1e9:.1f} GB" if row.get("bytes_per_chip")
                else "")
      lines.append(head + f"{row['batch'] or 'none fits'} | {memory} | "
                   f"{'estimate pending' if row['batch'] else ''} | | | | |")
      continue
    collectives = ", ".join(f"{k} {v['count']}" for k, v in row["collectives"].items())
    # At least the model's FLOPs at peak (rows planned before plan.py floored
    # XLA's count at the model's: XLA counts its own loops' bodies once).
    flop_bound = max(row.get("roofline_seconds", {}).get("flops", 0.0),
                     row["mfu"] * row["step_seconds"])
    best = f"{flop_bound * 1e3:.0f} ms ({row['mfu'] * row['step_seconds'] / flop_bound:.0%})"
    lines.append(
        head + f"{row['batch']} | {row['bytes_per_chip'] / 1e9:.1f} GB | "
        f"{row['step_seconds'] * 1e3:.0f} ms ({row.get('bound_by', '')}"
        f"{'' if is_current(row) else ', old count' if row.get('hbm_count') != HBM_COUNT else ', earlier step'}) | "
        f"{row['tokens_per_second']:,.0f} | {row['mfu']:.0%} | {best} | {collectives} |")
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="benchmarks/tpu_plan_table.jsonl")
  parser.add_argument("--objectives", default="mlm,maelm,3ml")
  parser.add_argument("--sizes", default="base,large")
  parser.add_argument("--topologies", default="v5e:4x4,v5p:2x2x1")
  parser.add_argument("--remat", default=",".join(REMAT))
  parser.add_argument("--seq_len", type=int, default=512)
  parser.add_argument("--layout", default="fsdp", choices=LAYOUTS,
                      help="fsdp: search the largest batch (fsdp over the slice, "
                      "scanned layers); default: estimate the configs' own layout "
                      "(data-parallel, unscanned) at the fsdp row's batch")
  parser.add_argument("--markdown", action="store_true",
                      help="print the table from --out and exit")
  args = parser.parse_args()
  out = pathlib.Path(args.out)
  rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
  if args.markdown:
    print("\n".join(markdown(rows)))
    return
  by_key = {key(r): r for r in rows}
  log = lambda text: print(text, flush=True)
  slices = [plan.topology_devices(t) for t in args.topologies.split(",")]
  for size in args.sizes.split(","):
    for objective in args.objectives.split(","):
      for devices, name in slices:
        for remat in args.remat.split(","):
          old = by_key.get((objective, size, name, remat, args.layout))
          if old is not None and old.get("fits") is False:
            old = None  # The step changed since its search and no longer fits: again.
          if old is not None and (not old["batch"] or is_current(old)):
            continue
          log(f"{objective} {size} {name} remat={remat}:")
          started = time.perf_counter()
          searched = by_key.get((objective, size, name, remat, "fsdp"))
          if args.layout == "default":  # At the batch the fsdp search found.
            if searched is None or not searched["batch"]:
              log("  no fsdp row to take the batch from: search it first")
              continue
            batch, compiles = searched["batch"], 1
            best = estimate_at(objective, size, remat, devices, name, args.seq_len,
                               batch, log, layout="default")
          elif old is not None:  # Searched already: only the estimate is missing.
            batch, compiles = old["batch"], old["compiles"]
            best = estimate_at(objective, size, remat, devices, name, args.seq_len,
                               batch, log)
          else:
            batch, best, compiles = largest_batch(objective, size, remat, devices,
                                                  name, args.seq_len, log)
          row = {"objective": objective, "size": size, "topology": name,
                 "remat": remat, "layout": args.layout, "seq_len": args.seq_len,
                 "batch": batch,
                 "compiles": compiles,
                 "search_seconds": round(time.perf_counter() - started)
                                   + (old or {}).get("search_seconds", 0)}
          if best is not None and best.get("estimated_step_seconds"):
            row.update({"bytes_per_chip": best["bytes_per_chip"]["total"],
                        "step_seconds": best["estimated_step_seconds"],
                        "tokens_per_second": best["estimated_tokens_per_second"],
                        "mfu": best["estimated_mfu"], "bound_by": best["bound_by"],
                        "roofline_seconds": best["roofline_seconds"],
                        "hbm_count": HBM_COUNT, "fits": bool(best["fits"]),
                        "step": STEP,
                        "hbm_traffic_bytes_per_chip": best["hbm_traffic_bytes_per_chip"],
                        "hbm_traffic_by_category_per_chip":
                            best["hbm_traffic_by_category_per_chip"],
                        "hbm_first_principles_per_chip":
                            best["hbm_first_principles_per_chip"],
                        "collectives": best["collectives"],
                        "attention": {k: v["implementation"]
                                      for k, v in best["attention"].items()}})
          by_key[key(row)] = row
          rows = list(by_key.values())
          temporary = out.with_suffix(".tmp")  # A killed run keeps the old file.
          temporary.write_text("".join(json.dumps(r) + "\n" for r in rows))
          temporary.replace(out)
          log(f"  -> batch {batch} ({compiles} compiles, {row['search_seconds']} s)")
  print("\n".join(markdown(rows)))


if __name__ == "__main__":
  main()

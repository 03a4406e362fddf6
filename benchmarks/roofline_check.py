r"""How far to trust the planner's roofline: plan a step for this machine's own
accelerator, then run that same compiled step and time it.

  # on a GPU
  python benchmarks/roofline_check.py --config=configs/pretrain.py:objective=mlm,size=base \
      --set=seq_len=512 --set=batch_size=128 --set=model.dtype=bfloat16 \
      --set=model.scan_layers=True --json=runs/roofline.json
  # the plumbing on a CPU, with a named chip's constants (the numbers mean nothing)
  python benchmarks/roofline_check.py --config=configs/pretrain.py:objective=mlm,size=tiny \
      --set=seq_len=64 --set=batch_size=8 --chip=H100

The step is `maelm_jax.plan`'s: `plan.build` (the run's own `pretrain_program`)
over a one-device mesh, compiled once by `plan.plan_built`, which reads its memory,
FLOPs, HBM traffic (`tools/hlo_stats.py`) and roofline with the chip's constants
(`flops.CHIPS`). The executable it compiled (`Built.compiled`) then runs on random
token ids from freshly initialised state: one warm-up step, then `--repeats`
windows of `--steps` steps, the median reported. The row says the measured step
against the roofline's estimate and against its FLOP term (the best case), the
MFU of each, and the compiled memory against the allocator's peak, where the
platform reports one.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# plan.py pins the CPU (it plans TPU chips from a CPU host); this measures the
# machine's own accelerator, so jax picks the platform unless told otherwise.
os.environ.setdefault("JAX_PLATFORMS", "")

from maelm_jax import plan  # noqa: E402
from maelm_jax.core import sharding  # noqa: E402
from maelm_jax.core import special_tokens  # noqa: E402
from maelm_jax.modeling import flops  # noqa: E402
from maelm_jax.run import config_lib, train_lib  # noqa: E402


def make_config(config_arg: str, settings):
  module = config_lib.load_config_module(config_arg)
  config = module.get_config(config_arg.split(":", 1)[1] if ":" in config_arg else None)
  config.unlock()
  config.mesh_shape = (1, 1, 1)
  for setting in settings:
    key, _, text = setting.partition("=")
    config_lib.typed_set(config, key, text)
  return config


def random_ids(batch: int, seq_len: int, vocab_size: int, seed: int):
  """Full rows `[CLS] w .. w [SEP]`, w uniform over the non-special ids."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  ids = rng.randint(special_tokens.NUM_SPECIAL, vocab_size, (batch, seq_len))
  ids[:, 0], ids[:, -1] = special_tokens.CLS_ID, special_tokens.SEP_ID
  return ids.astype(np.int32)


def check(config, chip_name: str = "", steps: int = 10, repeats: int = 3,
          seed: int = 0) -> dict:
  """Plans `config` for the first local device, runs the planned executable and
  returns the plan beside the measurement."""
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()[:1]
  chip = flops.CHIPS[chip_name] if chip_name else None
  built = plan.build(config, devices)
  result = plan.plan_built(built, devices[0].device_kind, devices, chip=chip)
  if built.compiled is None:
    raise SystemExit(f"the step does not compile on {devices[0].device_kind}: "
                     f"{result.get('compile_error', '')[:200]}")
  program = built.program
  state, _ = train_lib.create_sharded_state(built.model_cfg, built.seq_len, program.tx,
                                            built.mesh, seed)
  ids = random_ids(built.batch_size, built.seq_len, built.model_cfg.vocab_size, seed)
  batch = {"input_ids": jax.device_put(ids, sharding.batch_sharding(built.mesh))}
  step = built.compiled
  knots = program.learning_rate_knots
  started = time.perf_counter()
  state, metrics = step(state, batch, knots)
  jax.block_until_ready((state, metrics))
  warm_up = time.perf_counter() - started
  windows = []
  for _ in range(repeats):
    started = time.perf_counter()
    for _ in range(steps):
      state, metrics = step(state, batch, knots)
    jax.block_until_ready((state, metrics))
    windows.append((time.perf_counter() - started) / steps)
  loss = float(metrics["loss"])
  measured = statistics.median(windows)
  stats = devices[0].memory_stats() or {}
  peak_flops = result["chip_constants"]["peak_flops"]
  terms = result["roofline_seconds"]
  row = {
      "device": devices[0].device_kind, "chip_constants": result["chip_constants"],
      "objective": built.config.model.objective,
      "decoder_type": built.config.model.decoder_type,
      "batch_size": built.batch_size, "seq_len": built.seq_len,
      "dtype": built.config.model.dtype, "scan_layers": built.model_cfg.scan_layers,
      "remat_policy": built.model_cfg.remat_policy,
      "attention": {site: v["implementation"] for site, v in result["attention"].items()},
      "measured_step_seconds": measured, "step_seconds_windows": windows,
      "warm_up_seconds": warm_up, "final_loss": loss,
      "estimated_step_seconds": result["estimated_step_seconds"],
      "roofline_seconds": terms, "bound_by": result["bound_by"],
      "measured_over_estimate": measured / result["estimated_step_seconds"],
      "measured_over_flop_term": measured / terms["flops"],
      "model_flops": built.model_flops,
      "measured_mfu": built.model_flops / (measured * peak_flops),
      "estimated_mfu": result["estimated_mfu"],
      "hbm_traffic_bytes": result["hbm_traffic_bytes_per_chip"],
      "xla_bytes_accessed": result["xla_bytes_accessed_per_chip"],
      "xla_flops_notes": result["xla_flops_notes"],
      # Where XLA's count fell below the model's (a GPU's cuBLAS and cuDNN calls
      # count nothing), the FLOP term is the model's: then this check tests the
      # model-FLOP and HBM terms of the roofline, not XLA's count.
      "xla_flops_counted": result["xla_flops_counted_per_chip"],
      "flop_term_source": ("model" if result["xla_flops_per_chip"]
                           == result["model_flops_per_chip"] else "xla"),
      "planned_bytes": result["bytes_per_chip"]["total"],
      "measured_peak_bytes": stats.get("peak_bytes_in_use"),
      "compile_seconds": result["compile_seconds"],
      "command": " ".join(["python", "benchmarks/roofline_check.py"] + sys.argv[1:]),
  }
  return row


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--config", default="configs/pretrain.py:objective=mlm,size=base",
                 help="a pretraining config file and its argument")
  p.add_argument("--set", action="append", default=[],
                 help="key=value: a config override (repeatable)")
  p.add_argument("--chip", default="", choices=[""] + sorted(flops.CHIPS),
                 help="plan with this chip's constants (default: the device's own)")
  p.add_argument("--steps", type=int, default=10, help="steps per timed window")
  p.add_argument("--repeats", type=int, default=3, help="timed windows (median)")
  p.add_argument("--json", default="", help="append the row to this JSON-lines file")
  args = p.parse_args(argv)
  try:
    row = check(make_config(args.config, args.set), args.chip, args.steps, args.repeats)
  except plan.PlanError as error:
    print(f"roofline_check: {error}", file=sys.stderr)
    return 1
  terms = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in row["roofline_seconds"].items())
  print(f"{row['device']}: {row['objective']} batch {row['batch_size']} x {row['seq_len']}, "
        f"{row['dtype']}\n"
        f"  measured step {row['measured_step_seconds'] * 1e3:.1f} ms "
        f"(MFU {row['measured_mfu']:.1%}); roofline {row['estimated_step_seconds'] * 1e3:.1f} ms "
        f"(bound by {row['bound_by']}: {terms}; MFU {row['estimated_mfu']:.1%})\n"
        f"  measured / estimate {row['measured_over_estimate']:.2f}, "
        f"measured / FLOP term {row['measured_over_flop_term']:.2f}; memory planned "
        f"{row['planned_bytes'] / 1e9:.2f} GB, allocator peak "
        + (f"{row['measured_peak_bytes'] / 1e9:.2f} GB" if row["measured_peak_bytes"]
           else "not reported"), flush=True)
  if args.json:
    pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "a") as f:
      f.write(json.dumps(row) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())

r"""Where our `mlm` step's time goes beyond the model's matmuls: variants of the
step at the peer race's configuration (benchmarks/peer_race.py), timed side by
side in one process.

  .venv/bin/python benchmarks/step_overheads.py                 # float32
  .venv/bin/python benchmarks/step_overheads.py --dtype=bfloat16 --out=benchmarks/peer-race.md

Variants (each its own compiled step and state; everything else as the race):
  as raced          dropout 0.1 (hidden and attention), none inside the FFN;
  + FFN dropout     model.activation_dropout=0.1: the model before it had that knob,
                    when the FFN's [B, L, 4d] hidden units dropped out at `dropout`;
  no dropout        dropout 0: no random bits drawn (the masks' are negligible);
  no guard          the non-finite guard removed (train_lib's `isfinite` patched to
                    a constant True while tracing, so XLA drops the selects over
                    params and Adam moments).
Timing: after compile and one untimed step each, --rounds rounds; in each, every
variant in turn (order rotated) runs --steps steps, ended by block_until_ready.
Reported: median step time, and the median over rounds of (variant / as raced)
step-time ratio, which pairs neighbouring windows on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import pathlib
import statistics
import sys
import time
import types

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import peer_race  # noqa: E402
import train_throughput as tt  # noqa: E402
from maelm_jax.core import sharding  # noqa: E402
from maelm_jax.run import train_lib  # noqa: E402

VARIANTS = {  # name -> (config.model overrides, guard removed)
    "as raced": ({}, False),
    "+ FFN dropout (before activation_dropout)": ({"activation_dropout": 0.1}, False),
    "no dropout": ({"dropout": 0.0, "attention_dropout": 0.0}, False),
    "no non-finite guard": ({}, True),
}


@contextlib.contextmanager
def guard_removed():
  """train_lib's `jnp.isfinite` as a constant True while a step is traced."""
  module = types.ModuleType("jnp_without_isfinite")
  module.__getattr__ = lambda name: getattr(jnp, name)
  module.isfinite = lambda x: jnp.ones((), bool)
  saved, train_lib.jnp = train_lib.jnp, module
  try:
    yield
  finally:
    train_lib.jnp = saved


class Variant:
  def __init__(self, name, dtype, ids, seed=0):
    overrides, no_guard = VARIANTS[name]
    self.name = name
    config, model_cfg = peer_race.ours_config(dtype, **overrides)
    tx = train_lib.make_optimizer(config)
    mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
    self.state, shardings = train_lib.create_sharded_state(
        model_cfg, peer_race.SEQ_LEN, tx, mesh, seed)
    step, _ = train_lib.jit_steps(model_cfg, peer_race.SEQ_LEN, tx, mesh, shardings, 1)
    self.batch = {"input_ids": jax.device_put(ids, sharding.batch_sharding(mesh))}
    self.knots = train_lib.learning_rate_knots(config)
    with guard_removed() if no_guard else contextlib.nullcontext():
      self.step = step.lower(self.state, self.batch, self.knots).compile()
    self.run(1)
    self.seconds = []

  def run(self, steps):
    t0 = time.perf_counter()
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch, self.knots)
    jax.block_until_ready((self.state, metrics))
    return time.perf_counter() - t0


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--rounds", type=int, default=8)
  p.add_argument("--steps", type=int, default=3)
  p.add_argument("--out", default="", help="markdown file to append the table to")
  args = p.parse_args(argv)
  started = datetime.datetime.now(datetime.timezone.utc)
  ids = tt.random_batch(peer_race.BATCH, peer_race.SEQ_LEN, 0)
  variants = [Variant(name, args.dtype, ids) for name in VARIANTS]
  meter = tt.CpuMeter()
  for rnd in range(args.rounds):
    order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
    for v in order:
      time.sleep(0.2)
      v.seconds.append(v.run(args.steps) / args.steps)
    print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
        f"{v.name} {v.seconds[-1] * 1e3:.0f} ms" for v in variants), flush=True)
  others = meter.others_cores()
  base = variants[0]
  lines = [
      f"### Step overheads, {args.dtype} ({started:%Y-%m-%d %H:%M} UTC)", "",
      f"- Machine: {peer_race._cpu_model()}, {peer_race._cores()} cores; jax "
      f"{jax.__version__}; other processes' CPU while timing: "
      + ("n/a" if others is None else f"{others:.2f} cores"),
      f"- Command: `.venv/bin/python benchmarks/step_overheads.py --dtype={args.dtype} "
      f"--rounds={args.rounds} --steps={args.steps}`", "",
      "| variant | step ms (median) | step time / as raced (per-round median [min–max]) |",
      "|---|--:|--:|"]
  for v in variants:
    ratios = [a / b for a, b in zip(v.seconds, base.seconds)]
    lines.append(f"| {v.name} | {statistics.median(v.seconds) * 1e3:,.0f} | "
                 f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] |")
  table = "\n".join(lines) + "\n"
  print()
  print(table)
  if args.out:
    path = pathlib.Path(args.out)
    path = path if path.is_absolute() else REPO / path
    text = path.read_text() if path.exists() else ""
    with open(path, "a") as f:
      f.write(("" if text.endswith("\n\n") or not text else "\n") + table)
    print(f"appended to {path}")


if __name__ == "__main__":
  main()

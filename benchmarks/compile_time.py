r"""Compile time of the train step with unrolled and scanned layers
(`model.scan_layers`), and what each remat policy keeps for the backward pass.

  python benchmarks/compile_time.py                       # base and large, CPU
  python benchmarks/compile_time.py --sizes=base --objectives=mlm,maelm \
      --seq_len=512 --batch=32 --dtype=bfloat16           # on an accelerator

Nothing is allocated: the train step is lowered and compiled from the abstract,
sharded state (as resume does), on one device. Each line: size, objective,
layout, lowering and compile seconds; then the bytes the backward pass keeps
from the forward pass under each `model.remat_policy` (jax's saved residuals,
parameters included; the same on every platform), and where the platform reports
it, the compiled step's temporary memory.
"""

import argparse
import json
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "configs")]

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pretrain  # noqa: E402  (configs/pretrain.py)
from maelm_jax.modeling import model as model_lib  # noqa: E402
from maelm_jax.core import sharding  # noqa: E402
from maelm_jax.run import train_lib  # noqa: E402


def model_config(size, objective, dtype, vocab, **knobs):
  config = pretrain.get_config(f"objective={objective},size={size}")
  config.unlock()
  config.model.dtype = dtype
  from maelm_jax.run import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(config)
  cfg = model_lib.ModelConfig.from_config(config.model, vocab, 4)
  return model_lib.dataclasses.replace(cfg, **knobs), config


def lower_abstract_step(cfg, config, seq_len, batch):
  """The train step lowered from the abstract sharded state on one device (nothing
  allocated), and the seconds lowering took."""
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  tx = train_lib.make_optimizer(config)
  abstract, shardings = train_lib.abstract_sharded_state(cfg, seq_len, tx, mesh)
  step, _ = train_lib.jit_steps(cfg, seq_len, tx, mesh, shardings)
  ids = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32,
                             sharding=sharding.batch_sharding(mesh))
  start = time.perf_counter()
  lowered = step.lower(abstract, {"input_ids": ids}, train_lib.learning_rate_knots(config))
  return lowered, time.perf_counter() - start


def compile_seconds(cfg, config, seq_len, batch):
  lowered, lower_s = lower_abstract_step(cfg, config, seq_len, batch)
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  done = time.perf_counter()
  memory = compiled.memory_analysis()
  temp = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None
  return lower_s, done - lowered_at, temp


def kept_bytes(cfg, seq_len, batch):
  from jax._src.ad_checkpoint import saved_residuals  # pylint: disable=g-import-not-at-top
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import masking  # pylint: disable=g-import-not-at-top
  ids = jnp.full((batch, seq_len), 7, jnp.int32)
  masks = masking.draw_masks(jax.random.PRNGKey(0), ids, cfg.mask_counts(seq_len),
                             mask_id=4, vocab_size=cfg.vocab_size)
  model = model_lib.MaskedLM(cfg)
  params = jax.eval_shape(lambda: nn.meta.unbox(
      model.init(jax.random.PRNGKey(0), masks)["params"]))

  def loss_fn(p):
    logits = model.apply({"params": p}, masks)
    return model_lib.masked_lm_loss(logits, masks.targets, masks.selected_weights)[0]

  return sum(int(np.prod(a.shape)) * a.dtype.itemsize
             for a, _ in saved_residuals(loss_fn, params))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="base,large")
  p.add_argument("--objectives", default="mlm")
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--vocab", type=int, default=32000)
  p.add_argument("--remat", action="store_true", help="also the remat policies")
  p.add_argument("--out", default="")
  args = p.parse_args()
  print(f"device: {jax.devices()[0].device_kind}, jax {jax.__version__}", flush=True)
  for size in args.sizes.split(","):
    for objective in args.objectives.split(","):
      for scan in (False, True):
        cfg, config = model_config(size, objective, args.dtype, args.vocab,
                                   scan_layers=scan)
        lower_s, compile_s, temp = compile_seconds(cfg, config, args.seq_len,
                                                   args.batch)
        record = {"size": size, "objective": objective, "scan_layers": scan,
                  "layers": cfg.num_layers, "lower_s": round(lower_s, 2),
                  "compile_s": round(compile_s, 2), "temp_bytes": temp,
                  "seq_len": args.seq_len, "batch": args.batch, "dtype": args.dtype,
                  "device": jax.devices()[0].device_kind}
        print(json.dumps(record), flush=True)
        if args.out:
          with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
      if args.remat:
        for policy in model_lib.REMAT_POLICIES:
          cfg, _ = model_config(size, objective, args.dtype, args.vocab,
                                remat_policy=policy, scan_layers=True)
          print(json.dumps({"size": size, "objective": objective,
                            "remat_policy": policy,
                            "kept_mb": round(kept_bytes(cfg, args.seq_len,
                                                        args.batch) / 1e6, 1)}),
                flush=True)


if __name__ == "__main__":
  main()

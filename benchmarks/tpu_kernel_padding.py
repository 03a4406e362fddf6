r"""MAE-LM's and 3ML's encoders on the TPU kernel, before and after padding.

Before 2026-11-27 the Pallas TPU flash-attention kernel ran only at lengths that
are multiples of 128, so under `attention_impl=auto` the encoder of MAE-LM (L - K
visible tokens: 444 of 512) and 3ML (309 of 512), and the cross decoder (K
queries), fell back to the einsum on a TPU. Now `attention.tpu_flash_attention`
pads them to the kernel's blocks. This compiles the same step both ways for a
TPU slice on this CPU host (maelm_jax.plan) and prints the plan of each: the
attention per call site, memory per chip, FLOPs and the roofline estimate.
"Before" is the old rule put back for the run (the one condition it had).

    pip install -e '.[tpu]'
    python benchmarks/tpu_kernel_padding.py --topology=v5e:2x2 --size=base \
        --batch_size=64 --out=runs/kernel_padding.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "configs"))

from maelm_jax.modeling import attention  # noqa: E402
from maelm_jax import plan  # noqa: E402
import pretrain  # noqa: E402

CASES = {"maelm": {}, "3ml (cross)": {"decoder_type": "cross"}}


def old_rule(unmet):
  """The kernel's rule before padding: lengths that are multiples of 128."""
  def rule(dropout_active, q_len, kv_len):
    why = unmet(dropout_active, q_len, kv_len)
    if q_len % 128 or kv_len % 128:
      why.append(f"sequence lengths that are multiples of 128 (queries {q_len}, "
                 f"keys {kv_len})")
    return why
  return rule


def plan_case(objective, model_overrides, args, devices, topology):
  config = pretrain.get_config(f"objective={objective},size={args.size}")
  config.unlock()
  config.seq_len, config.batch_size = args.seq_len, args.batch_size
  config.tokenizer.vocab_size = 32000
  config.model.attention_dropout = 0.0  # The kernel runs without it.
  for key, value in model_overrides.items():
    config.model[key] = value
  return plan.plan_built(plan.build(config, devices), topology, devices)


def summary(result) -> dict:
  return {"attention": {k: v["implementation"] for k, v in result["attention"].items()},
          "bytes_per_chip": result["bytes_per_chip"]["total"],
          "xla_flops_per_chip": result["xla_flops_per_chip"],
          "estimated_step_seconds": result["estimated_step_seconds"],
          "estimated_mfu": result["estimated_mfu"], "bound_by": result["bound_by"],
          "roofline_seconds": result["roofline_seconds"],
          "tpu_custom_calls": result["tpu_custom_calls"]["per_step"]}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--topology", default="v5e:2x2")
  parser.add_argument("--size", default="base")
  parser.add_argument("--seq_len", type=int, default=512)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  devices, topology = plan.topology_devices(args.topology)
  rows = {}
  for name, overrides in CASES.items():
    objective = name.split()[0]
    now = attention.tpu_flash_unmet
    attention.tpu_flash_unmet = old_rule(now)
    try:
      before = summary(plan_case(objective, overrides, args, devices, topology))
    finally:
      attention.tpu_flash_unmet = now
    after = summary(plan_case(objective, overrides, args, devices, topology))
    rows[name] = {"before": before, "after": after}
    for when, row in (("before", before), ("after", after)):
      print(f"{name:12} {when:6} attention {row['attention']}, kernel calls "
            f"{row['tpu_custom_calls']}, {row['bytes_per_chip'] / 1e9:.2f} GB/chip, "
            f"est. {row['estimated_step_seconds'] * 1e3:.1f} ms/step "
            f"(bound by {row['bound_by']}), MFU {row['estimated_mfu']:.1%}", flush=True)
  if args.out:
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
      json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
  main()

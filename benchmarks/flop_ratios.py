r"""Training FLOPs per step of MAE-LM and 3ML relative to MLM, by the FLOP model.

  python benchmarks/flop_ratios.py                       # sizes tiny..large, L=128
  python benchmarks/flop_ratios.py --seq_len=512 --decoder_layers=2
  python benchmarks/flop_ratios.py --sizes=tiny --num_layers=2,4,8,12   # deeper tiny

Each objective at its config's defaults (`configs/pretrain.py`: mask ratio,
decoder depth per size) and `maelm_jax.modeling.flops.train_flops_per_step`: matmuls, 3x
forward. Below 1.00x an objective is cheaper per step than MLM; the papers'
"RoBERTa quality at 78% / 68% of the compute" needs 0.78x / 0.68x per token seen.
No model is built and nothing runs: seconds on any machine.
"""

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import compile_time  # noqa: E402
from maelm_jax.modeling import flops  # noqa: E402

OBJECTIVES = {"mlm": ("mlm", {}), "maelm": ("maelm", {}),
              "maelm (cross)": ("maelm", {"decoder_type": "cross"}),
              "3ml (self)": ("3ml", {}), "3ml (cross)": ("3ml", {"decoder_type": "cross"})}


def ratios(size: str, seq_len: int, vocab: int, **knobs) -> dict[str, float]:
  """Objective -> its train FLOPs per step / mlm's, at one size."""
  out = {}
  for name, (objective, extra) in OBJECTIVES.items():
    cfg, _ = compile_time.model_config(size, objective, "float32", vocab,
                                       **{**knobs, **extra})
    out[name] = flops.train_flops_per_step(cfg, seq_len, 1)
  return {name: f / out["mlm"] for name, f in out.items()}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--sizes", default="tiny,small,base,large")
  p.add_argument("--seq_len", type=int, default=128)
  p.add_argument("--vocab", type=int, default=8000)
  p.add_argument("--decoder_layers", type=int, default=None,
                 help="override every size's decoder depth")
  p.add_argument("--num_layers", default="",
                 help="comma-separated encoder depths to tabulate each size at "
                 "(default: the size's own), e.g. 2,8: where the encoder is deep "
                 "enough for the tokens it skips to pay for the decoder")
  args = p.parse_args(argv)
  knobs = {} if args.decoder_layers is None else {"decoder_layers": args.decoder_layers}
  depths = [int(d) for d in args.num_layers.split(",")] if args.num_layers else [None]
  print(f"| size (L={args.seq_len}, vocab {args.vocab}) | " + " | ".join(OBJECTIVES)
        + " |")
  print("|---|" + "--:|" * len(OBJECTIVES))
  for size in args.sizes.split(","):
    for depth in depths:
      extra = {} if depth is None else {"num_layers": depth}
      r = ratios(size, args.seq_len, args.vocab, **knobs, **extra)
      label = size if depth is None else f"{size}, {depth} layers"
      print(f"| {label} | " + " | ".join(f"{r[name]:.2f}x" for name in OBJECTIVES)
            + " |")


if __name__ == "__main__":
  main()

r"""BLiMP and held-out [MASK] accuracy against pretraining FLOPs (log axis) for
runs of very different budgets, e.g. the CPU study's 8-layer MLM against the
same model pretrained on one GPU (studies/gpu-encoders.md, "8 x 128, batch 128, float32,
one H200").

  python studies/lever_plot.py --out=docs/lever_gpu.png \
      --run=mlm_cpu_240tf=runs/study8/pretrain/mlm_seed0:runs/study8/blimp/mlm_seed0 \
      --run=mlm_gpu=runs/gpu_study/pretrain/mlm_gpu:runs/gpu_study/blimp/mlm_gpu,runs/gpu_study/blimp/mlm_gpu_half

Each --run is name=workdir[:folders of BLiMP results]: the workdir gives the
[MASK] accuracy curve (its metrics.jsonl) and the FLOPs per step (its config);
every `step<N>_<pairs>.json` in the folders (written by `maelm_jax.compare` or
`studies/score_encoders.py`) is a BLiMP point at step N, with its 95% interval.
"""

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ml_collections  # noqa: E402

from maelm_jax import compare  # noqa: E402
from maelm_jax.core import workdir as workdir_lib  # noqa: E402


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--run", action="append", required=True)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  runs, scores = [], {}
  for spec in args.run:
    name, rest = spec.split("=", 1)
    workdir, _, folders = rest.partition(":")
    config = ml_collections.ConfigDict(workdir_lib.read_config(workdir))
    runs.append({"name": name, "workdir": workdir, "config": config})
    for folder in filter(None, folders.split(",")):
      for path in glob.glob(os.path.join(folder, "step*_*.json")):
        with open(path) as f:
          result = json.load(f)
        scores.setdefault(name, {})[result["step"]] = result
  compare.plot_curves(runs, scores, args.out, log_flops=True)
  for name, by_step in scores.items():
    print(name, {step: round(v["mean"], 1) for step, v in sorted(by_step.items())})


if __name__ == "__main__":
  main()

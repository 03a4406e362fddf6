r"""One JSON row per pretrained encoder: its compute, held-out `[MASK]` accuracy,
BLiMP and GLUE (median, low, high over seeds), readable without the prose around
them (`studies/results/*.json`).

  python studies/encoder_rows.py --encoders=mlm_8x256=W1,maelmx_8x256=W2 \
      --blimp=BLIMP_OUT/blimp.json [--scores=SCORE_OUT/scores.json] \
      --device='one NVIDIA H200' --command='OUT=$OUT bash studies/gpu_call.sh' \
      --out=studies/results/device_encoders.json

W: a pretraining workdir (a slim copy is enough: config.json and metrics.jsonl);
`--blimp`: `maelm_jax.blimp`'s blimp.json scoring them (models named as the
workdirs' folders); `--scores`: `studies/score_encoders.py`'s scores.json. A task
nobody scored is null. Rows already in --out under other names are kept.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.collect_rows import write_rows  # noqa: E402
from maelm_jax.modeling.model import SIZES  # noqa: E402

TASKS = ("sst2", "qnli", "cola")


def encoder_row(name: str, workdir: str, blimp: dict, scores: dict) -> dict:
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    metrics = [json.loads(line) for line in f if line.strip()]
  evals = [m for m in metrics if "eval/mask_accuracy" in m]
  last_step = max(m["step"] for m in metrics)
  # A run stopped between log steps (SIGTERM) saved a later step than it logged.
  checkpoint_dir = os.path.join(workdir, "checkpoints")
  if os.path.isdir(checkpoint_dir):
    last_step = max([last_step] + [int(d) for d in os.listdir(checkpoint_dir)
                                   if d.isdigit()])
  model = config["model"]
  size = SIZES[model.get("size", "tiny")]  # (layers, hidden, ...): keys left at 0.
  flops_per_step = config["total_flops"] / config["total_steps"]
  glue = (scores.get(name) or {}).get("glue", {})
  row = {
      "name": name, "objective": model["objective"],
      "decoder_type": model.get("decoder_type"),
      "shape": f"{model.get('num_layers') or size[0]}x{model.get('hidden') or size[1]}",
      "batch_size": config["batch_size"], "seq_len": config["seq_len"],
      "steps": last_step, "schedule_steps": config["total_steps"],
      "flops": flops_per_step * last_step,
      "tokens": last_step * config["batch_size"] * config["seq_len"],
      "heldout_mask_accuracy": evals[-1]["eval/mask_accuracy"] if evals else None,
      "blimp": (blimp.get(os.path.basename(os.path.normpath(workdir))) or {}).get("mean"),
  }
  for task in TASKS:
    entry = glue.get(task)
    row[task] = None if entry is None else {
        "median": entry["median"], "low": entry["seed_range"][0],
        "high": entry["seed_range"][1], "learning_rate": entry["learning_rate"]}
  return row


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--encoders", required=True, help="name=workdir,...")
  p.add_argument("--blimp", default="", help="maelm_jax.blimp's blimp.json")
  p.add_argument("--scores", default="", help="score_encoders.py's scores.json")
  p.add_argument("--device", default="", help="where they were pretrained")
  p.add_argument("--command", default="", help="the command that pretrained them")
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  blimp = {}
  if args.blimp:
    with open(args.blimp) as f:
      blimp = json.load(f)["models"]
  scores = {}
  if args.scores:
    with open(args.scores) as f:
      scores = json.load(f)
  rows = []
  for item in args.encoders.split(","):
    name, workdir = item.split("=", 1)
    row = encoder_row(name, workdir, blimp, scores)
    row.update(device=args.device, command=args.command)
    rows.append(row)
  if os.path.exists(args.out):
    with open(args.out) as f:
      names = {r["name"] for r in rows}
      rows = [r for r in json.load(f) if r["name"] not in names] + rows
  write_rows(args.out, rows)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())

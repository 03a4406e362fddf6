r"""Scores encoders pretrained elsewhere (another machine, an import) by the
comparison's own protocol: BLiMP, then each GLUE task at the encoder's own
learning rate picked on a split of the training data, 3 seeds
(`maelm_jax.compare.finetune_encoder`, `blimp_scores`; `get_finetune` of the
config). Resumable: finished runs are skipped.

  python studies/score_encoders.py --out=runs/gpu_study \
      --encoders=mlm_gpu=runs/gpu_study/pretrain/mlm_gpu \
      --glue_dir=<data>/glue --tasks=sst2,qnli,cola \
      --blimp_dir=<data>/blimp --blimp_max_pairs=200

Used for the lever: an 8-layer `tiny` pretrained on one GPU, fine-tuned
and scored on the 2 CPU cores exactly as `runs/study8`'s encoders were
(studies/does-pretraining-pay.md, "On one GPU").
"""

import json
import os

from absl import app, flags

from maelm_jax import compare
from maelm_jax.run import config_lib

flags.DEFINE_string("out", None, "Output folder (glue/, glue_select/, finetune/, blimp/).")
flags.DEFINE_list("encoders", None, "name=pretraining workdir, ...")
flags.DEFINE_string("config", "configs/compare.py:size=tiny", "Config with get_finetune.")
flags.DEFINE_string("glue_dir", "", "GLUE folder (tasks/<TASK>/train.tsv, dev.tsv).")
flags.DEFINE_list("tasks", ["sst2", "qnli", "cola"], "GLUE tasks.")
flags.DEFINE_string("blimp_dir", "", "BLiMP folder; empty: no BLiMP.")
flags.DEFINE_integer("blimp_max_pairs", 200, "Pairs per paradigm (0: all).")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  out = os.path.abspath(FLAGS.out)
  module = config_lib.load_config_module(FLAGS.config)
  protocol = module.get_finetune(FLAGS.config.split(":", 1)[1] if ":" in FLAGS.config
                                 else None)
  runs = [{"name": name, "workdir": os.path.abspath(path)}
          for name, path in (e.split("=", 1) for e in FLAGS.encoders)]
  summary = {}
  if FLAGS.blimp_dir:
    for name, by_step in compare.blimp_scores(runs, FLAGS.blimp_dir, out,
                                              max_pairs=FLAGS.blimp_max_pairs).items():
      step, result = max(by_step.items())
      summary.setdefault(name, {})["blimp"] = {"step": step, "mean": result["mean"]}
      print(f"{name}: BLiMP {result['mean']:.1f} at step {step}", flush=True)
  if FLAGS.tasks:
    data_dir = compare.glue_root(FLAGS.glue_dir, out, FLAGS.tasks)
    select_dir = compare.selection_root(data_dir, out, FLAGS.tasks)
    for run in runs:
      report = compare.finetune_encoder(run, FLAGS.tasks, protocol, data_dir,
                                        select_dir, out)
      summary.setdefault(run["name"], {})["glue"] = {
          task: {k: e[k] for k in ("learning_rate", "median", "seed_range")}
          for task, e in report["tasks"].items()}
      print(run["name"], json.dumps(summary[run["name"]]["glue"]), flush=True)
  path = os.path.join(out, "scores.json")
  if os.path.exists(path):  # Another call's encoders stay.
    with open(path) as f:
      summary = {**json.load(f), **summary}
  with open(path + ".tmp", "w") as f:
    json.dump(summary, f, indent=2)
  os.replace(path + ".tmp", path)


if __name__ == "__main__":
  flags.mark_flags_as_required(["out", "encoders"])
  app.run(main)

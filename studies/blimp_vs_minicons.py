r"""BLiMP scoring speed and agreement: `maelm_jax.evaluate.blimp` against minicons.

minicons (`scorer.MaskedLMScorer`, PyTorch) is what BLiMP users score masked LMs
with today. Both score the same pairs with the same MLM: ours from the
pretraining workdir, minicons from its `export_hf --with_lm_head` export (the
PyTorch port, `trust_remote_code`). Same PLL variant on both sides: `token`
against minicons' "original"; `word_l2r` against its "within_word_l2r" (which
finds words with the exported fast tokenizer's word ids). Reports pairs/s of
each (scoring only, after one warm-up call each, which includes our
compilations) and the share of pairs both decide the same way.

  pip install minicons   # beside the test extras (torch, transformers)
  python studies/blimp_vs_minicons.py --workdir=W --data=<data>/blimp \
      --pairs_per_paradigm=20 --variant=token
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from maelm_jax.evaluate import blimp  # noqa: E402

MINICONS_METRIC = {"token": "original", "word_l2r": "within_word_l2r"}


def minicons_scores(export_dir, sentences, variant, batch_size):
  import torch  # pylint: disable=g-import-not-at-top
  from minicons import scorer  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count())
  model = scorer.MaskedLMScorer(export_dir, "cpu", trust_remote_code=True)
  out = []
  for i in range(0, len(sentences), batch_size):
    out += model.sequence_score(sentences[i:i + batch_size],
                                PLL_metric=MINICONS_METRIC[variant],
                                reduction=lambda x: x.sum(0).item())
  return np.asarray(out)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--data", required=True)
  p.add_argument("--pairs_per_paradigm", type=int, default=20)
  p.add_argument("--variant", choices=sorted(MINICONS_METRIC), default="token")
  p.add_argument("--minicons_batch", type=int, default=32)
  p.add_argument("--out", default="")
  args = p.parse_args()

  pairs = blimp.read_pairs(args.data, args.pairs_per_paradigm)
  sentences = [q.good for q in pairs] + [q.bad for q in pairs]
  run = blimp.load_run(args.workdir, None)
  warm = pairs[:8]
  blimp.score_pairs(run.model_cfg, run.params, run.tokenizer, pairs,
                    variant=args.variant)  # Compiles every shape group once.
  start = time.perf_counter()
  good, bad = blimp.score_pairs(run.model_cfg, run.params, run.tokenizer, pairs,
                                variant=args.variant)
  ours_seconds = time.perf_counter() - start

  with tempfile.TemporaryDirectory() as export_dir:
    subprocess.run([sys.executable, "-m", "maelm_jax.interop.export_hf",
                    f"--workdir={args.workdir}", f"--out={export_dir}/hf",
                    "--with_lm_head"], check=True, cwd=REPO, capture_output=True)
    minicons_scores(f"{export_dir}/hf", [q.good for q in warm], args.variant,
                    args.minicons_batch)
    start = time.perf_counter()
    theirs = minicons_scores(f"{export_dir}/hf", sentences, args.variant,
                             args.minicons_batch)
    theirs_seconds = time.perf_counter() - start
  n = len(pairs)
  ours_right = good > bad
  theirs_right = theirs[:n] > theirs[n:]
  result = {
      "workdir": args.workdir, "pairs": n, "variant": args.variant,
      "ours_pairs_per_s": n / ours_seconds, "minicons_pairs_per_s": n / theirs_seconds,
      "speedup": theirs_seconds / ours_seconds,
      "same_decision": float((ours_right == theirs_right).mean()),
      "ours_accuracy": 100 * float(ours_right.mean()),
      "minicons_accuracy": 100 * float(theirs_right.mean()),
      "max_abs_pll_difference": float(np.abs(np.concatenate([good, bad]) - theirs).max()),
      "cpus": os.cpu_count()}
  print(json.dumps(result, indent=2))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()

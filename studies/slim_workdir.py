"""Writes <dst>: the workdir <src> with only the params of its newest checkpoint (or,
with a third argument, of the kept one nearest half its last step): no optimizer
state, no data iterator, all that fine-tuning and BLiMP read. A third of the size,
for bringing a run back from a lent machine (studies/gpu_pretrain.sh).

  python studies/slim_workdir.py SRC DST [half]
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orbax.checkpoint as ocp  # noqa: E402

from maelm_jax import checkpoints, tokenizer, workdir  # noqa: E402

src, dst = sys.argv[1:3]
steps = checkpoints.committed_steps(src)
if len(sys.argv) > 3:  # "half": the kept step nearest half the last one.
  steps = [min(steps, key=lambda s: abs(s - steps[-1] / 2))]
params, step = checkpoints.restore_params(src, steps[-1])
os.makedirs(dst)
for f in (workdir.CONFIG_FILE, workdir.METRICS_FILE, *tokenizer.TOKENIZER_FILENAMES,
          "corpus_report.json"):
  if os.path.exists(os.path.join(src, f)):
    shutil.copy(os.path.join(src, f), dst)
step_dir = os.path.join(checkpoints.checkpoint_dir(dst), str(step))
ocp.PyTreeCheckpointer().save(os.path.join(step_dir, "state"), {"params": params})
open(os.path.join(step_dir, "commit_success.txt"), "w").write("slim copy\n")
print("slim", dst, "step", step)

"""Writes <dst>: the workdir <src> with only the params of its newest checkpoint (or,
with `half`, of the kept one nearest half its last step): no optimizer state, no
data iterator, all that fine-tuning and BLiMP read. A third of the size, for
bringing a run back from a GPU machine (studies/run_study.py keeps its runs so). With
`--dtype=bfloat16` the floating params are rounded to bfloat16 (half again, for
the 64 MiB that come back from a GPU run; a bf16 run's float32 master
weights lose their low 16 bits); `--dtype=float32` widens such a copy back, the
form fine-tuning and BLiMP expect.

  python studies/slim_workdir.py SRC DST [half] [--dtype=bfloat16|float32]
"""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from maelm_jax.run import checkpoints  # noqa: E402
from maelm_jax.run import pretrained as pretrained_lib  # noqa: E402
from maelm_jax.data import tokenizer  # noqa: E402
from maelm_jax.core import workdir  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--dtype=")]
dtypes = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--dtype=")]
if len(args) not in (2, 3) or args[2:] not in ([], ["half"]) or dtypes not in (
    [], ["bfloat16"], ["float32"]):
  sys.exit("usage: slim_workdir.py SRC DST [half] [--dtype=bfloat16|float32]")
src, dst = args[:2]
steps = checkpoints.committed_steps(src)
if not steps:
  sys.exit(f"slim_workdir.py: {src} holds no committed checkpoint to copy")
if len(args) > 2:  # "half": the kept step nearest half the last one.
  steps = [min(steps, key=lambda s: abs(s - steps[-1] / 2))]
params, step = pretrained_lib.restore_params(src, steps[-1])
if dtypes:
  dtype = jax.numpy.dtype(dtypes[0])
  params = jax.tree.map(lambda x: np.asarray(x).astype(dtype) if jax.numpy.issubdtype(
      x.dtype, jax.numpy.floating) else np.asarray(x), params)
os.makedirs(dst)
for f in (workdir.CONFIG_FILE, workdir.METRICS_FILE, *tokenizer.TOKENIZER_FILENAMES,
          "corpus_report.json"):
  if os.path.exists(os.path.join(src, f)):
    shutil.copy(os.path.join(src, f), dst)
step_dir = os.path.join(checkpoints.checkpoint_dir(dst), str(step))
ocp.PyTreeCheckpointer().save(os.path.join(step_dir, "state"), {"params": params})
open(os.path.join(step_dir, "commit_success.txt"), "w").write("slim copy\n")
print("slim", dst, "step", step)

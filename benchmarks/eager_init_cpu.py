r"""A model's init run op by op against the same init jitted, on the CPU.

Run op by op, `MaskedLM(cfg).init` compiles each of its few hundred operations
as a program of its own; jitted, it is one program. The tiny MAE-LM with a
cross-attention decoder, each way in a fresh process (the persistent
compilation cache off), alternating, `--rounds` times.

  python benchmarks/eager_init_cpu.py --rounds=2
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_integer("rounds", 2, "processes per way, alternating")
flags.DEFINE_string("child", "", "internal: 'eager' or 'jit'")
FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(jitted: bool) -> float:
  sys.path.insert(0, REPO)
  import jax  # pylint: disable=import-outside-toplevel
  from maelm_jax.modeling import model as model_lib  # pylint: disable=import-outside-toplevel
  from tests import helpers  # pylint: disable=import-outside-toplevel
  config = helpers.tiny_config("maelm", **{"model.decoder_type": "cross"})
  cfg = model_lib.ModelConfig.from_config(config.model, vocab_size=120, mask_id=4)
  masks = helpers.draw_masks(cfg, helpers.random_ids(4, 32, 120, num_pad=5), 120)
  init = model_lib.MaskedLM(cfg).init
  started = time.perf_counter()
  jax.block_until_ready((jax.jit(init) if jitted else init)(jax.random.PRNGKey(0), masks))
  return time.perf_counter() - started


def main(argv):
  del argv
  if FLAGS.child:
    print(child(FLAGS.child == "jit"))
    return
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_COMPILATION_CACHE="false")
  seconds = {"eager": [], "jit": []}
  for _ in range(FLAGS.rounds):
    for way in seconds:
      out = subprocess.run([sys.executable, __file__, f"--child={way}"], env=env,
                           capture_output=True, text=True, check=True)
      seconds[way].append(float(out.stdout.strip().splitlines()[-1]))
  for way, values in seconds.items():
    print(f"{way:>5}: median {statistics.median(values):.2f} s of {len(values)} processes")


if __name__ == "__main__":
  app.run(main)

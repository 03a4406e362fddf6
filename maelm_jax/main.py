"""Command-line entry point.

  python -m maelm_jax.main --config=configs/pretrain.py:objective=maelm,size=tiny \
      --workdir=/tmp/maelm [--config.data.source=text:/data/*.txt] [--config.x=...]
"""

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                "configs/pretrain.py:objective=maelm,size=tiny",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, logs and the tokenizer go.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  import jax  # Imported late so that --xla flags and env set by launchers apply.
  from maelm_jax import train
  logging.info("JAX %s, %d processes, devices: %s", jax.__version__,
               jax.process_count(), jax.devices())
  last = train.train_and_evaluate(flags.FLAGS.config, flags.FLAGS.workdir)
  logging.info("done: %s", last)


if __name__ == "__main__":
  app.run(main)

"""Command-line entry point of pretraining and fine-tuning (the config's `mode`).

`maelm-pretrain` and `maelm-finetune` are this command with their own --help
(PRETRAIN_HELP, FINETUNE_HELP).
"""

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from maelm_jax.run import host_memory
from maelm_jax.core import cli, storage, workdir as workdir_lib


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", None, "Config file: "
                                  "configs/pretrain.py:objective=maelm,size=tiny, "
                                  "configs/glue.py:task=sst2 or configs/squad.py",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Where checkpoints, logs and the tokenizer go.")
  flags.mark_flags_as_required(["config", "workdir"])


def summary(workdir: str, last: dict) -> str:
  from maelm_jax.run import baselines, plots  # pylint: disable=g-import-not-at-top
  workdir = storage.absolute(workdir)
  lines = ["", "=" * 72, "Done."]
  if "eval/mask_accuracy" in last:
    lines += [
        "  held-out [MASK]ed positions (the model never saw these tokens):",
        f"    {'':22}{'accuracy':>9}{'loss':>8}",
        f"    {'this model':22}{last['eval/mask_accuracy']:>9.2%}"
        f"{last['eval/mask_loss']:>8.3f}",
        f"    {'unigram baseline':22}{last['eval/unigram_accuracy']:>9.2%}"
        f"{last['eval/unigram_loss']:>8.3f}",
        f"    {'bigram baseline':22}{last['eval/bigram_accuracy']:>9.2%}{'':>8}",
        f"  verdict: {baselines.plateau_status(last).split(';')[0]}",
        f"  all selected positions (kept/random included): loss "
        f"{last['eval/loss']:.4f}, accuracy {last['eval/accuracy']:.2%}",
        f"  learning curve: {workdir}/{plots.FILENAME}" if plots.enabled() else
        "  learning curve: not drawn (MAELM_PLOTS=0)"]
  lines += [
      f"  metrics:     {workdir}/{workdir_lib.METRICS_FILE} (TensorBoard: "
      f"{workdir}/tensorboard)",
      f"  checkpoints: {workdir}/checkpoints   tokenizer: {workdir}/tokenizer.model",
      f"  config:      {workdir}/{workdir_lib.CONFIG_FILE}",
      "The same command on other data (use a new --workdir):",
      "  your text:  --config.data.source='text:/path/to/*.txt'  (.gz .xz .jsonl too)",
      "  a tfds corpus: --config.data.source='tfds:wikipedia/20230601.en' "
      "--config.data.tfds_data_dir=/path/to/tensorflow_datasets",
      "=" * 72]
  return "\n".join(lines)


def main() -> None:
  import jax  # Imported late so that --xla flags and env set by launchers apply.
  from maelm_jax.run import distributed
  try:
    distributed.maybe_initialize()  # Multi-host: before anything touches devices.
  except distributed.DistributedConfigError as e:
    raise app.UsageError(str(e)) from e
  watchdog = distributed.start_peer_watchdog()
  from maelm_jax.run import train  # noqa: F401
  logging.info("JAX %s, %d processes, devices: %s", jax.__version__,
               jax.process_count(), jax.devices())
  allocator = host_memory.allocator()
  if allocator == "glibc":
    logging.info("host allocator: glibc malloc, whose arenas keep ~12 MB more per 1,000 "
                 "steps at the default checkpoint cadence; for runs of hours preload "
                 "jemalloc (apt install libjemalloc2; the launchers in launch/ then do)")
  else:
    logging.info("host allocator: %s", allocator)
  config = flags.FLAGS.config
  mode = config.get("mode", "pretrain")
  if mode not in ("pretrain", "glue", "squad"):
    raise app.UsageError(f"config.mode={mode!r}: expected pretrain, glue or squad")
  if mode == "pretrain":
    last = train.train_and_evaluate(config, flags.FLAGS.workdir)
    if watchdog is not None:  # Done: peers stop watching this process.
      watchdog.finish()
    if last.get("stopped_by") == "SIGINT":
      sys.exit(130)  # Saved, but stopped by the user: a `&&` chain stops too.
    if jax.process_index() == 0 and not last.get("dry_run"):
      print(summary(flags.FLAGS.workdir, last), flush=True)
  else:
    from maelm_jax.finetune import run as finetune_run
    results = finetune_run.run(config, flags.FLAGS.workdir)
    if watchdog is not None:
      watchdog.finish()
    if results.get("stopped_by") == "SIGINT":
      sys.exit(130)


PRETRAIN_HELP = """Pretrains a masked-language-model encoder (MAE-LM, 3ML or MLM).

  maelm-pretrain --config=configs/pretrain.py:objective=maelm,size=tiny \\
      --workdir=runs/maelm --config.data.source='text:/data/*.txt'

The same command resumes a stopped run. Guide: docs/pretraining-and-data.md;
fine-tuning: maelm-finetune --help.
"""

FINETUNE_HELP = """Fine-tunes a pretrained encoder on GLUE or SQuAD.

  maelm-finetune --config=configs/glue.py:task=sst2 --workdir=runs/sst2 \\
      --config.init_from=runs/maelm --config.data.dir=/data/glue/SST-2
  maelm-finetune --config=configs/squad.py:version=1.1 --workdir=runs/squad \\
      --config.init_from=runs/maelm \\
      --config.data.train_file=/data/squad/train-v1.1.json \\
      --config.data.eval_file=/data/squad/dev-v1.1.json

Tasks of configs/glue.py: sst2, cola, mrpc, qqp, stsb, mnli, qnli, rte, wnli.
Guide: docs/finetuning-and-evaluation.md; pretraining: maelm-pretrain --help.
"""

# `python -m` and the maelm-pretrain and maelm-finetune commands (setup.py's
# console scripts). Ctrl-C while training saves and exits 130 by itself
# (run_session); one before training (the tokenizer, the corpus report) or
# during a save ends here.
_STOPPED = "nothing saved is lost; the same command resumes (or starts) the run"
console = cli.command(main, define_flags, stopped=_STOPPED, doc=PRETRAIN_HELP)
finetune_console = cli.command(main, define_flags, stopped=_STOPPED, doc=FINETUNE_HELP)

if __name__ == "__main__":
  console()

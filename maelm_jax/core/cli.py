"""What every `python -m maelm_jax...` command shares, in one place.

    def define_flags():
      flags.DEFINE_string("out", None, "Where the report goes.", required=True)

    def main() -> int | None:     # reads flags.FLAGS; returns the exit status
      ...

    if __name__ == "__main__":
      cli.run(main, define_flags, stopped="finished shards are kept; the same "
              "command goes on")

- Flags are defined only when the command runs: the modules of several commands
  share a process (a notebook, the tests, `main` beside `plan`), and absl refuses
  a flag defined twice (every command has `--verbose`, several `--config`).
- A stray positional argument is a usage error (a command that takes some says
  so with `positional=`).
- A `--config.x` misspelt or mistyped is said in one line (`errors.parse_flags`).
- The project's own errors are said in one line, `error: <what is wrong and the
  fix>`, exit 1; `--verbose` shows their traceback. Errors inside JAX or a
  library keep theirs (`errors.one_line_errors`).
- Ctrl-C ends with one line saying what was kept (`stopped=`), exit 130, so a
  `&&` chain stops.
- Libraries' INFO lines are left out (orbax and grain log every file they
  touch), and so are the tracebacks of a full disk, which the run says in one
  line; their warnings stay.
- `--config=configs/X.py` names the packaged config when there is no such file
  here: the console scripts (`maelm-pretrain`, ...) run from any directory.
- Python's cyclic garbage collector runs less often (`collect_garbage_less`).
"""

from __future__ import annotations

import gc
import logging as pylogging
import os
import pathlib
import re
import sys
import traceback
from typing import Callable

from absl import app, flags, logging

from maelm_jax.core import errors


def command_line(module: str) -> str:
  """This process's command, as a record of what made a result
  (`python -m maelm_jax.evaluate.blimp --workdir=...`)."""
  return " ".join([f"python -m {module}"] + sys.argv[1:])


PACKAGED_CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
_CONFIG_ARG = re.compile(r"^(configs/\w+\.py)(:.*)?$")


def with_packaged_configs(argv: list[str]) -> list[str]:
  """`argv` with `--config=configs/X.py[:arg]` pointing at the packaged file
  where ./configs/X.py does not exist (a console script run elsewhere)."""
  out = list(argv)
  for i, arg in enumerate(out):
    flag, eq, value = arg.partition("=")
    if flag != "--config":
      continue
    if not eq:  # `--config configs/X.py`: the value is the next argument.
      i, value = i + 1, out[i + 1] if i + 1 < len(out) else ""
    match = _CONFIG_ARG.match(value)
    if not match or os.path.exists(match[1]):
      continue
    packaged = PACKAGED_CONFIGS / match[1][len("configs/"):]
    if packaged.exists():
      out[i] = (f"--config={packaged}" if eq else str(packaged)) + (match[2] or "")
  return out


# What orbax's and asyncio's tracebacks say when a disk is full or a bucket
# stopped answering (TensorStore's and aiohttp's words): the run says each in one
# line (errors.DiskFull, errors.StoreUnreachable).
SAID_IN_ONE_LINE = ("No space left on device", "Could not connect to server",
                    "retry attempts failed", "Cannot connect to host")


def _said_in_one_line(record) -> bool:
  texts = [record.getMessage()]
  error = record.exc_info[1] if record.exc_info else None
  while error is not None and len(texts) < 20:
    texts.append(str(error))
    error = error.__cause__ or error.__context__
  return any(phrase in t for t in texts for phrase in SAID_IN_ONE_LINE)


class QuietLibraries(pylogging.Filter):
  """Orbax, grain and tfds log every file they touch at INFO; keep their warnings,
  except the tracebacks of a full disk or a bucket gone, which the run says in
  one line (SAID_IN_ONE_LINE): orbax's own, and asyncio's "Task exception was never
  retrieved" for orbax's other write coroutines that failed the same way (when
  the event loop's garbage collector gets to them first: timing-dependent)."""

  def filter(self, record):
    noisy = any(name in record.pathname
                for name in ("/orbax/", "/grain/", "/tensorflow_datasets/"))
    if (("/orbax/" in record.pathname or "/asyncio/" in record.pathname)
        and _said_in_one_line(record)):
      return False
    if "/orbax/" in record.pathname and _ITEM_WITHOUT_METADATA.search(
        record.getMessage()):
      return False
    return record.levelno >= pylogging.WARNING or not noisy


# What orbax warns on every read of one item of a step (checkpoints/N/state, as
# restores, fine-tuning and exports read it): an item has no step metadata of
# its own, which lives one folder up. The checkpoint is fine; the warning read
# like a broken one.
_ITEM_WITHOUT_METADATA = re.compile(
    r"^Metadata file does not exist: .*/checkpoints/\d+/\w+/_CHECKPOINT_METADATA$")


def _closed_loop_noise(kind, error, trace) -> bool:
  """A TensorStore callback that reached an event loop orbax has closed
  (`Event loop is closed`, raised in asyncio's loop itself as the callback is
  scheduled): hundreds of these tracebacks once a bucket stops answering
  mid-save, while the run says what happened in one line (errors.StoreUnreachable)."""
  frames = traceback.extract_tb(trace) if trace is not None else []
  return (kind is RuntimeError and str(error) == "Event loop is closed"
          and bool(frames) and pathlib.PurePath(frames[0].filename).parts[-2:]
          == ("asyncio", "base_events.py"))


def _quiet_closed_loops(hook):
  """sys.excepthook without _closed_loop_noise."""
  def quiet(kind, error, trace):
    if not _closed_loop_noise(kind, error, trace):
      hook(kind, error, trace)
  return quiet


def _quiet_closed_loops_unraisable(hook):
  """sys.unraisablehook without _closed_loop_noise."""
  def quiet(info):
    if not _closed_loop_noise(info.exc_type, info.exc_value, info.exc_traceback):
      hook(info)
  return quiet


def _no_accelerator_probe() -> None:
  """Where libtpu is installed (the `[tpu]` extra, for the planner) but this
  machine has no TPU and no CUDA plugin, JAX would try the TPU first and log
  'Unable to initialize backend tpu' and libtpu's start-up trace on every
  command: the CPU is said outright instead. JAX_PLATFORMS, when set, wins;
  a TPU VM (/dev/accel*, /dev/vfio) or a CUDA plugin keeps JAX's own choice."""
  import glob  # pylint: disable=import-outside-toplevel
  import importlib.util  # pylint: disable=import-outside-toplevel
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return
  if any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13)):
    return
  if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
    return
  os.environ["JAX_PLATFORMS"] = "cpu"
  # JAX reads the variable once, at its import: a command whose module imported
  # it (blimp, analyze, compare, the sweeps) is told through its config.
  if "jax" in sys.modules:
    sys.modules["jax"].config.update("jax_platforms", "cpu")


def _define_verbose() -> None:
  if "verbose" not in flags.FLAGS:
    flags.DEFINE_bool("verbose", False, "Print the full traceback of an error that "
                      "maelm_jax reports in a line (bad config, input or workdir).")


HELP_FLAGS = ("--help", "-h", "-?", "--helpshort", "--helpfull")
CONFIG_DOCS = "docs/configuration.md"


def help_text(main: Callable, doc: str | None, full: bool = False) -> str:
  """What `--help` prints: the command's own description (`doc`, else its
  module's docstring), its flags, and where the `--config.*` keys are described.
  (absl's --help prints the console script's empty docstring and exits 1.)"""
  import inspect  # pylint: disable=import-outside-toplevel
  text = inspect.cleandoc(doc or sys.modules[main.__module__].__doc__ or "")
  own = flags.FLAGS.get_help() if full else "\n".join(
      line for line in flags.FLAGS.module_help(sys.argv[0]).splitlines()
      if line.strip() and line.strip() != f"{sys.argv[0]}:")  # No module line.
  lines = [text, "", "flags:", own.rstrip()]
  if "config" in flags.FLAGS:
    lines += ["", "  --config.KEY=VALUE: any key of the config; every key, its default "
              f"and what it does: {CONFIG_DOCS}"]
  if not full:
    lines.append("  --helpfull: every flag, the libraries' included")
  return "\n".join(lines) + "\n"


# Collect the youngest generation after 50,000 net allocations, not 700, and the
# oldest after 20 middle-generation collections, not 10. Tracing a JAX program
# makes millions of short-lived objects; with Python's defaults the collector's
# functions were 7% of a warm 20-step tiny run's CPU samples (perf), and these
# thresholds gave 8.90 against 9.70 CPU-s, means of five alternating pairs
# (benchmarks/test-suite-cost.md).
# The train loop is untouched either way: 200 more steps of a tiny run added no
# collection of any generation (`gc.get_stats()`), its objects freed by their
# reference counts.
GC_THRESHOLDS = (50_000, 50, 20)


def collect_garbage_less() -> None:
  """Python's collector at `GC_THRESHOLDS`, what is alive now left out of it."""
  gc.collect()
  gc.freeze()  # The imports' objects: long-lived, never garbage.
  gc.set_threshold(*GC_THRESHOLDS)


def command(main: Callable, define_flags: Callable[[], None] | None = None,
            **options) -> Callable[[], None]:
  """The command as a function of no arguments (`run` with these arguments):
  what `python -m` calls and setup.py's console scripts name."""
  return lambda: run(main, define_flags, **options)


def run(main: Callable, define_flags: Callable[[], None] | None = None, *,
        positional: str = "", stopped: str = "", doc: str | None = None) -> None:
  """Defines the command's flags and `--verbose`, parses the command line and
  runs `main()` (`main(args)` with `positional`, its name in the usage error),
  exiting with what it returns. `--help` prints `help_text` and exits 0."""
  _no_accelerator_probe()
  if define_flags is not None:
    define_flags()
  _define_verbose()
  # --help lists the main module's flags; a console script's main module is the
  # script, not the command's module, which defined them.
  for module in (main.__module__, __name__):
    for flag in flags.FLAGS.flags_by_module_dict().get(module, []):
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  asked = [arg.split("=")[0] for arg in sys.argv[1:]]
  if any(arg in HELP_FLAGS for arg in asked):
    sys.stdout.write(help_text(main, doc, full="--helpfull" in asked))
    sys.exit(0)

  def entry(argv):
    if len(argv) > 1 and not positional:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if positional and len(argv) < 2:
      raise app.UsageError(f"expected {positional}")
    logging.get_absl_handler().addFilter(QuietLibraries())
    collect_garbage_less()
    sys.excepthook = _quiet_closed_loops(sys.excepthook)
    sys.unraisablehook = _quiet_closed_loops_unraisable(sys.unraisablehook)
    args = (argv[1:],) if positional else ()
    try:
      status = errors.one_line_errors(main, *args, verbose=flags.FLAGS.verbose)
    except KeyboardInterrupt:
      if not stopped:
        raise
      sys.stderr.write(f"stopped: {stopped}\n")
      sys.exit(130)
    sys.exit(status or 0)

  app.run(entry, argv=with_packaged_configs(sys.argv), flags_parser=errors.parse_flags)

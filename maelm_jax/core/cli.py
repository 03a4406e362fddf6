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
- `quiet=True`: absl's INFO lines (orbax logs every file it reads) are left out.
"""

from __future__ import annotations

import sys
from typing import Callable

from absl import app, flags, logging

from maelm_jax.core import errors


def command_line(module: str) -> str:
  """This process's command, as a record of what made a result
  (`python -m maelm_jax.blimp --workdir=...`)."""
  return " ".join([f"python -m {module}"] + sys.argv[1:])


def _define_verbose() -> None:
  if "verbose" not in flags.FLAGS:
    flags.DEFINE_bool("verbose", False, "Print the full traceback of an error that "
                      "maelm_jax reports in a line (bad config, input or workdir).")


def run(main: Callable, define_flags: Callable[[], None] | None = None, *,
        positional: str = "", stopped: str = "", quiet: bool = False) -> None:
  """Defines the command's flags and `--verbose`, parses the command line and
  runs `main()` (`main(args)` with `positional`, its name in the usage error),
  exiting with what it returns."""
  if define_flags is not None:
    define_flags()
  _define_verbose()

  def entry(argv):
    if len(argv) > 1 and not positional:
      raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if positional and len(argv) < 2:
      raise app.UsageError(f"expected {positional}")
    if quiet:
      logging.set_verbosity(logging.WARNING)
    args = (argv[1:],) if positional else ()
    try:
      status = errors.one_line_errors(main, *args, verbose=flags.FLAGS.verbose)
    except KeyboardInterrupt:
      if not stopped:
        raise
      sys.stderr.write(f"stopped: {stopped}\n")
      sys.exit(130)
    sys.exit(status or 0)

  app.run(entry, flags_parser=errors.parse_flags)

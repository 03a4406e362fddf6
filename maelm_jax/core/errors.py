"""One-line errors: the project's own checks speak to the user, not in tracebacks.

Each entry point (`main`, `export_hf`, `analyze`) runs its work through
`one_line_errors`: an error raised by maelm_jax's own code (a bad config, input,
workdir) prints as `error: <what is wrong and the fix>` and exits 1; anything
else (a bug, an error inside JAX or orbax) keeps its traceback. `--verbose`
shows the traceback of the former too.
"""

from __future__ import annotations

import os
import re
import sys
import traceback

# The package (maelm_jax/), not this file's folder (maelm_jax/core/).
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

class DiskFull(OSError):
  """A write failed for want of space; the message names the disk, what is free
  and needed, and that the same command resumes."""


class StoreUnreachable(ConnectionError):
  """A bucket workdir's store stopped answering; the message names the bucket,
  says what is safe, and that the same command resumes."""


# The types the project's own checks raise; raised from inside maelm_jax they are
# a message for the user (what is wrong, the fix), not a bug.
USER_ERROR_TYPES = (ValueError, FileNotFoundError, PermissionError, KeyError,
                    FloatingPointError, TimeoutError, IsADirectoryError,
                    FileExistsError, RuntimeError, DiskFull, StoreUnreachable)


def is_user_error(error: BaseException) -> bool:
  """Raised by maelm_jax's own code (its innermost frame is in the package), as
  opposed to an error inside JAX, orbax or Python that needs its traceback."""
  if not isinstance(error, USER_ERROR_TYPES):
    return False
  frames = traceback.extract_tb(error.__traceback__)
  return bool(frames) and frames[-1].filename.startswith(PACKAGE_DIR)


def error_message(error: BaseException) -> str:
  text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
  return f"error: {text}\n(the traceback: rerun with --verbose)"


def one_line_errors(fn, *args, verbose: bool = False, **kwargs):
  """`fn(*args, **kwargs)`, with the project's own errors said in one line."""
  try:
    return fn(*args, **kwargs)
  except Exception as error:  # pylint: disable=broad-except
    if verbose or not is_user_error(error):
      raise
    sys.stderr.write(error_message(error) + "\n")
    sys.exit(1)


def _missing_config_file(argv) -> str:
  """What is wrong with `--config=FILE[:arg]` when FILE does not exist (which
  ml_collections says in a chained traceback, after JAX has started), or ''."""
  for i, arg in enumerate(argv):
    flag, eq, value = arg.partition("=")
    if flag != "--config":
      continue
    if not eq:
      value = argv[i + 1] if i + 1 < len(argv) else ""
    path = value.split(":", 1)[0]
    if path and not os.path.exists(path):
      folder = os.path.dirname(path) or "."
      known = sorted(f for f in os.listdir(folder) if f.endswith(".py")
                     and not f.startswith("_")) if os.path.isdir(folder) else []
      return (f"--config={value}: no such file {path}"
              + (f"; {folder}/ has {', '.join(known)}" if known else ""))
  return ""


def parse_flags(argv):
  """absl's parser, with a misspelt or mistyped `--config.x` (which ml_collections
  reports as a chained 50-line traceback) said in one line. The `flags_parser` of
  every entry point with a `--config`."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  missing = _missing_config_file(argv)
  if missing and "--verbose" not in argv:
    sys.stderr.write(f"error in the command line: {missing}\n")
    sys.exit(2)
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as error:
    text = str(error.args[0]) if error.args else str(error)
    text = " ".join(text.replace("\\'", "'").replace("\\n", "\n").split())
    misspelt = re.search(r"'(\w+)'.*Did you mean \"([\w.]+)\"", text)
    if misspelt:
      text = (f"--config has no key '{misspelt[1]}'; did you mean "
              f"'{misspelt[2]}'?")
    elif re.fullmatch(r"[\"']*\w+[\"']*", text):
      text = f"--config has no key {text.strip(chr(34))}; see the config file for its keys"
    elif "Error whilst parsing config file" in text and "Traceback" in text:
      # get_config(arg) refused its argument: keep its message, not the traceback.
      flag, _, rest = text.partition(": Error whilst parsing config file")
      text = f"{flag}: " + re.split(r"\b\w*Error: ", rest)[-1]
    if "--verbose" in argv:
      raise
    sys.stderr.write(f"error in the command line: {text}\n")
    sys.exit(2)

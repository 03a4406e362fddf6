"""One-line errors: the project's own checks speak to the user, not in tracebacks.

Each entry point (`main`, `export_hf`, `analyze`) runs its work through
`one_line_errors`: an error raised by maelm_jax's own code (a bad config, input,
workdir) prints as `error: <what is wrong and the fix>` and exits 1; anything
else (a bug, an error inside JAX or orbax) keeps its traceback. `--verbose`
shows the traceback of the former too.
"""

from __future__ import annotations

import os
import sys
import traceback

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

class DiskFull(OSError):
  """A write failed for want of space; the message names the disk, what is free
  and needed, and that the same command resumes."""


# The types the project's own checks raise; raised from inside maelm_jax they are
# a message for the user (what is wrong, the fix), not a bug.
USER_ERROR_TYPES = (ValueError, FileNotFoundError, PermissionError, KeyError,
                    FloatingPointError, TimeoutError, IsADirectoryError,
                    FileExistsError, RuntimeError, DiskFull)


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

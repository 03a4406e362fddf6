"""The test session's compilation cache folder, which no killed session leaves behind.

Each session's folder sits under one parent and holds a lock (`flock`) that its
session keeps open to its end. The kernel drops the lock when that process dies,
however it dies (SIGTERM, kill -9, a machine going down), while the folder's own
removal at the session's end (conftest.py) never runs. So each new session first
removes every folder whose lock nobody holds: at most the folders of sessions that
died since the last start remain. Standard library only: conftest.py imports this
before JAX.
"""

import fcntl
import os
import shutil
import tempfile
import time

PARENT = os.path.join(tempfile.gettempdir(), f"maelm-test-jax-caches-{os.getuid()}")
_LOCK = "held-by-a-live-session"


def open_session_folder(parent: str = PARENT) -> tuple[str, int]:
  """(a new folder, the descriptor whose lock holds it) for this process's session,
  after removing the folders of sessions that died."""
  os.makedirs(parent, exist_ok=True)
  remove_abandoned(parent)
  # Locked before it bears the name whose lock a sweep reads (a `new-` folder
  # goes only a minute old), so no sweep sees it unheld.
  staging = tempfile.mkdtemp(prefix="new-", dir=parent)
  held = os.open(os.path.join(staging, _LOCK), os.O_CREAT | os.O_RDWR, 0o600)
  fcntl.flock(held, fcntl.LOCK_EX)
  folder = os.path.join(parent, "session-" + os.path.basename(staging)[len("new-"):])
  os.rename(staging, folder)
  return folder, held


def remove_abandoned(parent: str = PARENT) -> list[str]:
  """Removes the session folders under `parent` whose lock no process holds
  (and those a session died making); returns them."""
  removed = []
  for name in sorted(os.listdir(parent)):
    folder = os.path.join(parent, name)
    if name.startswith("new-"):  # Being made now, or its maker died making it.
      try:
        if time.time() - os.path.getmtime(folder) > 60:
          shutil.rmtree(folder, ignore_errors=True)
          removed.append(folder)
      except FileNotFoundError:  # Renamed or removed just now.
        pass
      continue
    if not name.startswith("session-"):
      continue
    try:
      probe = os.open(os.path.join(folder, _LOCK), os.O_RDWR)
    except FileNotFoundError:  # Another session's sweep removed it just now.
      continue
    try:
      fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # A live session's.
      continue
    else:
      shutil.rmtree(folder, ignore_errors=True)
      removed.append(folder)
    finally:
      os.close(probe)
  return removed

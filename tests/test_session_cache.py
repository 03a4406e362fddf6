"""A test session killed before its end leaves no compilation cache behind for
long: the next session removes it, and never a live session's
(tests/session_cache.py)."""

import os
import signal
import subprocess
import sys
import time

from tests import session_cache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_session(parent):
  """A process that opens a session folder under `parent`, says which, and waits."""
  child = subprocess.Popen(
      [sys.executable, "-c", "import sys, time\nfrom tests import session_cache\n"
       "folder, _ = session_cache.open_session_folder(sys.argv[1])\n"
       "print(folder, flush=True)\ntime.sleep(600)\n", str(parent)],
      cwd=REPO, stdout=subprocess.PIPE, text=True)
  folder = child.stdout.readline().strip()
  assert os.path.isdir(folder), folder
  return child, folder


def test_a_killed_sessions_folder_goes_at_the_next_start_a_live_ones_stays(tmp_path):
  parent = tmp_path / "caches"
  killed, killed_folder = start_session(parent)
  live, live_folder = start_session(parent)
  try:
    with open(os.path.join(killed_folder, "a-program-cache"), "wb") as f:
      f.write(b"x" * 1000)
    killed.send_signal(signal.SIGKILL)  # No end of session: nothing removes it.
    killed.wait()
    assert os.path.isdir(killed_folder)

    mine, held = session_cache.open_session_folder(str(parent))
    try:
      assert not os.path.exists(killed_folder)
      assert os.path.isdir(live_folder) and os.path.isdir(mine)
      assert sorted(os.listdir(parent)) == sorted(
          os.path.basename(f) for f in (live_folder, mine))
      # Held in this process too (one descriptor's lock, not the process's).
      assert session_cache.remove_abandoned(str(parent)) == []
    finally:
      os.close(held)
    assert session_cache.remove_abandoned(str(parent)) == [mine]
  finally:
    live.kill()
    live.wait()
  assert session_cache.remove_abandoned(str(parent)) == [live_folder]
  assert os.listdir(parent) == []


def test_a_session_that_died_making_its_folder_leaves_it_for_a_minute_at_most(tmp_path):
  parent = tmp_path / "caches"
  old, young = parent / "new-old", parent / "new-young"
  for folder in (old, young):
    folder.mkdir(parents=True)
  os.utime(old, (time.time() - 120, time.time() - 120))
  assert session_cache.remove_abandoned(str(parent)) == [str(old)]
  assert young.is_dir()  # Perhaps a session making it now.

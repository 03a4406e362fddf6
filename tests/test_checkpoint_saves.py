"""A save whose step directory cannot be made fails at once, with the reason.

Found from a test that sometimes took 300 s: with orbax's default, the step's
directories are made in a background thread, and the threads writing the items
(the data iterator's in the main thread) wait for its "made" signal. A mkdir
that fails (a bucket gone mid-run, a disk that refuses) never sends it, so the
run heard of the failure only when that wait ran out (orbax's
`multihost.coordination_timeout()`, 300 s), as a TimeoutError about a signal key.
"""

import errno

import grain
import numpy as np
from orbax.checkpoint._src.multihost import multihost
from orbax.checkpoint._src.path import async_path
import pytest

from maelm_jax.run import checkpoints
from tests.helpers import tiny_config

STATE = {"w": np.arange(256, dtype=np.float32).reshape(16, 16), "step": np.int32(0)}


@pytest.fixture
def short_signal_wait(monkeypatch):
  """Were the failure still left to the signal's wait, the test would end in
  10 s with that TimeoutError instead of waiting the default 300."""
  monkeypatch.setattr(multihost, "_DEFAULT_BARRIER_TIMEOUT", 10)


@pytest.mark.parametrize("failure,raised,said", [
    (OSError(errno.ENOSPC, "No space left on device"), checkpoints.DiskFull,
     "no space left on the disk of"),
    (ConnectionError("store gone"), ConnectionError, "store gone"),
])
def test_a_step_directory_that_cannot_be_made_fails_the_save_at_once(
    tmp_path, monkeypatch, short_signal_wait, failure, raised, said):
  manager = checkpoints.make_manager(str(tmp_path), tiny_config(keep_checkpoints=2))
  data = iter(grain.MapDataset.range(100).to_iter_dataset())
  next(data)
  checkpoints.save(manager, 1, STATE, data)  # The data item: a blocking save.
  manager.wait_until_finished()

  async def refused(*args, **kwargs):
    raise failure
  monkeypatch.setattr(async_path, "mkdir", refused)
  with pytest.raises(raised, match=said) as caught:
    checkpoints.save(manager, 2, STATE, data)
    manager.wait_until_finished()
  assert not isinstance(caught.value, TimeoutError)
  monkeypatch.undo()
  manager.close()
  # Step 1 stands complete; nothing of step 2 was committed.
  assert checkpoints.committed_steps(str(tmp_path)) == [1]

"""benchmarks/max_batch.py: the batch search, and that its memory model grows with B."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import max_batch  # noqa: E402


@pytest.mark.parametrize("capacity", [0, 7, 8, 9, 100, 136, 4095, 4096, 10_000])
def test_largest_fitting_finds_the_boundary_in_few_calls(capacity):
  calls = []

  def fits(batch):
    calls.append(batch)
    return batch <= capacity

  best = max_batch.largest_fitting(fits, multiple=8, max_batch=4096)
  assert best == min(capacity, 4096) // 8 * 8
  assert all(b % 8 == 0 and 8 <= b <= 4096 for b in calls)
  assert len(calls) <= 2 * 10 + 1  # doubling then bisecting over 512 units


def test_planned_step_bytes_hold_the_state_and_grow_with_the_batch():
  import jax  # pylint: disable=g-import-not-at-top
  from maelm_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import train_lib  # pylint: disable=g-import-not-at-top
  cfg, config = max_batch.compile_time.model_config("tiny", "mlm", "float32", 512)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  abstract, _ = train_lib.abstract_sharded_state(
      cfg, 32, train_lib.make_optimizer(config), mesh)
  param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(abstract.params))
  small = max_batch.step_bytes(cfg, config, 32, 8)
  large = max_batch.step_bytes(cfg, config, 32, 64)
  # Parameters and both Adam moments are arguments of the step: at least 3x params.
  assert small >= 3 * param_bytes
  assert large > small

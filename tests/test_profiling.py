"""profiling: XLA op time from a real jax.profiler trace, nested ops counted once."""

import time

import jax
import jax.numpy as jnp
import pytest

from maelm_jax.tools import profiling


def test_exclusive_times_charge_a_parent_only_for_its_own_time():
  # A `while` from 0 to 10 s enclosing two ops (1-4 s, 5-9 s), then a copy.
  events = [(0.0, 10.0, "while.5", ""), (1.0, 4.0, "fusion.1", ""),
            (5.0, 9.0, "dot.2", ""), (10.0, 10.5, "copy.3", "")]
  times = {op: s for op, _, s in profiling._exclusive_times(events)}
  assert times == pytest.approx({"while.5": 3.0, "fusion.1": 3.0, "dot.2": 4.0,
                                 "copy.3": 0.5})


def test_kinds_and_base_names():
  assert profiling.base_name("%loop_fusion.12") == "loop_fusion"
  assert profiling.base_name("dot.3.1") == "dot"
  assert profiling.kind_of("custom-call.4", "cudnn_fmha_fwd").startswith("attention")
  assert profiling.kind_of("custom-call.2", "sm90_xmma_gemm_bf16").startswith("matmul")
  assert profiling.kind_of("all-reduce.1").startswith("collective")
  assert profiling.kind_of("loop_fusion.7").startswith("elementwise")
  assert profiling.kind_of("while.5") == "while"


def trace_a_scan_of_matmuls(trace_dir) -> float:
  """Traces 3 calls of a scan of 3 large matmuls + relu; returns the wall time.

  The weight is an argument, not a captured constant: without most of XLA's
  optimisations (the suite's default) a constant is broadcast again in every
  iteration, and that broadcast took up to a quarter of the op time, enough
  for elementwise work to outweigh the matmuls on a busy machine. relu, not
  tanh: XLA:CPU's older fusion emitters (the tests', conftest.py) take as long
  for a tanh as for the matmul before it. 64 rows of 2048 against a 2048-square
  weight: 2048 multiply-adds for each element the relu touches (768 at 768
  square)."""
  w = jnp.full((2048, 2048), 1e-3)

  @jax.jit
  def f(x, w):
    def body(c, _):
      return jnp.maximum(c @ w, 0.0), None
    return jax.lax.scan(body, x, None, length=3)[0].sum()

  x = jnp.ones((64, 2048))
  f(x, w).block_until_ready()
  start = time.perf_counter()
  with jax.profiler.trace(str(trace_dir)):
    for _ in range(3):
      f(x, w).block_until_ready()
  return time.perf_counter() - start


def least_disturbed_trace(tmp_path, traces=3):
  """The trace of the fastest of `traces` runs of `trace_a_scan_of_matmuls`, and
  its wall time: ops are timed by the wall clock, and one stall of the busy
  machine inside a relu (69 ms of a trace's 136, in a full `make test`) once put
  the elementwise work ahead of the matmuls."""
  walls = [(trace_a_scan_of_matmuls(tmp_path / str(i)), tmp_path / str(i))
           for i in range(traces)]
  return min(walls)


def test_summary_of_a_real_trace_finds_the_matmuls_inside_scan(tmp_path):
  """The matmuls dominate, the enclosing `while` is charged almost nothing, and
  op time does not exceed the traced wall time."""
  wall, trace_dir = least_disturbed_trace(tmp_path)
  events = profiling.op_events(str(trace_dir))
  total = sum(s for _, _, s in events)
  assert 0 < total <= wall
  kinds = profiling.summarize(events, "kind")
  assert kinds[0].name.startswith("matmul"), kinds
  assert kinds[0].share > 0.5
  ops = {o.name: o for o in profiling.summarize(events, "op")}
  if "while" in ops:  # XLA:CPU runs the scan as a while thunk around its body
    assert ops["while"].share < 0.1
  text = profiling.format_summary(str(trace_dir), top=2)
  assert "matmul (dot / gemm)" in text and "op time" in text


def test_a_process_that_planned_for_tpu_still_profiles_its_cpu_steps(tmp_path):
  """Once libtpu has described TPU chips in this process (python -m
  maelm_jax.plan, or a test of it), traces carry empty TPU planes; the CPU's
  ops are still found (they were not: 0 events, after test_plan in a worker)."""
  from maelm_jax import plan  # pylint: disable=g-import-not-at-top
  if plan.libtpu_problem():
    pytest.skip(plan.libtpu_problem())
  plan.topology_devices("v5e:2x2")
  wall, trace_dir = least_disturbed_trace(tmp_path)
  events = profiling.op_events(str(trace_dir))
  assert 0 < sum(s for _, _, s in events) <= wall
  assert profiling.summarize(events, "kind")[0].name.startswith("matmul")


def test_a_directory_without_a_trace_says_how_to_record_one(tmp_path):
  with pytest.raises(FileNotFoundError, match="jax.profiler.trace"):
    profiling.op_events(str(tmp_path))


def test_a_run_records_a_trace_of_the_steps_it_is_asked_for(tmp_path):
  """--config.profile_steps=A,B: a jax.profiler trace of steps A..B-1 in
  <workdir>/profile, which the summarizer (and so TensorBoard) reads."""
  from maelm_jax.run import train  # pylint: disable=import-outside-toplevel
  from tests.helpers import tiny_config  # pylint: disable=import-outside-toplevel
  config = tiny_config(profile_steps="2,4", total_steps=4, log_every=1, eval_every=4,
                       eval_batches=1, **{"tokenizer.vocab_size": 600,
                                          "data.source": "pydoc:",
                                          "data.eval_fraction": 0.05})
  train.train_and_evaluate(config, str(tmp_path / "run"))
  trace = tmp_path / "run" / "profile"
  assert profiling.xplane_files(str(trace)), list(trace.rglob("*"))
  events = profiling.op_events(str(trace))
  assert events and profiling.summarize(events)  # XLA ops of the traced steps.


def test_a_bad_profile_steps_is_refused_before_anything_runs():
  from maelm_jax.run import config_lib  # pylint: disable=import-outside-toplevel
  from tests.helpers import tiny_config  # pylint: disable=import-outside-toplevel
  for bad in ("10", "5,5", "0,3", "a,b"):
    with pytest.raises(ValueError, match="profile_steps=.*1 <= A < B"):
      config_lib.validate(tiny_config(profile_steps=bad))

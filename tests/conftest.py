"""Test set-up: 8 fake CPU devices in the test process, 2 in the runs it starts,
set before JAX initialises; a run in the test process meshes 2 of its 8 unless its
mesh_shape needs more (`_runs_mesh_two_devices`)."""

import collections
import importlib.util
import os

# Where libtpu is installed (the test extras have it, for the planner) and no
# CUDA plugin is, the CPU: jax would otherwise look for a local TPU first, and
# warn. A GPU machine keeps its GPU for the tests that use one.
if (importlib.util.find_spec("libtpu") is not None
    and not any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13))):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The test process has 8 fake devices (meshes up to 2x2x2; pytest_configure
# below). A run a test starts as a process has 2, unless the test gives it more:
# its mesh and checkpoints are still sharded, and a tiny run costs about a quarter
# less CPU than on 8 (a 20-step run, its steps in the compilation cache, three
# interleaved pairs: median 11.7 against 15.2 CPU-s; benchmarks/test-suite-cost.md).
_TEST_PROCESS_DEVICES = 8
RUN_DEVICES = 2  # Also what a run in the test process meshes (`_runs_mesh_two_devices`).
os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(RUN_DEVICES))
# LLVM at -O1, not -O2, for the tests' own programs and every run they start: the
# suite is bound by XLA's CPU compiles of tiny programs, and -O1 compiles them
# about a sixth faster while the 500-step quality test runs as fast
# (benchmarks/test-suite-cost.md). XLA's own passes, and so every value, are the same.
# And XLA:CPU's older fusion emitters, not its MLIR ones: with most optimisations
# off (below) they compile a tiny train step in a quarter less time (median 2.54
# against 3.44 s) for about 14% slower steps, and test_model + test_scan_layers
# cost a third less CPU (benchmarks/test-suite-cost.md). The same ops are fused; an `optimized`
# test's runs go back to the MLIR emitters, which run its many steps faster.
FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"
# And each program's LLVM module compiled whole, not split into parts for
# parallel codegen threads: on two cores that the suite keeps busy the split only
# adds work (the tiny MAE-LM and MLM steps' compiles, three alternating pairs of
# processes: 10.3, 10.3, 9.4 CPU-s against 11.7, 11.2, 10.8;
# benchmarks/test-suite-cost.md). Only how LLVM's work is divided changes.
CODEGEN_UNSPLIT = "--xla_cpu_parallel_codegen_split_count=1"
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2 "
                      "--xla_backend_optimization_level=1 "
                      f"{FUSION_EMITTERS_OFF} {CODEGEN_UNSPLIT}")  # helpers.xla_flags(n) changes only the count
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Most of XLA's optimisations off (LLVM at -O0, its expensive passes skipped) for
# the tests and every run they start: the suite's CPU goes mostly to compiling
# tiny programs, and these compile cheaper (test_model + test_scan_layers 255
# against 338 CPU-s, benchmarks/test-suite-cost.md). A test whose cost is running
# many steps (or that compiles for TPU chips, as a user's plan does) is marked
# `optimized`: the fixture below turns the optimisations back on for it and the
# runs it starts.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# No learning-curve figures from the tests' runs (run/plots.py): a draw costs
# about a quarter of a CPU-second, a process's first more, and the runs evaluate
# often (benchmarks/test-suite-cost.md). The tests of a
# run's figure ask for it (`plots_on`); tests/test_plots.py draws them directly.
os.environ.setdefault("MAELM_PLOTS", "0")
# glibc keeps 64 MB free at the top of each heap it shrinks (its default, 128 KB,
# handed a step's freed buffers back to the OS and faulted them in again the next
# step): the plateau test's minor page faults 7.3 M -> 1.7 M, its CPU 95.9 / 89.6
# -> 82.6 / 75.8 s (two pairs side by side), its peak memory 0.64 -> 0.80 GB;
# compile-bound tests unchanged (benchmarks/test-suite-cost.md). Read by glibc when
# a process starts: the xdist workers and every run a test starts, not `-n0`'s.
os.environ.setdefault("MALLOC_TOP_PAD_", str(64 << 20))

# One persistent compilation cache for the whole session: the controller makes
# the directory before xdist starts its workers, which inherit the variables, as
# does every run a test starts as a subprocess (most compile the same tiny
# steps). Everything is cached, however quick to compile. Removed at the end, or
# by the next session where this one was killed (tests/session_cache.py), with
# the session's temporary folder.
_OWN_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_CACHE:
  import tempfile  # noqa: E402
  from tests import session_cache  # noqa: E402
  _SESSION, _SESSION_HELD = session_cache.open_session_folder()
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_SESSION, "jax-cache")
  # The session's temporary files beside it, gone with it: libraries make folders
  # they never remove (transformers' module caches, tfds' dataset info, wandb's
  # media), some at import in every worker. pytest's own (tmp_path) stay where
  # they were, the last three sessions' kept to look at.
  os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
  os.environ["TMPDIR"] = os.path.join(_SESSION, "tmp")
  for _folder in (os.environ["JAX_COMPILATION_CACHE_DIR"], os.environ["TMPDIR"]):
    os.mkdir(_folder)
  tempfile.tempdir = None  # Read TMPDIR again.

# A run a test starts is one process of its own, though the shell that started
# the tests is a step of a SLURM job or a TPU pod's worker: the variables that
# run/distributed.py reads go (the tests of distribution set their own).
for _name in list(os.environ):
  if (_name.startswith(("SLURM_", "MEGASCALE_"))
      or _name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES", "MAELM_DISTRIBUTED",
                   "MAELM_COORDINATOR_ADDRESS", "MAELM_NUM_PROCESSES", "MAELM_PROCESS_ID",
                   "MAELM_LOCAL_DEVICE_IDS", "MAELM_PEER_TIMEOUT_S")):
    del os.environ[_name]
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pathlib  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data():
  if not SHARED_DATA.is_dir():
    pytest.skip(f"shared evaluation data not found at {SHARED_DATA}")
  return SHARED_DATA


def pytest_configure(config):
  del config  # (the hook's signature)
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_num_cpu_devices", _TEST_PROCESS_DEVICES)


@pytest.fixture(autouse=True)
def _optimized_when_marked(request, monkeypatch):
  """XLA's optimisations back on for a test marked `optimized`, in this process
  and in the runs it starts (they inherit the environment), and the runs' MLIR
  fusion emitters."""
  if request.node.get_closest_marker("optimized") is None:
    yield
    return
  import jax  # pylint: disable=import-outside-toplevel
  before = jax.config.read("jax_disable_most_optimizations")
  monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
  # (This process's backend read its XLA_FLAGS at collection; its runs have not.)
  monkeypatch.setenv("XLA_FLAGS", " ".join(
      f for f in os.environ.get("XLA_FLAGS", "").split() if f != FUSION_EMITTERS_OFF))
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(autouse=True)
def _runs_mesh_two_devices(monkeypatch):
  """A run in the test process (train, fine-tune, BLiMP: `sharding.make_mesh` with
  no devices given) meshes the first 2 of its 8 devices, as the runs tests start
  as processes have 2; a mesh_shape that 2 cannot make (2x2x2, 8x1x1) gets all 8,
  and a wrong one the 8 devices' message. On 2 cores a tiny run shards no better
  over 8 fake devices than over 2, and pays for the other 6: test_train_e2e,
  test_export_hf, test_import_hf and test_wandb 340.2 against 363.8 CPU-s
  (benchmarks/test-suite-cost.md)."""
  import jax  # pylint: disable=import-outside-toplevel
  from maelm_jax.core import sharding  # pylint: disable=import-outside-toplevel
  make_mesh = sharding.make_mesh

  def on_two_devices(mesh_shape, devices=None):
    if devices is None:
      try:
        return make_mesh(mesh_shape, jax.devices()[:RUN_DEVICES])
      except ValueError:
        pass
    return make_mesh(mesh_shape, devices)

  monkeypatch.setattr(sharding, "make_mesh", on_two_devices)


@pytest.fixture
def plots_on(monkeypatch):
  """The run's figures drawn, in this process and the runs it starts."""
  monkeypatch.setenv("MAELM_PLOTS", "1")


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory):
  """A 600-piece tokenizer of the `pydoc:` corpus for the runs tests start,
  trained once for the session (every worker shares it), so no run trains one."""
  from maelm_jax.data import pipeline, sources, tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  from tests.helpers import built_once  # pylint: disable=import-outside-toplevel

  def build(directory):
    tokenizer_lib.train_tokenizer(
        pipeline.training_texts(sources.open_source("pydoc:", "train")),
        str(directory / "sp"), vocab_size=600)

  return str(built_once(tmp_path_factory, "pydoc_tokenizer", build) / "sp.model")


# Test functions of other files measured at about 8 s or more on the 2 cores
# (benchmarks/test-suite-cost.md): one `file::name` a line, every
# parameter case included; `make test-quick` leaves them out. The twelve files
# that start runs as processes are marked slow as a whole (their `pytestmark`).
SLOW_TESTS = pathlib.Path(__file__).with_name("slow_tests.txt")


# Two long files of few tests whose runs neither fill nor read the suite's
# compilation cache (the notebook's one-device demo programs; the launches' own
# cache). By number of tests they went out last and ran on alone: at 4d06daf the
# workers ended at 815, 913 and 937 s, on test_multiprocess.py and the notebook.
FIRST_FILES = ("tests/test_notebook.py", "tests/test_multiprocess.py")


def pytest_collection_modifyitems(config, items):
  del config  # (the hook's signature)
  listed = {line.split("#")[0].strip() for line in SLOW_TESTS.read_text().splitlines()}
  listed.discard("")
  root = SLOW_TESTS.parent.parent
  sources = {f: (root / f).read_text() if (root / f).is_file() else ""
             for f in {n.split("::")[0] for n in listed}}
  stale = sorted(n for n in listed
                 if f"def {n.split('::')[1]}(" not in sources[n.split("::")[0]])
  if stale:
    raise pytest.UsageError(f"{SLOW_TESTS.name} names tests that no longer exist: "
                            f"{', '.join(stale)}; remove or rename them there")
  for item in items:
    if item.nodeid.split("[")[0] in listed:
      item.add_marker(pytest.mark.slow)
  # The order xdist hands the files out in (the Makefile's --no-loadscope-reorder
  # keeps it): its own, by number of tests, but FIRST_FILES first.
  def file_of(item):
    return item.nodeid.split("::")[0]
  counts = collections.Counter(map(file_of, items))
  items.sort(key=lambda item: (file_of(item) not in FIRST_FILES, -counts[file_of(item)],
                               file_of(item)))


def pytest_collection_finish(session):
  """Before the first test: the CPU backend made, and the collector as the
  commands' (core/cli.py), the test modules' imports frozen.

  XLA reads XLA_FLAGS when the backend is made, at the process's first use of a
  device. Made inside an `optimized` test, whose monkeypatch drops
  FUSION_EMITTERS_OFF for its runs, the worker compiled with the newer emitters
  to its end: test_scan_layers took 81.4 CPU-s after a one-line optimized test
  against 48.6 alone, and a worker that began with test_plan.py paid it for
  every file after (benchmarks/test-suite-cost.md). The collector: test_model +
  test_masking 54.3 against 55.8 CPU-s."""
  del session  # (the hook's signature)
  import jax  # pylint: disable=g-import-not-at-top
  from maelm_jax.core import cli  # pylint: disable=g-import-not-at-top
  jax.devices()
  cli.collect_garbage_less()


# MAELM_TEST_COMPILE_LOG=<file>: each test's count of XLA compiles and their
# seconds in this process (trace, lowering, backend), a line per test appended to
# the file, to find the tests that run models op by op (every operation its own
# compile) or build many programs: sort -t$'\t' -k3 -n -r <file> | head
COMPILE_LOG = os.environ.get("MAELM_TEST_COMPILE_LOG")
_compiles = {"count": 0, "seconds": 0.0}


def _count_compile(name, seconds, **kwargs):
  del kwargs
  if name.startswith("/jax/core/compile/"):
    _compiles["seconds"] += seconds
    _compiles["count"] += name.endswith("backend_compile_duration")


if COMPILE_LOG:
  import jax  # noqa: E402  pylint: disable=g-import-not-at-top

  jax.monitoring.register_event_duration_secs_listener(_count_compile)


# MAELM_TEST_CPU_LOG=<file>: each test's CPU seconds (user + system, setup and
# teardown included), of the test process and of the runs it started and waited
# for, then the xdist worker, and the wall-clock time it started (Unix seconds)
# and took, a line per test appended to the file. On a machine the suite keeps
# busy, wall-clock durations mostly say which tests ran beside which; CPU seconds
# say what a test costs: sort -t$'\t' -k2 -g -r <file> | head -40. The start
# times show where a worker idled or waited (the suite's tail).
CPU_LOG = os.environ.get("MAELM_TEST_CPU_LOG")


def _cpu_seconds():
  own, children = (resource.getrusage(who) for who in
                   (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


if COMPILE_LOG or CPU_LOG:
  @pytest.hookimpl(hookwrapper=True)
  def pytest_runtest_protocol(item, nextitem):
    del nextitem
    _compiles.update(count=0, seconds=0.0)
    own, children = _cpu_seconds() if CPU_LOG else (0.0, 0.0)
    started = time.time()
    yield
    if COMPILE_LOG:
      with open(COMPILE_LOG, "a", encoding="utf-8") as log:
        log.write(f"{item.nodeid}\t{_compiles['count']}\t{_compiles['seconds']:.1f}\n")
    if CPU_LOG:
      own_after, children_after = _cpu_seconds()
      with open(CPU_LOG, "a", encoding="utf-8") as log:
        log.write(f"{item.nodeid}\t{own_after - own + children_after - children:.1f}"
                  f"\t{own_after - own:.1f}\t{children_after - children:.1f}"
                  f"\t{os.environ.get('PYTEST_XDIST_WORKER', 'main')}\t{started:.1f}"
                  f"\t{time.time() - started:.1f}\n")


def pytest_unconfigure(config):
  """The controller (not an xdist worker) removes the session folder it made."""
  if _OWN_CACHE and not hasattr(config, "workerinput"):
    import shutil  # pylint: disable=import-outside-toplevel
    shutil.rmtree(_SESSION, ignore_errors=True)
    os.close(_SESSION_HELD)

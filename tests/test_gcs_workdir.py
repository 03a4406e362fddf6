"""`gs://` workdirs, against a GCS emulator on 127.0.0.1 (tests/gcs_emulator.py):
pretraining stopped and resumed there gives the weights of the same run on a
local disk, bit for bit, after a preemption and after a kill -9 in the middle
of a checkpoint save; two runs racing for one workdir: one is refused; the
lease of a gone run is taken over, a live one's is not; fine-tuning reads its
pretrained model from and writes its run to the bucket."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from maelm_jax.core import storage, workdir as workdir_lib
from maelm_jax.run import checkpoints
from tests import gcs_emulator, helpers

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
BUCKET = f"gs://{gcs_emulator.BUCKET}"
TOTAL_STEPS = 20
RUN_ARGS = [
    "--config=configs/pretrain.py:objective=maelm,size=tiny",
    "--config.data.source=pydoc:", "--config.data.eval_fraction=0.05",
    "--config.batch_size=8", "--config.seq_len=64",
    f"--config.total_steps={TOTAL_STEPS}", "--config.warmup_steps=5",
    "--config.log_every=1", f"--config.eval_every={TOTAL_STEPS}",
    "--config.eval_batches=2", "--config.checkpoint_every=4",
    "--config.keep_checkpoints=2", "--config.model.dtype=float32",
    "--config.data.num_streams=2", "--config.tokenizer.vocab_size=600",
]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
  """The emulator, and this process pointed at it as the runs are."""
  server = gcs_emulator.Emulator(str(tmp_path_factory.mktemp("gcs"))).start()
  saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST",
                                          "TENSORSTORE_GCS_HTTP_URL",
                                          "MAELM_MIRROR_DIR")}
  os.environ.update(server.env())
  # Mirrors of the runs killed here stay where the test's files go.
  os.environ["MAELM_MIRROR_DIR"] = str(tmp_path_factory.mktemp("mirrors"))
  os.environ.pop("TENSORSTORE_GCS_HTTP_URL", None)
  storage.configure()
  yield server
  server.stop()
  for key, value in saved.items():
    if value is None:
      os.environ.pop(key, None)
    else:
      os.environ[key] = value


def command(workdir, tokenizer_file, *extra):
  return [sys.executable, "-m", "maelm_jax.main", f"--workdir={workdir}", *RUN_ARGS,
          f"--config.tokenizer.path={tokenizer_file}", *extra]


def env(emulator):
  return dict(os.environ, **emulator.env(), JAX_NUM_CPU_DEVICES="2",
              XLA_FLAGS=helpers.xla_flags(2))


def run(emulator, workdir, tokenizer_file, *extra):
  out = subprocess.run(command(workdir, tokenizer_file, *extra), cwd=REPO,
                       env=env(emulator), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  return out


def records(workdir) -> list[dict]:
  path = storage.join(str(workdir), workdir_lib.METRICS_FILE)
  return [json.loads(line) for line in storage.read_text(path).splitlines()]


def final_params(workdir) -> dict:
  step_dir = storage.join(checkpoints.checkpoint_dir(str(workdir)), str(TOTAL_STEPS))
  return checkpoints.read_arrays(storage.join(step_dir, "state"))["params"]


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory, emulator, tokenizer_file):
  workdir = tmp_path_factory.mktemp("local")
  run(emulator, workdir, tokenizer_file)
  return final_params(workdir), [r["train/loss"] for r in records(workdir)]


def assert_same_run(workdir, reference):
  params, losses = reference
  logged = records(workdir)
  assert [r["step"] for r in logged] == list(range(1, TOTAL_STEPS + 1))
  assert [r["train/loss"] for r in logged] == losses  # Exactly: same floats.
  for got, want in zip(jax.tree.leaves(final_params(workdir)), jax.tree.leaves(params)):
    np.testing.assert_array_equal(got, want)


def start(emulator, workdir, tokenizer_file, *extra):
  return subprocess.Popen([*command(workdir, tokenizer_file), *extra], cwd=REPO,
                          env=env(emulator), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def test_preempted_on_gs_resumes_to_the_local_runs_weights_bit_for_bit(
    emulator, tokenizer_file, local_reference):
  workdir = f"{BUCKET}/preempted"
  process = start(emulator, workdir, tokenizer_file)
  deadline = time.monotonic() + 300
  while checkpoints.latest_step(workdir) is None:  # A step saved: well under way.
    assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.2)
  process.send_signal(signal.SIGTERM)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 0, stderr[-3000:]
  stopped = checkpoints.latest_step(workdir)
  assert "preempted: saved a checkpoint" in stderr and stopped < TOTAL_STEPS
  # Its files reached the bucket before it let go of it; the lease is gone.
  names = storage.listdir(workdir)
  assert {"config.json", "metrics.jsonl", "tokenizer.model",
          "tensorboard", "checkpoints"} <= set(names) and ".lock" not in names
  out = run(emulator, workdir, tokenizer_file)
  assert f"at step {stopped}" in out.stderr and "resumed from" in out.stderr
  assert_same_run(workdir, local_reference)


def test_kill_9_during_a_save_to_gs_then_exact_resume(emulator, tokenizer_file,
                                                      local_reference):
  """Killed while a step is in the bucket but not yet marked done (orbax writes
  `commit_success.txt` last there: GCS has no rename)."""
  workdir = f"{BUCKET}/killed"
  process = start(emulator, workdir, tokenizer_file)
  fs, deadline, caught = storage.filesystem(), time.monotonic() + 300, None
  while caught is None:
    assert process.poll() is None, "the run ended before a save could be caught"
    assert time.monotonic() < deadline
    for step, step_dir in checkpoints.step_dirs(workdir).items():
      if step > 4 and not checkpoints.is_committed(step_dir):
        caught = step
    time.sleep(0.02)
  process.kill()
  process.wait()
  prefix = f"{gcs_emulator.BUCKET}/killed/checkpoints/{caught}/"
  assert not fs.exists(prefix + "commit_success.txt")  # Still unfinished.
  out = run(emulator, workdir, tokenizer_file)
  assert "resumed from" in out.stderr
  assert checkpoints.latest_step(workdir) == TOTAL_STEPS
  assert_same_run(workdir, local_reference)


def test_the_store_gone_mid_run_one_line_nothing_lost_the_same_command_resumes(
    emulator, tokenizer_file, local_reference):
  workdir = f"{BUCKET}/outage"
  process = subprocess.Popen(
      command(workdir, tokenizer_file), cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, env=dict(env(emulator), MAELM_GCS_RETRIES="2"))
  try:
    deadline = time.monotonic() + 300
    while checkpoints.latest_step(workdir) is None:
      assert process.poll() is None, process.communicate()[1][-3000:]
      assert time.monotonic() < deadline
      time.sleep(0.2)
    emulator.stop()  # The store goes away mid-run.
    _, stderr = process.communicate(timeout=500)
  finally:
    emulator.stop()
    emulator.start()  # Back, with what it held.
  assert process.returncode == 1, stderr[-3000:]
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1, stderr[-3000:]
  assert f"{BUCKET} stopped answering" in errors[0] and "Nothing was lost" in errors[0]
  assert "run the same command" in errors[0]
  out = run(emulator, workdir, tokenizer_file)
  assert "resumed from" in out.stderr
  assert_same_run(workdir, local_reference)


def test_the_emulator_stopped_mid_write_restarts_with_what_it_held(tmp_path,
                                                                   monkeypatch):
  """The emulator the outage test stops at any instant keeps its index whole, as
  GCS does: it once wrote `.meta` in place, a kill mid-write left it cut short,
  no restart could read it, and every later gs:// test of that suite failed."""
  emulator_storage = pytest.importorskip("gcp_storage_emulator.storage")
  store_class = emulator_storage._FileStore  # pylint: disable=protected-access
  monkeypatch.setattr(store_class, "write_bytes", store_class.write_bytes)  # Restored.
  gcs_emulator.write_files_whole()
  held = emulator_storage.Storage(data_dir=str(tmp_path))
  held.create_bucket("kept", {"name": "kept"})
  write = pathlib.Path.write_bytes

  def killed_mid_write(path, content):
    with open(path, "wb") as f:  # Opened (emptied), half written, then killed.
      f.write(content[:len(content) // 2])
    raise SystemExit("killed mid-write")

  monkeypatch.setattr(pathlib.Path, "write_bytes", killed_mid_write)
  with pytest.raises(SystemExit):
    held.create_bucket("half-written", {"name": "half-written"})
  monkeypatch.setattr(pathlib.Path, "write_bytes", write)
  restarted = emulator_storage.Storage(data_dir=str(tmp_path))
  assert set(restarted.buckets) == {"kept"}
  restarted.create_bucket("after", {"name": "after"})
  assert set(emulator_storage.Storage(data_dir=str(tmp_path)).buckets) == {"kept", "after"}


def test_two_runs_racing_for_one_gs_workdir_one_is_refused(emulator, tokenizer_file):
  """The second starts while the first holds the lease and is refused; the first
  goes on undisturbed until it is stopped, and saves. (The first's schedule is
  far longer than the test, so on however fast a machine the two overlap; the
  lease's own race is test_the_lease_of_a_gone_run...'s.)"""
  workdir, endless = f"{BUCKET}/raced", "--config.total_steps=100000"
  first = start(emulator, workdir, tokenizer_file, endless)
  deadline = time.monotonic() + 300
  while not storage.exists(f"{workdir}/.lock"):
    assert first.poll() is None, first.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.1)
  second = start(emulator, workdir, tokenizer_file, endless)
  code, refused = second.wait(timeout=600), second.communicate()[1]
  assert code != 0 and f"{workdir} is in use by pid" in refused, refused[-2000:]
  assert first.poll() is None, first.communicate()[1][-3000:]
  while checkpoints.latest_step(workdir) is None:  # It trains on: a step saved.
    assert first.poll() is None, first.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.1)
  first.send_signal(signal.SIGTERM)
  assert first.wait(timeout=600) == 0, first.communicate()[1][-3000:]
  saved = checkpoints.latest_step(workdir)
  # The winner's run, whole: every step logged once, up to the one it saved last.
  assert [r["step"] for r in records(workdir)] == list(range(1, saved + 1))
  assert not storage.exists(f"{workdir}/.lock")


def test_two_processes_share_a_gs_workdir(emulator, tmp_path):
  """Process 0 trains the tokenizer and writes the run's files, process 1 reads
  the tokenizer from the bucket, both write their shards of each checkpoint."""
  workdir = f"{BUCKET}/two_processes"
  args = [a for a in RUN_ARGS if not a.startswith(("--config.total_steps",
                                                   "--config.checkpoint_every"))]
  out = subprocess.run(
      ["bash", str(REPO / "launch" / "local.sh"), "--num_processes=2",
       "--devices_per_process=2", "--", *args, "--config.total_steps=6",
       "--config.checkpoint_every=3", f"--workdir={workdir}"],
      cwd=REPO, env=dict(os.environ, **emulator.env(), TMPDIR=str(tmp_path)),
      capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  assert [r["step"] for r in records(workdir)] == [1, 2, 3, 4, 5, 6]
  assert checkpoints.committed_steps(workdir) == [3, 6]
  assert {"tokenizer.model", "config.json"} <= set(storage.listdir(workdir))
  assert ".lock" not in storage.listdir(workdir)
  assert "logs in " + str(tmp_path) in out.stderr  # Not inside the bucket.


def test_the_lease_of_a_gone_run_is_taken_over_a_live_ones_is_not(emulator,
                                                                   monkeypatch):
  monkeypatch.setenv("MAELM_LEASE_SECONDS", "2")
  workdir = f"{BUCKET}/leased"
  holder = workdir_lib.Lock(workdir)
  assert isinstance(holder, workdir_lib.Lease)
  holder.acquire()
  time.sleep(3)  # Past one lease: the holder's renewals keep it.
  with pytest.raises(workdir_lib.WorkdirError, match="in use by pid .* renews its"):
    workdir_lib.Lock(workdir).acquire()
  # The holder goes silent (a preempted pod, on another host): it is taken over
  # once its lease runs out, not before.
  holder._stop.set()  # pylint: disable=protected-access
  holder._renewer.join()  # pylint: disable=protected-access
  record = json.loads(storage.read_text(f"{workdir}/.lock"))
  monkeypatch.setattr(workdir_lib.socket, "gethostname", lambda: "another-host")
  with workdir_lib.Lock(workdir) as taker:
    assert time.time() >= record["expires"]
    record = json.loads(storage.read_text(f"{workdir}/.lock"))
    assert record["pid"] == os.getpid() and taker._generation is not None  # pylint: disable=protected-access
  assert not storage.exists(f"{workdir}/.lock")
  holder.release()  # The old holder's release leaves the new lease alone.


@pytest.fixture(scope="module")
def gs_pretrained(emulator, tokenizer_file):
  workdir = f"{BUCKET}/pretrained"
  run(emulator, workdir, tokenizer_file, "--config.total_steps=4")
  return workdir


def test_export_of_a_gs_workdir_is_the_export_of_its_copy(gs_pretrained, tmp_path):
  pytest.importorskip("safetensors")
  from maelm_jax.interop import export_hf
  copy = tmp_path / "copy"
  storage.filesystem().get(f"{gcs_emulator.BUCKET}/pretrained", str(copy),
                           recursive=True)
  export_hf.export(gs_pretrained, str(tmp_path / "from_gs"))
  export_hf.export(str(copy), str(tmp_path / "from_copy"))
  for name in ("model.safetensors", "config.json", "tokenizer.json"):
    assert ((tmp_path / "from_gs" / name).read_bytes()
            == (tmp_path / "from_copy" / name).read_bytes()), name
  card = (tmp_path / "from_gs" / "README.md").read_text()
  assert f"--workdir={gs_pretrained}`" in card


def test_what_cannot_be_in_a_bucket_is_refused_in_one_line(monkeypatch):
  from maelm_jax.data import prepare_data, sources
  with pytest.raises(ValueError, match="ArrayRecord opens local files only"):
    prepare_data.prepare("pydoc:", f"{BUCKET}/corpus")
  with pytest.raises(ValueError, match="ArrayRecord opens local files only"):
    sources.open_source(f"arrayrecord:{BUCKET}/corpus", "train")
  with pytest.raises(ValueError, match="served are gs://BUCKET/PATH"):
    storage.check("s3://bucket/run")
  with pytest.raises(ValueError, match="served are gs://BUCKET/PATH"):
    storage.check("gs:///run")
  from maelm_jax import compare, sweep
  with pytest.raises(ValueError, match="--sweep_dir=gs://b/s: this directory is written"):
    sweep.run_sweep("configs/pretrain.py", "gs://b/s", {})
  with pytest.raises(ValueError, match="--out=gs://b/c: this directory is written"):
    compare.compare("configs/pretrain.py", "gs://b/c", {}, glue_dir="")
  monkeypatch.setattr(storage.importlib.util, "find_spec", lambda name: None)
  # The first-day report: 'maelm-jax[gcs]' is not a package pip can find.
  with pytest.raises(ValueError, match=r"pip install 'gcsfs.* pip install -e '.\[gcs\]'"):
    storage.check(f"{BUCKET}/run")


def test_a_bucket_that_cannot_serve_is_said_in_one_line_at_once(emulator, monkeypatch):
  """The first-day report: an unreachable store waited 51 s, then printed a
  129-line traceback. Now the start says why in one line, within seconds."""
  storage.check(f"{BUCKET}/run")  # The emulator's bucket answers.
  started = time.monotonic()
  with pytest.raises(ValueError, match=r"gs://no-such-bucket-x: no such bucket"):
    storage.check("gs://no-such-bucket-x/run")
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
  with pytest.raises(ValueError, match=r"gs://maelm-test: the store at http://127\.0\.0\.1:\d+ "
                                       r"cannot be reached \(ConnectionRefusedError"):
    storage.check(f"{BUCKET}/run")
  assert time.monotonic() - started < 15


def free_port() -> int:
  import socket  # pylint: disable=import-outside-toplevel
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_finetuning_from_and_into_gs(emulator, gs_pretrained, tmp_path):
  from maelm_jax.finetune import glue_data
  pretrained = gs_pretrained
  glue_dir = glue_data.write_sample_sst2(str(tmp_path), num_train=64, num_dev=32)
  workdir = f"{BUCKET}/sst2"
  cmd = [sys.executable, "-m", "maelm_jax.main", "--config=configs/glue.py:task=sst2",
         f"--config.init_from={pretrained}", f"--config.data.dir={glue_dir}",
         f"--workdir={workdir}", "--config.max_seq_len=16", "--config.batch_size=16",
         "--config.eval_batch_size=16", "--config.num_epochs=1",
         "--config.dtype=float32", "--config.log_every=2"]
  out = subprocess.run(cmd, cwd=REPO, env=env(emulator), capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  results = json.loads(storage.read_text(f"{workdir}/eval_results.json"))
  assert results["init_from"] == pretrained and results["step"] == 4
  assert 0.0 <= results["accuracy"] <= 1.0
  assert records(workdir) and checkpoints.latest_step(workdir) == 4
  assert f"results: {workdir}/eval_results.json" in out.stdout


def test_a_prune_cut_short_in_a_bucket_never_blocks_a_start(emulator, monkeypatch):
  """A bucket has no rename: a pruned step loses its commit marker first, so a
  kill midway leaves a step that reads as unfinished; the next start removes it
  (older than the newest complete one) in one line and goes on."""
  workdir = f"{BUCKET}/pruned-{time.time_ns()}"
  directory = checkpoints.checkpoint_dir(workdir)
  fs = storage.filesystem()
  for step in (4, 8, 12):
    for name in ("state/array", "commit_success.txt", "_CHECKPOINT_METADATA"):
      fs.pipe(f"{directory}/{step}/{name}"[len("gs://"):], b"x")
  marker_when_deleted = []
  remove_tree = storage.remove_tree
  monkeypatch.setattr(storage, "remove_tree", lambda path: (
      marker_when_deleted.append(storage.exists(f"{path}/commit_success.txt")),
      remove_tree(path)))
  checkpoints.StepPruner(directory).delete(4)
  assert marker_when_deleted == [False]
  # The same kill, earlier: the marker gone, the rest still there.
  fs.rm(f"{directory}/8/commit_success.txt"[len("gs://"):])
  assert checkpoints.committed_steps(workdir) == [12]
  checkpoints.tidy_unfinished_steps(workdir)
  assert sorted(checkpoints.step_dirs(workdir)) == [12]

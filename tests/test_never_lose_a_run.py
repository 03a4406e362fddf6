"""What a hurried user does by accident must never destroy a run: each case
stops with a short message (or works), and leaves the checkpoints and
config.json byte for byte as they were."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from maelm_jax.run import checkpoints
from maelm_jax.run import pretrained as pretrained_lib
from maelm_jax.core import workdir as workdir_lib
from maelm_jax.run.metric_writers import truncate_jsonl
from tests import helpers
from tests.test_resume import (REPO, TOTAL_STEPS, command, losses,  # noqa: F401
                               reference, reference_workdir, run, run_env,
                               steps_logged)  # (reference, reference_workdir: fixtures)

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

ENV = run_env()  # test_resume's: 2 devices.


def snapshot(workdir) -> dict[str, bytes]:
  """Every file of the checkpoints and config.json, by relative path."""
  workdir = pathlib.Path(workdir)
  files = [workdir / "config.json", *(workdir / "checkpoints").rglob("*")]
  return {str(p.relative_to(workdir)): p.read_bytes() for p in files if p.is_file()}


def fails(cmd, timeout=300):
  out = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True,
                       timeout=timeout)
  assert out.returncode not in (0, None), out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  return out.stderr


def error_lines(stderr: str) -> list[str]:
  """The lines of the error itself (log lines start with I/W/E + date)."""
  lines = stderr.strip().splitlines()
  start = max(i for i, line in enumerate(lines) if line.startswith("error"))
  return lines[start:]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tokenizer_file):
  """A finished 10-step run with checkpoints at 5 and 10."""
  workdir = tmp_path_factory.mktemp("trained")
  run(workdir, tokenizer_file, "--config.total_steps=10")
  return workdir


def copy_of(trained, tmp_path):
  import shutil
  target = tmp_path / "run"
  shutil.copytree(trained, target)
  return target


def test_a_checkpoint_of_another_model_is_refused_not_quarantined(
    trained, tmp_path, tokenizer_file):
  workdir = copy_of(trained, tmp_path)
  before = snapshot(workdir)
  stderr = fails(command(workdir, tokenizer_file, "--config.total_steps=20",
                         "--config.allow_config_change=True",
                         "--config.model.num_layers=3"))
  message = " ".join(error_lines(stderr))
  assert "does not fit this run's model" in message
  assert "layer_2" in message and "not in the checkpoint" in message
  assert len(error_lines(stderr)) <= 3
  assert snapshot(workdir) == before  # config.json and both checkpoints intact.
  assert not list((workdir / "checkpoints").glob("*.corrupt*"))


def test_a_changed_data_pipeline_is_refused_not_quarantined(trained, tmp_path,
                                                           tokenizer_file):
  """data.num_workers changes the data iterator's saved state; found on the
  landed code: both checkpoints renamed *.corrupt and training from step 1."""
  workdir = copy_of(trained, tmp_path)
  before = snapshot(workdir)
  stderr = fails(command(workdir, tokenizer_file, "--config.total_steps=20",
                         "--config.data.num_workers=1"))
  assert "data.num_workers" in " ".join(error_lines(stderr))
  assert snapshot(workdir) == before
  assert steps_logged(workdir) == 10


def test_a_foreign_step_folder_is_named_and_left_alone(trained, tmp_path,
                                                       tokenizer_file):
  workdir = copy_of(trained, tmp_path)
  foreign = workdir / "checkpoints" / "100"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  before = snapshot(workdir)
  stderr = fails(command(workdir, tokenizer_file, "--config.total_steps=20"))
  assert "not a finished maelm_jax checkpoint" in stderr and str(foreign) in stderr
  assert snapshot(workdir) == before and foreign.is_dir()
  # The newest *committed* step is what init_from and fine-tuning read.
  assert checkpoints.latest_step(workdir) == 10


def test_unreadable_checkpoints_never_start_over_without_the_flag(
    trained, tmp_path, tokenizer_file):
  workdir = copy_of(trained, tmp_path)
  for step in (5, 10):  # Truncate every array file of both checkpoints.
    for path in (workdir / "checkpoints" / str(step) / "state").rglob("*"):
      if path.is_file() and path.stat().st_size > 1000:
        path.write_bytes(path.read_bytes()[:100])
  config_before = (workdir / "config.json").read_bytes()
  stderr = fails(command(workdir, tokenizer_file, "--config.total_steps=20"))
  assert "not starting over by itself" in stderr and "start_over=True" in stderr
  names = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  assert names == ["10.corrupt", "5.corrupt"]  # Moved aside, nothing deleted.
  assert (workdir / "config.json").read_bytes() == config_before
  assert steps_logged(workdir) == 10
  out = run(workdir, tokenizer_file, "--config.total_steps=20",
            "--config.start_over=True")
  assert "resumed from" not in out.stderr
  steps, _ = losses(workdir)
  assert steps == list(range(1, 21))


def test_finetuning_into_a_pretraining_workdir_is_refused(trained, tmp_path):
  workdir = copy_of(trained, tmp_path)
  before = snapshot(workdir)
  glue = tmp_path / "glue"
  glue.mkdir()
  for target in (workdir, tmp_path / "other_pretraining"):
    if target != workdir:
      import shutil
      shutil.copytree(trained, target)
    stderr = fails([sys.executable, "-m", "maelm_jax.main",
                    "--config=configs/glue.py:task=sst2", f"--workdir={target}",
                    f"--config.init_from={workdir}", f"--config.data.dir={glue}"])
    assert ("is also --config.init_from" in stderr if target == workdir
            else "holds a pretraining run" in stderr), stderr[-2000:]
  assert snapshot(workdir) == before


def test_two_live_runs_on_one_workdir_and_a_stale_lock(tmp_path):
  workdir = str(tmp_path)
  with workdir_lib.Lock(workdir):
    holder = json.loads((tmp_path / ".lock").read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    # Another live process holding it: refused, naming the holder.
    child = subprocess.run(
        [sys.executable, "-c", "import sys; from maelm_jax import workdir as w;"
         f"w.Lock({workdir!r}).acquire()"], cwd=REPO, capture_output=True, text=True)
    assert child.returncode != 0
    assert f"in use by another run (pid {os.getpid()}" in child.stderr
  assert not (tmp_path / ".lock").exists()  # Released.
  # A lock left by a process that is gone (kill -9) is taken over.
  dead = subprocess.Popen([sys.executable, "-c", "pass"])
  dead.wait()
  (tmp_path / ".lock").write_text(json.dumps(
      {"host": socket.gethostname(), "pid": dead.pid, "start_time": "1"}))
  with workdir_lib.Lock(workdir):
    assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
  # A lock from another host cannot be checked: refused, with the way out.
  (tmp_path / ".lock").write_text(json.dumps({"host": "elsewhere", "pid": 1}))
  with pytest.raises(workdir_lib.WorkdirError, match="host elsewhere.*delete"):
    workdir_lib.Lock(workdir).acquire()


def test_a_second_run_on_a_live_workdir_is_refused(tmp_path, tokenizer_file):
  process = subprocess.Popen(command(tmp_path, tokenizer_file), cwd=REPO, env=ENV,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    import time
    deadline = time.time() + 300
    while steps_logged(tmp_path) < 2:
      assert process.poll() is None, process.communicate()[1][-3000:]
      assert time.time() < deadline
      time.sleep(0.05)
    stderr = fails(command(tmp_path, tokenizer_file))
    assert f"in use by another run (pid {process.pid}" in stderr
  finally:
    process.kill()
    process.communicate()


def test_ctrl_c_saves_and_resumes_exactly(tmp_path, tokenizer_file, reference):
  """SIGINT as a terminal sends it (the test worker may ignore SIGINT, and a
  child inherits that, so the child starts with the default disposition)."""
  import time
  process = subprocess.Popen(
      helpers.with_sigint_default(command(tmp_path, tokenizer_file)), cwd=REPO,
      env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while steps_logged(tmp_path) < 6:
    assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.time() < deadline
    time.sleep(0.02)
  process.send_signal(signal.SIGINT)
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stderr[-3000:]
  assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
  assert "interrupted (Ctrl-C): saved a checkpoint at step" in stderr
  stopped_at = steps_logged(tmp_path)
  assert checkpoints.latest_step(tmp_path) == stopped_at < TOTAL_STEPS
  run(tmp_path, tokenizer_file)
  steps, values = losses(tmp_path)
  assert steps == list(range(1, TOTAL_STEPS + 1))
  np.testing.assert_allclose(values, reference, rtol=1e-6, atol=1e-6)


def test_errors_are_one_line_without_a_traceback(tmp_path, trained):
  said_in_one_line = {  # The command line's mistake: what is said.
      ("--config=configs/pretrain.py", "--config.lerning_rate=3e-3"):
          "--config has no key 'lerning_rate'; did you mean 'learning_rate'?",
      ("--config=configs/pretrain.py:objectiv=mlm",):
          "flag --config=configs/pretrain.py:objectiv=mlm: unknown config argument "
          "'objectiv'; known: ['objective', 'recipe', 'size']",
      ("--config=configs/pretrain.py:size=huge",):
          "flag --config=configs/pretrain.py:size=huge: size='huge' is unknown; use "
          "one of ['tiny', 'small', 'base', 'large']",
      ("--config=configs/pretrian.py:size=tiny",):
          "--config=configs/pretrian.py:size=tiny: no such file configs/pretrian.py; "
          "configs/ has compare.py, demo.py, glue.py, pretrain.py, squad.py",
  }
  for args, said in said_in_one_line.items():
    stderr = fails([sys.executable, "-m", "maelm_jax.main", *args,
                    f"--workdir={tmp_path}"])
    assert stderr.strip().splitlines() == [f"error in the command line: {said}"]
  small = ["--config=configs/pretrain.py:size=small", f"--workdir={tmp_path / 'small'}",
           "--config.total_steps=2", f"--config.init_from={trained}",
           "--config.tokenizer.vocab_size=600", "--config.data.source=pydoc:",
           "--config.data.eval_fraction=0.05", "--config.batch_size=8",
           "--config.seq_len=64"]
  other_size = fails([sys.executable, "-m", "maelm_jax.main", *small])
  message = " ".join(error_lines(other_size))
  assert "holds another model" in message and "shape" in message
  assert "(128," in message and "(256," in message
  verbose = subprocess.run([sys.executable, "-m", "maelm_jax.main", *small, "--verbose"],
                           cwd=REPO, env=ENV, capture_output=True, text=True)
  assert "Traceback" in verbose.stderr and "CheckpointMismatch" in verbose.stderr


def test_torn_last_metrics_line_is_dropped_and_a_broken_one_is_named(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n{"step": 3, "x"')
  truncate_jsonl(str(path), 2)
  assert path.read_text() == '{"step": 1, "x": 1}\n{"step": 2, "x": 2}\n'
  path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')
  with pytest.raises(ValueError, match=r"metrics.jsonl, line 2, is not JSON"):
    truncate_jsonl(str(path), 2)


def test_the_workdir_reads_back_its_own_files(tmp_path):
  """workdir.py owns config.json and metrics.jsonl: readers skip a torn line,
  and a config write killed half-way leaves the previous config whole."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from maelm_jax.core import config_defaults, workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  assert workdir_lib.read_config(str(tmp_path)) is None
  assert workdir_lib.read_metrics(str(tmp_path)) == []
  workdir_lib.write_config(ml_collections.ConfigDict({"mode": "glue", "seed": 1}),
                           str(tmp_path))
  (tmp_path / "config.json.tmp").write_text('{"mode": "pre')  # Killed mid-write.
  # Read back whole, with the keys added since (config_defaults.complete).
  assert workdir_lib.read_config(str(tmp_path)) == config_defaults.complete(
      {"mode": "glue", "seed": 1})
  assert workdir_lib.saved_mode(str(tmp_path)) == "glue"
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 1, "eval/x": 1}\n{"step": 2}\n{"step": 3, "ev')
  assert [r["step"] for r in workdir_lib.read_metrics(str(tmp_path))] == [1, 2]
  assert workdir_lib.read_metrics(str(tmp_path), lambda r: "eval/x" in r) == [
      {"step": 1, "eval/x": 1}]


def test_dry_run_describes_the_launch_and_writes_nothing(trained, tmp_path,
                                                         tokenizer_file):
  def dry(workdir, *extra):
    out = subprocess.run(command(workdir, tokenizer_file, "--config.dry_run=True",
                                 *extra),
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout

  before = snapshot(trained)
  report = dry(trained, "--config.total_steps=10")
  assert "maelm/tiny" in report and "vocabulary 600" in report
  assert "num_selected=9" in report  # 15% of the 62 maskable tokens of 64.
  assert "over 2 devices" in report and "data       pydoc:" in report
  assert "resumable at step 10" in report
  assert "REFUSED" in dry(trained, "--config.model.mask_ratio=0.3")
  assert snapshot(trained) == before
  fresh = tmp_path / "fresh"
  assert "new (will be created)" in dry(fresh)
  assert not fresh.exists()


def test_the_same_command_on_a_finished_run_reports_it_again(trained, tmp_path,
                                                            tokenizer_file):
  """`make demo` twice: the second run trains nothing, changes nothing, and
  still prints the result table next to the baselines."""
  workdir = copy_of(trained, tmp_path)
  before = snapshot(workdir)
  metrics_before = (workdir / "metrics.jsonl").read_bytes()
  out = run(workdir, tokenizer_file, "--config.total_steps=10")
  assert "this run already finished at step 10" in out.stderr
  assert "this model" in out.stdout and "unigram baseline" in out.stdout
  assert (workdir / "metrics.jsonl").read_bytes() == metrics_before
  assert snapshot(workdir) == {k: v for k, v in before.items()}


def test_a_finished_run_resumed_longer_keeps_its_schedule_and_says_so(
    trained, tmp_path, tokenizer_file):
  """The first-day report: total_steps raised on a finished run restarted the
  decay over the new length (the rate went back up; a sawtooth in the curve)
  and the log said only "resumed". Now the rate goes on from where it got to,
  the log says so in one line, and config.json keeps the schedule for later
  resumes."""
  workdir = copy_of(trained, tmp_path)
  out = run(workdir, tokenizer_file, "--config.total_steps=14")
  said = [line for line in out.stderr.splitlines() if "total_steps 10 -> 14" in line]
  assert len(said) == 1 and "under a tenth of the peak" in said[0], out.stderr[-2000:]
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  rates = {r["step"]: r["lr"] for r in records if "lr" in r}
  assert sorted(rates) == list(range(1, 15))
  assert all(rates[step] <= rates[10] for step in range(11, 15)), rates
  config = json.loads((workdir / "config.json").read_text())
  assert config["lr_schedule_segments"] == [[0, 10], [10, 14]]


def test_silent_corruption_is_caught_by_checksums_and_quarantined(
    trained, tmp_path, tokenizer_file):
  """Flipped bits in a committed checkpoint's array data (same size, still
  readable) fail its recorded SHA-256: it is moved aside as `.corrupt`, named,
  and the run resumes from the previous checkpoint."""
  workdir = copy_of(trained, tmp_path)
  for step in (5, 10):  # Recorded when the step was final.
    sums = json.loads((workdir / "checkpoints" / str(step) /
                       checkpoints.CHECKSUM_FILE).read_text())
    assert any(name.startswith("state/") for name in sums)
  victim = max((p for p in (workdir / "checkpoints" / "10" / "state").rglob("*")
                if p.is_file()), key=lambda p: p.stat().st_size)
  data = bytearray(victim.read_bytes())
  for offset in range(len(data) // 2, len(data) // 2 + 64, 8):
    data[offset] ^= 0x10
  victim.write_bytes(bytes(data))
  with pytest.raises(checkpoints.CorruptCheckpoint, match="SHA-256 differs"):
    checkpoints.verify_checksums(str(workdir / "checkpoints" / "10"))
  checkpoints.verify_checksums(str(workdir / "checkpoints" / "5"))  # Untouched.
  out = run(workdir, tokenizer_file, "--config.total_steps=12")
  assert "checkpoint at step 10 cannot be restored (CorruptCheckpoint" in out.stderr
  assert "resumed from" in out.stderr and "at step 5" in out.stderr
  names = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  assert "10.corrupt" in names and "12" in names
  steps, _ = losses(workdir)
  assert steps == list(range(1, 13))


def test_a_kill_while_checksums_are_written_leaves_a_good_checkpoint_good(
    trained, tmp_path):
  """Killed between writing `maelm_checksums.json.tmp` and renaming it: the next
  run records the step's checksums again. Found while writing `maelm_jax.tools.chaos` (where
  can a kill land?), by reading the code, not by a kill: they used
  to list the stale temporary file as part of the checkpoint, which then
  failed verification ('missing') and a good step was quarantined."""
  workdir = copy_of(trained, tmp_path)
  step_dir = workdir / "checkpoints" / "10"
  (step_dir / checkpoints.CHECKSUM_FILE).unlink()
  (step_dir / (checkpoints.CHECKSUM_FILE + ".tmp")).write_text('{"state/_ME')
  checkpoints.record_checksums(str(step_dir))
  sums = json.loads((step_dir / checkpoints.CHECKSUM_FILE).read_text())
  assert not any(name.startswith(checkpoints.CHECKSUM_FILE) for name in sums)
  checkpoints.verify_checksums(str(step_dir))  # Raised 'is missing' before.
  (step_dir / (checkpoints.CHECKSUM_FILE + ".tmp")).write_text("{")  # Killed again.
  checkpoints.verify_checksums(str(step_dir))


def _can_mount_tmpfs(where) -> bool:
  import shutil  # pylint: disable=import-outside-toplevel
  if shutil.which("unshare") is None:
    return False
  probe = subprocess.run(["unshare", "-rm", "sh", "-c",
                          f"mount -t tmpfs -o size=1m tmpfs {where}"],
                         capture_output=True)
  return probe.returncode == 0


def test_a_full_disk_stops_in_one_line_and_the_same_command_resumes(
    tmp_path, tokenizer_file, reference):
  """The workdir on a real 22 MB tmpfs (a private mount namespace): the save of
  step 15 cannot fit beside steps 5 and 10 (8.5 MB each), and is refused before
  orbax starts it (`Manager._check_room`: orbax failing mid-write also ends in the
  one line, but its I/O threads printed tracebacks as they wound down, timing-
  dependent, twice in this file's runs). The run stops with
  one line naming the disk and the space a checkpoint takes, the newest
  complete checkpoint stays readable; with the disk grown, the same command
  finishes with the losses of an uninterrupted run, each step logged once."""
  disk, out = tmp_path / "disk", tmp_path / "out"
  disk.mkdir()
  out.mkdir()
  if not _can_mount_tmpfs(disk):
    pytest.skip("no private mount namespace here (unshare -rm) for a small tmpfs")
  cmd = " ".join(f"'{a}'" for a in command(disk / "run", tokenizer_file))
  script = f"""
    mount -t tmpfs -o size=22m tmpfs {disk}
    {cmd} > {out}/first.out 2> {out}/first.err; echo $? > {out}/first.rc
    cp -r {disk}/run {out}/after_full
    mount -o remount,size=400m {disk}
    {cmd} > {out}/second.out 2> {out}/second.err; echo $? > {out}/second.rc
    cp -r {disk}/run {out}/final
  """
  subprocess.run(["unshare", "-rm", "bash", "-c", script], cwd=REPO, env=ENV,
                 timeout=900, check=True)
  first_err = (out / "first.err").read_text()
  assert (out / "first.rc").read_text().strip() == "1", first_err[-3000:]
  assert "Traceback" not in first_err, first_err[-3000:]
  lines = error_lines(first_err)
  assert lines[0].startswith(f"error: no space left on the disk of {disk}"), lines
  assert "MB free" in lines[0] and "the same command" in lines[0]
  assert len(lines) == 2 and "--verbose" in lines[1]
  left = out / "after_full"
  newest = checkpoints.latest_step(str(left))
  assert newest in (5, 10)
  checkpoints.verify_checksums(str(left / "checkpoints" / str(newest)))
  pretrained_lib.restore_params(str(left), newest)  # Readable, whole.
  assert (out / "second.rc").read_text().strip() == "0", (
      (out / "second.err").read_text()[-3000:])
  assert f"at step {newest}" in (out / "second.err").read_text()
  steps, values = losses(out / "final")
  assert steps == list(range(1, TOTAL_STEPS + 1))
  np.testing.assert_allclose(values, reference, rtol=1e-6, atol=1e-6)


def test_a_held_out_split_too_small_for_its_streams_is_refused(tmp_path, tokenizer_file):
  """1% of pydoc fills a global batch of 16 x 64 but not one from each of the 2
  streams: every evaluation would have scored nothing and logged zeros as
  figures (the 2-process test did, unnoticed). Refused at set-up instead."""
  stderr = fails(command(tmp_path / "run", tokenizer_file,
                         "--config.data.eval_fraction=0.01", "--config.batch_size=16"))
  assert error_lines(stderr)[0].startswith(
      "error: the held-out split does not fill one batch of 16 x 64 from each of its "
      "2 data streams"), stderr[-2000:]
  assert not (tmp_path / "run" / "metrics.jsonl").exists() or steps_logged(
      tmp_path / "run") == 0


def test_full_disk_tracebacks_of_orbax_and_asyncio_are_left_to_the_one_line():
  """The full-disk test once failed on a traceback from asyncio ('Task exception
  was never retrieved', one of orbax's write coroutines, logged when the loop
  collected it): such records are dropped; other errors of either are kept."""
  import logging as pylogging  # pylint: disable=import-outside-toplevel
  from maelm_jax.core import cli  # pylint: disable=import-outside-toplevel

  def record(path, message):
    return pylogging.LogRecord("absl", pylogging.ERROR, path, 1, message, None, None)

  full = ("Task exception was never retrieved\nfuture: <Task exception=ValueError("
          "'RESOURCE_EXHAUSTED: ... No space left on device [os_error_code=28]')>")
  quiet = cli.QuietLibraries()
  assert not quiet.filter(record("/x/lib/python3.11/asyncio/base_events.py", full))
  assert not quiet.filter(record("/x/orbax/checkpoint/_src/a.py", full))
  assert quiet.filter(record("/x/lib/python3.11/asyncio/base_events.py",
                             "Task exception was never retrieved: KeyError"))
  assert quiet.filter(record("/x/maelm_jax/run/train.py", full))  # Our own: kept.
  # Reading one item of a step (checkpoints/N/state): orbax misses the step's
  # metadata there, by design; a step folder without it is a real warning.
  orbax = "/x/orbax/checkpoint/_src/metadata/checkpoint.py"
  assert not quiet.filter(record(orbax, "Metadata file does not exist: "
                                 "/w/checkpoints/40/state/_CHECKPOINT_METADATA"))
  assert quiet.filter(record(orbax, "Metadata file does not exist: "
                             "/w/checkpoints/40/_CHECKPOINT_METADATA"))


def test_a_refused_resume_closes_the_checkpoint_manager(trained, tmp_path, monkeypatch):
  """In a notebook the process lives on after an error: the manager opened for
  the restore (orbax's threads) is closed when the resume is refused, not left
  running beside the next try."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from maelm_jax.run import train  # pylint: disable=import-outside-toplevel
  workdir = copy_of(trained, tmp_path)
  before = snapshot(workdir)
  opened = []
  real_make_manager = checkpoints.make_manager

  def recording_make_manager(*args, **kwargs):
    manager = real_make_manager(*args, **kwargs)
    real_close = manager.close
    manager.closes = 0

    def close():
      manager.closes += 1
      real_close()
    manager.close = close
    opened.append(manager)
    return manager

  monkeypatch.setattr(checkpoints, "make_manager", recording_make_manager)
  config = ml_collections.ConfigDict(workdir_lib.read_config(str(workdir)))
  config.total_steps, config.allow_config_change = 20, True
  config.model.num_layers = 3  # Does not fit the checkpoint: refused at restore.
  with pytest.raises(Exception, match="does not fit this run's model"):
    train.train_and_evaluate(config, str(workdir))
  assert len(opened) == 1 and opened[0].closes == 1
  assert snapshot(workdir) == before


def test_a_failed_start_leaves_no_directory_it_made(tmp_path):
  """The first-day report: a wrong data glob, a wrong init_from and a wrong GLUE
  directory each left an empty workdir behind. Now the folders a failed start
  made are gone, and a folder that existed before stays, with what it held."""
  import sys as sys_lib
  sys_lib.path.insert(0, str(pathlib.Path(REPO) / "configs"))
  import glue  # pylint: disable=import-outside-toplevel
  from maelm_jax.finetune import run as finetune_run  # pylint: disable=import-outside-toplevel
  from maelm_jax.run import train  # pylint: disable=import-outside-toplevel
  from tests.helpers import tiny_config  # pylint: disable=import-outside-toplevel
  bad_data = tiny_config(**{"data.source": f"text:{tmp_path}/no_such/*.txt"})
  new = tmp_path / "runs" / "first"
  with pytest.raises(Exception, match="no_such"):
    train.train_and_evaluate(bad_data, str(new))
  assert not (tmp_path / "runs").exists()

  bad_init = tiny_config(init_from=str(tmp_path / "no_such_run"))
  with pytest.raises(Exception, match="no_such_run"):
    train.train_and_evaluate(bad_init, str(new))
  assert not (tmp_path / "runs").exists()

  sst2 = glue.get_config("task=sst2")
  sst2.init_from = str(tmp_path / "no_such_run")
  sst2.data.dir = str(tmp_path / "no_such_glue")
  with pytest.raises(Exception, match="no_such"):
    finetune_run.run(sst2, str(tmp_path / "sst2"))
  assert not (tmp_path / "sst2").exists()

  existing = tmp_path / "mine"
  existing.mkdir()
  (existing / "notes.txt").write_text("mine")
  with pytest.raises(Exception, match="no_such"):
    train.train_and_evaluate(bad_data, str(existing))
  assert sorted(os.listdir(existing)) == ["notes.txt"]

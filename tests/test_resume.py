"""Long runs that survive: exact resume after kill -9 and SIGTERM, corrupted
checkpoints, other device counts, init_from, non-finite steps, bad input."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from maelm_jax.run import checkpoints, run_tokenizer, train, train_lib
from maelm_jax.modeling import model as model_lib
from maelm_jax.core import sharding
from tests import helpers
from tests.helpers import built_once, random_ids, tiny_config

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[1]
TOTAL_STEPS = 20
RUN_ARGS = [
    "--config=configs/pretrain.py:objective=maelm,size=tiny",
    "--config.data.source=pydoc:", "--config.data.eval_fraction=0.05",
    "--config.batch_size=8", "--config.seq_len=64",
    f"--config.total_steps={TOTAL_STEPS}", "--config.warmup_steps=5",
    "--config.log_every=1", f"--config.eval_every={TOTAL_STEPS}",
    "--config.eval_batches=2", "--config.checkpoint_every=5",
    "--config.keep_checkpoints=2", "--config.model.dtype=float32",
    "--config.data.num_streams=2",
]


def command(workdir, tokenizer_file, *extra):
  return [sys.executable, "-m", "maelm_jax.main", f"--workdir={workdir}", *RUN_ARGS,
          f"--config.tokenizer.path={tokenizer_file}",
          "--config.tokenizer.vocab_size=600", *extra]


def run_env(devices=2):
  """The environment of the runs here and in test_never_lose_a_run.py (whose
  losses are compared bit for bit): `devices` fake devices, 2 unless said."""
  return dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices),
              XLA_FLAGS=helpers.xla_flags(devices))


def run(workdir, tokenizer_file, *extra, devices=2):
  out = subprocess.run(command(workdir, tokenizer_file, *extra), cwd=REPO,
                       env=run_env(devices),
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-4000:]
  return out


def losses(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  steps = [r["step"] for r in records]
  assert steps == sorted(set(steps)), f"a step was logged twice or out of order: {steps}"
  return steps, [r["train/loss"] for r in records]


def steps_logged(workdir):
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return 0
  with open(path) as f:
    return sum(1 for _ in f)


@pytest.fixture(scope="session")
def reference_workdir(tmp_path_factory, tokenizer_file):
  """The uninterrupted run, one for the whole test run: its losses are what every
  interrupted run here and in test_never_lose_a_run.py must reproduce, and a
  copy of it is the finished run other tests start from (it keeps the
  checkpoints of steps 10, 15 and 20)."""
  return built_once(tmp_path_factory, "reference_run",
                    lambda path: run(path, tokenizer_file, "--config.keep_checkpoints=3"))


@pytest.fixture(scope="session")
def reference(reference_workdir):
  """The uninterrupted run's losses."""
  steps, values = losses(reference_workdir)
  assert steps == list(range(1, TOTAL_STEPS + 1))
  return values


def copy_of(workdir, to):
  """A copy of a finished run's workdir, to resume, damage or start from."""
  shutil.copytree(workdir, to)
  return to


def interrupt(workdir, tokenizer_file, sig, *extra, after_steps=12):
  """Starts a run, sends `sig` once `after_steps` steps are logged."""
  process = subprocess.Popen(command(workdir, tokenizer_file, *extra), cwd=REPO,
                             env=run_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while steps_logged(workdir) < after_steps:
    assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.time() < deadline
    time.sleep(0.02)
  assert process.poll() is None, "the run ended before it could be interrupted"
  process.send_signal(sig)
  _, stderr = process.communicate(timeout=300)
  return process.returncode, stderr


def test_resume_after_kill_9_reproduces_the_uninterrupted_losses(
    tmp_path, tokenizer_file, reference):
  returncode, _ = interrupt(tmp_path, tokenizer_file, signal.SIGKILL)
  assert returncode == -signal.SIGKILL
  killed_at = steps_logged(tmp_path)
  assert killed_at < TOTAL_STEPS
  out = run(tmp_path, tokenizer_file)
  assert "resumed from" in out.stderr
  steps, values = losses(tmp_path)
  assert steps == list(range(1, TOTAL_STEPS + 1))  # None twice, none skipped.
  np.testing.assert_allclose(values, reference, rtol=1e-6, atol=1e-6)


def test_sigterm_saves_at_the_next_step_and_exits_0(tmp_path, tokenizer_file,
                                                    reference):
  returncode, stderr = interrupt(tmp_path, tokenizer_file, signal.SIGTERM)
  assert returncode == 0, stderr[-3000:]
  assert "preempted: saved a checkpoint at step" in stderr
  saved = checkpoints.latest_step(tmp_path)
  stopped_at = steps_logged(tmp_path)
  assert saved == stopped_at < TOTAL_STEPS  # The preemption checkpoint itself.
  run(tmp_path, tokenizer_file)
  steps, values = losses(tmp_path)
  assert steps == list(range(1, TOTAL_STEPS + 1))
  np.testing.assert_allclose(values, reference, rtol=1e-6, atol=1e-6)


def test_a_run_moved_to_another_machine_resumes_exactly(tmp_path, tokenizer_file):
  """A run grown across time-limited slots (launch/slot.sh): stopped by its
  --max_runtime on one machine, it goes on on another that kept none of its
  files. Its workdir travels as tar parts; its token ids are prepared again from
  the same text into the same path. Unpacked there and resumed, it logs the
  uninterrupted run's losses, though the first machine died before swapping in
  its parts and the second holds a half-unpacked workdir (moved aside)."""
  import lzma
  from maelm_jax.data import prepare_data, sources
  texts = tmp_path / "text"
  texts.mkdir()
  docs = sources.open_source("pydoc:", "train")
  for name, part in (("a", range(0, 150)), ("b", range(150, 300))):
    with lzma.open(texts / f"{name}.jsonl.xz", "wt", encoding="utf-8") as f:
      f.writelines(json.dumps({"text": docs[i]}) + "\n" for i in part)
  ids = tmp_path / "ids"

  def prepare():
    prepare_data.prepare(f"text:{texts}/*.jsonl.xz", str(ids),
                         tokenizer_path=tokenizer_file, workers=2)

  prepare()
  extra = (f"--config.data.source=arrayrecord:{ids}",)
  run(tmp_path / "reference", tokenizer_file, *extra)
  reference_steps, reference_losses = losses(tmp_path / "reference")
  workdir, parts = tmp_path / "run", tmp_path / "drive"

  def slot(max_runtime):
    out = subprocess.run(
        ["bash", "launch/slot.sh", f"--workdir={workdir}", f"--parts={parts}",
         "--part_size=1M", f"--max_runtime={max_runtime}", f"--python={sys.executable}",
         "--", *command(workdir, tokenizer_file, *extra)[4:]],
        cwd=REPO, env=run_env(),
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stderr

  stderr = slot("1s")
  assert "max_runtime reached" in stderr and steps_logged(workdir) < TOTAL_STEPS
  packed = sorted(p.name for p in (parts / "parts").iterdir())
  assert packed[0] == "COMPLETE" and len(packed) > 2  # Several 1 MB files.
  # The machine died before its swap: the new set waits complete in parts.new/
  # beside an older complete set (here one that would not even unpack).
  (parts / "parts").rename(parts / "parts.new")
  (parts / "parts").mkdir()
  for name, data in (("workdir.tar.part-000", b"an older slot's"), ("SERIAL", b"0"),
                     ("COMPLETE", b"")):
    (parts / "parts" / name).write_bytes(data)
  # The other machine has nothing of the run but a workdir half unpacked by an
  # earlier try, and prepares the same token ids from the same text.
  shutil.rmtree(workdir)
  workdir.mkdir()
  (workdir / "config.json").write_text("{")
  shutil.rmtree(ids)
  prepare()
  stderr = slot("")
  assert "unpacked slot 1" in stderr and "resumed from" in stderr
  aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.before-slot-1.")]
  assert len(aside) == 1 and (aside[0] / "config.json").read_text() == "{"
  steps, values = losses(workdir)
  assert steps == reference_steps == list(range(1, TOTAL_STEPS + 1))
  np.testing.assert_allclose(values, reference_losses, rtol=1e-6, atol=1e-6)
  assert sorted(os.listdir(parts)) == ["parts"]  # Swapped, the older set gone.
  assert (parts / "parts" / "SERIAL").read_text().strip() == "2"


def test_corrupted_checkpoint_falls_back_to_the_previous_one(tmp_path,
                                                             tokenizer_file,
                                                             reference_workdir,
                                                             reference):
  tmp_path = copy_of(reference_workdir, tmp_path / "run")
  ckpt = pathlib.Path(checkpoints.checkpoint_dir(tmp_path))
  assert sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) == [10, 15, 20]
  # Truncate every data file of the newest step's state.
  for path in (ckpt / "20" / "state").rglob("*"):
    if path.is_file() and path.stat().st_size > 1000:
      path.write_bytes(path.read_bytes()[:100])
  # And remove an item of the one before.
  shutil.rmtree(ckpt / "15" / "data")
  out = run(tmp_path, tokenizer_file, f"--config.total_steps={TOTAL_STEPS}")
  assert "checkpoint at step 20 cannot be restored" in out.stderr
  assert "checkpoint at step 15 cannot be restored" in out.stderr
  assert "resumed from" in out.stderr and "at step 10" in out.stderr
  # Nothing was deleted: the bad steps were moved aside, 15 and 20 written anew.
  names = sorted(p.name for p in ckpt.iterdir())
  assert "20.corrupt" in names and "15.corrupt" in names and "20" in names
  steps, values = losses(tmp_path)
  assert steps == list(range(1, TOTAL_STEPS + 1))
  np.testing.assert_allclose(values, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("devices", [1, 4])
def test_resume_on_another_device_count(tmp_path, tokenizer_file, reference_workdir,
                                        reference, devices):
  # The run of 2 devices, as if it had stopped at 10: its later checkpoints
  # dropped, it resumes elsewhere.
  tmp_path = copy_of(reference_workdir, tmp_path / "run")
  for step in ("15", "20"):
    shutil.rmtree(os.path.join(checkpoints.checkpoint_dir(tmp_path), step))
  out = run(tmp_path, tokenizer_file, "--config.mesh_shape=(-1,1,1)",
            devices=devices)
  assert f"over {devices} devices" in out.stderr and "at step 10" in out.stderr
  steps, values = losses(tmp_path)
  assert steps == list(range(1, TOTAL_STEPS + 1))
  np.testing.assert_allclose(values, reference, rtol=2e-5, atol=2e-5)


def test_init_from_starts_a_new_run_from_another_runs_params(tmp_path, tokenizer_file,
                                                            reference_workdir):
  source = copy_of(reference_workdir, tmp_path / "source")
  target = tmp_path / "target"
  out = run(target, "", f"--config.init_from={source}", "--config.total_steps=5",
            "--config.tokenizer.path=")
  assert f"initialised params from step {TOTAL_STEPS} of {source}" in out.stderr
  assert (target / "tokenizer.model").read_bytes() == pathlib.Path(
      tokenizer_file).read_bytes()
  _, fresh = losses(source)
  _, warm = losses(target)
  assert warm[0] < fresh[0] - 0.3  # Starts where the other run got to.


def test_nonfinite_step_is_skipped_and_counted():
  config = tiny_config("maelm", **{"model.dropout": 0.0, "model.attention_dropout": 0.0})
  cfg = model_lib.ModelConfig.from_config(config.model, 64, 4)
  tx = train_lib.make_optimizer(config)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, shardings = train_lib.create_sharded_state(cfg, 32, tx, mesh, 0)
  step, _ = train_lib.jit_steps(cfg, 32, tx, mesh, shardings)
  batch = {"input_ids": random_ids(8, 32, 64)}
  knots = train_lib.learning_rate_knots(config)
  state, _ = step(state, batch, knots)
  good_bias = state.params["lm_head"]["bias"]
  poisoned = state.replace(params={**state.params, "lm_head": {
      **state.params["lm_head"], "bias": good_bias.at[7].set(np.nan)}})
  before = jax.tree.map(np.asarray, (poisoned.params, poisoned.opt_state))
  after_state, metrics = step(poisoned, batch, knots)
  assert not np.isfinite(float(metrics["loss"]))
  assert int(after_state.step) == 2 and int(after_state.nonfinite_count) == 1
  assert int(after_state.last_nonfinite_step) == 2
  after = jax.tree.map(np.asarray, (after_state.params, after_state.opt_state))
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
    np.testing.assert_array_equal(a, b)  # Nothing applied, Adam moments intact.


def test_nonfinite_policy_stop_names_the_step_and_keeps_checkpoints(tmp_path):
  config = tiny_config("maelm", **{
      "data.source": "pydoc:", "tokenizer.vocab_size": 600, "batch_size": 8,
      "seq_len": 64, "total_steps": 12, "warmup_steps": 0, "log_every": 4,
      "eval_every": 100, "checkpoint_every": 1, "learning_rate": 1e30,
      "grad_clip_norm": 1e30, "data.eval_fraction": 0.05})
  with pytest.raises(FloatingPointError, match=r"non-finite .* the last at step \d+"):
    train.train_and_evaluate(config, str(tmp_path))
  assert checkpoints.latest_step(tmp_path) is not None  # Earlier ones are kept.


def test_workdir_of_another_config_is_refused(tmp_path, tokenizer_file, reference_workdir):
  tmp_path = copy_of(reference_workdir, tmp_path / "run")
  out = subprocess.run(command(tmp_path, tokenizer_file, "--config.model.mask_ratio=0.3"),
                       cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert "belongs to a run with a different config" in out.stderr
  assert "model.mask_ratio: 0.15 -> 0.3" in out.stderr
  assert "To resume it as it was saved, add: --config.model.mask_ratio=0.15" in out.stderr


def test_unknown_config_key_is_a_clear_error(tmp_path):
  out = subprocess.run([sys.executable, "-m", "maelm_jax.main",
                        "--config=configs/pretrain.py", f"--workdir={tmp_path}",
                        "--config.model.mask_rate=0.3"], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert out.stderr.strip().splitlines() == [
      "error in the command line: --config has no key 'mask_rate'; did you mean "
      "'mask_ratio'?"]


def test_missing_data_and_unwritable_workdir(tmp_path):
  config = tiny_config("maelm", **{"data.source": f"text:{tmp_path}/nothing/*.txt"})
  with pytest.raises(FileNotFoundError, match="nothing"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  with pytest.raises(ValueError):
    train.train_and_evaluate(tiny_config("maelm", **{"data.source": f"text:{empty}"}),
                             str(tmp_path / "run2"))
  not_a_directory = tmp_path / "file"
  not_a_directory.write_text("x")
  with pytest.raises(PermissionError, match="writable --workdir"):
    train.train_and_evaluate(tiny_config("maelm"), str(not_a_directory / "run"))
  with pytest.raises(ValueError, match="URLs served are gs://BUCKET/PATH"):
    train.train_and_evaluate(tiny_config("maelm"), "s3://bucket/run")
  assert not os.path.exists("s3:"), "nothing may be created for a URL workdir"


def test_corpus_smaller_than_a_batch(tmp_path, tokenizer_file):
  small = tmp_path / "small.txt"
  small.write_text("\n\n".join(f"Paragraph {i} has a few words of text." for i in range(10)))
  config = tiny_config("maelm", **{"data.source": f"text:{small}",
                                   "data.eval_fraction": 0.5,
                                   "tokenizer.path": tokenizer_file,
                                   "tokenizer.vocab_size": 600, "batch_size": 64})
  with pytest.raises(ValueError, match="fewer than one batch needs"):
    train.train_and_evaluate(config, str(tmp_path / "run"))


@pytest.mark.parametrize("stored,given", [("tokenizer.model", "other.json"),
                                          ("tokenizer.json", "other.model")])
def test_resume_refuses_a_tokenizer_of_the_other_kind(tmp_path, stored, given):
  """A workdir trained with a SentencePiece model resumed with a tokenizer.json
  (or the reverse) is refused like any other tokenizer swap, before any work."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / stored).write_text("the run's own tokenizer")
  (tmp_path / given).write_text("another tokenizer")
  config = tiny_config()
  config.tokenizer.path = str(tmp_path / given)
  with pytest.raises(ValueError, match=f"differs from {workdir / stored}.*new --workdir"):
    run_tokenizer.tokenizer_path_for(config, str(workdir))
  # The same file of the same kind resumes.
  same = tmp_path / ("same" + os.path.splitext(stored)[1])
  same.write_text("the run's own tokenizer")
  if stored.endswith(".model"):
    config.tokenizer.path = str(same)
    assert run_tokenizer.tokenizer_path_for(config, str(workdir)) == str(same)

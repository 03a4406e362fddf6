"""One run lifecycle for both loops (run_session.py): the refusals before any
write, the lock, config.json and metrics.jsonl as of the step a run goes on
from, the stop signal and its one message, and closing on every exit."""

import contextlib
import json
import os
import signal
import threading
import time

import pytest

from configs import glue as glue_config
from maelm_jax.run import config_lib, preemption, run_session
from maelm_jax.core import workdir as workdir_lib
from maelm_jax.finetune import run as finetune_run
from tests.helpers import tiny_config


def pretraining_config(**overrides):
  return tiny_config("mlm", **overrides)


def finetuning_config(init_from, **overrides):
  config = glue_config.get_config("task=sst2")
  config.init_from = str(init_from)
  for key, value in overrides.items():
    setattr(config, key, value)
  return config


def both_modes(tmp_path):
  """(mode, config maker) of each loop; fine-tuning's init_from is some other
  directory (claim never reads it)."""
  init_from = tmp_path / "pretrained"
  return [("pretrain", pretraining_config),
          ("glue", lambda **o: finetuning_config(init_from, **o))]


@pytest.mark.parametrize("loop", [0, 1], ids=["pretraining", "fine-tuning"])
def test_claim_refuses_before_any_write_in_both_loops(tmp_path, loop):
  mode, make = both_modes(tmp_path)[loop]
  workdir = tmp_path / "run"
  run_session.claim(make(), str(workdir), mode)  # Creates it, writes nothing.
  assert workdir.is_dir() and os.listdir(workdir) == []
  workdir_lib.write_config(make(), str(workdir))
  run_session.claim(make(), str(workdir), mode)  # The same config: fine.
  # Another config: refused, naming the key and the flag that resumes as saved.
  other = make(learning_rate=0.123)
  with pytest.raises(workdir_lib.WorkdirError,
                     match=r"learning_rate: .* -> 0.123(.|\n)*To resume it as it "
                           r"was saved, add: --config.learning_rate=") as error:
    run_session.claim(other, str(workdir), mode)
  assert ("allow_config_change" in str(error.value)) == (mode == "pretrain")
  if mode == "pretrain":  # Pretraining may take new values on purpose.
    run_session.claim(pretraining_config(learning_rate=0.123,
                                         allow_config_change=True),
                      str(workdir), mode)
  # The other loop's workdir: refused by mode, before the config is compared.
  other_mode, other_make = both_modes(tmp_path)[1 - loop]
  with pytest.raises(workdir_lib.WorkdirError, match="pass a new --workdir"):
    run_session.claim(other_make(), str(workdir), other_mode)
  assert sorted(os.listdir(workdir)) == ["config.json"]
  # The fine-tuning sweep asks the same question of each of its runs.
  if mode == "glue":
    with pytest.raises(workdir_lib.WorkdirError, match="another config"):
      finetune_run.check_same_run(other, str(workdir))


def test_a_run_of_the_former_positions_resumes_with_the_flags_it_is_told(tmp_path):
  """A workdir saved when the fast recipe had a learned table and a relative bias
  (before 2026-12-03), met by the same command under today's rotary default: the
  refusal names both keys and the flags that resume it, and those flags do."""
  workdir = tmp_path / "run"
  former = pretraining_config(**{"model.position": "learned",
                                 "model.relative_position_bias": True})
  run_session.claim(former, str(workdir), "pretrain")
  workdir_lib.write_config(former, str(workdir))
  assert pretraining_config().model.position == "rope"
  with pytest.raises(workdir_lib.WorkdirError) as error:
    run_session.claim(pretraining_config(), str(workdir), "pretrain")
  message = str(error.value)
  assert "model.position: 'learned' -> 'rope'" in message
  assert "model.relative_position_bias: True -> False" in message
  flags = message.split("add: ", 1)[1].splitlines()[0].split()
  assert sorted(flags) == ["--config.model.position=learned",
                           "--config.model.relative_position_bias=True"]
  told = pretraining_config(**{"model.position": "learned",
                               "model.relative_position_bias": True})
  run_session.claim(told, str(workdir), "pretrain")  # Resumes: no refusal.


def test_hold_is_one_live_run_per_workdir(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  with run_session.hold(str(workdir)):
    assert (workdir / workdir_lib.LOCK_FILE).exists()
    with pytest.raises(workdir_lib.WorkdirError, match="in use"):
      with run_session.hold(str(workdir)):
        pass
  assert not (workdir / workdir_lib.LOCK_FILE).exists()


class FakeManager:
  """What the session asks of a checkpoint manager."""

  def __init__(self, directory):
    self.directory = directory
    self.calls = []

  def wait_until_finished(self):
    self.calls.append("wait")

  def close(self):
    self.calls.append("close")


@pytest.mark.parametrize("loop", [0, 1], ids=["pretraining", "fine-tuning"])
def test_session_files_stop_signal_and_close(tmp_path, loop):
  mode, make = both_modes(tmp_path)[loop]
  workdir = tmp_path / "run"
  workdir.mkdir()
  metrics = workdir / workdir_lib.METRICS_FILE
  metrics.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n"
                             for s in (10, 20, 30)))
  manager = FakeManager(str(workdir / "checkpoints"))
  previous = signal.getsignal(signal.SIGTERM)
  with run_session.RunSession(str(workdir), make(), manager, restored_step=20) as s:
    # config.json written; the records after the step it goes on from cut.
    assert workdir_lib.read_config(str(workdir))["learning_rate"] == make().learning_rate
    assert [r["step"] for r in workdir_lib.read_metrics(str(workdir))] == [10, 20]
    s.write(21, {"loss": 0.5})
    assert not s.stop_requested(21)
    os.kill(os.getpid(), signal.SIGTERM)  # A preemption notice: no exit.
    assert s.stop_requested(22)
    assert s.stopped(22) == {"preempted_at_step": 22, "stopped_by": "SIGTERM"}
  # Closed on leaving: the last checkpoint waited for, the handler given back.
  assert manager.calls == ["wait", "close"]
  assert signal.getsignal(signal.SIGTERM) == previous
  assert [r["step"] for r in workdir_lib.read_metrics(str(workdir))] == [10, 20, 21]
  # A fresh run (nothing restored) starts its metrics over; an error inside
  # the block still closes everything.
  manager = FakeManager(str(workdir / "checkpoints"))
  with pytest.raises(RuntimeError, match="boom"):
    with run_session.RunSession(str(workdir), make(), manager, restored_step=None):
      assert workdir_lib.read_metrics(str(workdir)) == []
      raise RuntimeError("boom")
  assert manager.calls == ["wait", "close"]
  assert signal.getsignal(signal.SIGTERM) == previous


@contextlib.contextmanager
def watcher_with_sigint(tmp_path, disposition, given_back):
  """A PreemptionWatcher made while SIGINT is `disposition`; closed on leaving
  (even after a failed assert), then SIGINT put back as the test found it.
  `given_back` gets what the watcher's close left SIGINT at."""
  previous = signal.signal(signal.SIGINT, disposition)
  watcher = preemption.PreemptionWatcher(FakeManager(str(tmp_path)))
  try:
    yield watcher
  finally:
    watcher.close()
    given_back.append(signal.getsignal(signal.SIGINT))
    signal.signal(signal.SIGINT, previous)


def test_a_second_ctrl_c_aborts_without_waiting_for_the_save(tmp_path):
  """Ctrl-C once: save at the next step boundary and stop, as for SIGTERM.
  Ctrl-C again while that is under way: abort at once (KeyboardInterrupt). The
  installed handler is called as the signal would call it (a real SIGINT could
  reach pytest-xdist); SIGINT starts at Python's default, as from a terminal."""
  given_back = []
  with watcher_with_sigint(tmp_path, signal.default_int_handler, given_back) as watcher:
    handler = signal.getsignal(signal.SIGINT)
    assert handler is not signal.default_int_handler
    assert not watcher.reached(1)
    handler(signal.SIGINT, None)
    assert watcher.signal_name == "SIGINT" and watcher.reached(2)
    with pytest.raises(KeyboardInterrupt):
      handler(signal.SIGINT, None)
  assert given_back == [signal.default_int_handler]


def test_an_ignored_ctrl_c_stays_ignored_and_other_threads_set_no_handler(
    tmp_path, caplog):
  """A run started in the background of a script inherits SIGINT ignored, as the
  shell meant: it stays ignored, SIGTERM is still the watcher's. A watcher made
  outside the main thread, where Python sets no handlers, says so per signal."""
  with watcher_with_sigint(tmp_path, signal.SIG_IGN, []) as watcher:
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert getattr(signal.getsignal(signal.SIGTERM), "__self__", None) is watcher
  before = signal.getsignal(signal.SIGTERM)
  thread = threading.Thread(
      target=lambda: preemption.PreemptionWatcher(FakeManager(str(tmp_path))))
  thread.start()
  thread.join()
  assert signal.getsignal(signal.SIGTERM) is before
  said = [r.getMessage() for r in caplog.records if "not in the main thread" in
          r.getMessage()]
  assert "not in the main thread: SIGTERM will not save a checkpoint" in said, said


@pytest.mark.parametrize("loop", [0, 1], ids=["pretraining", "fine-tuning"])
def test_session_after_a_crash_mid_write(tmp_path, loop):
  """The same guarantees for both loops: a torn last metrics line (the process
  died writing it) is dropped on resume, the whole lines kept. (Ctrl-C is sent
  to a real run in test_never_lose_a_run: SIGINT here would reach pytest-xdist.)"""
  mode, make = both_modes(tmp_path)[loop]
  workdir = tmp_path / "run"
  workdir.mkdir()
  metrics = workdir / workdir_lib.METRICS_FILE
  metrics.write_text(json.dumps({"step": 10, "loss": 1.0}) + "\n"
                     + json.dumps({"step": 20, "loss": 0.9}) + "\n" + '{"step": 3')
  manager = FakeManager(str(workdir / "checkpoints"))
  previous = signal.getsignal(signal.SIGINT)
  with run_session.RunSession(str(workdir), make(), manager, restored_step=20) as s:
    assert metrics.read_text().splitlines() == [
        json.dumps({"step": 10, "loss": 1.0}), json.dumps({"step": 20, "loss": 0.9})]
    assert not s.stop_requested(21)
  assert manager.calls == ["wait", "close"]
  assert signal.getsignal(signal.SIGINT) == previous


class _Manager:
  def __init__(self, close_error=None):
    self.closes, self.close_error = 0, close_error

  def close(self):
    self.closes += 1
    if self.close_error:
      raise self.close_error


def test_closed_on_error_closes_only_on_error_and_keeps_the_run_error():
  manager = _Manager()
  with run_session.closed_on_error(manager):
    pass
  assert manager.closes == 0  # The session owns it from here and closes it.
  with pytest.raises(ValueError, match="does not fit"):
    with run_session.closed_on_error(manager):
      raise ValueError("does not fit this run's model")
  assert manager.closes == 1
  # A manager that fails to close (a full disk) does not hide the run's error.
  failing = _Manager(close_error=OSError("No space left on device"))
  with pytest.raises(KeyboardInterrupt):
    with run_session.closed_on_error(failing):
      raise KeyboardInterrupt
  assert failing.closes == 1


@pytest.mark.parametrize("loop", [0, 1], ids=["pretraining", "fine-tuning"])
def test_max_runtime_stops_at_the_first_step_boundary_past_it(tmp_path, loop):
  mode, make = both_modes(tmp_path)[loop]
  del mode
  workdir = tmp_path / "run"
  workdir.mkdir()
  manager = FakeManager(str(workdir / "checkpoints"))
  with run_session.RunSession(str(workdir), make(max_runtime="0.5s"), manager,
                              restored_step=None) as s:
    assert not s.stop_requested(1)
    time.sleep(0.6)
    assert s.stop_requested(2)
    assert s.stopped(2) == {"preempted_at_step": 2, "stopped_by": "max_runtime"}
  # No limit: never.
  with run_session.RunSession(str(workdir), make(), FakeManager(str(workdir)),
                              restored_step=None) as s:
    time.sleep(0.1)
    assert not s.stop_requested(1)


@pytest.mark.parametrize("text,seconds", [("", None), ("90s", 90.0), ("9m", 540.0),
                                          ("1h30m", 5400.0), ("2.5h", 9000.0),
                                          ("600", 600.0), (" 1M ", 60.0)])
def test_max_runtime_reads_durations(text, seconds):
  assert config_lib.max_runtime_seconds(pretraining_config(max_runtime=text)) == seconds


@pytest.mark.parametrize("loop", [0, 1], ids=["pretraining", "fine-tuning"])
@pytest.mark.parametrize("bad", ["9 minutes", "0", "-5m", "1d", "m"])
def test_a_bad_max_runtime_is_refused_in_one_line(tmp_path, loop, bad):
  validate = [config_lib.validate, finetune_run.validate][loop]
  config = both_modes(tmp_path)[loop][1](max_runtime=bad)
  with pytest.raises(ValueError) as refused:
    validate(config)
  problems = [line for line in str(refused.value).splitlines() if "max_runtime" in line]
  assert len(problems) == 1 and "give a duration such as 90s, 9m or 1h30m" in problems[0]


def test_a_pretraining_past_max_runtime_saves_and_the_same_command_goes_on(
    tmp_path, tokenizer_file):
  """The run past its limit checkpoints the step it reached and returns (exit 0
  from the CLI); the same config without the limit resumes there and finishes."""
  from maelm_jax.run import checkpoints, train  # pylint: disable=import-outside-toplevel
  workdir = str(tmp_path / "run")
  make = lambda limit: pretraining_config(**{
      "max_runtime": limit, "total_steps": 6, "log_every": 1, "eval_every": 6,
      "eval_batches": 1, "checkpoint_every": 100, "data.source": "pydoc:",
      "data.eval_fraction": 0.05, "tokenizer.path": tokenizer_file,
      "tokenizer.vocab_size": 600})
  first = train.train_and_evaluate(make("0.1s"), workdir)  # Past it at step 1.
  assert first["stopped_by"] == "max_runtime"
  stopped_at = first["preempted_at_step"]
  assert 1 <= stopped_at < 6
  assert checkpoints.committed_steps(workdir) == [stopped_at]
  last = train.train_and_evaluate(make(""), workdir)  # A longer limit is a resume too.
  assert "stopped_by" not in last
  assert [r["step"] for r in workdir_lib.read_metrics(workdir)] == [1, 2, 3, 4, 5, 6]
  assert checkpoints.committed_steps(workdir)[-1] == 6


@pytest.mark.parametrize("value", ["0", "-5", "60s", "inf"])
def test_a_lease_length_that_cannot_work_is_named_before_the_lease_is_taken(
    monkeypatch, value):
  """Zero or less renewed without pause and expired at once (a second run took
  the workdir over); '60s' failed in float() naming no variable."""
  monkeypatch.setenv("MAELM_LEASE_SECONDS", value)
  with pytest.raises(ValueError, match=f"MAELM_LEASE_SECONDS='{value}' is not a number"):
    workdir_lib.Lease("gs://bucket/run")
  monkeypatch.setenv("MAELM_LEASE_SECONDS", "2.5")
  assert workdir_lib.Lease("gs://bucket/run").seconds == 2.5
  monkeypatch.delenv("MAELM_LEASE_SECONDS")
  assert workdir_lib.Lease("gs://bucket/run").seconds == workdir_lib.LEASE_SECONDS

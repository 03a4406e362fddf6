r"""Fault injection: kill a small real run at random instants, then check that
nothing was lost.

  python -m maelm_jax.tools.chaos --out=runs/chaos --kills=50 --seed=0

For each of --runs (a tiny MAE-LM pretraining on CPython's docs, then a GLUE
fine-tuning of it on a synthetic SST-2-format task), the harness
  1. runs the command once without interruption (the reference), timing its
     phases from its log;
  2. runs the same command in a workdir of its own over and over: each life
     gets SIGKILL (or, one time in four, SIGTERM: a preemption notice) at an
     instant drawn from --seed inside a phase drawn from PHASES (start-up,
     set-up, first batches through the data pipeline, compilation, steps, the
     middle of a checkpoint write, the deletion of an old checkpoint), until
     --kills signals were delivered; the last life runs to the end. Every life
     deletes old checkpoints slowly (PRUNE_SECONDS, as on a slow disk), so
     that kills land inside a prune too; a life whose signal targets
     compilation starts with JAX's compilation cache off, so that it compiles;
  3. compares: every array of the final checkpoint (params, optimizer state,
     counters) and the data iterator's state bit for bit with the reference's,
     and metrics.jsonl record by record (each step once, the same values).

It reports figures, not a pass: per kill the phase it landed in (seen from the
log and the checkpoint directory at the instant of delivery), the step logged,
the newest committed checkpoint, the step the next life resumed from, steps
redone, bytes of the interrupted checkpoint write thrown away, and processes the
dead run left behind; totals by phase in <out>/chaos_report.json and a table.
Work lost beyond the last committed checkpoint must be 0, and every start must
run until its signal (a start that exits with an error is a failure). Exit 1 if
any check fails.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from absl import flags
import numpy as np

from maelm_jax.core import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PHASES = ("start-up", "set-up", "first batches", "compilation", "steps",
          "checkpoint write", "pruning")
# Seen in the ordering the run goes through them; "finishing" (the last step is
# logged, the final save and close are under way) is never a target, only seen.
SEEN_PHASES = PHASES + ("finishing",)
# The log line that starts each phase after start-up (the first that matches).
MARKERS = {
    "pretrain": (("set-up", r"\bmesh \{"),
                 ("first batches", r"training steps \d+\.\.|this run already finished"),
                 ("compilation", r"compiling the train step")),
    "glue": (("set-up", r"\d+ epochs x \d+ steps"),
             ("compilation", r"loaded encoder|resumed from")),
}
# Where each run's log says which step it starts from.
START_STEP = {
    "pretrain": (r"resumed from .* at step (\d+)", r"training steps 1\.\."),
    "glue": (r"resumed from .* at step (\d+)", r"loaded encoder"),
}
TIMING_KEYS = ("tokens_per_sec", "mfu", "examples_per_sec")
# The console line of a logged step (metric_writers.format_console): this life
# trained a step. (Counting metrics.jsonl's records cannot tell: a life first
# cuts the file back to its checkpoint's step.)
STEP_LOGGED = r"\bstep \d+/\d+ \|"
SIGTERM_SHARE = 0.25
LIFE_TIMEOUT_S = 600
# How long each life takes to delete an old checkpoint (checkpoints.PRUNE_SECONDS_ENV):
# a tiny run's step is gone in a millisecond, too quick for a kill to land in.
PRUNE_SECONDS = 0.6
# A phase marked by the log (set-up, first batches, compilation) is hit at an
# instant in the first half of the reference's length of it: the length varies
# with the machine's load (a compile 1.6x faster than the reference's was seen
# on a busy 2-core host), and a later instant would land in the next phase.
PHASE_SHARE = 0.5
# A life whose signal targets compilation, and the reference that times that
# phase, compile from nothing: with JAX's compilation cache warm (a restarted
# run reads its steps from it) the phase lasts a fraction of a second, and the
# signal would land in the steps after it.
COLD_COMPILE = ["--config.compilation_cache_dir="]
# Exit statuses a signal explains: killed, stopped by the signal before the
# run's handlers were in place, or a clean stop after a SIGTERM's save.
SIGNAL_EXITS = {"SIGKILL": (-signal.SIGKILL,),
                "SIGTERM": (0, -signal.SIGTERM, 128 + signal.SIGTERM)}


# ------------------------------------------------------------------- The runs --


def pretrain_command(workdir: str, tokenizer: str, total_steps: int) -> list[str]:
  """Tiny MAE-LM, a checkpoint every 3 steps (2 kept), an evaluation every 10,
  a grain worker process prefetching (a child the kill must not orphan)."""
  return [sys.executable, "-m", "maelm_jax.main", f"--workdir={workdir}",
          "--config=configs/pretrain.py:objective=maelm,size=tiny",
          "--config.data.source=pydoc:", "--config.data.eval_fraction=0.05",
          "--config.data.num_workers=1", "--config.data.num_streams=2",
          "--config.batch_size=8", "--config.seq_len=64",
          f"--config.total_steps={total_steps}", "--config.warmup_steps=5",
          "--config.log_every=1", "--config.eval_every=10", "--config.eval_batches=2",
          "--config.checkpoint_every=3", "--config.keep_checkpoints=2",
          "--config.model.dtype=float32", f"--config.tokenizer.path={tokenizer}",
          "--config.tokenizer.vocab_size=600", "--config.baseline_tokens=20000"]


def glue_command(workdir: str, pretrained: str, data_dir: str,
                 num_epochs: int) -> list[str]:
  """SST-2-format fine-tuning of the pretraining reference: 10 steps an epoch,
  a checkpoint and a dev evaluation at each epoch's end, dropout on."""
  return [sys.executable, "-m", "maelm_jax.main", f"--workdir={workdir}",
          "--config=configs/glue.py:task=sst2", f"--config.init_from={pretrained}",
          f"--config.data.dir={data_dir}", "--config.max_seq_len=24",
          "--config.batch_size=16", "--config.eval_batch_size=16",
          f"--config.num_epochs={num_epochs}", "--config.learning_rate=1e-3",
          "--config.dtype=float32", "--config.log_every=1",
          "--config.keep_final_checkpoint=True"]


def write_sentiment_task(directory: str, num_train: int = 160, num_dev: int = 32):
  """SST-2's files (sentence<TAB>label) for a task a tiny encoder learns: one
  sentiment word among filler."""
  words = {0: ("bad", "dull", "awful"), 1: ("good", "fine", "great")}
  filler = "the a of to in is it that for on with as this by be are".split()
  rng = np.random.default_rng(7)
  task = os.path.join(directory, "SST-2")
  os.makedirs(task)
  for name, count in (("train.tsv", num_train), ("dev.tsv", num_dev)):
    with open(os.path.join(task, name), "w") as f:
      f.write("sentence\tlabel\n")
      for i in range(count):
        sentence = list(rng.choice(filler, size=7))
        sentence[rng.integers(7)] = rng.choice(words[i % 2])
        f.write(f"{' '.join(sentence)}\t{i % 2}\n")


# ------------------------------------------------------------ Watching a run --


def metrics_records(workdir: str) -> list[dict[str, Any]]:
  """metrics.jsonl's whole lines (a line being written is not one yet)."""
  from maelm_jax.core import workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  path = workdir_lib.metrics_path(workdir)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    text = f.read()
  return [json.loads(line) for line in text.split("\n")[:-1] if line]


def checkpoint_in_flight(workdir: str, since: float = 0.0) -> int:
  """Bytes of checkpoint writes not committed yet (orbax's temporary step
  directories, or a step directory without its commit marker) changed at or
  after `since` (a time.time(); an earlier life's leftovers are not this life's
  writes); 0 if none."""
  from maelm_jax.run import checkpoints  # pylint: disable=import-outside-toplevel
  directory = checkpoints.checkpoint_dir(workdir)
  try:
    names = os.listdir(directory)
  except FileNotFoundError:
    return 0
  total, found = 0, False
  for name in names:
    path = os.path.join(directory, name)
    step = name.split(".")[0]
    if not step.isdigit() or name.endswith(".corrupt"):
      continue
    try:
      changed = os.stat(path).st_mtime
    except OSError:
      continue
    if changed < since:
      continue
    if "tmp" in name or (name.isdigit() and not checkpoints.is_committed(path)):
      found = True
      for root, _, files in os.walk(path):
        for f in files:
          try:
            total += os.path.getsize(os.path.join(root, f))
          except OSError:
            pass
  return max(total, 1) if found else 0


def pruning(workdir: str) -> bool:
  """Whether an old checkpoint is being deleted now (checkpoints.remove_step)."""
  from maelm_jax.run import checkpoints  # pylint: disable=import-outside-toplevel
  try:
    names = os.listdir(checkpoints.checkpoint_dir(workdir))
  except FileNotFoundError:
    return False
  return any(name.endswith(checkpoints.PRUNING_SUFFIX) for name in names)


def session_processes(session_id: int) -> list[int]:
  """Live processes of a session (the run was started as its leader)."""
  found = []
  for entry in os.listdir("/proc"):
    if not entry.isdigit():
      continue
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
      continue
    if int(fields[3]) == session_id and fields[0] != "Z":  # fields[3]: session.
      found.append(int(entry))
  return found


def life_env(devices: int, environ=None) -> dict[str, str]:
  """The environment of every launch: `devices` CPU devices, and the caller's
  other XLA_FLAGS kept (its compile options apply to the reference and the
  killed run alike, so they stay comparable bit for bit)."""
  environ = os.environ if environ is None else environ
  kept = [f for f in environ.get("XLA_FLAGS", "").split()
          if not f.startswith("--xla_force_host_platform_device_count")]
  return dict(environ, JAX_NUM_CPU_DEVICES=str(devices),
              XLA_FLAGS=" ".join([f"--xla_force_host_platform_device_count={devices}",
                                  *kept]),
              JAX_PLATFORMS="cpu", MAELM_FAULT_PRUNE_SECONDS=str(PRUNE_SECONDS))


class Life:
  """One launch of the run's command, its stderr read as it comes."""

  def __init__(self, command: list[str], workdir: str, mode: str, devices: int):
    env = life_env(devices)
    self.workdir, self.mode = workdir, mode
    self.marks: dict[str, float] = {}
    self.lines: list[str] = []
    self.start_step: int | None = None
    self.steps_logged = 0  # Console lines of logged steps, this life.
    self.launched, self.launched_at = time.monotonic(), time.time()
    self.process = subprocess.Popen(command, cwd=REPO, env=env, text=True,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    start_new_session=True)
    self._reader = threading.Thread(target=self._read, daemon=True)
    self._reader.start()

  def _read(self) -> None:
    resumed, fresh = START_STEP[self.mode]
    for line in self.process.stderr:
      self.lines.append(line)
      now = self.elapsed()
      for phase, pattern in MARKERS[self.mode]:
        if phase not in self.marks and re.search(pattern, line):
          self.marks[phase] = now
      if re.search(STEP_LOGGED, line):
        self.steps_logged += 1
      if self.start_step is None:
        if match := re.search(resumed, line):
          self.start_step = int(match[1])
        elif re.search(fresh, line):
          self.start_step = 0

  def elapsed(self) -> float:
    return time.monotonic() - self.launched

  def alive(self) -> bool:
    return self.process.poll() is None

  def phase(self, final_step: int) -> str:
    """Where the run is now, from its log and its workdir."""
    if pruning(self.workdir):
      return "pruning"
    if self.checkpoint_in_flight():
      return "checkpoint write"
    records = metrics_records(self.workdir)
    if records and records[-1]["step"] >= final_step:
      return "finishing"
    if self.steps_logged:
      return "steps"
    marked = [p for p, _ in MARKERS[self.mode] if p in self.marks]
    return marked[-1] if marked else "start-up"

  def checkpoint_in_flight(self) -> int:
    return checkpoint_in_flight(self.workdir, since=self.launched_at)

  @property
  def error(self) -> str:
    """The last line of its log that says what went wrong, for a report."""
    lines = [line.strip() for line in self.lines if line.strip()]
    said = [line for line in lines if line.startswith(("error", "Error"))
            or "Error:" in line]
    return (said or lines or [""])[-1][:300]

  def finish(self, timeout: float) -> tuple[int | None, list[int]]:
    """Waits for the exit; (return code or None if it hung, processes of its
    session left behind, which are then killed)."""
    try:
      code = self.process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      code = None
      os.killpg(self.process.pid, signal.SIGKILL)
      self.process.wait()
    self._reader.join(timeout=10)
    time.sleep(0.2)  # Children that exit with their parent have done so.
    orphans = session_processes(self.process.pid)
    for pid in orphans:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    return code, orphans

  @property
  def log(self) -> str:
    return "".join(self.lines)


# ----------------------------------------------------------- The reference --


@dataclasses.dataclass
class Reference:
  workdir: str
  final_step: int
  phase_seconds: dict[str, float]  # How long each phase lasted, uninterrupted.
  step_seconds: float  # Median time between logged steps.
  wall_seconds: float


def run_reference(command: list[str], workdir: str, mode: str,
                  devices: int) -> Reference:
  life = Life(command, workdir, mode, devices)
  step_times, seen = [], 0
  while life.alive():  # The time each record appears, for the step time.
    records = len(metrics_records(workdir))
    if records > seen:
      step_times.append(life.elapsed())
      seen = records
    time.sleep(0.005)
  code, _ = life.finish(60)
  if code != 0:
    raise RuntimeError(f"the uninterrupted run failed (exit {code}):\n{life.log[-3000:]}")
  records = metrics_records(workdir)
  first_record = step_times[0] if step_times else life.elapsed()
  starts = [("start-up", 0.0)] + [(p, life.marks[p]) for p, _ in MARKERS[mode]
                                  if p in life.marks] + [("steps", first_record)]
  phase_seconds = {p: max(0.05, starts[i + 1][1] - t)
                   for i, (p, t) in enumerate(starts[:-1])}
  gaps = np.diff(step_times) if len(step_times) > 2 else [0.1]
  return Reference(workdir, records[-1]["step"], phase_seconds,
                   float(np.median(gaps)), life.elapsed())


# ------------------------------------------------------------- The kills --


@dataclasses.dataclass
class Kill:
  life: int
  target: str
  signal: str
  phase: str = ""  # Where it landed.
  seconds_after_launch: float = 0.0
  exit_code: int | None = None
  logged_step: int = 0  # The last step in metrics.jsonl when it died.
  trained: bool = False  # Whether this life logged steps past where it started.
  committed_step: int = 0  # The newest complete checkpoint when it died.
  resumed_from: int | None = None  # The step the next life started from.
  in_flight_bytes: int = 0  # The interrupted checkpoint write, thrown away.
  orphans: int = 0
  sigterm_saved: bool | None = None  # SIGTERM: a checkpoint at the step it stopped.

  @property
  def lost_steps(self) -> int:
    """Committed work the next life did not start from (must be 0)."""
    return max(0, self.committed_step - (self.resumed_from or 0))

  @property
  def redone_steps(self) -> int:
    """Steps this life logged that the next one trains again."""
    return max(0, self.logged_step - (self.resumed_from or 0)) if self.trained else 0


def wait_until(condition, life: Life, deadline: float) -> None:
  while life.alive() and time.monotonic() < deadline and not condition():
    time.sleep(0.003)


def deliver(life: Life, target: str, sig: signal.Signals, reference: Reference,
            rng: np.random.Generator, checkpoint_every: int) -> Kill | None:
  """Waits for `target` in this life, then a random instant inside it, and
  sends `sig`; None if the run ended first."""
  deadline = time.monotonic() + LIFE_TIMEOUT_S
  order = list(SEEN_PHASES)
  reached = lambda: order.index(life.phase(reference.final_step)) >= order.index(target)
  if target == "steps":
    wanted = int(rng.integers(1, 2 * checkpoint_every + 1))
    wait_until(lambda: life.steps_logged >= wanted, life, deadline)
    delay = rng.uniform(0, reference.step_seconds)
  elif target == "checkpoint write":
    wait_until(lambda: life.checkpoint_in_flight() > 0, life, deadline)
    delay = rng.uniform(0, 0.03)
  elif target == "pruning":
    wait_until(lambda: pruning(life.workdir), life, deadline)
    delay = rng.uniform(0, 0.8 * PRUNE_SECONDS)
  else:
    if target != "start-up":
      wait_until(reached, life, deadline)
    delay = rng.uniform(0, PHASE_SHARE * reference.phase_seconds.get(target, 0.5))
  time.sleep(delay)
  if not life.alive():
    return None
  phase = life.phase(reference.final_step)  # Where it is at the instant of the signal.
  records = metrics_records(life.workdir)
  life.process.send_signal(sig)
  logged = records[-1]["step"] if records else 0
  return Kill(life=0, target=target, signal=sig.name, phase=phase,
              seconds_after_launch=round(life.elapsed(), 3), logged_step=logged,
              trained=life.steps_logged > 0)


def chaos_run(mode: str, command: list[str], workdir: str, reference: Reference,
              kills: int, rng: np.random.Generator, devices: int,
              plan: list[tuple[str, str]] | None = None,
              say=print) -> dict[str, Any]:
  """Lives of `command` in `workdir` until `kills` signals were delivered (or
  `plan`'s (phase, signal name) pairs were), then one to the end."""
  from maelm_jax.run import checkpoints  # pylint: disable=import-outside-toplevel
  targets = [t for t in PHASES if mode == "pretrain" or t != "first batches"]
  checkpoint_every = 3 if mode == "pretrain" else 10
  delivered: list[Kill] = []
  lives: list[Life] = []
  failed_starts: list[dict[str, Any]] = []  # Lives that exited with an error.
  misses = 0
  started = time.monotonic()
  wanted = len(plan) if plan is not None else kills
  while len(delivered) < wanted:
    if plan is not None:
      target, sig = plan[len(delivered)][0], signal.Signals[plan[len(delivered)][1]]
    else:
      target = str(rng.choice(targets))
      sig = signal.SIGTERM if rng.random() < SIGTERM_SHARE else signal.SIGKILL
    cold = COLD_COMPILE if target == "compilation" else []
    life = Life(command + cold, workdir, mode, devices)
    lives.append(life)
    kill = deliver(life, target, sig, reference, rng, checkpoint_every)
    code, orphans = life.finish(LIFE_TIMEOUT_S)
    if kill is None:  # The run finished (or failed) before the signal.
      if code != 0:  # Every later start would fail the same way: stop here.
        failed_starts.append({"life": len(lives), "exit_code": code,
                              "error": life.error})
        say(f"  life {len(lives)} failed without a signal (exit {code}): "
            f"{life.error}")
        break
      misses += 1
      if metrics_records(workdir)[-1]["step"] >= reference.final_step:
        say(f"  the run reached its end after {len(delivered)} signals; "
            "raise --steps for more")
        break
      continue
    kill.life = len(lives)
    kill.exit_code = code
    if code not in SIGNAL_EXITS[kill.signal]:  # It had failed before the signal.
      failed_starts.append({"life": len(lives), "exit_code": code,
                            "error": life.error})
    kill.orphans = len(orphans)
    kill.in_flight_bytes = life.checkpoint_in_flight()
    committed = checkpoints.committed_steps(workdir)
    kill.committed_step = committed[-1] if committed else 0
    if sig == signal.SIGTERM and kill.phase in ("steps", "checkpoint write", "finishing"):
      saved = re.search(r"preempted: saved a checkpoint at step (\d+)", life.log)
      kill.sigterm_saved = bool(saved) and code == 0 and int(saved[1]) == kill.committed_step
    delivered.append(kill)
    say(f"  {mode} kill {len(delivered):>3}: {kill.signal:<7} in {kill.phase:<16} "
        f"at {kill.seconds_after_launch:6.2f}s (exit {code}), step {kill.logged_step}, "
        f"committed {kill.committed_step}")
  last = Life(command, workdir, mode, devices)  # To the end, untouched.
  lives.append(last)
  code, orphans = last.finish(LIFE_TIMEOUT_S)
  if code != 0:
    failed_starts.append({"life": len(lives), "exit_code": code, "error": last.error})
    say(f"  the last life failed (exit {code}): {last.error}")
  # Each kill's next life that got as far as reading a checkpoint.
  for kill in delivered:
    later = [lv.start_step for lv in lives[kill.life:] if lv.start_step is not None]
    kill.resumed_from = later[0] if later else None
  return {"kills": delivered, "lives": len(lives), "misses": misses,
          "failed_starts": failed_starts,
          "last_orphans": len(orphans), "wall_seconds": time.monotonic() - started,
          "quarantined": sorted(n for n in os.listdir(checkpoints.checkpoint_dir(workdir))
                                if n.endswith(".corrupt"))}


# -------------------------------------------------------------- Comparing --


def compare_final_state(reference_dir: str, workdir: str) -> dict[str, Any]:
  """Every array of the newest checkpoints' `state` bit for bit, the other
  items' (data iterator, fine-tuning progress) JSON, and fine-tuning's dev
  predictions."""
  from maelm_jax.run import checkpoints  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  ref_step, step = checkpoints.latest_step(reference_dir), checkpoints.latest_step(workdir)
  result = {"reference_step": ref_step, "step": step, "leaves": 0, "bytes": 0,
            "differing_leaves": [], "differing_items": []}
  if ref_step != step:
    result["differing_items"].append(f"newest step {step} != {ref_step}")
    return result
  ref_path = os.path.join(checkpoints.checkpoint_dir(reference_dir), str(step))
  path = os.path.join(checkpoints.checkpoint_dir(workdir), str(step))
  expected = jax.tree_util.tree_flatten_with_path(
      checkpoints.read_arrays(os.path.join(ref_path, "state")))[0]
  got = dict(jax.tree_util.tree_flatten_with_path(
      checkpoints.read_arrays(os.path.join(path, "state")))[0])
  for key, want in expected:
    have = got.pop(key, None)
    want, have = np.asarray(want), None if have is None else np.asarray(have)
    result["leaves"] += 1
    result["bytes"] += want.nbytes
    if (have is None or have.dtype != want.dtype or have.shape != want.shape
        or have.tobytes() != want.tobytes()):
      result["differing_leaves"].append(jax.tree_util.keystr(key))
  result["differing_leaves"] += [jax.tree_util.keystr(k) for k in got]
  for item in sorted(os.listdir(ref_path)):
    if item == "state" or not os.path.isdir(os.path.join(ref_path, item)):
      continue
    for name in sorted(os.listdir(os.path.join(ref_path, item))):
      if name.startswith("_") or name == "commit_success.txt":  # Orbax's own.
        continue
      with open(os.path.join(ref_path, item, name), "rb") as f:
        want = f.read()
      other = os.path.join(path, item, name)
      if not os.path.exists(other) or open(other, "rb").read() != want:
        result["differing_items"].append(f"{item}/{name}")
  predictions = os.path.join(reference_dir, "eval_predictions.jsonl")
  if os.path.exists(predictions):
    other = os.path.join(workdir, "eval_predictions.jsonl")
    if not os.path.exists(other) or open(other).read() != open(predictions).read():
      result["differing_items"].append("eval_predictions.jsonl")
  return result


def compare_metrics(reference_dir: str, workdir: str) -> dict[str, Any]:
  """metrics.jsonl record by record, timing fields aside."""
  strip = lambda r: {k: v for k, v in r.items() if k not in TIMING_KEYS}
  want = [strip(r) for r in metrics_records(reference_dir)]
  got = [strip(r) for r in metrics_records(workdir)]
  steps = [r["step"] for r in got if any(k.startswith("train/") for k in r)]
  differing = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
  return {"records": len(got), "reference_records": len(want),
          "train_steps_once": len(steps) == len(set(steps)) and steps == sorted(steps),
          "differing_records": differing[:10] + ([] if len(want) == len(got) else
                                                 [f"{len(got)} != {len(want)} records"])}


# --------------------------------------------------------------- Reporting --


def summarize(mode: str, run: dict[str, Any], state: dict[str, Any],
              metrics: dict[str, Any]) -> dict[str, Any]:
  kills: list[Kill] = run["kills"]
  by_phase = collections.OrderedDict()
  for phase in SEEN_PHASES:
    mine = [k for k in kills if k.phase == phase]
    if mine:
      by_phase[phase] = {
          "kills": len(mine), "SIGKILL": sum(k.signal == "SIGKILL" for k in mine),
          "SIGTERM": sum(k.signal == "SIGTERM" for k in mine),
          "steps_redone": sum(k.redone_steps for k in mine),
          "steps_lost_beyond_checkpoint": sum(k.lost_steps for k in mine),
          "in_flight_bytes_thrown_away": sum(k.in_flight_bytes for k in mine)}
  sigterms = [k for k in kills if k.sigterm_saved is not None]
  failures = []
  if any(k.lost_steps for k in kills):
    failures.append("work lost beyond the last committed checkpoint")
  if any(k.resumed_from is None for k in kills):
    failures.append("a kill has no later life that resumed")
  if state["differing_leaves"] or state["differing_items"]:
    failures.append(f"final state differs: {state['differing_leaves'][:3]} "
                    f"{state['differing_items'][:3]}")
  if metrics["differing_records"] or not metrics["train_steps_once"]:
    failures.append(f"metrics.jsonl differs: {metrics['differing_records'][:3]}")
  if any(k.orphans for k in kills) or run["last_orphans"]:
    failures.append("processes left behind by a dead run")
  if any(k.exit_code is None for k in kills):
    failures.append("a run did not exit within "
                    f"{LIFE_TIMEOUT_S}s of its signal")
  if any(not k.sigterm_saved for k in sigterms):
    failures.append("a SIGTERM during training did not save at the step it stopped")
  if run["quarantined"]:
    failures.append(f"good checkpoints quarantined: {run['quarantined']}")
  for failed in run.get("failed_starts", []):
    failures.append(f"life {failed['life']} exited {failed['exit_code']} "
                    f"without a signal: {failed['error']}")
  return {
      "run": mode, "kills": len(kills), "lives": run["lives"],
      "finished_before_the_signal": run["misses"],
      "by_phase": by_phase,
      "steps_redone": sum(k.redone_steps for k in kills),
      "steps_lost_beyond_checkpoint": sum(k.lost_steps for k in kills),
      "in_flight_bytes_thrown_away": sum(k.in_flight_bytes for k in kills),
      "processes_left_behind": sum(k.orphans for k in kills) + run["last_orphans"],
      "failed_starts": run.get("failed_starts", []),
      "sigterm_saved": f"{sum(bool(k.sigterm_saved) for k in sigterms)}/{len(sigterms)}",
      "final_state": state, "metrics": metrics, "failures": failures,
      "wall_seconds": round(run["wall_seconds"], 1),
      "kill_log": [dict(dataclasses.asdict(k), lost_steps=k.lost_steps,
                        redone_steps=k.redone_steps) for k in kills]}


def table(summary: dict[str, Any]) -> str:
  rows = [f"{summary['run']}: {summary['kills']} signals over {summary['lives']} "
          f"lives ({summary['wall_seconds']:.0f} s)",
          f"  {'phase':<17}{'kills':>6}{'KILL':>6}{'TERM':>6}{'redone':>8}"
          f"{'lost':>6}{'in-flight bytes':>17}"]
  for phase, f in summary["by_phase"].items():
    rows.append(f"  {phase:<17}{f['kills']:>6}{f['SIGKILL']:>6}{f['SIGTERM']:>6}"
                f"{f['steps_redone']:>8}{f['steps_lost_beyond_checkpoint']:>6}"
                f"{f['in_flight_bytes_thrown_away']:>17,}")
  state, metrics = summary["final_state"], summary["metrics"]
  rows.append(f"  final state (step {state['step']}): {state['leaves']} arrays, "
              f"{state['bytes']:,} bytes, {len(state['differing_leaves'])} differ; "
              f"other items differing: {len(state['differing_items'])}")
  rows.append(f"  metrics.jsonl: {metrics['records']} records, "
              f"{len(metrics['differing_records'])} differ; SIGTERMs saved "
              f"{summary['sigterm_saved']}; processes left behind "
              f"{summary['processes_left_behind']}")
  rows.append("  " + ("; ".join(summary["failures"]) if summary["failures"] else
                      "nothing lost"))
  return "\n".join(rows)


# -------------------------------------------------------------------- Main --


def chaos(out: str, runs: tuple[str, ...] = ("pretrain", "glue"), kills: int = 10,
          seed: int = 0, devices: int = 2, steps: int | None = None,
          plans: dict[str, list[tuple[str, str]]] | None = None,
          say=print, tokenizer: str = "") -> list[dict[str, Any]]:
  """Runs the harness into `out` (new or empty); returns one summary per run.
  `tokenizer`: a 600-piece SentencePiece model of the `pydoc:` corpus to use
  (default: one trained into `out`)."""
  from maelm_jax.data import pipeline, sources, tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  if os.path.exists(out) and os.listdir(out):
    raise FileExistsError(f"--out={out} is not empty; give a new directory (the "
                          "harness never writes over an earlier run)")
  os.makedirs(out, exist_ok=True)
  rng = np.random.default_rng(seed)
  plans = plans or {}
  if not tokenizer:
    prefix = os.path.join(out, "tokenizer", "sp")
    os.makedirs(os.path.dirname(prefix))
    tokenizer_lib.train_tokenizer(
        pipeline.training_texts(sources.open_source("pydoc:", "train")), prefix,
        vocab_size=600)
    tokenizer = prefix + ".model"
  n_kills = {mode: len(plans[mode]) if mode in plans else kills for mode in runs}
  pretrain_steps = steps or 3 * n_kills.get("pretrain", kills) + 30
  commands = {
      "pretrain": lambda w: pretrain_command(w, tokenizer, pretrain_steps),
      "glue": lambda w: glue_command(w, os.path.join(out, "pretrain", "reference"),
                                     out, max(3, (n_kills["glue"] + 3) // 3))}
  summaries = []
  for mode in ("pretrain", "glue"):
    if mode not in runs and not (mode == "pretrain" and "glue" in runs):
      continue
    if mode == "glue":
      write_sentiment_task(out)
    ref_dir, workdir = os.path.join(out, mode, "reference"), os.path.join(out, mode, "chaos")
    say(f"{mode}: the uninterrupted run...")
    reference = run_reference(commands[mode](ref_dir) + COLD_COMPILE, ref_dir, mode,
                              devices)
    say(f"  {reference.final_step} steps in {reference.wall_seconds:.1f}s; phases "
        + ", ".join(f"{p} {s:.1f}s" for p, s in reference.phase_seconds.items())
        + f"; a step {reference.step_seconds * 1e3:.0f} ms")
    if mode not in runs:  # Only needed as the fine-tuning's encoder.
      continue
    run = chaos_run(mode, commands[mode](workdir), workdir, reference,
                    n_kills[mode], rng, devices, plans.get(mode), say)
    summary = summarize(mode, run, compare_final_state(ref_dir, workdir),
                        compare_metrics(ref_dir, workdir))
    summary["command"] = " ".join(commands[mode]("WORKDIR")[1:])
    summary["reference_seconds"] = round(reference.wall_seconds, 1)
    summaries.append(summary)
    say(table(summary))
  with open(os.path.join(out, "chaos_report.json"), "w") as f:
    json.dump({"seed": seed, "devices": devices, "runs": summaries}, f, indent=1)
  return summaries


def main() -> int:
  FLAGS = flags.FLAGS
  summaries = chaos(FLAGS.out, tuple(FLAGS.runs), FLAGS.kills, FLAGS.seed,
                    FLAGS.devices, FLAGS.steps)
  print(f"report: {os.path.join(FLAGS.out, 'chaos_report.json')}")
  return 1 if any(s["failures"] for s in summaries) else 0


def define_flags() -> None:
  flags.DEFINE_string("out", None, "A new (or empty) directory for the runs and the "
                      "report.", required=True)
  flags.DEFINE_list("runs", ["pretrain", "glue"], "Which runs to kill: pretrain, glue.")
  flags.DEFINE_integer("kills", 10, "Signals to deliver to each run.")
  flags.DEFINE_integer("seed", 0, "Draws the phases, instants and signals.")
  flags.DEFINE_integer("devices", 2, "Fake CPU devices of each run.")
  flags.DEFINE_integer("steps", None, "Pretraining steps (default 3 per kill + 30).")


if __name__ == "__main__":
  cli.run(main, define_flags)

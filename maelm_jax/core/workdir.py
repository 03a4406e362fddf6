"""A workdir belongs to one run of one mode, and to one live process at a time.

This module owns the names of the run's own files: `config.json` (the resolved
config, `write_config` / `read_config`) and `metrics.jsonl` (one JSON record per
logged step, `metrics_path` / `read_metrics`); checkpoints live in
`checkpoints/` (checkpoints.py), the tokenizer beside them (tokenizer.py).

What refuses a workdir before anything is written (`create`, `check_mode`),
and the lock (`Lock`): a second live run on the same workdir (a double submit, a
requeued job overlapping the old one) is refused, naming the holder; a lock left
by a process that no longer exists on this host (kill -9, a crash) is stale and
taken over with a log line. A run's lifecycle in both loops (claim, lock,
config.json, metrics.jsonl, stop signal) is run_session.py.

Only process 0 of a multi-process run takes the lock: the processes of one run
share the workdir by design.
"""

from __future__ import annotations

import json
import os
import socket
import time

from absl import logging

LOCK_FILE = ".lock"
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
# transformers' name for a model's config (an export's, an import's source):
# another file than a run's, that happens to share the name.
HF_CONFIG_FILE = "config.json"


def config_path(workdir: str) -> str:
  return os.path.join(workdir, CONFIG_FILE)


def metrics_path(workdir: str) -> str:
  return os.path.join(workdir, METRICS_FILE)


def read_config(workdir: str) -> dict | None:
  """The run's saved config as a dict; None if the workdir has none."""
  path = config_path(workdir)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def write_config(config, workdir: str) -> None:
  """The resolved config, whole or not at all (a kill mid-write leaves the old)."""
  tmp = config_path(workdir) + ".tmp"
  with open(tmp, "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))
  os.replace(tmp, config_path(workdir))


def read_metrics(workdir: str, where=None) -> list[dict]:
  """metrics.jsonl's records in order (those for which `where(record)` holds);
  a torn or unreadable line (a crash mid-write) is skipped; [] without the file."""
  path = metrics_path(workdir)
  if not os.path.exists(path):
    return []
  records = []
  with open(path) as f:
    for line in f:
      try:
        record = json.loads(line)
      except ValueError:
        continue
      if where is None or where(record):
        records.append(record)
  return records


def evaluations(workdir: str) -> list[dict]:
  """A pretraining run's records of its held-out evaluations, in step order."""
  return read_metrics(workdir, lambda r: "eval/mask_accuracy" in r)


class WorkdirError(ValueError):
  """The workdir cannot be used by this run; nothing in it was changed."""


def saved_mode(workdir: str) -> str | None:
  """The mode of the run that owns `workdir` ('pretrain', 'glue', 'squad'), or
  None for a new workdir. Pretraining configs written before `mode` existed
  have none: they are pretraining runs."""
  path = config_path(workdir)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as error:
    raise WorkdirError(f"{path} cannot be read ({error}); it is this workdir's "
                       "record of its run: restore it, or pass a new --workdir") from error
  return saved.get("mode", "pretrain")


def _start_time(pid: int) -> str | None:
  """The kernel's start time of `pid` (Linux), so a reused pid is not mistaken
  for the lock holder; None where /proc is absent."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int, start_time: str | None) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Exists, owned by someone else.
  return start_time is None or _start_time(pid) in (None, start_time)


def _holder(path: str) -> dict:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return {}  # Torn or empty: written by a process that died mid-write.


class Lock:
  """`<workdir>/.lock`, created with O_EXCL so two runs cannot both take it."""

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK_FILE)
    self._held = False

  def acquire(self) -> None:
    me = {"host": socket.gethostname(), "pid": os.getpid(),
          "start_time": _start_time(os.getpid()),
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        holder = _holder(self.path)
        same_host = holder.get("host") == me["host"]
        if holder and not same_host:
          raise WorkdirError(
              f"{os.path.dirname(self.path)} is in use by pid {holder.get('pid')} on "
              f"host {holder.get('host')} (since {holder.get('since')}); wait for "
              f"that run to end, or, if it is gone, delete {self.path}") from None
        if holder and _alive(int(holder.get("pid", -1)), holder.get("start_time")):
          raise WorkdirError(
              f"{os.path.dirname(self.path)} is in use by another run (pid "
              f"{holder['pid']} on this host, since {holder.get('since')}); wait "
              "for it to end or stop it, or pass another --workdir") from None
        logging.warning("taking over the stale lock %s of a run that is gone (%s)",
                        self.path, holder or "unreadable")
        try:
          os.remove(self.path)
        except FileNotFoundError:
          pass
        continue
      with os.fdopen(fd, "w") as f:
        json.dump(me, f)
      self._held = True
      return
    raise WorkdirError(f"could not take {self.path}: another run keeps taking it; "
                       "pass another --workdir")

  def release(self) -> None:
    if self._held:
      self._held = False
      try:
        if _holder(self.path).get("pid") == os.getpid():
          os.remove(self.path)
      except FileNotFoundError:
        pass

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()


def create(workdir: str) -> None:
  """Creates `workdir` (local paths only) or checks that it is writable."""
  if "://" in workdir:
    raise ValueError(f"--workdir={workdir}: URLs are not supported (metrics, logs and "
                     "the tokenizer are written with local file I/O); mount the bucket "
                     "(e.g. gcsfuse) and pass the mounted path")
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as error:
    raise PermissionError(f"cannot create workdir {workdir} ({error}); pass a "
                          "writable --workdir") from error
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise PermissionError(f"workdir {workdir} is not writable; pass a writable "
                          "--workdir")


def check_mode(workdir: str, mode: str, init_from: str = "") -> None:
  """Refuses a workdir that belongs to a run of another mode, before any write."""
  if init_from and os.path.abspath(init_from) == os.path.abspath(workdir):
    raise WorkdirError(
        f"--workdir={workdir} is also --config.init_from: fine-tuning there would "
        "overwrite the pretraining run's config.json; pass a new --workdir (e.g. "
        f"{os.path.join(workdir, 'finetune_' + mode)} is fine too, a subdirectory)")
  owner = saved_mode(workdir)
  if owner is not None and owner != mode:
    what = {"pretrain": "a pretraining run", "glue": "a GLUE fine-tuning run",
            "squad": "a SQuAD fine-tuning run"}
    raise WorkdirError(
        f"workdir {workdir} holds {what.get(owner, owner)} (its config.json has "
        f"mode={owner!r}); this is {what.get(mode, mode)}: pass a new --workdir"
        + (" (keep --config.init_from pointing at the pretraining workdir)"
           if owner == "pretrain" else ""))

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

A workdir in a bucket (`gs://`, storage.py) is locked by a lease instead
(`Lease`): GCS has no flock, and a pod recreated after a preemption has new
hostnames, so "the holder's pid is gone on this host" cannot tell a stale lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time

from absl import logging

from maelm_jax.core import config_defaults, storage

LOCK_FILE = ".lock"
# A bucket workdir's lease: renewed every third of it; a run whose holder went
# silent waits at most this long to take it over.
LEASE_SECONDS = 60.0
CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
# transformers' name for a model's config (an export's, an import's source):
# another file than a run's, that happens to share the name.
HF_CONFIG_FILE = "config.json"


def config_path(workdir: str) -> str:
  """The run's config.json (of a bucket workdir: in its mirror, storage.py)."""
  return os.path.join(storage.local(workdir), CONFIG_FILE)


def metrics_path(workdir: str) -> str:
  return os.path.join(storage.local(workdir), METRICS_FILE)


def read_config(workdir: str) -> dict | None:
  """The run's saved config as a dict, with the keys added since it was written
  (`config_defaults.complete`); None if the workdir has none. Every reader of a
  saved config reads it here."""
  path = config_path(workdir)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return config_defaults.complete(json.load(f))


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


def check_results_out(out: str, results_file: str, overwrite: bool) -> None:
  """An evaluation's `--out` holding an earlier `results_file` (hours of scoring,
  perhaps) is refused before any work unless `overwrite`: a quick rerun with other
  flags would replace it silently."""
  path = os.path.join(out, results_file)
  if overwrite or not os.path.exists(path):
    return
  try:
    with open(path) as f:
      command = json.load(f).get("command") or "another command"
  except (OSError, ValueError):
    command = "another command"
  raise FileExistsError(
      f"--out={out} already holds {results_file} (made by: {command}); name another "
      "--out, or pass --overwrite to replace it (nothing was touched)")


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
  """`<workdir>/.lock`, created with O_EXCL so two runs cannot both take it; a
  bucket workdir's (a URL or its mirror) is a `Lease`."""

  def __new__(cls, workdir: str):
    remote = storage.remote_of(workdir)
    if remote is not None and cls is Lock:
      return Lease(remote)
    return super().__new__(cls)

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


def _lease_seconds() -> float:
  """MAELM_LEASE_SECONDS (LEASE_SECONDS unless set): how long a bucket workdir's
  lease lasts unrenewed. Zero or less would renew without pause and expire at once."""
  value = os.environ.get("MAELM_LEASE_SECONDS", "").strip()
  try:
    seconds = float(value) if value else float(LEASE_SECONDS)
  except ValueError:
    seconds = 0.0
  if not seconds > 0 or seconds == float("inf"):
    raise ValueError(f"MAELM_LEASE_SECONDS={value!r} is not a number of seconds above 0 "
                     f"(how long a bucket workdir's lease lasts unrenewed; "
                     f"{LEASE_SECONDS} if unset)")
  return seconds


class Lease:
  """`<gs workdir>/.lock`: an object created only where none exists (a
  generation precondition, GCS's atomic create), renewed every quarter of
  LEASE_SECONDS while the run lives, and deleted when it ends.

  A run that finds a lease watches it: renewed, its holder lives (on any host)
  and the run is refused, naming it; expired, it is taken over, again under a
  precondition, so two runs racing for it cannot both win. A holder on this
  host whose process is gone (kill -9) is known dead at once. So the same
  command run again after a crash starts at once on the same host, and within
  LEASE_SECONDS on a pod recreated after a preemption."""

  def __init__(self, url: str):
    self.url = storage.absolute(url)
    self.path = f"{self.url}/{LOCK_FILE}"
    self.seconds = _lease_seconds()
    self._generation = None
    self._stop = threading.Event()
    self._renewer = None
    self.lost = False

  def _retry(self):
    """The client's retries, bounded by a renewal period: a lease that cannot
    be renewed in that long is better reported than waited on."""
    from google.cloud.storage import retry  # pylint: disable=import-outside-toplevel
    return retry.DEFAULT_RETRY.with_timeout(max(self.seconds / 4, 5.0))

  def _blob(self):
    from google.cloud import storage as gcs  # pylint: disable=import-outside-toplevel
    storage.configure()
    bucket, name = storage.bucket_and_name(self.path)
    return gcs.Client().bucket(bucket).blob(name)

  def _record(self) -> str:
    now = time.time()
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                       "start_time": _start_time(os.getpid()), "since": self._since, "renewed": now,
                       "expires": now + self.seconds})

  def acquire(self) -> None:
    from google.api_core import exceptions  # pylint: disable=import-outside-toplevel
    self._since = time.strftime("%Y-%m-%d %H:%M:%S")
    blob = self._blob()
    for _ in range(3):
      try:
        blob.upload_from_string(self._record(), if_generation_match=0)
      except exceptions.PreconditionFailed:
        holder = blob.bucket.get_blob(blob.name)
        if holder is None:
          continue  # Released in between: try again.
        try:
          record = json.loads(holder.download_as_text())
        except ValueError:
          record = {}
        if not self._gone(holder, record):
          raise WorkdirError(
              f"{self.url} is in use by pid {record.get('pid')} on host "
              f"{record.get('host')} (since {record.get('since')}; it renews its "
              f"lease every {self.seconds / 4:.0f} s); wait for that run to end, or "
              "pass another --workdir") from None
        logging.warning("taking over the lease %s of a run that is gone (%s)",
                        self.path, record or "unreadable")
        try:
          blob.upload_from_string(self._record(),
                                  if_generation_match=holder.generation)
        except exceptions.PreconditionFailed:
          continue  # Another run took it first: look again.
      self._generation = blob.generation
      self._renewer = threading.Thread(target=self._renew, daemon=True,
                                       name="maelm-lease")
      self._renewer.start()
      return
    raise WorkdirError(f"could not take {self.path}: another run keeps taking it; "
                       "pass another --workdir")

  def _gone(self, holder, record: dict) -> bool:
    """Whether the holder of the lease object `holder` is gone: its process on
    this host is, or it lets the lease expire rather than renew it."""
    if record.get("host") == socket.gethostname() and record.get("pid"):
      if not _alive(int(record["pid"]), record.get("start_time")):
        return True
    expires = float(record.get("expires", 0))
    if expires > time.time():
      logging.info("%s is held by pid %s on host %s: watching its lease (taken over "
                   "if it expires, refused if it is renewed)", self.url,
                   record.get("pid"), record.get("host"))
    while time.time() < expires:
      time.sleep(min(max(self.seconds / 40, 0.1), expires - time.time() + 0.05))
      now = holder.bucket.get_blob(holder.name)
      if now is None or now.generation != holder.generation:
        return now is None  # Released: gone; renewed: alive.
    return True

  def _renew(self) -> None:
    from google.api_core import exceptions  # pylint: disable=import-outside-toplevel
    blob = self._blob()
    while not self._stop.wait(self.seconds / 4):
      try:
        blob.upload_from_string(self._record(), if_generation_match=self._generation,
                                retry=self._retry())
        self._generation = blob.generation
      except exceptions.PreconditionFailed:
        self.lost = True
        logging.error("the lease %s was taken by another run; this run's "
                      "checkpoints may now be overwritten by it", self.path)
        return
      except Exception as error:  # pylint: disable=broad-except
        logging.warning("renewing the lease %s failed (%s); trying again in %.0f s",
                        self.path, str(error).splitlines()[0][:120], self.seconds / 4)

  def release(self) -> None:
    from google.api_core import exceptions  # pylint: disable=import-outside-toplevel
    self._stop.set()
    if self._renewer is not None:
      self._renewer.join()
      self._renewer = None
    if self._generation is not None and not self.lost:
      try:
        self._blob().delete(if_generation_match=self._generation, retry=self._retry())
      except (exceptions.NotFound, exceptions.PreconditionFailed):
        pass
      except Exception as error:  # pylint: disable=broad-except
        logging.warning("could not delete the lease %s (%s); it expires by itself "
                        "in %.0f s", self.path, error, self.seconds)
    self._generation = None

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()


@contextlib.contextmanager
def removed_if_start_fails(workdir: str):
  """A start that fails (bad data, a wrong init_from, a refused config, Ctrl-C)
  leaves no directory it made: on the way out of an error, the folders of
  `workdir`'s path that did not exist before are removed if they are empty. A
  folder with anything in it, and every folder that existed, stay as they were."""
  made = []
  if not storage.is_remote(workdir):
    path = os.path.abspath(workdir)
    while path and not os.path.exists(path):
      made.append(path)
      path = os.path.dirname(path)
  try:
    yield
  except BaseException:
    for path in made:  # Deepest first.
      try:
        os.rmdir(path)
      except OSError:
        break
    raise


def create(workdir: str) -> None:
  """Creates `workdir` or checks that it is writable (a bucket workdir: that
  its mirror exists, storage.local)."""
  if storage.is_remote(workdir):
    storage.check(workdir)
    return
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
  if init_from and storage.absolute(init_from) == storage.absolute(
      storage.display(workdir)):
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

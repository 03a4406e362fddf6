"""Workdirs in a bucket: `gs://` paths wherever a command takes a workdir.

Checkpoints go straight to the bucket: orbax and TensorStore write `gs://`
natively. The run's other files (config.json, metrics.jsonl, the tokenizer,
TensorBoard events, plots, results) live in a *mirror*: a local directory this
process owns, filled from the bucket when the workdir is first used
(`local(path)`) and uploaded by the run that holds the workdir (`push`: when the
run starts, before each checkpoint save, at most every 30 s while it logs, and
when it ends; while the bucket does not answer, skipped with a warning). The project's
file code, SentencePiece (local files only) and the TensorBoard writer thus run
unchanged, and the bucket gets whole objects: GCS has no append and no rename,
and a reader of an object never sees it half written. A run killed between two
pushes loses only records after its last checkpoint, which a resume redoes
anyway (run_session.py truncates them). Files that never reached the bucket
stay in the mirror (`Mirror.remove`), and the log says where.

`checkpoint_dir` of a mirror is its bucket's (`remote_of`); the lock of a
bucket workdir is a lease object (workdir.Lock), since GCS has no flock.

One variable points every layer at a local emulator, as the Google clients do:
`STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` reaches gcsfs (the file layer of
orbax, through etils.epath, and of this module), the google-cloud-storage client
(the lock) and TensorStore, whose own `TENSORSTORE_GCS_HTTP_URL` is set from it
where unset (`configure`).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import logging as std_logging
import os
import posixpath
import shutil
import sys
import tempfile
import threading
import time

from absl import logging

SCHEME = "gs://"
# Read by the run from the bucket but not kept in a mirror: checkpoints are
# orbax's (read in place), TensorBoard events only ever grow new files.
NOT_MIRRORED = ("checkpoints", "tensorboard")
PUSH_EVERY_SECONDS = 30.0
INSTALL = ("pip install 'gcsfs>=2024.2.0' 'google-cloud-storage>=2.14' (from a "
           "checkout: pip install -e '.[gcs]')")


def is_remote(path) -> bool:
  return "://" in os.fspath(path)


def join(base: str, *parts: str) -> str:
  return posixpath.join(base, *parts) if is_remote(base) else os.path.join(base, *parts)


def parent(path: str) -> str:
  return posixpath.dirname(path.rstrip("/")) if is_remote(path) else os.path.dirname(path)


def absolute(path: str) -> str:
  """A URL as given (without a trailing slash), a local path made absolute."""
  return path.rstrip("/") if is_remote(path) else os.path.abspath(path)


def check(path: str) -> None:
  """Refuses a URL this module cannot serve, in one line, before any work."""
  if not is_remote(path):
    return
  if not path.startswith(SCHEME) or len(path) <= len(SCHEME) or path[len(SCHEME)] == "/":
    raise ValueError(f"{path}: the workdir URLs served are gs://BUCKET/PATH; for "
                     "another store, mount it and pass the mounted path")
  if not all(importlib.util.find_spec(m) for m in ("gcsfs", "google.cloud.storage")):
    raise ValueError(f"{path}: gs:// workdirs need gcsfs and google-cloud-storage: "
                     f"{INSTALL}")
  configure()
  problem = bucket_problem(path)
  if problem:
    raise ValueError(problem)


def bucket_problem(url: str, timeout: float = 10.0) -> str | None:
  """Why the bucket of `url` cannot serve a run, in one line, from one request
  without retries (gcsfs retries for most of a minute, then raises a traceback);
  None when it answers. The request carries no credentials, so a bucket that
  refuses it (401/403) has answered: a run with credentials finds out next."""
  import urllib.error  # pylint: disable=import-outside-toplevel
  import urllib.request  # pylint: disable=import-outside-toplevel
  bucket, _ = bucket_and_name(url)
  try:
    urllib.request.urlopen(f"{endpoint()}/storage/v1/b/{bucket}?fields=name",
                           timeout=timeout).close()
  except urllib.error.HTTPError as error:
    if error.code == 404:
      return (f"{bucket_url(url)}: no such bucket; create it (gcloud storage "
              "buckets create gs://BUCKET) or fix the name")
    return None
  except (OSError, ValueError) as error:
    reason = getattr(error, "reason", error)
    return (f"{bucket_url(url)}: the store at {endpoint()} cannot be reached "
            f"({type(reason).__name__}: {str(reason)[:120]}); check the network and "
            "DNS, or STORAGE_EMULATOR_HOST if you use an emulator")
  return None


def check_local(path: str, flag: str) -> None:
  """Refuses a URL for a directory that is written with local file I/O (a
  sweep's or a comparison's own), in one line, before anything runs."""
  if is_remote(path):
    raise ValueError(f"{flag}={path}: this directory is written with local file I/O; "
                     "pass a local or mounted one (the pretraining workdirs its runs "
                     "read, --config.init_from, may be gs://)")


def _emulator_url() -> str:
  """STORAGE_EMULATOR_HOST as a URL, or "" where it names no emulator: unset,
  empty, or "default", which gcsfs reads as Google's own service."""
  host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
  if host in ("", "default"):
    return ""
  return host if host.startswith("http") else "http://" + host


def configure() -> None:
  """Points TensorStore at the emulator the Google clients are pointed at,
  bounds its retries (`gcs_retries`), and
  keeps gcsfs's probe of the bucket type (a warning per call without
  credentials, as under an emulator) and its read-ahead notes out of the log."""
  emulator = _emulator_url()
  if emulator:
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", emulator)
    # No credentials to find: google.auth would probe a GCE metadata server for
    # seconds on every client gcsfs makes. Both read the word in lower case.
    os.environ.setdefault("NO_GCE_CHECK", "true")
    # And none to send: an emulator wants none, and gcsfs would otherwise load
    # the machine's own account (application default credentials) and refresh
    # its token with Google before each first request to the emulator.
    try:
      import fsspec.config  # pylint: disable=import-outside-toplevel
    except ImportError:  # No gs:// support installed: nothing to configure.
      pass
    else:
      fsspec.config.conf.setdefault("gs", {}).setdefault("token", "anon")
    _plain_gcsfs_for_an_emulator()
  std_logging.getLogger("gcsfs").setLevel(std_logging.CRITICAL)  # Ours say it.
  std_logging.getLogger("fsspec").setLevel(std_logging.WARNING)
  std_logging.getLogger("google.auth").setLevel(std_logging.ERROR)
  _bound_tensorstore_retries()
  _bound_gcsfs_retries()


# TensorStore retries a failed GCS request up to 32 times, for up to ~15 minutes
# (its default); a run then stops in one line (checkpoints.py) and the same
# command resumes. 8 retries from 1 s, doubling to 32 s: about 2 minutes.
# MAELM_GCS_RETRIES bounds gcsfs's tries of a request too (its own 6, about
# 33 s a request, and a save makes several in a row).
def gcs_retries() -> dict:
  """TensorStore's `gcs_request_retries`: MAELM_GCS_RETRIES retries (8 unless
  set), read when asked, so a variable set after the import (a notebook) counts."""
  value = os.environ.get("MAELM_GCS_RETRIES", "").strip()
  try:
    tries = int(value) if value else 8
  except ValueError:
    tries = -1
  if tries < 0:
    raise ValueError(f"MAELM_GCS_RETRIES={value!r} is not a whole number of 0 or "
                     "more: how many times a failed GCS request is retried (8 if unset)")
  return {"max_retries": tries, "initial_delay": "1s", "max_delay": "32s"}


def _bound_tensorstore_retries() -> None:
  """Sets `gcs_request_retries` in the TensorStore contexts orbax builds for
  every checkpoint (orbax has no option for it: its context templates are the
  one place)."""
  try:
    from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=import-outside-toplevel
  except ImportError:
    return
  for template in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
    context = getattr(tensorstore_utils, template, None)
    if isinstance(context, dict):
      context["gcs_request_retries"] = gcs_retries()


def _plain_gcsfs_for_an_emulator() -> None:
  """gcsfs (2026.x) asks GCS's gRPC control plane each bucket's layout; an
  emulator has none, the lookup fails after about 30 s of retries and, not
  cached on failure, is paid again by the next operation. Against an emulator
  the plain HTTP filesystem is used (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false,
  or fsspec's `gs` pointed at it where gcsfs is already imported)."""
  os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
  if (os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"].lower() not in ("true", "1")
      and "gcsfs" in sys.modules):
    import fsspec  # pylint: disable=import-outside-toplevel
    import gcsfs.core  # pylint: disable=import-outside-toplevel
    for protocol in ("gs", "gcs"):
      if fsspec.get_filesystem_class(protocol) is not gcsfs.core.GCSFileSystem:
        fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)


def _bound_gcsfs_retries() -> None:
  """gcsfs fixes its retry count (6) when its class is defined; where
  MAELM_GCS_RETRIES is set, its retried requests are wrapped again with that
  many tries (at least one), the undecorated functions being kept as
  `__wrapped__`."""
  if "MAELM_GCS_RETRIES" not in os.environ:
    return
  try:
    import gcsfs  # pylint: disable=import-outside-toplevel
    import gcsfs.core  # pylint: disable=import-outside-toplevel
    from gcsfs import retry  # pylint: disable=import-outside-toplevel
  except ImportError:
    return
  tries = max(1, gcs_retries()["max_retries"])
  for cls in {gcsfs.core.GCSFileSystem, gcsfs.GCSFileSystem}:  # (plain, extended)
    for name in ("_request", "_get_file_request", "_get_file_concurrent"):
      method = cls.__dict__.get(name)
      original = getattr(method, "__wrapped__", None)
      if original is None or getattr(method, "_maelm_tries", None) == tries:
        continue
      bounded = retry.retry_request(retries=tries)(original)
      bounded._maelm_tries = tries  # pylint: disable=protected-access
      setattr(cls, name, bounded)


def endpoint() -> str:
  """The GCS JSON API's address: the emulator's where one is set."""
  return _emulator_url().rstrip("/") or "https://storage.googleapis.com"


def reachable(url: str, timeout: float = 5.0) -> bool:
  """Whether the store of `url` answers at all (any HTTP status counts: a
  refused credential is an answer). One request, no retries: a run checks it
  before an upload rather than wait out gcsfs's half minute of retries."""
  import urllib.error  # pylint: disable=import-outside-toplevel
  import urllib.request  # pylint: disable=import-outside-toplevel
  bucket, _ = bucket_and_name(url)
  try:
    urllib.request.urlopen(f"{endpoint()}/storage/v1/b/{bucket}?fields=name",
                           timeout=timeout).close()
  except urllib.error.HTTPError:
    return True
  except (OSError, ValueError):
    return False
  return True


def filesystem():
  """gcsfs, the same file layer etils.epath (orbax's) uses for gs://."""
  import fsspec  # pylint: disable=import-outside-toplevel
  configure()
  return fsspec.filesystem("gs")


def _key(url: str) -> str:
  return url[len(SCHEME):].rstrip("/")


# ------------------------------------------------ Files, local or remote --
def exists(path: str) -> bool:
  """Whether `path` exists now (gcsfs's listing cache is dropped first: another
  process, or orbax's thread, may have written it since)."""
  if not is_remote(path):
    return os.path.exists(path)
  fs = filesystem()
  fs.invalidate_cache(_key(path))
  return fs.exists(_key(path))


def isdir(path: str) -> bool:
  return filesystem().isdir(_key(path)) if is_remote(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
  """The names directly under `path`; [] when there is nothing."""
  if not is_remote(path):
    return os.listdir(path) if os.path.isdir(path) else []
  fs = filesystem()
  try:
    entries = fs.ls(_key(path), detail=False, refresh=True)
  except FileNotFoundError:
    return []
  return [posixpath.basename(e.rstrip("/")) for e in entries]


def read_text(path: str) -> str:
  if is_remote(path):
    return filesystem().cat_file(_key(path)).decode("utf-8")
  with open(path, encoding="utf-8") as f:
    return f.read()


def remove_tree(path: str) -> None:
  """A directory and what it holds, gone (nothing there: nothing to do)."""
  if is_remote(path):
    fs = filesystem()
    if fs.exists(_key(path)):
      fs.rm(_key(path), recursive=True)
  else:
    shutil.rmtree(path, ignore_errors=True)


def remove_file(path: str) -> None:
  """One file gone (nothing there: nothing to do)."""
  if is_remote(path):
    fs = filesystem()
    if fs.exists(_key(path)):
      fs.rm(_key(path))
  elif os.path.exists(path):
    os.remove(path)


def rename_dir(source: str, target: str) -> None:
  """A directory moved; on GCS, where there is no rename, copied then deleted."""
  if is_remote(source):
    fs = filesystem()
    fs.copy(_key(source), _key(target), recursive=True)
    fs.rm(_key(source), recursive=True)
  else:
    os.rename(source, target)


# --------------------------------------------------------------- Mirrors --
class Mirror:
  """A local copy of a bucket workdir's files other than NOT_MIRRORED."""

  def __init__(self, url: str):
    self.url = absolute(url)
    root = os.environ.get("MAELM_MIRROR_DIR") or None
    if root:
      os.makedirs(root, exist_ok=True)
    self.local = tempfile.mkdtemp(prefix="maelm_mirror_", dir=root)
    self._pushed: dict[str, tuple[int, int]] = {}
    self._last_push = 0.0
    self._lock = threading.Lock()
    self.pull()

  def _remote(self, relative: str) -> str:
    return f"{_key(self.url)}/{relative}"

  def pull(self) -> None:
    """Downloads the workdir's files (an empty or new workdir: nothing)."""
    fs = filesystem()
    prefix = _key(self.url) + "/"
    found = {}
    try:  # The top level, then into what is mirrored: never the checkpoints.
      for info in fs.ls(_key(self.url), detail=True, refresh=True):
        name = info["name"].rstrip("/")
        if posixpath.basename(name) in NOT_MIRRORED + (".lock",):
          continue
        found.update(fs.find(name, detail=True) if info.get("type") == "directory"
                     else {name: info})
    except FileNotFoundError:
      pass  # A new workdir.
    for key, info in found.items():
      relative = key[len(prefix):] if key.startswith(prefix) else ""
      if not relative or info.get("type") == "directory":
        continue
      target = os.path.join(self.local, relative)
      os.makedirs(os.path.dirname(target), exist_ok=True)
      fs.get_file(key, target)
      self._pushed[relative] = _signature(target)

  def fetch(self, relative: str) -> bool:
    """Downloads one file if the bucket has it now (a file another process of
    the run writes: the tokenizer process 0 trains); whether it is here."""
    target = os.path.join(self.local, relative)
    fs = filesystem()
    if not exists(SCHEME + self._remote(relative)):
      return False
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fs.get_file(self._remote(relative), target + ".part")
    os.replace(target + ".part", target)
    self._pushed[relative] = _signature(target)
    return True

  def push(self, *, force: bool = True) -> int:
    """Uploads the files written or changed since the last push (all of them
    at once when `force`, else at most once per PUSH_EVERY_SECONDS); returns
    how many."""
    if not force and time.monotonic() - self._last_push < PUSH_EVERY_SECONDS:
      return 0
    if not reachable(self.url):
      self._last_push = time.monotonic()
      raise ConnectionError(f"{bucket_url(self.url)} does not answer")
    with self._lock:
      fs, uploaded = filesystem(), 0
      for root, _, names in os.walk(self.local):
        for name in names:
          path = os.path.join(root, name)
          relative = os.path.relpath(path, self.local).replace(os.sep, "/")
          if name.endswith((".tmp", ".part")) or ".tmp." in name:
            continue  # Mid-write; its final name follows.
          signature = _signature(path)
          if signature is None or self._pushed.get(relative) == signature:
            continue
          fs.put_file(path, self._remote(relative))
          self._pushed[relative] = signature
          uploaded += 1
      self._last_push = time.monotonic()
      return uploaded

  def unpushed(self) -> list[str]:
    """The files written here that the bucket does not have yet."""
    found = []
    for root, _, names in os.walk(self.local):
      for name in names:
        path = os.path.join(root, name)
        relative = os.path.relpath(path, self.local).replace(os.sep, "/")
        if self._pushed.get(relative) != _signature(path):
          found.append(relative)
    return found

  def remove(self) -> None:
    """Deletes the mirror, unless it holds files the bucket lacks (a push that
    failed at the end): those stay, and the log says where."""
    missing = self.unpushed()
    if missing:
      logging.warning("%d file(s) of the run did not reach %s (%s); they are kept in "
                      "%s (gcloud storage cp -r %s/* %s/ uploads them)", len(missing),
                      self.url, ", ".join(missing[:4]), self.local, self.local, self.url)
      return
    shutil.rmtree(self.local, ignore_errors=True)


def _signature(path: str) -> tuple[int, int] | None:
  try:
    stat = os.stat(path)
  except FileNotFoundError:
    return None
  return stat.st_size, stat.st_mtime_ns


_MIRRORS: dict[str, Mirror] = {}  # By URL; one per workdir and process.
_BY_LOCAL: dict[str, Mirror] = {}


def local(path: str) -> str:
  """Where this process reads and writes the workdir's files: `path` itself
  when local; for a bucket workdir, its mirror (filled on first use)."""
  if not is_remote(path):
    return path
  check(path)
  url = absolute(path)
  if url not in _MIRRORS:
    mirror = Mirror(url)
    _MIRRORS[url] = _BY_LOCAL[mirror.local] = mirror
  return _MIRRORS[url].local


def mirror_of(path: str) -> Mirror | None:
  """The mirror behind a local path or a URL (None for a local workdir)."""
  if is_remote(path):
    return _MIRRORS.get(absolute(path))
  return _BY_LOCAL.get(os.path.abspath(path))


def remote_of(path: str) -> str | None:
  """The bucket URL of a workdir given as a URL or as its mirror; None for a
  local workdir."""
  if is_remote(path):
    return absolute(path)
  mirror = _BY_LOCAL.get(os.path.abspath(path))
  return mirror.url if mirror else None


@contextlib.contextmanager
def mirrored(path: str):
  """`path` for a local workdir; for a bucket workdir, its mirror for the
  block, dropped after it (the run's hold pushes its files: run_session.py)."""
  if not is_remote(path):
    yield path
    return
  mirror_path = local(path)
  try:
    yield mirror_path
  finally:
    forget(mirror_path)


def display(path: str) -> str:
  """The name to show a user: the bucket URL rather than the mirror."""
  return remote_of(path) or path


def push(path: str, *, force: bool = True) -> int:
  """Uploads a mirrored workdir's new files (nothing for a local workdir).
  A failure is logged, never raised: the checkpoints are orbax's, a run must
  not die of its metrics, and what failed goes up at the next push."""
  mirror = mirror_of(path)
  if mirror is None:
    return 0
  try:
    return mirror.push(force=force)
  except Exception as error:  # pylint: disable=broad-except
    logging.warning("could not upload the run's files to %s (%s); they stay in %s "
                    "until an upload succeeds", mirror.url,
                    str(error).splitlines()[0][:200], mirror.local)
    return 0


def fetch(path: str) -> bool:
  """For a file of a mirrored workdir: downloads it if the bucket has it now.
  Whether `path` exists here afterwards (a local workdir's: whether it does)."""
  if os.path.exists(path):
    return True
  directory = os.path.dirname(os.path.abspath(path))
  for mirror in list(_MIRRORS.values()):
    if directory == mirror.local or directory.startswith(mirror.local + os.sep):
      return mirror.fetch(os.path.relpath(os.path.abspath(path), mirror.local))
  return False


def forget(path: str) -> None:
  """Drops a workdir's mirror (after its run: a later use downloads anew)."""
  mirror = mirror_of(path)
  if mirror is not None:
    _MIRRORS.pop(mirror.url, None)
    _BY_LOCAL.pop(mirror.local, None)
    mirror.remove()


@atexit.register
def _remove_mirrors() -> None:
  for mirror in list(_MIRRORS.values()):
    mirror.remove()


def bucket_url(url: str) -> str:
  return SCHEME + bucket_and_name(url)[0]


def bucket_and_name(url: str) -> tuple[str, str]:
  bucket, _, name = _key(url).partition("/")
  return bucket, name

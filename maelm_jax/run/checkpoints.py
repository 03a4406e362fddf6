"""Orbax checkpoints of this run: the manager, checksums, restore and quarantine
(another run's parameters: `pretrained.py`).

A checkpoint step directory holds two items: `state` (the `TrainState`: params,
optimizer state, step, rng) and `data` (the grain iterator state), and, once
committed, `maelm_checksums.json` (every file's size and SHA-256): a restore
verifies them, so a checkpoint corrupted silently (flipped bits that still
read) is quarantined like one that fails to read.

A bucket workdir's checkpoints (`gs://`, core/storage.py) are written in place
by orbax and TensorStore, and the functions here read them there. They carry no
checksum file: an object is stored whole or not at all, and GCS checks each
one's CRC32C itself; reading a checkpoint back after each save to hash it would
cost what the save did.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging as py_logging
import os
import shutil
import time
from typing import Any

from absl import logging
import grain
import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from maelm_jax.core import errors, storage

CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(workdir: str) -> str:
  """`<workdir>/checkpoints`; in the bucket for a bucket workdir or its mirror."""
  return storage.join(storage.remote_of(workdir) or os.path.abspath(workdir),
                      CHECKPOINT_DIR)


COMMIT_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")


class CheckpointMismatch(ValueError):
  """A checkpoint that reads but does not fit this run (tree, shapes, data
  iterator). The run stops before anything is written; nothing is moved."""


def is_committed(step_dir: str) -> bool:
  """Orbax finishes a save by writing these (after the atomic rename on local
  disks; on object stores, where there is no rename and the step is written
  under its final name, `_CHECKPOINT_METADATA` early and `commit_success.txt`
  last: only the last says it is done)."""
  if storage.is_remote(step_dir):
    return storage.exists(storage.join(step_dir, COMMIT_MARKERS[1]))
  return any(os.path.exists(os.path.join(step_dir, m)) for m in COMMIT_MARKERS)


def step_dirs(workdir: str) -> dict[int, str]:
  directory = checkpoint_dir(workdir)
  return {int(name): storage.join(directory, name)
          for name in storage.listdir(directory) if name.isdigit()}


def latest_step(workdir: str) -> int | None:
  """The newest *committed* step (an unfinished save is never picked)."""
  steps = [step for step, path in step_dirs(workdir).items() if is_committed(path)]
  return max(steps) if steps else None


PRUNING_SUFFIX = ".pruning"
# Fault injection (tools/chaos.py): seconds a prune takes to delete a step's
# files, spread between them, as on a slow disk, so that kills land inside it.
PRUNE_SECONDS_ENV = "MAELM_FAULT_PRUNE_SECONDS"


def remove_step(step_dir: str) -> None:
  """Deletes a step directory so that a kill at any instant leaves either the
  whole step or nothing a start takes for a step.

  On a local disk the step is first renamed to `<step>.pruning` (atomic), then
  deleted; a `.pruning` left by a kill is finished by the next start. A bucket
  has no rename: the commit marker goes first, so a step half deleted reads as
  unfinished (never restored), then the rest; the next start removes it."""
  if storage.is_remote(step_dir):
    storage.remove_file(storage.join(step_dir, COMMIT_MARKERS[1]))
    storage.remove_tree(step_dir)
    return
  doomed = step_dir + PRUNING_SUFFIX
  if os.path.exists(doomed):  # An earlier prune of this number, cut short.
    shutil.rmtree(doomed, ignore_errors=True)
  os.rename(step_dir, doomed)
  seconds = float(os.environ.get(PRUNE_SECONDS_ENV) or 0)
  if seconds > 0:
    files = [os.path.join(root, name) for root, _, names in os.walk(doomed)
             for name in names]
    for path in files:
      time.sleep(seconds / len(files))
      os.remove(path)
  shutil.rmtree(doomed, ignore_errors=True)


class StepPruner:
  """Deletes the steps orbax's manager retires (`keep_checkpoints`), by
  `remove_step`, in place of orbax's deleter. Orbax's deletes a local step's
  files in parallel, `_CHECKPOINT_METADATA` among the first: a kill in that
  window left a numbered folder holding only `state/`, which blocked every
  later start. Process 0 deletes, as with orbax's."""

  def __init__(self, directory: str):
    self.directory = directory

  def delete(self, step: int) -> None:
    if jax.process_index() == 0:
      remove_step(storage.join(self.directory, str(step)))

  def delete_steps(self, steps) -> None:
    for step in steps:
      self.delete(step)

  def close(self) -> None:
    pass


def tidy_unfinished_steps(workdir: str, *, refuse_newer: bool = True) -> None:
  """What a kill during a prune or a save left in the checkpoint folder, seen
  before the run starts.

  - `<step>.pruning` (a prune cut short): deleted.
  - A numbered folder without its commit marker, older than the newest complete
    checkpoint: a prune cut short by an earlier version, or a torn copy; no
    restore would pick it. Deleted, and said in one line.
  - One newer than every complete checkpoint (a copy by hand, a save torn on a
    filesystem without atomic rename) is neither restored nor moved: the run
    stops and names it (`refuse_newer`), because the next save of that step
    would collide. In a bucket, where orbax writes a step under its final name
    and marks it done last, an unfinished newest step is orbax's own to clean.
  """
  directory = checkpoint_dir(workdir)
  remote = storage.is_remote(directory)
  names = storage.listdir(directory)
  if jax.process_index() == 0 and not remote:
    for name in names:
      if name.endswith(PRUNING_SUFFIX) and name.split(".")[0].isdigit():
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
  steps = step_dirs(workdir)
  committed = [step for step, path in steps.items() if is_committed(path)]
  newest = max(committed, default=None)
  unfinished = sorted(step for step in steps if step not in committed)
  for step in unfinished:
    if newest is not None and step < newest:
      if jax.process_index() == 0:
        logging.warning(
            "%s: an unfinished step older than the newest complete checkpoint "
            "(%d), left by a kill while it was being deleted; removed",
            storage.display(steps[step]), newest)
        remove_step(steps[step])
  newer = [steps[step] for step in unfinished if newest is None or step > newest]
  if newer and refuse_newer and not remote:
    raise CheckpointMismatch(
        f"{', '.join(newer)}: not a finished maelm_jax checkpoint (no "
        f"{COMMIT_MARKERS[0]}); move it out of {directory} and rerun")


def _tree_metadata(path: str):
  """{params: ..., opt_state: ...} of ArrayMetadata-like leaves (shape, dtype)."""
  metadata = ocp.PyTreeCheckpointer().metadata(path)
  return (metadata.item_metadata.tree if hasattr(metadata, "item_metadata")
          else metadata.tree)


def _flat_shapes(tree) -> dict[str, tuple]:
  flat, _ = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict))
  out = {}
  for path, leaf in flat:
    keys = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
            for k in path]
    out["/".join(keys)] = tuple(getattr(leaf, "shape", ()))
  return out


def tree_differences(saved, wanted, limit: int = 4) -> list[str]:
  """What keeps `saved` (checkpoint metadata) from filling `wanted` (the abstract
  tree of this run): missing / unexpected entries and shape changes."""
  saved, wanted = _flat_shapes(saved), _flat_shapes(wanted)
  missing = sorted(set(wanted) - set(saved))
  extra = sorted(set(saved) - set(wanted))
  shapes = sorted(k for k in set(saved) & set(wanted) if saved[k] != wanted[k])
  out = []
  for names, what in ((missing, "not in the checkpoint"),
                      (extra, "in the checkpoint, not in this model"),):
    if names:
      more = f" (and {len(names) - limit} more)" if len(names) > limit else ""
      out.append(f"{', '.join(names[:limit])}{more}: {what}")
  for name in shapes[:limit]:
    out.append(f"{name}: shape {saved[name]} in the checkpoint, {wanted[name]} here")
  return out


# --------------------------------------------------------------------------
# Checksums and a full disk.

CHECKSUM_FILE = "maelm_checksums.json"


class CorruptCheckpoint(ValueError):
  """A committed checkpoint whose files no longer match their checksums."""


DiskFull = errors.DiskFull


def _step_files(step_dir: str) -> dict[str, int]:
  """{path relative to the step directory: size} of its files, checksum file aside."""
  files = {}
  for root, _, names in os.walk(step_dir):
    for name in names:
      path = os.path.join(root, name)
      relative = os.path.relpath(path, step_dir)
      # The checksum file and its temporary (left by a kill while it was being
      # written) are not part of the checkpoint.
      if relative not in (CHECKSUM_FILE, CHECKSUM_FILE + ".tmp"):
        files[relative] = os.path.getsize(path)
  return files


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while chunk := f.read(1 << 22):
      digest.update(chunk)
  return digest.hexdigest()


def record_checksums(step_dir: str) -> None:
  """Writes the size and SHA-256 of every file of a committed step beside them,
  atomically (a step without the file is simply not verified; in a bucket,
  none: see the module docstring)."""
  if storage.is_remote(step_dir):
    return
  sums = {name: [size, _sha256(os.path.join(step_dir, name))]
          for name, size in sorted(_step_files(step_dir).items())}
  tmp = os.path.join(step_dir, CHECKSUM_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump(sums, f, indent=0)
  os.replace(tmp, os.path.join(step_dir, CHECKSUM_FILE))


def verify_checksums(step_dir: str, *, full: bool = True) -> None:
  """Raises `CorruptCheckpoint` naming the first file that is missing, of
  another size or (with `full`) of another SHA-256 than when it was committed."""
  path = os.path.join(step_dir, CHECKSUM_FILE)
  if storage.is_remote(step_dir) or not os.path.exists(path):
    return  # Saved before checksums, killed before they were recorded, a bucket.
  with open(path) as f:
    try:
      sums = json.load(f)
    except ValueError:
      raise CorruptCheckpoint(f"{path} is not JSON") from None
  present = _step_files(step_dir)
  for name, (size, sha) in sums.items():
    if name not in present:
      raise CorruptCheckpoint(f"{os.path.join(step_dir, name)} is missing")
    if present[name] != size:
      raise CorruptCheckpoint(f"{os.path.join(step_dir, name)} is {present[name]} "
                              f"bytes, {size} when committed")
    if full and _sha256(os.path.join(step_dir, name)) != sha:
      raise CorruptCheckpoint(f"{os.path.join(step_dir, name)} has changed since it "
                              "was committed (SHA-256 differs): silent corruption")


def is_disk_full(error: BaseException) -> bool:
  text = f"{type(error).__name__}: {error}"
  return (getattr(error, "errno", None) == errno.ENOSPC or "No space left" in text
          or "RESOURCE_EXHAUSTED" in text)


def disk_full_message(directory: str) -> str:
  """What a user needs when a save fails for space: the disk, what is free, what
  a checkpoint takes, and that the same command resumes."""
  usage = shutil.disk_usage(directory)
  committed = [d for d in (os.path.join(directory, n) for n in os.listdir(directory)
                           if n.isdigit()) if is_committed(d)]
  newest = max(committed, key=lambda d: int(os.path.basename(d)), default=None)
  need = sum(_step_files(newest).values()) if newest else 0
  resume = (f"it resumes from step {os.path.basename(newest)}, the newest complete "
            "checkpoint, which is intact" if newest else "no checkpoint was completed")
  return (f"no space left on the disk of {directory} ({usage.free / 2**20:,.0f} MB free "
          f"of {usage.total / 2**20:,.0f} MB); a checkpoint of this run takes "
          f"{need / 2**20:,.0f} MB, and a save needs room for it beside the previous "
          f"one. Free space or move the workdir, then run the same command: {resume}")


class Manager(ocp.CheckpointManager):
  """Orbax's manager, plus: the checksums of every step it commits (process 0
  writes them once the step is final, before the next save starts or at the
  end), old steps deleted safely at any instant (`StepPruner`), and a full disk
  said in one line instead of orbax's traceback."""

  def __init__(self, directory: str, *args, **kwargs):
    super().__init__(directory, *args, **kwargs)
    if not hasattr(self, "_checkpoint_deleter"):  # Pinned by tests/test_checkpoints.py.
      raise RuntimeError("this orbax version's CheckpointManager has no "
                         "_checkpoint_deleter; maelm_jax.run.checkpoints.Manager "
                         "needs updating")
    self._checkpoint_deleter = StepPruner(directory)

  def _record_new_checksums(self) -> None:
    if jax.process_index() != 0:
      return
    for step in self.all_steps():
      step_dir = os.path.join(str(self.directory), str(step))
      if is_committed(step_dir) and not os.path.exists(
          os.path.join(step_dir, CHECKSUM_FILE)):
        record_checksums(step_dir)

  def _said_plainly(self, fn, *args, **kwargs):
    try:
      return fn(*args, **kwargs)
    except Exception as error:  # pylint: disable=broad-except
      chain, cause = [], error
      while cause is not None and len(chain) < 20:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
      if any(is_disk_full(e) for e in chain):
        raise DiskFull(disk_full_message(str(self.directory))) from None
      directory = str(self.directory)
      if storage.is_remote(directory) and not storage.reachable(directory):
        raise errors.StoreUnreachable(self._unreachable_message(error)) from None
      raise

  def _unreachable_message(self, error: BaseException) -> str:
    newest = getattr(self, "_newest_complete", None)
    return (f"{storage.bucket_url(str(self.directory))} stopped answering "
            f"({type(error).__name__}: {str(error).splitlines()[0][:160]}), after "
            f"{storage.gcs_retries()['max_retries']} retries with backoff. Nothing was "
            "lost: " + (f"step {newest} is the newest complete checkpoint there, "
                        "and a step it did not finish is never restored"
                        if newest else "no checkpoint was completed")
            + ". When it answers again, run the same command: it resumes")

  def _check_room(self) -> None:
    """Refuses a save that cannot fit (free space under the newest complete
    checkpoint's size) before orbax starts it: orbax's failure mid-write is said
    in one line too, but its I/O threads can still print tracebacks while they
    wind down (asyncio's closed event loop, timing-dependent)."""
    directory = str(self.directory)
    if not os.path.isdir(directory):  # Not a local disk (gs://...): orbax's say.
      return
    committed = [os.path.join(directory, n) for n in os.listdir(directory)
                 if n.isdigit() and is_committed(os.path.join(directory, n))]
    if not committed:
      return
    newest = max(committed, key=lambda d: int(os.path.basename(d)))
    try:
      need, free = sum(_step_files(newest).values()), shutil.disk_usage(directory).free
    except OSError:
      return
    if free < need:
      raise DiskFull(disk_full_message(directory))

  def _finished(self) -> None:
    """Waits for the save in flight; every step saved is then complete."""
    self._said_plainly(super().wait_until_finished)
    self._newest_complete = self.latest_step()
    self._said_plainly(self._record_new_checksums)

  def save(self, *args, **kwargs):
    self._finished()
    self._check_room()
    return self._said_plainly(super().save, *args, **kwargs)

  def wait_until_finished(self):
    self._finished()


def _write_replicated_arrays_once_on_cpu() -> None:
  """On CPU devices orbax's replica-parallel save (each of R replicas of a
  replicated array writes 1/R of it) is pure cost: the devices share the host's
  memory, and each slice is a small program compiled and dispatched, 8 x 192
  of them for the tiny model on 8 devices (its first save 14 s against 1.7 s
  without: benchmarks/checkpoint_save_cpu.py). Orbax already turns it off on GPUs; on TPUs
  it spreads the copy to the host over the chips, and stays on. The files
  written are the same either way."""
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if jax.default_backend() != "cpu" or not getattr(handler, "_use_replica_parallel", False):
    return
  absl_logger = logging.get_absl_logger()  # Orbax warns of any override.
  level = absl_logger.level
  absl_logger.setLevel(py_logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
        override=True)
  finally:
    absl_logger.setLevel(level)


def make_manager(workdir: str, config,
                 item_names=("state", "data")) -> ocp.CheckpointManager:
  """Async saves; keeps the last `keep_checkpoints` plus every
  `checkpoint_keep_period`-th step for good. Orbax writes each step into a
  temporary directory and renames it when complete, and deletes old steps only
  after a newer one is finalised, so a crash never leaves fewer good steps."""
  _write_replicated_arrays_once_on_cpu()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=config.get("keep_checkpoints", 1),
      keep_period=config.get("checkpoint_keep_period", 0) or None,
      enable_async_checkpointing=True,
      # One process makes the step's directories in `save`, before it
      # returns, not in a background thread: orbax's threads wait for that
      # thread's "made" signal, and a mkdir that fails (a bucket gone, a disk
      # that refuses) never sends it, so the run heard of the failure only when
      # that wait ran out, 300 s later (multihost.coordination_timeout()).
      # Made in `save`, the failure is raised at once and said in one line
      # (`_said_plainly`); a save blocks for a mkdir more
      # (tests/test_checkpoint_saves.py). Several processes keep orbax's
      # default: its synchronous path runs the barriers around the mkdir (a
      # device collective) from a helper thread, and with it one run of
      # tests/test_multiprocess.py's dead-host test aborted in gloo ("a
      # distributed collective mismatch"), not understood; a mkdir that fails
      # there still waits out orbax's bound.
      async_options=ocp.AsyncOptions(
          create_directories_asynchronously=jax.process_count() > 1),
      cleanup_tmp_directories=True)
  return Manager(checkpoint_dir(workdir), item_names=item_names, options=options)


def save(manager: ocp.CheckpointManager, step: int, state, data_iterator=None,
         **more) -> None:
  """Hands `step` to orbax, which writes it in the background: the train state,
  with the data iterator's position (pretraining) or other items (`more`, e.g.
  a fine-tuning run's progress); says so in one line."""
  if jax.process_index() == 0:
    # A bucket workdir's records up to `step` reach it before the step can
    # commit: a resume from it keeps them and redoes only later ones.
    storage.push(storage.parent(str(manager.directory)))
  items = {"state": ocp.args.StandardSave(state), **more}
  if data_iterator is not None:
    items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
  started = time.perf_counter()
  manager.save(step, args=ocp.args.Composite(**items), force=True)
  state_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)
                    if hasattr(x, "dtype"))
  logging.info("checkpoint step %d: %.1f MB of state handed to orbax in %.1fs "
               "(written in the background)", step, state_bytes / 1e6,
               time.perf_counter() - started)


def _quarantine(manager: ocp.CheckpointManager, step: int) -> str:
  """Moves a bad step aside (never deletes it) so the next save can use its
  number. Every process calls it (they agreed on `step`); process 0 picks the
  name and renames, the others learn the name from it."""
  directory = os.path.join(str(manager.directory), str(step))
  suffix = 0
  if jax.process_index() == 0:
    while storage.exists(f"{directory}.corrupt{suffix or ''}"):
      suffix += 1
    storage.rename_dir(directory, f"{directory}.corrupt{suffix or ''}")
  if jax.process_count() > 1:
    suffix = int(multihost_utils.broadcast_one_to_all(np.int32(suffix)))
  manager.reload()
  return f"{directory}.corrupt{suffix or ''}"


def _everyone(ok: bool) -> bool:
  """True only if `ok` on every process, so all hosts restore the same step.
  Also the only collective of a restore: every process calls it the same number
  of times, whatever failed where."""
  if jax.process_count() == 1:
    return ok
  return bool(multihost_utils.process_allgather(np.int32(ok)).min())


def _local_checkpointer() -> ocp.Checkpointer:
  """Reads this process's shards with no barrier inside. The manager's own
  `restore` ends in a barrier that only the processes whose read succeeded
  reach; one host failing to read a chunk (a corrupt file only it reads) would
  leave the others there while it went on, and the hosts' collectives would
  pair up wrongly (measured: tests/restore_agreement_worker.py)."""
  me = jax.process_index()
  options = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
  return ocp.Checkpointer(
      ocp.CompositeCheckpointHandler(
          composite_options=ocp.CompositeOptions(multiprocessing_options=options)),
      multiprocessing_options=options)


def _read_aux_state(step_dir: str, item: str) -> None:
  """Raises if the JSON item beside `state` (grain's data-iterator state, one
  file per process; fine-tuning's progress) is missing or not JSON."""
  directory = storage.join(step_dir, item)
  names = [n for n in storage.listdir(directory) if n != "commit_success.txt"]
  if not names:
    raise FileNotFoundError(f"no {item} state in {directory}")
  for name in names:
    json.loads(storage.read_text(storage.join(directory, name)))


def restore_latest_good(manager: ocp.CheckpointManager, abstract_state,
                        data_iterator, *, start_over: bool = False):
  """Pretraining's restore: the state and the grain iterator position.
  Returns (state, step), or (None, None) for a fresh start."""
  state, _, step = restore_newest_readable(
      manager, abstract_state, "data",
      lambda: grain.checkpoint.CheckpointRestore(data_iterator),
      "data.num_workers, data.num_streams, seq_len, batch_size or the process "
      "count changed", start_over=start_over)
  return state, step


def restore_newest_readable(manager: ocp.CheckpointManager, abstract_state,
                            aux_item: str, aux_restore, aux_hint: str, *,
                            start_over: bool = False):
  """Restores the newest checkpoint that reads back completely.

  Only a checkpoint that fails to *read* (truncated or corrupt files, a missing
  item) is moved aside as `<step>.corrupt`, never deleted, and the previous one
  tried. One that reads but does not fit this run (parameter tree or shapes,
  the `aux_item` state) raises `CheckpointMismatch` before anything is touched.
  When checkpoints existed and none read, the run stops unless `start_over`.
  Every process takes the same decision for every step.
  Returns (state, aux, step), or (None, None, None) for a fresh start.
  """
  quarantined = []
  checkpointer = _local_checkpointer()
  for step in sorted(manager.all_steps(), reverse=True):
    step_dir = os.path.join(str(manager.directory), str(step))
    try:
      verify_checksums(step_dir)  # Silent corruption reads, but not as saved.
      saved_tree = _tree_metadata(os.path.join(step_dir, "state"))
      _read_aux_state(step_dir, aux_item)
      read_error = None
    except Exception as error:  # Orbax/tensorstore raise many types here.
      read_error = error
    if _everyone(read_error is None):
      differences = tree_differences(saved_tree, abstract_state)
      if differences:
        raise CheckpointMismatch(
            f"checkpoint {step_dir} does not fit this run's model (nothing was "
            "changed): " + "; ".join(differences) + ". Resume it with the config it "
            "was trained with (its workdir's config.json), or pass a new --workdir "
            "(with --config.init_from=<this workdir> to start from its params)")
      logging.info("restoring the checkpoint of step %d from %s...", step,
                   manager.directory)
      try:
        state = checkpointer.restore(step_dir, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state))).state
      except Exception as error:  # pylint: disable=broad-except
        read_error = error
    if _everyone(read_error is None):
      aux_error = None
      try:
        aux = checkpointer.restore(step_dir, args=ocp.args.Composite(
            **{aux_item: aux_restore()}))[aux_item]
      except Exception as error:  # pylint: disable=broad-except
        aux_error = error
      if not _everyone(aux_error is None):
        reason = (f"{type(aux_error).__name__}: {str(aux_error)[:200]}" if aux_error
                  else "another process could not restore its part")
        raise CheckpointMismatch(
            f"checkpoint {step_dir}: the {aux_item} state does not fit this run "
            f"({reason}); {aux_hint}. Resume with the values in its config.json "
            "(nothing was changed)") from aux_error
      return state, aux, step
    moved = _quarantine(manager, step)
    quarantined.append(moved)
    logging.error("checkpoint at step %d cannot be restored (%s); moved it to %s "
                  "and falling back to the previous one", step,
                  f"{type(read_error).__name__}: {str(read_error)[:500]}" if read_error
                  else "another process could not read it", moved)
  if quarantined and not start_over:
    raise CheckpointMismatch(
        f"no checkpoint of {manager.directory} could be read (moved aside, not "
        f"deleted: {', '.join(quarantined)}); not starting over by itself. "
        "Pass --config.start_over=True to train from step 1 in this workdir")
  return None, None, None


def read_arrays(path: str, tree: Any = None) -> Any:
  """An item of a checkpoint (e.g. `<step>/state`) as numpy arrays, read from its
  own metadata whatever mesh wrote it; `tree`: the part of that metadata to read
  (default: all of it)."""
  if tree is None:
    metadata = ocp.PyTreeCheckpointer().metadata(path)
    tree = (metadata.item_metadata.tree if hasattr(metadata, "item_metadata")
            else metadata.tree)
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
  item = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), tree)
  return ocp.PyTreeCheckpointer().restore(path, args=ocp.args.PyTreeRestore(
      item=item, restore_args=restore_args, partial_restore=True))


def committed_steps(workdir: str) -> list[int]:
  """Steps of the workdir's complete checkpoints, ascending."""
  return sorted(s for s, d in step_dirs(workdir).items() if is_committed(d))

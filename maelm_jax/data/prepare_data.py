r"""One preparation step: any corpus -> ArrayRecord shards read lazily by training.

  python -m maelm_jax.data.prepare_data \
      --source='text:<data>/corpus/wikipedia/*.jsonl.xz' --out=/data/wiki
  python -m maelm_jax.main --config=configs/pretrain.py:objective=maelm,size=base \
      --config.data.source=arrayrecord:/data/wiki --workdir=...

Inputs (`--source`): every spec a training run reads (`text:`, `tfds:`,
`pydoc:`, see `sources.py`), plus
  parquet:<glob>[,...]   parquet files, the document in column --text_field
                         (FineWeb, C4, Wikipedia as the Hugging Face hub has them);
  hfdisk:<dir>           a `datasets.Dataset.save_to_disk` folder (its Arrow files).
Parquet and Arrow are memory-mapped and read by record batch, JSON Lines line by
line, so memory stays flat whatever the input size; a plain-text file (a book,
split into paragraphs) is read whole, one file at a time.

Output (`--out`, see `prepared.py` for the layout): one shard per input unit
(a file; a block of `--records_per_shard` records of a tfds or pydoc corpus),
written by `--workers` processes, and `corpus.json` last. With
`--tokenizer=PATH` the shards hold token ids instead of text, so training hosts
skip tokenization; the tokenizer is copied beside them.

Killed at any instant and run again with the same flags, it finishes without
redoing finished shards and without losing or duplicating a document: a shard
is written to a temporary file, renamed into place, then recorded in
`.parts/<shard>.json`; only recorded shards count as done. Run again on a
finished corpus, it checks every shard's size (`--verify`: its SHA-256 too) and
rewrites the damaged ones. An output directory that holds anything else (another
corpus, other files) is refused untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
import bz2
import dataclasses
import datetime
import glob
import gzip
import itertools
import json
import lzma
import multiprocessing
import os
import shutil
import time
from typing import Any
import zlib

from absl import flags
from absl import logging
import numpy as np

from maelm_jax.core import cli, errors
from maelm_jax.data import prepared
from maelm_jax.data import sources
from maelm_jax.data import text as text_lib
from maelm_jax.core import workdir as workdir_lib

PARTS_DIR = ".parts"
INTENT_FILE = "prepare.json"
_ENCODE_BATCH = 64
_PROGRESS_EVERY_S = 5.0
# How often (documents) a worker reports its progress to the main process.
_REPORT_EVERY_DOCS = 2000

_INPUT_HELP = (
    "use a training source (text:<glob>, tfds:<name>, pydoc:) or "
    "parquet:<glob> or hfdisk:<dir>")


# --------------------------------------------------------------------------
# Input units: what one worker turns into one shard.


@dataclasses.dataclass(frozen=True)
class Unit:
  kind: str      # jsonl | plain | parquet | arrow | tfds | pydoc
  path: str      # the file (tfds: the dataset name)
  size: int      # bytes on disk (tfds, pydoc: records), for progress and ETA
  mtime_ns: int = 0
  start: int = 0  # tfds, pydoc: the unit's records [start, stop)
  stop: int = 0

  def describe(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _files(patterns: str, scheme: str) -> list[str]:
  files = set()
  for pattern in filter(None, (p.strip() for p in patterns.split(","))):
    matches = [m for m in glob.glob(os.path.expanduser(pattern), recursive=True)
               if os.path.isfile(m)]
    if not matches:
      raise FileNotFoundError(f"{scheme}: pattern {pattern!r} matches no file; "
                              "check the path in --source")
    files.update(matches)
  return sorted(files)


def _file_unit(kind: str, path: str) -> Unit:
  st = os.stat(path)
  return Unit(kind, path, st.st_size, st.st_mtime_ns)


def hfdisk_files(directory: str) -> list[str]:
  """The Arrow files of a `save_to_disk` folder, in the dataset's order."""
  directory = os.path.expanduser(directory)
  state = os.path.join(directory, "state.json")
  if os.path.exists(os.path.join(directory, "dataset_dict.json")):
    with open(os.path.join(directory, "dataset_dict.json")) as f:
      splits = json.load(f).get("splits", [])
    raise ValueError(
        f"{directory} is a DatasetDict (splits {splits}); name one split's "
        f"folder, e.g. --source=hfdisk:{os.path.join(directory, (splits or ['train'])[0])}")
  if not os.path.isdir(directory) or not os.path.exists(state):
    raise ValueError(
        f"{directory} is not a datasets.save_to_disk folder (no state.json); point "
        "--source=hfdisk: at the folder save_to_disk wrote")
  with open(state) as f:
    try:
      data_files = [d["filename"] for d in json.load(f)["_data_files"]]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise ValueError(f"{state} does not list the dataset's Arrow files "
                       f"(_data_files: {e}); save the dataset again") from None
  paths = [os.path.join(directory, name) for name in data_files]
  missing = [p for p in paths if not os.path.exists(p)]
  if missing:
    raise FileNotFoundError(f"{state} lists {missing[0]}, which is missing; copy "
                            "the whole save_to_disk folder")
  return paths


def list_units(spec: str, *, tfds_data_dir: str | None = None,
               records_per_shard: int = 100_000) -> list[Unit]:
  scheme, sep, rest = spec.partition(":")
  scheme, rest = scheme.strip().lower(), rest.strip()
  if scheme == "text" and sep and rest:
    return [_file_unit("jsonl" if p.endswith(sources._JSONL_SUFFIXES) else "plain", p)  # pylint: disable=protected-access
            for p in sources.text_files(rest)]
  if scheme == "parquet" and sep and rest:
    return [_file_unit("parquet", p) for p in _files(rest, "parquet")]
  if scheme == "hfdisk" and sep and rest:
    return [_file_unit("arrow", p) for p in hfdisk_files(rest)]
  if (scheme == "tfds" and sep and rest) or (scheme == "pydoc" and not rest):
    total = len(_record_documents(scheme, rest, tfds_data_dir, "text"))
    return [Unit(scheme, rest, min(total, start + records_per_shard) - start, 0,
                 start, min(total, start + records_per_shard))
            for start in range(0, total, records_per_shard)]
  if scheme == "arrayrecord":
    raise ValueError(f"{spec!r} is prepared already: train on it directly "
                     f"(--config.data.source={spec})")
  raise ValueError(f"--source={spec!r} is not understood; {_INPUT_HELP}")


# --------------------------------------------------------------------------
# Reading a unit's documents, streaming.


class _Progress:
  """A unit's position in its input, as a fraction, for the ETA."""
  fraction = 0.0


def _record_documents(scheme: str, name: str, tfds_data_dir: str | None,
                      text_field: str):
  if scheme == "pydoc":
    return sources._pydoc_documents()[0]  # pylint: disable=protected-access
  data_source = sources.open_tfds_split(name, "train", tfds_data_dir)
  return sources._TfdsTexts(data_source, text_field, f"tfds:{name}")  # pylint: disable=protected-access


def _jsonl_documents(path: str, size: int, text_field: str, on_bad_text: str,
                     progress: _Progress) -> Iterator[str]:
  """`sources._jsonl_documents`, line by line: the same documents, in flat memory,
  under the same bad-text rule (`text.Utf8Reader`)."""
  del on_bad_text  # The caller applies it to NotText.
  suffix = os.path.splitext(path)[1]
  opener = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}.get(suffix)
  reader = text_lib.Utf8Reader(path)
  with open(path, "rb") as raw:
    stream = opener(raw, "rb") if opener else raw
    try:
      for line_number, line_bytes in enumerate(stream, 1):
        if line_number % 256 == 0:
          progress.fraction = raw.tell() / max(1, size)
        line = reader.decode(line_bytes, line_number)
        line = line.rstrip("\n").removesuffix("\r")
        if not line.strip():
          continue
        where = f"{path}:{line_number}"
        document = sources.jsonl_document(where, sources.json_object(where, line),
                                          text_field, flag="--text_field")
        if document:
          yield document
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as error:
      raise ValueError(
          f"{path} cannot be read ({type(error).__name__}: {error}); a corrupt or "
          f"truncated {suffix or 'text'} file? Repair it or leave it out of --source"
      ) from None
  reader.check()
  warning = reader.warning("")
  if warning:
    logging.warning("%s", warning)


def _check_text_column(path: str, schema, text_field: str) -> None:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  if text_field not in schema.names:
    raise ValueError(f"{path} has no column {text_field!r} (its columns are "
                     f"{schema.names}); pass --text_field=<the column holding the "
                     "document text>")
  field_type = schema.field(text_field).type
  if not (pa.types.is_string(field_type) or pa.types.is_large_string(field_type)):
    raise ValueError(f"{path}: column {text_field!r} is {field_type}, not a string; "
                     "pass --text_field=<the column holding the document text>")


def _open_parquet(path: str):
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  try:
    return pq.ParquetFile(path, memory_map=True)
  except Exception as e:  # pylint: disable=broad-except  (pyarrow raises many types)
    raise ValueError(f"{path} cannot be read as parquet ({e}); a truncated or "
                     "non-parquet file? Repair it or leave it out of --source") from None


def _open_arrow(path: str):
  """(memory map, record batch reader) of an Arrow IPC stream or file."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  source = pa.memory_map(path)
  try:
    return source, pa.ipc.open_stream(source)  # What `datasets` writes.
  except pa.ArrowInvalid:
    try:
      return source, pa.ipc.open_file(source)
    except pa.ArrowInvalid as e:
      raise ValueError(f"{path} is not an Arrow file ({e}); copy the save_to_disk "
                       "folder again") from None


def check_columns(unit: Unit, text_field: str) -> None:
  """Parquet and Arrow inputs hold a string column `text_field` (reads only
  the schema)."""
  if unit.kind == "parquet":
    _check_text_column(unit.path, _open_parquet(unit.path).schema_arrow, text_field)
  elif unit.kind == "arrow":
    _check_text_column(unit.path, _open_arrow(unit.path)[1].schema, text_field)


def _column_documents(batches, text_field: str) -> Iterator[str]:
  for batch in batches:
    for value in batch.column(text_field).to_pylist():
      if value is not None and (value := sources.normalize_whitespace(value)):
        yield value


def _parquet_documents(path: str, text_field: str,
                       progress: _Progress) -> Iterator[str]:
  parquet = _open_parquet(path)
  _check_text_column(path, parquet.schema_arrow, text_field)
  groups = parquet.num_row_groups
  for group in range(groups):
    progress.fraction = group / max(1, groups)
    yield from _column_documents(
        parquet.iter_batches(batch_size=1024, row_groups=[group],
                             columns=[text_field]), text_field)


def _arrow_documents(path: str, size: int, text_field: str,
                     progress: _Progress) -> Iterator[str]:
  source, reader = _open_arrow(path)
  _check_text_column(path, reader.schema, text_field)

  def batches():
    for batch in reader:
      progress.fraction = source.tell() / max(1, size)
      yield batch

  yield from _column_documents(batches(), text_field)


def unit_documents(unit: Unit, *, text_field: str, on_bad_text: str,
                   tfds_data_dir: str | None = None,
                   progress: _Progress | None = None) -> Iterator[str]:
  progress = progress or _Progress()
  if unit.kind == "jsonl":
    return _jsonl_documents(unit.path, unit.size, text_field, on_bad_text, progress)
  if unit.kind == "plain":
    return iter(sources._plain_text_documents(unit.path, on_bad_text))  # pylint: disable=protected-access
  if unit.kind == "parquet":
    return _parquet_documents(unit.path, text_field, progress)
  if unit.kind == "arrow":
    return _arrow_documents(unit.path, unit.size, text_field, progress)
  documents = _record_documents(unit.kind, unit.path, tfds_data_dir, text_field)
  return (d for d in (documents[i] for i in range(unit.start, unit.stop)) if d)


# --------------------------------------------------------------------------
# Writing one shard (in a worker process).


@dataclasses.dataclass(frozen=True)
class Job:
  unit: Unit
  index: int
  count: int
  out: str
  text_field: str
  on_bad_text: str
  tokenizer_path: str | None
  tfds_data_dir: str | None


def _atomic_json(path: str, obj: Any) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


_REPORTS = None  # The worker's queue of (unit index, documents, text bytes, fraction).


def _init_worker(reports) -> None:
  global _REPORTS
  _REPORTS = reports


def write_shard(job: Job, report=None) -> dict[str, Any]:
  """Writes `job.unit`'s documents as one shard; returns its part record."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  report = report or (_REPORTS.put if _REPORTS is not None else (lambda _: None))
  name = prepared.shard_name(job.index, job.count)
  final = os.path.join(job.out, name)
  tmp = os.path.join(job.out, PARTS_DIR, f"{name}.tmp{os.getpid()}")
  tokenizer = None
  if job.tokenizer_path:
    from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    tokenizer = tokenizer_lib.open_tokenizer(job.tokenizer_path)
  progress = _Progress()
  documents = text_bytes = 0
  skipped = None
  writer = array_record_module.ArrayRecordWriter(tmp, prepared.WRITER_OPTIONS)
  try:
    texts = unit_documents(job.unit, text_field=job.text_field,
                           on_bad_text=job.on_bad_text,
                           tfds_data_dir=job.tfds_data_dir, progress=progress)
    while batch := list(itertools.islice(texts, _ENCODE_BATCH)):
      records = tokenizer.encode(batch) if tokenizer else batch
      for text, record in zip(batch, records):
        writer.write(prepared.encode_record(
            np.asarray(record, prepared.TOKEN_DTYPE) if tokenizer else record))
        text_bytes += len(text.encode("utf-8"))
      documents += len(batch)
      if documents % _REPORT_EVERY_DOCS < _ENCODE_BATCH:
        report((job.index, documents, text_bytes, progress.fraction))
  except text_lib.NotText as not_text:
    message = text_lib.not_text_message(job.unit.path, str(not_text), "--source")
    if job.on_bad_text == "stop":
      writer.close()
      os.remove(tmp)
      raise ValueError(message) from None
    logging.warning("%s; skipped (--on_bad_text=stop makes this an error)", message)
    skipped, documents, text_bytes = message, 0, 0
  except BaseException:
    writer.close()
    os.remove(tmp)
    raise
  writer.close()
  if skipped:  # An empty shard keeps the shard numbering; it is never read.
    os.remove(tmp)
    array_record_module.ArrayRecordWriter(tmp, prepared.WRITER_OPTIONS).close()
  with open(tmp, "rb+") as f:
    os.fsync(f.fileno())
  os.replace(tmp, final)
  part = {"file": name, "documents": documents, "text_bytes": text_bytes,
          "file_bytes": os.path.getsize(final), "sha256": prepared.file_sha256(final),
          "input": job.unit.describe(), "skipped": skipped}
  _atomic_json(os.path.join(job.out, PARTS_DIR, name + ".json"), part)
  report((job.index, documents, text_bytes, 1.0))
  return part


# --------------------------------------------------------------------------
# The command.


def _intent(spec, units, text_field, tokenizer_sha) -> dict[str, Any]:
  return {"source": spec, "text_field": text_field,
          "format": prepared.TOKEN_IDS if tokenizer_sha else prepared.TEXT,
          "tokenizer_sha256": tokenizer_sha,
          "units": [u.describe() for u in units]}


def _check_out_dir(out: str, intent: dict[str, Any]) -> dict[str, dict]:
  """Refuses an --out that holds something else; returns the finished parts."""
  ours = {workdir_lib.LOCK_FILE, PARTS_DIR}
  intent_path = os.path.join(out, PARTS_DIR, INTENT_FILE)
  metadata_path = os.path.join(out, prepared.METADATA_FILE)
  if os.path.exists(metadata_path):
    metadata = prepared.read_metadata(out)
    saved = metadata.get("intent", {})
  elif os.path.exists(intent_path):
    with open(intent_path) as f:
      saved = json.load(f)
  else:
    others = sorted(set(os.listdir(out)) - ours)
    if others:
      raise FileExistsError(
          f"--out={out} already holds {len(others)} other file(s) ({others[0]}, ...) "
          "and no corpus being prepared; use an empty or new directory")
    return {}
  finished = os.path.exists(metadata_path)
  for key, what in (("source", "--source"), ("text_field", "--text_field"),
                    ("tokenizer_sha256", "--tokenizer"), ("units", "input files")):
    # An unfinished preparation redoes the input files that changed (a user
    # fixing the file that stopped it); a finished corpus is never re-indexed.
    if saved.get(key) != intent[key] and (key != "units" or finished):
      differs = (f"its {what} differ(s) from this command's" if key != "units" else
                 "the input files changed (size, time or number) since it was "
                 "started")
      raise FileExistsError(
          f"--out={out} holds another corpus ({saved.get('source')!r}): {differs}; "
          "use a new --out (nothing was changed)")
  parts = {}
  if os.path.exists(metadata_path):
    parts = {s["file"]: s for s in metadata["shards"]}
  parts_dir = os.path.join(out, PARTS_DIR)
  if os.path.isdir(parts_dir):
    for name in os.listdir(parts_dir):
      if name.endswith(prepared.SHARD_SUFFIX + ".json"):
        with open(os.path.join(parts_dir, name)) as f:
          part = json.load(f)
        parts[part["file"]] = part
  return parts


def _intact(out: str, part: dict[str, Any], verify: bool) -> bool:
  path = os.path.join(out, part["file"])
  if not os.path.exists(path) or os.path.getsize(path) != part["file_bytes"]:
    return False
  return not verify or prepared.file_sha256(path) == part["sha256"]


def _format_eta(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else (
      f"{seconds // 60}m{seconds % 60:02d}s")


# ArrayRecord's reader and writer (C++, riegeli) open local files only.
NOT_IN_A_BUCKET = ("{what}: a prepared corpus is read and written with local file I/O "
                   "(ArrayRecord opens local files only); use a local or mounted "
                   "path (e.g. gcsfuse) for it. Workdirs can be gs:// paths")


def prepare(spec: str, out: str, *, text_field: str = "text",
            tokenizer_path: str | None = None, workers: int = 1,
            on_bad_text: str = "warn", eval_fraction: float = 0.01,
            tfds_data_dir: str | None = None, records_per_shard: int = 100_000,
            verify: bool = False, command: str = "") -> dict[str, Any]:
  """Prepares `spec` into `out`; returns the corpus metadata. See the module
  docstring."""
  if on_bad_text not in sources.BAD_TEXT_POLICIES:
    raise ValueError(f"--on_bad_text={on_bad_text!r} must be one of "
                     f"{sources.BAD_TEXT_POLICIES}")
  if workers < 1:
    raise ValueError(f"--workers={workers} must be >= 1")
  if "://" in out:
    raise ValueError(NOT_IN_A_BUCKET.format(what=f"--out={out}"))
  stride = sources.held_out_stride(eval_fraction)
  units = list_units(spec, tfds_data_dir=tfds_data_dir,
                     records_per_shard=records_per_shard)
  if not units:
    raise ValueError(f"--source={spec!r} holds no documents")
  tokenizer_sha = None
  if tokenizer_path:
    from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
    tokenizer_lib.open_tokenizer(tokenizer_path)  # A bad file fails here, not in a worker.
    tokenizer_sha = prepared.file_sha256(tokenizer_path)
  for unit in units:  # A missing column is refused before anything is written.
    check_columns(unit, text_field)
  intent = _intent(spec, units, text_field, tokenizer_sha)
  os.makedirs(out, exist_ok=True)
  with workdir_lib.Lock(out):
    parts = _check_out_dir(out, intent)
    os.makedirs(os.path.join(out, PARTS_DIR), exist_ok=True)
    for name in os.listdir(os.path.join(out, PARTS_DIR)):
      if ".tmp" in name:  # Left by a process killed mid-write.
        os.remove(os.path.join(out, PARTS_DIR, name))
    _atomic_json(os.path.join(out, PARTS_DIR, INTENT_FILE), intent)
    own_tokenizer = None
    if tokenizer_path:
      from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
      own_tokenizer = tokenizer_lib.own_name(tokenizer_path)
      shutil.copyfile(tokenizer_path, os.path.join(out, own_tokenizer))
    count = len(units)
    jobs = [Job(unit, i, count, out, text_field, on_bad_text, tokenizer_path,
                tfds_data_dir) for i, unit in enumerate(units)]
    done = {}
    for job in jobs:
      part = parts.pop(prepared.shard_name(job.index, count), None)
      if part and part["input"] != job.unit.describe():
        logging.warning("%s changed since its shard was written; writing it again",
                        job.unit.path)
      elif part and _intact(out, part, verify):
        done[job.index] = part
      elif part:
        logging.warning("%s is damaged (size or checksum); writing it again",
                        part["file"])
    for stale in parts:  # Shards of an input layout that changed before the end.
      if os.path.exists(os.path.join(out, stale)):
        os.remove(os.path.join(out, stale))
    pending = [job for job in jobs if job.index not in done]
    logging.info("preparing %s into %s: %d shards, %d done already, %d workers",
                 spec, out, count, len(done), min(workers, max(1, len(pending))))
    _run_jobs(pending, done, units, workers)
    shards = [done[i] for i in range(count)]
    metadata = _metadata(spec, text_field, shards, intent, own_tokenizer,
                         tokenizer_sha, eval_fraction, stride, command)
    _atomic_json(os.path.join(out, prepared.METADATA_FILE), metadata)
    shutil.rmtree(os.path.join(out, PARTS_DIR))
  return metadata


def _run_jobs(pending: list[Job], done: dict[int, dict], units: list[Unit],
              workers: int) -> None:
  """Runs `pending`, filling `done`; a progress line every few seconds."""
  total_input = sum(u.size for u in units) or 1
  finished_input = sum(units[i].size for i in done)
  live: dict[int, tuple[int, int, float]] = {}
  started = time.monotonic()
  last_line = [started]
  base_docs = sum(p["documents"] for p in done.values())
  base_bytes = sum(p["text_bytes"] for p in done.values())
  initial_input = finished_input

  def on_report(report, force=False):
    index, docs, text_bytes, fraction = report
    live[index] = (docs, text_bytes, fraction)
    now = time.monotonic()
    if not force and now - last_line[0] < _PROGRESS_EVERY_S:
      return
    last_line[0] = now
    docs_all = base_docs + sum(d for d, _, _ in live.values())
    mb = (base_bytes + sum(b for _, b, _ in live.values())) / 1e6
    input_done = initial_input + sum(units[i].size * f for i, (_, _, f) in live.items())
    elapsed = max(1e-6, now - started)
    rate = (input_done - initial_input) / elapsed
    eta = (total_input - input_done) / rate if rate > 0 else float("nan")
    logging.info("prepare: %d/%d shards, %s documents, %.1f MB of text, %.1f MB/s, "
                 "ETA %s", len(done), len(units), f"{docs_all:,}", mb,
                 (mb - base_bytes / 1e6) / elapsed,
                 _format_eta(eta) if eta == eta else "?")

  if workers == 1 or len(pending) <= 1:
    for job in pending:
      part = write_shard(job, report=on_report)
      done[job.index] = part
      on_report((job.index, part["documents"], part["text_bytes"], 1.0), force=True)
    return
  context = multiprocessing.get_context("spawn")  # No forked JAX/absl state.
  reports = context.Queue()
  with context.Pool(min(workers, len(pending)), initializer=_init_worker,
                    initargs=(reports,)) as pool:
    results = [pool.apply_async(write_shard, (job,)) for job in pending]
    remaining = dict(zip((j.index for j in pending), results))
    while remaining:
      while not reports.empty():
        on_report(reports.get())
      for index, result in list(remaining.items()):
        if result.ready():
          try:
            part = result.get()  # A worker's error, raised again here ...
          except errors.USER_ERROR_TYPES as error:
            # ... as the one-line message it is (its traceback is the pool's).
            raise type(error)(*error.args) from None
          done[index] = part
          del remaining[index]
          on_report((index, part["documents"], part["text_bytes"], 1.0), force=True)
      time.sleep(0.2)


def _metadata(spec, text_field, shards, intent, own_tokenizer, tokenizer_sha,
              eval_fraction, stride, command) -> dict[str, Any]:
  documents = sum(s["documents"] for s in shards)
  if not documents:
    raise ValueError(f"--source={spec!r} holds no documents (every file is empty, "
                     "blank or skipped as not text)")
  return {
      "format_version": prepared.FORMAT_VERSION,
      "source": spec, "text_field": text_field,
      "format": prepared.TOKEN_IDS if tokenizer_sha else prepared.TEXT,
      "tokenizer": ({"file": own_tokenizer, "sha256": tokenizer_sha}
                    if tokenizer_sha else None),
      "documents": documents,
      "text_bytes": sum(s["text_bytes"] for s in shards),
      "file_bytes": sum(s["file_bytes"] for s in shards),
      "shards": shards,
      "checksum": prepared.corpus_checksum(shards),
      "held_out": {"eval_fraction": eval_fraction, "stride": stride,
                   "train": sources.split_size(documents, sources.TRAIN, stride),
                   "eval": sources.split_size(documents, sources.EVAL, stride)},
      "intent": intent,
      "command": command,
      "created": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }


def _define_flags() -> None:
  flags.DEFINE_string("source", None, f"The corpus to prepare; {_INPUT_HELP}.",
                      required=True)
  flags.DEFINE_string("out", None, "The directory to write (empty, new, or this "
                      "command's own to resume).", required=True)
  flags.DEFINE_string("text_field", "text", "JSON field / parquet or Arrow column "
                      "holding the document text.")
  flags.DEFINE_string("tokenizer", None, "Store token ids of this tokenizer "
                      "(tokenizer.model or tokenizer.json) instead of text.")
  flags.DEFINE_integer("workers", min(8, os.cpu_count() or 1),
                       "Processes writing shards in parallel (one input file each).")
  flags.DEFINE_enum("on_bad_text", "warn", list(sources.BAD_TEXT_POLICIES),
                    "A file that is not UTF-8 text: skip with a warning, or stop.")
  flags.DEFINE_float("eval_fraction", 0.01, "The held-out share whose split counts "
                     "corpus.json states (training chooses its own).")
  flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir for --source=tfds:.")
  flags.DEFINE_integer("records_per_shard", 100_000, "tfds:/pydoc: records per shard.")
  flags.DEFINE_bool("verify", False, "On a finished corpus, check every shard's "
                    "SHA-256 (not only its size) and rewrite the damaged ones.")


def main() -> None:
  FLAGS = flags.FLAGS
  metadata = prepare(
      FLAGS.source, FLAGS.out, text_field=FLAGS.text_field,
      tokenizer_path=FLAGS.tokenizer, workers=FLAGS.workers,
      on_bad_text=FLAGS.on_bad_text, eval_fraction=FLAGS.eval_fraction,
      tfds_data_dir=FLAGS.tfds_data_dir, records_per_shard=FLAGS.records_per_shard,
      verify=FLAGS.verify, command=cli.command_line("maelm_jax.data.prepare_data"))
  print(f"{FLAGS.out}: {metadata['documents']:,} documents, "
        f"{metadata['text_bytes'] / 1e6:,.1f} MB of text in "
        f"{len(metadata['shards'])} shards ({metadata['format']}); train with "
        f"--config.data.source=arrayrecord:{FLAGS.out}")


# `python -m` and the maelm-prepare command (setup.py's console scripts).
console = cli.command(main, _define_flags,
                      stopped="finished shards are kept, and the same command resumes")

if __name__ == "__main__":
  console()

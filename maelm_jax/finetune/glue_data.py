"""GLUE: the task table, readers for the TSV directories and tfds, and encoding.

Sources (`config.data.source`):

  tsv   files in `config.data.dir`, which may name the task's directory or the
        GLUE root above it, in any of three layouts (found by what is there):
        - the directories written by the common `download_glue_data.py`
          (`CoLA/ SST-2/ MRPC/ STS-B/ QQP/ MNLI/ QNLI/ RTE/ WNLI/ diagnostic/`),
          parsed with quoting off (several contain bare `"`), MRPC's UTF-8
          byte-order mark dropped, CoLA's train/dev files without a header row,
          string labels (`entailment`, ...) mapped to class ids by `labels`;
        - the Hugging Face hub's parquet files (`nyu-mll/glue`: `sst2/
          train-00000-of-00001.parquet`, `validation-...`, `test-...`; MNLI's
          `validation_matched-...`), a folder per task named as tfds names it;
        - a `datasets` `DatasetDict.save_to_disk` folder of the task (its
          `train/ validation/ test/` splits of Arrow files).
        The hub's columns and class ids are tfds's.
  tfds  `glue/<task>` read with `tfds.data_source` (ArrayRecord, no TensorFlow),
        prepared with `tfds build glue/<task> --file_format=array_record`.

Class ids follow tfds (so both sources agree): `GlueTask.labels[i]` is the TSV
string of class i, which is also what a GLUE submission file expects.

Encoding: `[CLS] a [SEP]` or `[CLS] a [SEP] b [SEP]`, right-padded with [PAD] to
`max_seq_len`; a pair that does not fit is cut from the end of its longer text
first (BERT's `_truncate_seq_pair`).
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import math
import os
from typing import Sequence

from absl import logging
import numpy as np

from maelm_jax.data import sources


@dataclasses.dataclass(frozen=True)
class EvalSplit:
  """A labelled dev set and the unlabelled test set that goes with it."""

  name: str  # "dev", or "mnli_m" / "mnli_mm": MNLI's two dev sets.
  tsv_file: str
  tfds_split: str
  test_tsv_file: str
  test_tfds_split: str
  submission_file: str  # File name the GLUE server expects for the test predictions.

  @property
  def metric_prefix(self) -> str:
    """'' for a task's only dev set; 'mnli_m/' etc. when a task has several."""
    return "" if self.name == "dev" else self.name + "/"


def _single_dev(submission_name: str) -> tuple[EvalSplit, ...]:
  return (EvalSplit("dev", "dev.tsv", "validation", "test.tsv", "test",
                    f"{submission_name}.tsv"),)


@dataclasses.dataclass(frozen=True)
class GlueTask:
  """How to read, encode and score one GLUE task."""

  name: str  # tfds config name, e.g. "sst2".
  tsv_dir: str  # Directory name in the GLUE download, e.g. "SST-2".
  text_columns: tuple[str, ...]  # TSV header names of the one or two texts.
  label_column: str  # TSV header name of the label.
  tfds_text_features: tuple[str, ...]
  labels: tuple[str, ...] | None  # TSV label strings by class id; None: regression.
  metrics: tuple[str, ...]  # Names in `metrics.METRICS`, reported per dev set.
  main_metric: str  # Picks the best epoch; the task's number in a GLUE average.
  eval_splits: tuple[EvalSplit, ...]
  test_index_column: str = "index"
  # CoLA's train/dev files have no header: (text column indices, label index).
  headerless_layout: tuple[tuple[int, ...], int] | None = None

  @property
  def is_regression(self) -> bool:
    return self.labels is None

  @property
  def num_outputs(self) -> int:
    return 1 if self.labels is None else len(self.labels)


_MNLI_EVAL_SPLITS = (
    EvalSplit("mnli_m", "dev_matched.tsv", "validation_matched", "test_matched.tsv",
              "test_matched", "MNLI-m.tsv"),
    EvalSplit("mnli_mm", "dev_mismatched.tsv", "validation_mismatched",
              "test_mismatched.tsv", "test_mismatched", "MNLI-mm.tsv"),
)
# What each class means, where the files spell classes as 0/1 (the others' label
# strings are already words): the names an export's id2label gives, so that
# pipeline("text-classification") answers 'positive', not '1'.
LABEL_NAMES = {"sst2": ("negative", "positive"), "cola": ("unacceptable", "acceptable"),
               "mrpc": ("not_equivalent", "equivalent"),
               "qqp": ("not_duplicate", "duplicate"),
               "wnli": ("not_entailment", "entailment")}


def label_names(task: "GlueTask") -> tuple[str, ...]:
  """The names of `task`'s classes, by class id."""
  return LABEL_NAMES.get(task.name, task.labels)


_PAIR = ("sentence1", "sentence2")
_NLI_LABELS = ("entailment", "not_entailment")

TASKS: dict[str, GlueTask] = {t.name: t for t in (
    GlueTask("cola", "CoLA", ("sentence",), "label", ("sentence",), ("0", "1"),
             ("matthews_corr",), "matthews_corr", _single_dev("CoLA"),
             headerless_layout=((3,), 1)),
    GlueTask("sst2", "SST-2", ("sentence",), "label", ("sentence",), ("0", "1"),
             ("accuracy",), "accuracy", _single_dev("SST-2")),
    GlueTask("mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", _PAIR,
             ("0", "1"), ("accuracy", "f1"), "accuracy", _single_dev("MRPC")),
    GlueTask("stsb", "STS-B", _PAIR, "score", _PAIR, None,
             ("pearson", "spearman"), "spearman", _single_dev("STS-B")),
    GlueTask("qqp", "QQP", ("question1", "question2"), "is_duplicate",
             ("question1", "question2"), ("0", "1"), ("accuracy", "f1"),
             "accuracy", _single_dev("QQP"), test_index_column="id"),
    GlueTask("mnli", "MNLI", _PAIR, "gold_label", ("premise", "hypothesis"),
             ("entailment", "neutral", "contradiction"), ("accuracy",),
             "mnli_m/accuracy", _MNLI_EVAL_SPLITS),
    GlueTask("qnli", "QNLI", ("question", "sentence"), "label",
             ("question", "sentence"), _NLI_LABELS, ("accuracy",), "accuracy",
             _single_dev("QNLI")),
    GlueTask("rte", "RTE", _PAIR, "label", _PAIR, _NLI_LABELS, ("accuracy",),
             "accuracy", _single_dev("RTE")),
    GlueTask("wnli", "WNLI", _PAIR, "label", _PAIR, ("0", "1"), ("accuracy",),
             "accuracy", _single_dev("WNLI")),
)}

# The diagnostic set (AX) is scored by the MNLI model; only its test file exists.
DIAGNOSTIC_SUBMISSION_FILE = "AX.tsv"


def get_task(name: str) -> GlueTask:
  """'sst2', 'SST-2', 'sst_2', 'STS-B', ... -> the task."""
  key = name.lower().replace("-", "").replace("_", "")
  if key not in TASKS:
    raise ValueError(f"unknown GLUE task {name!r}; use one of {sorted(TASKS)}, "
                     "e.g. --config=configs/glue.py:task=rte")
  return TASKS[key]


@dataclasses.dataclass(frozen=True)
class GlueExample:
  index: int  # Position in a dev file; the file's own index column in a test file.
  texts: tuple[str, ...]
  label: int | float | None  # Class id, STS-B score, or None (test sets).


# --------------------------------------------------------------------------
# TSV files.


def _read_rows(path: str) -> list[list[str]]:
  # utf-8-sig drops MRPC's byte-order mark; QUOTE_NONE keeps bare quotes as text.
  try:
    with open(path, encoding="utf-8-sig", newline="") as f:
      rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  except UnicodeDecodeError as error:
    with open(path, "rb") as f:
      line = f.read()[:error.start].count(b"\n") + 1
    raise ValueError(f"{path}, line {line}: not UTF-8 ({error.reason}); GLUE files "
                     "are UTF-8: convert it (e.g. iconv -f latin1 -t utf-8)") from None
  return [row for row in rows if row and any(cell.strip() for cell in row)]


def _column_indices(path: str, header: list[str], names: Sequence[str],
                    task: GlueTask) -> list[int]:
  missing = [n for n in names if n not in header]
  if missing:
    raise ValueError(
        f"{path} has no column(s) {missing} (its header is {header}); a GLUE "
        f"{task.tsv_dir} file needs {list(names)}. Is --config.data.dir the "
        f"{task.tsv_dir} directory written by download_glue_data.py?")
  return [header.index(n) for n in names]


def _parse_label(task: GlueTask, raw: str, where: str) -> int | float:
  raw = raw.strip()
  if task.is_regression:
    try:
      return float(raw)
    except ValueError:
      raise ValueError(f"{where}: {task.label_column}={raw!r} is not a number") from None
  if raw not in task.labels:
    raise ValueError(f"{where}: label {raw!r} is not one of {task.tsv_dir}'s "
                     f"labels {list(task.labels)}")
  return task.labels.index(raw)


def read_tsv(task: GlueTask, path: str, *, labelled: bool = True,
             skip_malformed: bool = False) -> list[GlueExample]:
  """Examples of one GLUE TSV file.

  Args:
    task: the task whose layout the file has.
    path: e.g. `.../RTE/dev.tsv`.
    labelled: train/dev files (label column, position as index) or test files
      (no label, the file's `index`/`id` column as index).
    skip_malformed: skip rows with too few columns instead of failing (for
      training files; a dev or test row must never be dropped silently).
  """
  rows = _read_rows(path)
  if labelled and task.headerless_layout is not None:
    text_cols, label_col = task.headerless_layout
    text_cols = list(text_cols)
    body, first_line = rows, 1
  else:
    if not rows:
      raise ValueError(f"{path} is empty; expected a header row and examples")
    header = [cell.strip() for cell in rows[0]]
    text_cols = _column_indices(path, header, task.text_columns, task)
    if labelled:
      label_col = _column_indices(path, header, (task.label_column,), task)[0]
    else:
      index_col = _column_indices(path, header, (task.test_index_column,), task)[0]
    body, first_line = rows[1:], 2
  needed = max(text_cols + [label_col if labelled else index_col]) + 1
  if body and all(len(row) < needed for row in body):  # Another task's file.
    first = "\t".join(rows[0])[:60]
    raise ValueError(f"{path}: no row has the {needed} tab-separated fields of a "
                     f"{task.tsv_dir} file (its first line: {first!r}); is "
                     f"--config.data.dir the {task.tsv_dir} directory?")

  examples, skipped = [], 0
  for line, row in enumerate(body, start=first_line):
    where = f"{path}:{line}"
    if len(row) < needed:
      if skip_malformed:
        skipped += 1
        continue
      raise ValueError(f"{where} has {len(row)} tab-separated fields, fewer than the "
                       f"{needed} a {task.tsv_dir} row needs; the file is damaged")
    texts = tuple(row[c] for c in text_cols)
    if labelled:
      examples.append(GlueExample(len(examples), texts,
                                  _parse_label(task, row[label_col], where)))
    else:
      examples.append(GlueExample(int(row[index_col]), texts, None))
  if skipped:
    logging.warning("%s: skipped %d malformed rows of %d", path, skipped, len(body))
  return examples


def read_diagnostic_tsv(path: str) -> list[GlueExample]:
  """The GLUE diagnostic set (AX): `index sentence1 sentence2`, no labels."""
  return read_tsv(TASKS["mnli"], path, labelled=False)


def resolve_task_dir(task: GlueTask, data_dir: str) -> tuple[str, str]:
  """(directory, layout) of the task's files: `data_dir` itself, or its
  `<tsv_dir>/` (download_glue_data.py) or `<name>/` (the hub, save_to_disk)
  subfolder, holding TSVs, the hub's parquet files or a save_to_disk folder."""
  if not data_dir:
    raise ValueError(f"--config.data.dir is empty; point it at the {task.tsv_dir} "
                     "directory written by download_glue_data.py (or the GLUE root "
                     "holding it), or read tfds with --config.data.source=tfds")
  markers = ["train.tsv"] + [s.tsv_file for s in task.eval_splits]
  for candidate in (data_dir, os.path.join(data_dir, task.tsv_dir),
                    os.path.join(data_dir, task.name)):
    if any(os.path.isfile(os.path.join(candidate, m)) for m in markers):
      return candidate, "tsv"
    if glob.glob(os.path.join(glob.escape(candidate), "train-*.parquet")):
      return candidate, "parquet"
    if os.path.isfile(os.path.join(candidate, "dataset_dict.json")):
      return candidate, "hfdisk"
  raise FileNotFoundError(
      f"--config.data.dir={data_dir!r} holds neither {markers} nor a "
      f"{task.tsv_dir}/ directory with them, nor the hub's {task.name}/"
      "train-*.parquet, nor a save_to_disk folder (dataset_dict.json); point it at "
      f"the {task.tsv_dir} directory written by download_glue_data.py, or the GLUE "
      "root above it")


# --------------------------------------------------------------------------
# tfds.


def read_tfds(task: GlueTask, split: str, *,
              data_dir: str | None = None) -> list[GlueExample]:
  """Examples of tfds `glue/<task>` split `split` (test labels are -1 -> None)."""
  return examples_of_records(
      task, split, sources.tfds_records(f"glue/{task.name}", split, data_dir))


def read_hub_split(task: GlueTask, directory: str, layout: str,
                   split: str) -> list[GlueExample]:
  """Examples of one split of the hub's parquet files or a save_to_disk folder
  (the split named as tfds names it: train, validation, validation_matched...)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  files = _split_files(directory, layout, split)
  if not files:
    raise FileNotFoundError(f"{directory} has no {split} split ({_SPLIT_FILES[layout]})")
  tables = []
  for path in files:
    if layout == "parquet":
      tables.append(pq.read_table(path))
    else:
      with pa.memory_map(path) as source:
        tables.append(pa.ipc.open_stream(source).read_all())
  records = pa.concat_tables(tables).to_pylist()
  missing = [f for f in task.tfds_text_features if records and f not in records[0]]
  if missing:
    raise ValueError(f"{files[0]} has no column {missing} of {task.name} (its "
                     f"columns: {sorted(records[0])}); is it another task's file?")
  return examples_of_records(task, split, records)


# Where a split's files are, by layout (`{split}`: train, validation, ...).
_SPLIT_FILES = {"parquet": "{split}-*.parquet", "hfdisk": "{split}/*.arrow"}


def _split_files(directory: str, layout: str, split: str) -> list[str]:
  if layout == "hfdisk":
    from maelm_jax.data import prepare_data  # pylint: disable=g-import-not-at-top
    folder = os.path.join(directory, split)
    return prepare_data.hfdisk_files(folder) if os.path.isdir(folder) else []
  return sorted(glob.glob(os.path.join(directory, _SPLIT_FILES[layout].format(
      split=glob.escape(split)))))


def examples_of_records(task: GlueTask, split: str, records) -> list[GlueExample]:
  """GlueExamples of tfds-style records (the hub's columns are tfds's)."""
  examples = []
  for i, record in enumerate(records):
    raw = record.get("label", -1)
    if task.is_regression:
      label = float(raw)
      label = None if split.startswith("test") else label
    else:
      label = int(raw) if int(raw) >= 0 else None
    examples.append(GlueExample(int(record.get("idx", i)),
                                tuple(sources.tfds_text(record[f])
                                      for f in task.tfds_text_features),
                                label))
  return examples


# --------------------------------------------------------------------------
# A sample in SST-2's format, for trying the fine-tuning path offline.

_SAMPLE_WORDS = {
    1: ("good", "great", "moving", "funny", "charming", "gripping", "beautiful",
        "clever", "warm", "delightful"),
    0: ("bad", "dull", "boring", "flat", "clumsy", "tedious", "ugly", "lazy",
        "cold", "forgettable")}
_SAMPLE_SUBJECTS = ("the film", "the story", "the acting", "the script", "the ending",
                    "the music", "this movie", "the cast", "the director's work",
                    "the dialogue")
_SAMPLE_TEMPLATES = ("{subject} is {adverb} {word} .", "{subject} was {word} .",
                     "what a {word} film .", "{subject} felt {adverb} {word} to me .",
                     "i found {subject} {word} and {adverb} {other} .")
_SAMPLE_ADVERBS = ("very", "quite", "really", "rather", "truly", "surprisingly")


def write_sample_sst2(root: str, num_train: int = 4000, num_dev: int = 400,
                      seed: int = 0) -> str:
  """Writes `root/SST-2/{train,dev}.tsv`: templated sentences in SST-2's format
  and labels (1 positive), for running the fine-tuning path offline (the
  quickstart notebook). A sample, not SST-2: its accuracy says the mechanics
  work, nothing about a model. Returns `root`."""
  rng = np.random.default_rng(seed)
  directory = os.path.join(root, "SST-2")
  os.makedirs(directory, exist_ok=True)
  for name, count in (("train.tsv", num_train), ("dev.tsv", num_dev)):
    rows = ["sentence\tlabel"]
    for _ in range(count):
      label = int(rng.integers(2))
      words = _SAMPLE_WORDS[label]
      template = _SAMPLE_TEMPLATES[rng.integers(len(_SAMPLE_TEMPLATES))]
      rows.append(template.format(
          subject=_SAMPLE_SUBJECTS[rng.integers(len(_SAMPLE_SUBJECTS))],
          adverb=_SAMPLE_ADVERBS[rng.integers(len(_SAMPLE_ADVERBS))],
          word=words[rng.integers(len(words))], other=words[rng.integers(len(words))])
          + f"\t{label}")
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      f.write("\n".join(rows) + "\n")
  return root


# --------------------------------------------------------------------------
# One task's data, from either source.


class GlueData:
  """Where a task's train, dev and test examples come from."""

  def __init__(self, task: GlueTask, source: str = "tsv", data_dir: str = "",
               tfds_data_dir: str = ""):
    if source not in ("tsv", "tfds"):
      raise ValueError(f"--config.data.source={source!r}: use 'tsv' (a GLUE "
                       "directory in --config.data.dir) or 'tfds' (glue/<task>)")
    self.task = task
    self.source = source
    self.tfds_data_dir = tfds_data_dir or None
    self.dir, self.layout = (resolve_task_dir(task, data_dir) if source == "tsv"
                             else (None, None))

  def check_files(self, *, test: bool = False) -> None:
    """Fails fast (before any compilation) on a missing TSV file."""
    if self.source != "tsv":
      return
    if self.layout != "tsv":
      splits = ["train"] + [s.tfds_split for s in self.task.eval_splits]
      if test:
        splits += [s.test_tfds_split for s in self.task.eval_splits]
      missing = [s for s in splits if not _split_files(self.dir, self.layout, s)]
      if missing:
        raise FileNotFoundError(
            f"{self.dir} lacks the {missing} split(s) ({_SPLIT_FILES[self.layout]})"
            + (" (or set --config.data.predict_test=False)" if test and all(
                s.startswith("test") for s in missing) else ""))
      return
    names = ["train.tsv"] + [s.tsv_file for s in self.task.eval_splits]
    if test:
      names += [s.test_tsv_file for s in self.task.eval_splits]
    missing = [n for n in names if not os.path.isfile(os.path.join(self.dir, n))]
    if missing:
      hint = (" (or set --config.data.predict_test=False)" if test and
              all(n.startswith("test") for n in missing) else "")
      raise FileNotFoundError(f"{self.dir} lacks {missing}; a {self.task.tsv_dir} "
                              f"directory from download_glue_data.py has them{hint}")

  def train(self) -> list[GlueExample]:
    if self.source == "tfds":
      return read_tfds(self.task, "train", data_dir=self.tfds_data_dir)
    if self.layout != "tsv":
      return read_hub_split(self.task, self.dir, self.layout, "train")
    return read_tsv(self.task, os.path.join(self.dir, "train.tsv"), skip_malformed=True)

  def dev(self, split: EvalSplit) -> list[GlueExample]:
    if self.source == "tfds":
      return read_tfds(self.task, split.tfds_split, data_dir=self.tfds_data_dir)
    if self.layout != "tsv":
      return read_hub_split(self.task, self.dir, self.layout, split.tfds_split)
    return read_tsv(self.task, os.path.join(self.dir, split.tsv_file))

  def test(self, split: EvalSplit) -> list[GlueExample]:
    if self.source == "tfds":
      return read_tfds(self.task, split.test_tfds_split, data_dir=self.tfds_data_dir)
    if self.layout != "tsv":
      return read_hub_split(self.task, self.dir, self.layout, split.test_tfds_split)
    return read_tsv(self.task, os.path.join(self.dir, split.test_tsv_file),
                    labelled=False)


# --------------------------------------------------------------------------
# Encoding.


def truncated_pair_lengths(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
  """Lengths BERT's `_truncate_seq_pair` leaves: pop the longer text's last token
  (the second text's on a tie) until both fit in `budget` tokens."""
  if len_a + len_b <= budget:
    return len_a, len_b
  keep_a = min(len_a, max(math.ceil(budget / 2), budget - len_b))
  return keep_a, budget - keep_a


def encode_examples(examples: Sequence[GlueExample], tokenizer,
                    max_seq_len: int) -> np.ndarray:
  """int32 [N, max_seq_len] rows `[CLS] a [SEP] (b [SEP])` padded with [PAD]."""
  if not examples:
    return np.zeros((0, max_seq_len), np.int32)
  num_texts = len(examples[0].texts)
  columns = [tokenizer.encode([e.texts[i] for e in examples]) for i in range(num_texts)]
  ids = np.full((len(examples), max_seq_len), tokenizer.pad_id, np.int32)
  cls, sep = tokenizer.cls_id, tokenizer.sep_id
  for row, pieces in enumerate(zip(*columns)):
    if num_texts == 1:
      tokens = [cls] + pieces[0][:max_seq_len - 2] + [sep]
    else:
      keep_a, keep_b = truncated_pair_lengths(len(pieces[0]), len(pieces[1]),
                                              max_seq_len - 3)
      tokens = [cls] + pieces[0][:keep_a] + [sep] + pieces[1][:keep_b] + [sep]
    ids[row, :len(tokens)] = tokens
  return ids


def label_array(task: GlueTask, examples: Sequence[GlueExample]) -> np.ndarray:
  """int32 class ids or float32 scores, [N]."""
  if any(e.label is None for e in examples):
    raise ValueError(f"{task.name}: some examples have no label (a test set?)")
  dtype = np.float32 if task.is_regression else np.int32
  return np.asarray([e.label for e in examples], dtype)


def write_submission(path: str, task: GlueTask, indices: Sequence[int],
                     predictions: np.ndarray) -> None:
  """A GLUE server file: `index<TAB>prediction`, with label strings for
  classification and scores clipped to [0, 5] for STS-B."""
  with open(path, "w", encoding="utf-8") as f:
    f.write("index\tprediction\n")
    for index, prediction in zip(indices, predictions):
      if task.is_regression:
        value = f"{min(max(float(prediction), 0.0), 5.0):.3f}"
      else:
        value = task.labels[int(prediction)]
      f.write(f"{int(index)}\t{value}\n")

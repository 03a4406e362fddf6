"""Fine-tuning tasks: what a GLUE task or SQuAD brings to the one fine-tuning loop
(`run.py`): its data as model inputs, its head, loss and metrics, and how it writes
its predictions. The loop owns the rest (state, steps, checkpoints, the run's
workdir); a new task is a class with the same methods.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from absl import logging
import flax.linen as nn
import jax
import numpy as np

from maelm_jax.finetune import glue_data, heads, metrics as metrics_lib
from maelm_jax.finetune import squad_data, squad_metrics


@dataclasses.dataclass
class EvalSet:
  name: str  # "dev", "mnli_m", "mnli_mm", "squad".
  input_ids: np.ndarray  # int32 [N, max_seq_len]


@dataclasses.dataclass
class Evaluation:
  metrics: dict[str, float]
  outputs: Any  # What `write_predictions` needs (problem-specific).


# ------------------------------------------------------------------ GLUE --


class GlueProblem:
  """A GLUE task: classification (or STS-B regression) on the first token."""

  def __init__(self, config, check_data: bool = True):
    """check_data=False: the model side only (the planner compiles the step
    without reading data)."""
    self.config = config
    self.task = glue_data.get_task(config.task)
    self.main_metric = self.task.main_metric
    if not check_data:
      return
    self.data = glue_data.GlueData(self.task, config.data.source, config.data.dir,
                                   config.data.tfds_data_dir)
    self.data.check_files(test=config.data.predict_test)
    diagnostic = config.data.diagnostic_file
    if diagnostic and self.task.name != "mnli":
      raise ValueError("--config.data.diagnostic_file is scored by the MNLI model; "
                       f"drop it for task {self.task.name!r}")
    if diagnostic and not os.path.isfile(diagnostic):
      raise FileNotFoundError(f"--config.data.diagnostic_file={diagnostic!r} not "
                              "found; use GLUE's diagnostic/diagnostic.tsv")

  def load(self, tokenizer) -> None:
    """Reads and encodes every split (also the test sets, so that a bad file
    fails now rather than after training)."""
    encode = lambda examples: glue_data.encode_examples(
        examples, tokenizer, self.config.max_seq_len)
    train = _subset(self.data.train(), self.config.data.max_train_examples)
    self.train = {"input_ids": encode(train),
                  "label": glue_data.label_array(self.task, train)}
    self.dev_examples = {s.name: self.data.dev(s) for s in self.task.eval_splits}
    self.eval_sets = [EvalSet(s.name, encode(self.dev_examples[s.name]))
                      for s in self.task.eval_splits]
    self.test_sets = []  # (submission file, examples, input_ids)
    if self.config.data.predict_test:
      for split in self.task.eval_splits:
        examples = self.data.test(split)
        self.test_sets.append((split.submission_file, examples, encode(examples)))
    if self.config.data.diagnostic_file:
      examples = glue_data.read_diagnostic_tsv(self.config.data.diagnostic_file)
      self.test_sets.append((glue_data.DIAGNOSTIC_SUBMISSION_FILE, examples,
                             encode(examples)))
    logging.info("%s: %d train examples; dev %s", self.task.name, len(train),
                 {k: len(v) for k, v in self.dev_examples.items()})

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    """A training batch's arrays: name -> (shape after the batch axis, dtype)."""
    label = np.float32 if self.task.is_regression else np.int32
    return {"input_ids": ((self.config.max_seq_len,), np.int32), "label": ((), label)}

  def make_model(self, model_cfg, deterministic: bool) -> nn.Module:
    return heads.SequenceClassifier(model_cfg, self.task.num_outputs, deterministic,
                                    self.config.pooling)

  def loss(self, outputs, batch) -> jax.Array:
    if self.task.is_regression:
      return heads.regression_loss(outputs, batch["label"])
    return heads.classification_loss(outputs, batch["label"])

  def _predictions(self, outputs: np.ndarray) -> np.ndarray:
    return outputs[:, 0] if self.task.is_regression else outputs.argmax(axis=-1)

  def evaluate(self, outputs: dict[str, np.ndarray]) -> Evaluation:
    results, records = {}, []
    for split in self.task.eval_splits:
      examples = self.dev_examples[split.name]
      predictions = self._predictions(outputs[split.name])
      labels = glue_data.label_array(self.task, examples)
      for name, value in metrics_lib.compute(self.task.metrics, predictions,
                                             labels).items():
        results[split.metric_prefix + name] = value
      if not self.task.is_regression:
        # Beside every score, what always answering dev's most frequent class
        # scores, and how many classes the model answers at all (1: collapsed).
        majority = np.full_like(predictions, np.bincount(labels).argmax())
        for name, value in metrics_lib.compute(self.task.metrics, majority,
                                               labels).items():
          results[f"{split.metric_prefix}{MAJORITY}{name}"] = value
        results[split.metric_prefix + CLASSES_PREDICTED] = float(
            len(np.unique(predictions)))
      for example, prediction in zip(examples, predictions):
        record = {"index": example.index, "prediction": prediction.item(),
                  "label": example.label}
        if len(self.task.eval_splits) > 1:
          record["split"] = split.name
        records.append(record)
    return Evaluation(results, records)

  def predict_test(self, predict) -> list[tuple[str, list, np.ndarray]]:
    """(submission file, examples, predictions) of each test set; runs the
    model, so every process calls it."""
    return [(file_name, examples, self._predictions(predict(input_ids)))
            for file_name, examples, input_ids in self.test_sets]

  def write_predictions(self, workdir: str, evaluation: Evaluation,
                        test_predictions) -> None:
    with open(os.path.join(workdir, "eval_predictions.jsonl"), "w") as f:
      for record in evaluation.outputs:
        f.write(json.dumps(record) + "\n")
    if not test_predictions:
      return
    directory = os.path.join(workdir, "glue_submission")
    os.makedirs(directory, exist_ok=True)
    for file_name, examples, predictions in test_predictions:
      glue_data.write_submission(os.path.join(directory, file_name), self.task,
                                 [e.index for e in examples], predictions)
    logging.info("test predictions in %s", directory)


MAJORITY = "majority_"  # The prefix of the majority-class figures.
CLASSES_PREDICTED = "classes_predicted"


def collapse_warning(results: dict, main_metric: str, num_examples: int) -> str | None:
  """The line a summary must say when a classifier learned nothing usable: its
  dev predictions are all one class, or its score is within noise (two standard
  errors of an accuracy at that level) of always answering the majority class;
  None otherwise, and for tasks without the figures (regression, SQuAD)."""
  prefix, _, name = main_metric.rpartition("/")
  prefix = prefix + "/" if prefix else ""
  majority = results.get(f"{prefix}{MAJORITY}{name}")
  classes = results.get(prefix + CLASSES_PREDICTED)
  if majority is None or classes is None:
    return None
  score = results[main_metric]
  p = min(max(results.get(f"{prefix}{MAJORITY}accuracy", 0.5), 0.05), 0.95)
  noise = 2 * np.sqrt(p * (1 - p) / max(num_examples, 1))
  if classes > 1 and score > majority + noise:
    return None
  what = ("every dev prediction is one class" if classes <= 1 else
          f"{name} {score:.4f} is within noise (+-{noise:.3f}) of always answering "
          f"the majority class ({majority:.4f})")
  return (f"WARNING: {what}: the classifier learned nothing usable. What usually "
          "helps a small encoder: --config.pooling=mean, a higher "
          "--config.learning_rate (3e-4..1e-3 for one of a few M parameters), more "
          "--config.num_epochs or --config.data.max_train_examples")


# ----------------------------------------------------------------- SQuAD --


class SquadProblem:
  """SQuAD v1.1/v2.0: start/end logits over sliding windows."""

  main_metric = "f1"

  def __init__(self, config, check_data: bool = True):
    self.config = config
    self.version = config.version
    if self.version not in squad_metrics.VERSIONS:
      raise ValueError(f"config.version={self.version!r}: use "
                       "configs/squad.py:version=1.1 or version=2.0")
    if not check_data:
      return
    if config.data.source not in ("json", "tfds"):
      raise ValueError(f"--config.data.source={config.data.source!r}: use 'json' "
                       "(data.train_file / data.eval_file) or 'tfds' (squad/v<version>)")
    if config.data.source == "json":
      for flag in ("train_file", "eval_file"):
        path = config.data[flag]
        if not path or not os.path.isfile(path):
          raise FileNotFoundError(
              f"--config.data.{flag}={path!r} is not a file; pass the official "
              f"SQuAD v{self.version} JSON (e.g. {'train' if flag == 'train_file' else 'dev'}"
              f"-v{self.version}.json) or use --config.data.source=tfds")
    c = config
    if c.max_query_len < 1 or c.max_query_len + 3 >= c.max_seq_len:
      raise ValueError(f"max_query_len={c.max_query_len} leaves no room for context in "
                       f"max_seq_len={c.max_seq_len}; it must be in [1, max_seq_len - 4]")
    for name in ("doc_stride", "max_answer_len", "n_best"):
      if c[name] < 1:
        raise ValueError(f"{name}={c[name]} must be >= 1")

  def _read(self, which: str) -> list[squad_data.SquadExample]:
    data = self.config.data
    if data.source == "tfds":
      split = "train" if which == "train" else "validation"
      return squad_data.read_squad_tfds(self.version, split,
                                        data_dir=data.tfds_data_dir or None)
    path = data.train_file if which == "train" else data.eval_file
    examples = squad_data.read_squad_json(path)
    if self.version == "1.1" and any(e.is_impossible for e in examples):
      raise ValueError(f"{path} has unanswerable questions (SQuAD v2.0); use "
                       "configs/squad.py:version=2.0")
    return examples

  def load(self, tokenizer) -> None:
    c = self.config
    make = lambda examples, training: squad_data.make_features(
        examples, tokenizer, max_seq_len=c.max_seq_len, doc_stride=c.doc_stride,
        max_query_len=c.max_query_len, training=training)
    train = make(_subset(self._read("train"), c.data.max_train_examples), True)
    self.train = {"input_ids": train.input_ids,
                  "start_positions": train.start_positions,
                  "end_positions": train.end_positions}
    self.examples = self._read("eval")
    self.features = make(self.examples, False)
    self.eval_sets = [EvalSet("squad", self.features.input_ids)]
    logging.info("SQuAD v%s: %d train windows; %d dev questions in %d windows",
                 self.version, len(train), len(self.examples), len(self.features))

  def batch_spec(self) -> dict[str, tuple[tuple[int, ...], Any]]:
    """A training batch's arrays: name -> (shape after the batch axis, dtype)."""
    return {"input_ids": ((self.config.max_seq_len,), np.int32),
            "start_positions": ((), np.int32), "end_positions": ((), np.int32)}

  def make_model(self, model_cfg, deterministic: bool) -> nn.Module:
    return heads.SpanExtractor(model_cfg, deterministic)

  def loss(self, outputs, batch) -> jax.Array:
    start_logits, end_logits = outputs
    return heads.span_loss(start_logits, end_logits, batch["start_positions"],
                           batch["end_positions"])

  def evaluate(self, outputs: dict[str, Any]) -> Evaluation:
    start_logits, end_logits = outputs["squad"]
    decoded = squad_data.decode(self.examples, self.features, start_logits, end_logits,
                                n_best=self.config.n_best,
                                max_answer_len=self.config.max_answer_len)
    predictions = squad_data.final_predictions(
        decoded, self.version, self.config.null_score_diff_threshold)
    gold = squad_data.gold_answers(self.examples)
    results = squad_metrics.evaluate(gold, predictions, self.version)
    if self.version == "2.0":
      results.update(squad_metrics.best_thresholds(gold, decoded.best_text,
                                                   decoded.no_answer_score))
    return Evaluation(results, (predictions, decoded))

  def predict_test(self, predict) -> list:
    del predict  # SQuAD's test sets are hidden; there is nothing to predict.
    return []

  def write_predictions(self, workdir: str, evaluation: Evaluation,
                        test_predictions) -> None:
    del test_predictions
    predictions, decoded = evaluation.outputs
    with open(os.path.join(workdir, "predictions.json"), "w") as f:
      json.dump(predictions, f, indent=1, ensure_ascii=False)
    if self.version == "2.0":
      with open(os.path.join(workdir, "null_odds.json"), "w") as f:
        json.dump(decoded.no_answer_score, f, indent=1)


def _subset(examples: list, limit: int) -> list:
  """A fixed random subset (the same for every seed of a sweep), or all."""
  if not limit or limit >= len(examples):
    return examples
  keep = np.sort(np.random.default_rng(0).permutation(len(examples))[:limit])
  return [examples[i] for i in keep]

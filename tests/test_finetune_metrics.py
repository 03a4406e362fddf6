"""The GLUE metrics against values computed by hand (comments show the arithmetic),
and against scikit-learn and scipy on random predictions."""

import math

import numpy as np
import pytest

from maelm_jax.finetune import glue_data, metrics


def test_accuracy():
  assert metrics.accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
  assert metrics.accuracy(np.array([2, 0, 1]), np.array([2, 0, 1])) == 1.0


def test_f1_of_the_positive_class():
  # tp = 2 (rows 0, 4), fp = 1 (row 1), fn = 1 (row 3): F1 = 2*2 / (2*2 + 1 + 1).
  assert metrics.f1_score([1, 1, 0, 0, 1], [1, 0, 0, 1, 1]) == pytest.approx(2 / 3)
  # No positive predicted: precision is undefined, F1 is 0 (sklearn's convention).
  assert metrics.f1_score([0, 0, 0], [1, 0, 1]) == 0.0
  # Class 0 as the positive class: tp=1 (row 0), fp=0, fn=1 (row 1).
  assert metrics.f1_score([0, 1, 1], [0, 0, 1], positive=0) == pytest.approx(2 / 3)


def test_matthews_binary_by_hand():
  # tp=2, tn=1, fp=1, fn=1: (2*1 - 1*1) / sqrt((2+1)(2+1)(1+1)(1+1)) = 1/6.
  predictions = [1, 1, 0, 0, 1]
  labels = [1, 0, 0, 1, 1]
  assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(1 / 6)
  assert metrics.matthews_corrcoef(labels, labels) == pytest.approx(1.0)
  assert metrics.matthews_corrcoef([1 - x for x in labels], labels) == pytest.approx(-1.0)
  # A constant predictor (the collapsed CoLA model) has MCC 0, not NaN.
  assert metrics.matthews_corrcoef([1, 1, 1, 1, 1], labels) == 0.0


def test_matthews_multiclass_by_hand():
  # Confusion (rows true, cols predicted): [[2,0,0],[1,0,1],[0,1,1]].
  # t = (2,2,2), p = (3,1,2), correct 3, n 6:
  # (3*6 - (6+2+4)) / sqrt((36 - (9+1+4)) * (36 - 12)) = 6 / sqrt(22 * 24).
  value = metrics.matthews_corrcoef([0, 2, 1, 0, 0, 2], [0, 1, 2, 0, 1, 2])
  assert value == pytest.approx(6 / math.sqrt(22 * 24))


def test_pearson_by_hand():
  # dx = (-1.5,-.5,.5,1.5), dy = (-3,-1,0,4): 11 / sqrt(5 * 26).
  assert metrics.pearson_corrcoef([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(
      11 / math.sqrt(130))
  assert metrics.pearson_corrcoef([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  assert metrics.pearson_corrcoef([2, 2, 2], [1, 2, 3]) == 0.0  # Undefined -> 0.


def test_ranks_average_ties():
  np.testing.assert_array_equal(metrics.rankdata([10, 20, 10, 30, 20, 20]),
                                [1.5, 4, 1.5, 6, 4, 4])


def test_spearman_by_hand():
  # Ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4): 4.5 / sqrt(4.5 * 5).
  assert metrics.spearman_corrcoef([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(
      4.5 / math.sqrt(22.5))
  # Any increasing relation is a perfect rank correlation, unlike Pearson's.
  x = np.array([0.5, 1.0, 2.0, 3.0, 4.0])
  assert metrics.spearman_corrcoef(x, x**3) == pytest.approx(1.0)
  assert metrics.pearson_corrcoef(x, x**3) < 0.99


def test_mismatched_shapes_are_rejected():
  with pytest.raises(ValueError, match="same length"):
    metrics.accuracy([1, 0], [1, 0, 1])


@pytest.mark.parametrize("name,expected_keys", [
    ("cola", ["matthews_corr"]), ("sst2", ["accuracy"]), ("mrpc", ["accuracy", "f1"]),
    ("qqp", ["accuracy", "f1"]), ("stsb", ["pearson", "spearman"]),
    ("mnli", ["accuracy"]), ("qnli", ["accuracy"]), ("rte", ["accuracy"]),
    ("wnli", ["accuracy"]),
])
def test_each_task_reports_its_official_metrics(name, expected_keys):
  task = glue_data.get_task(name)
  predictions = np.array([1.0, 0.0, 1.0, 1.0])
  labels = np.array([1.0, 1.0, 1.0, 0.0])
  values = metrics.compute(task.metrics, predictions, labels)
  assert list(values) == expected_keys
  # The main metric is one of them, prefixed by the dev set for MNLI.
  assert task.main_metric.split("/")[-1] in expected_keys
  if "accuracy" in values:
    assert values["accuracy"] == 0.5
  if "f1" in values:  # tp=2, fp=1, fn=1.
    assert values["f1"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", range(20))
def test_metrics_equal_sklearn_and_scipy(seed):
  """Parity with the implementations the GLUE leaderboard's numbers come from,
  on random predictions: binary and 3-class, imbalanced, with ties in the
  regression scores, and collapsed to one class (MCC and F1 undefined: 0)."""
  sklearn_metrics = pytest.importorskip("sklearn.metrics")
  stats = pytest.importorskip("scipy.stats")
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 300))
  classes = 2 if seed % 2 else 3
  labels = rng.choice(classes, n, p=rng.dirichlet(np.ones(classes)))
  predictions = np.where(rng.random(n) < 0.6, labels, rng.integers(0, classes, n))
  if seed % 5 == 0:
    predictions = np.zeros(n, int)  # One class only.
  assert metrics.accuracy(predictions, labels) == pytest.approx(
      sklearn_metrics.accuracy_score(labels, predictions))
  assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
      sklearn_metrics.matthews_corrcoef(labels, predictions), abs=1e-12)
  if classes == 2:
    assert metrics.f1_score(predictions, labels) == pytest.approx(
        sklearn_metrics.f1_score(labels, predictions, zero_division=0), abs=1e-12)
  x = np.round(rng.normal(size=n), 1)  # Rounded: ties, as STS-B's 0-5 scores have.
  y = np.round(x + rng.normal(scale=0.7, size=n), 1)
  assert metrics.pearson_corrcoef(x, y) == pytest.approx(stats.pearsonr(x, y)[0],
                                                         abs=1e-12)
  assert metrics.spearman_corrcoef(x, y) == pytest.approx(stats.spearmanr(x, y)[0],
                                                          abs=1e-12)


def test_a_collapsed_classifier_is_named_in_its_summary():
  """The first-day report: SST-2 at 0.5092, every one of 872 predictions class 1,
  the share of class 1 in dev, and the summary said nothing."""
  from maelm_jax.finetune import run as finetune_run, tasks  # pylint: disable=import-outside-toplevel
  collapsed = {"accuracy": 0.5092, "majority_accuracy": 0.5092,
               "classes_predicted": 1.0}
  results = {"task": "sst2", "step": 125, "main_metric": "accuracy",
             "best": {"step": 125, "epoch": 1, "accuracy": 0.5092}, **collapsed}
  text = finetune_run.summary("/tmp/sst2", results, num_dev=872)
  assert "always the majority class: accuracy 0.5092" in text
  assert "every dev prediction is one class" in text and "--config.pooling=mean" in text
  # Two classes, but within noise of the majority (2 standard errors: 0.034).
  near = {"accuracy": 0.53, "majority_accuracy": 0.5092, "classes_predicted": 2.0}
  assert "within noise" in tasks.collapse_warning(near, "accuracy", 872)
  learned = {"accuracy": 0.615, "majority_accuracy": 0.5092, "classes_predicted": 2.0}
  assert tasks.collapse_warning(learned, "accuracy", 872) is None
  # MNLI's prefixed splits; CoLA's Matthews correlation (majority: 0).
  mnli = {"mnli_m/accuracy": 0.36, "mnli_m/majority_accuracy": 0.354,
          "mnli_m/classes_predicted": 3.0}
  assert "within noise" in tasks.collapse_warning(mnli, "mnli_m/accuracy", 9815)
  cola = {"matthews_corr": 0.21, "majority_matthews_corr": 0.0,
          "majority_accuracy": 0.69, "classes_predicted": 2.0}
  assert tasks.collapse_warning(cola, "matthews_corr", 1043) is None
  assert tasks.collapse_warning({"spearman": 0.1}, "spearman", 1500) is None

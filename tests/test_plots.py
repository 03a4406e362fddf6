"""A run's figures show every logged step, not only its evaluations: training
loss, learning rate and throughput beside the held-out curves (pretraining),
training loss and dev metrics (fine-tuning); and a sweep's score against the
learning rate with each rate's seed range."""

import json

import pytest

from maelm_jax.core import workdir as workdir_lib
from maelm_jax.finetune import sweep
from maelm_jax.run import plots


def write_metrics(workdir, records):
  workdir.mkdir(exist_ok=True)
  with open(workdir_lib.metrics_path(str(workdir)), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def test_the_learning_curve_draws_training_steps_beside_the_evaluations(tmp_path):
  records = [{"step": s, "train/loss": 9.0 - s / 10, "lr": s * 1e-4,
              "tokens_per_sec": 1000.0 + s} for s in range(10, 101, 10)]
  for record in records[4::5]:  # Two evaluations, at steps 50 and 100.
    record.update({"eval/mask_accuracy": record["step"] / 1000,
                   "eval/mask_loss": 8.0, "eval/unigram_accuracy": 0.05,
                   "eval/unigram_loss": 7.5, "eval/bigram_accuracy": 0.1})
  write_metrics(tmp_path, records)
  drawn = plots.plot_learning_curve(str(tmp_path))
  steps = list(range(10, 101, 10))
  assert drawn["accuracy on held-out [MASK] slots (%)"]["model"] == ([50, 100],
                                                                     [5.0, 10.0])
  assert drawn["loss (nats)"]["training (selected positions)"][0] == steps
  assert drawn["learning rate"]["lr"] == (steps, pytest.approx([s * 1e-4 for s in steps]))
  assert drawn["throughput (tokens/s)"]["tokens/s"][1][-1] == 1100.0
  assert (tmp_path / plots.FILENAME).stat().st_size > 10_000
  write_metrics(tmp_path, records[:3])  # No evaluation yet: no figure to draw.
  assert plots.plot_learning_curve(str(tmp_path)) is None


def test_the_finetuning_curve_has_the_loss_per_step_and_the_dev_metrics_per_epoch(
    tmp_path):
  records = [{"step": s, "train/loss": 0.7 - s / 100, "lr": 1e-3} for s in (5, 10, 15, 20)]
  records += [{"step": 10, "eval/accuracy": 0.6, "eval/f1": 0.5},
              {"step": 20, "eval/accuracy": 0.8, "eval/f1": 0.7}]
  write_metrics(tmp_path, records)
  drawn = plots.plot_finetuning_curve(str(tmp_path), ["accuracy", "f1"])
  assert drawn["training loss"]["loss"][0] == [5, 10, 15, 20]
  assert drawn["dev (per epoch)"] == {"accuracy": ([10, 20], [0.6, 0.8]),
                                      "f1": ([10, 20], [0.5, 0.7])}
  assert (tmp_path / plots.FINETUNING_FILENAME).stat().st_size > 10_000


def test_a_sweeps_figure_is_each_rates_median_and_seed_range(tmp_path):
  for seed, (low, high) in enumerate([(0.60, 0.70), (0.70, 0.50), (0.65, 0.72)]):
    for lr, accuracy in ((1e-5, low), (2e-5, high)):
      directory = tmp_path / "rte" / sweep.run_name(lr, seed)
      directory.mkdir(parents=True)
      (directory / "eval_results.json").write_text(json.dumps(
          {"task": "rte", "learning_rate": lr, "seed": seed, "main_metric": "accuracy",
           "best": {"step": 1, "epoch": 1, "accuracy": accuracy}, "accuracy": accuracy}))
  sweep.write_report(str(tmp_path))
  assert (tmp_path / "report.png").stat().st_size > 10_000
  drawn = sweep.plot_report(sweep.build_report(str(tmp_path)), str(tmp_path / "x.png"))
  rates, medians, lows, highs = drawn["rte"]
  assert rates == [1e-5, 2e-5]
  assert medians == pytest.approx([65.0, 70.0])
  assert lows == pytest.approx([60.0, 50.0]) and highs == pytest.approx([70.0, 72.0])


@pytest.mark.parametrize("value,drawn", [
    ("0", False), ("false", False), ("No", False), (" off ", False),
    ("1", True), ("true", True), ("", True)])
def test_maelm_plots_turns_figures_off_in_the_words_people_write(monkeypatch, value, drawn):
  monkeypatch.setenv("MAELM_PLOTS", value)
  assert plots.enabled() is drawn

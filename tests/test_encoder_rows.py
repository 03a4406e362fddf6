"""studies/encoder_rows.py: a pretrained encoder's row (compute, held-out [MASK]
accuracy, BLiMP, GLUE medians with their seed ranges) read from its workdir and the
scorers' outputs, and the table and figure of studies/does-pretraining-pay.md drawn
from the committed rows (studies/results/device_encoders.json)."""

import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies"))

import encoder_rows  # noqa: E402  pylint: disable=wrong-import-position

ROWS = ROOT / "studies" / "results" / "device_encoders.json"


def fake_workdir(path, *, objective, mask_ratio, logged_steps, saved_step):
  (path / "checkpoints" / str(saved_step)).mkdir(parents=True)
  (path / "checkpoints" / "tmp").mkdir()  # Not a step: left out.
  (path / "config.json").write_text(json.dumps({
      "batch_size": 64, "seq_len": 128, "total_steps": 1000, "total_flops": 2e15,
      "seed": 1, "learning_rate": 1e-2, "relative_updates": True,
      "model": {"objective": objective, "decoder_type": "cross", "size": "tiny",
                "num_layers": 8, "hidden": 0, "mask_ratio": mask_ratio,
                "dtype": "bfloat16", "mlp_activation": "geglu"}}))
  with open(path / "metrics.jsonl", "w") as f:
    for step in logged_steps:
      f.write(json.dumps({"step": step, "train/loss": 3.0}) + "\n")
      f.write(json.dumps({"step": step, "eval/mask_accuracy": step / 1000,
                          "eval/mask_loss": 7 - step / 200}) + "\n")
  return str(path)


def test_a_row_holds_the_saved_step_its_flops_and_each_task_median_with_its_range(tmp_path):
  workdir = fake_workdir(tmp_path / "w1", objective="maelm", mask_ratio=0.15,
                         logged_steps=[200, 400], saved_step=450)
  blimp = {"w1": {"mean": 61.5, "pairs": 7200}}
  # score_encoders' form: every metric's median, the main metric's seed range.
  scores = {"enc": {"glue": {
      "sst2": {"median": {"accuracy": 0.801, "loss": 0.45},
               "seed_range": [0.79, 0.812], "learning_rate": 1e-3},
      "cola": {"median": {"accuracy": 0.7, "matthews_corr": 0.125},
               "seed_range": [0.1, 0.15], "learning_rate": 3e-4}}}}
  row = encoder_rows.encoder_row("enc", workdir, blimp, scores, run="grow")
  # SIGTERM saved step 450 after the last log at 400: the row is the saved encoder.
  assert (row["steps"], row["schedule_steps"], row["run"]) == (450, 1000, "grow")
  assert row["flops"] == pytest.approx(2e15 * 450 / 1000)
  assert row["tokens"] == 450 * 64 * 128
  assert row["shape"] == "8x128"  # num_layers set, hidden from the size `tiny`.
  assert (row["heldout_mask_accuracy"], row["heldout_mask_rate"]) == (0.4, 0.15)
  assert row["heldout_mask_loss"] == 5.0  # The last evaluation's, at step 400.
  # The recipe a knob comparison varies: as configured, defaults where unset.
  assert row["recipe"] == {"seed": 1, "learning_rate": 1e-2, "relative_updates": True,
                           "mlp_activation": "geglu", "normformer": False,
                           "mask_ratio_start": 0.0}
  assert (row["blimp"], row["blimp_pairs"], row["dtype"]) == (61.5, 7200, "bfloat16")
  # In points, of each task's main metric (CoLA: Matthews correlation x 100).
  assert row["sst2"] == pytest.approx({"median": 80.1, "low": 79.0, "high": 81.2,
                                       "learning_rate": 1e-3})
  assert row["cola"] == pytest.approx({"median": 12.5, "low": 10.0, "high": 15.0,
                                       "learning_rate": 3e-4})
  assert row["qnli"] is None  # Nobody scored it.
  line = encoder_rows.markdown([{**row, "device": "one NVIDIA H200 (call 2)"}])[2]
  assert line == ("| MAE-LM (cross), 8 x 128, batch 64, bfloat16, 45% of its "
                  "schedule | one H200 | 900 TFLOP | 4 M | 40.0% | 61.5 | "
                  "80.1 (79.0 to 81.2) |  | 12.5 (10.0 to 15.0) |")


def test_the_figure_draws_each_run_against_flops_and_each_control_as_a_line(tmp_path):
  def g(median, low, high):
    return {"median": median, "low": low, "high": high, "learning_rate": 1e-3}
  base = {"objective": "mlm", "decoder_type": "none", "shape": "8x128",
          "batch_size": 128, "seq_len": 128, "heldout_mask_rate": 0.15,
          "blimp_pairs": 7200, "device": "one NVIDIA H200", "qnli": None, "cola": None}
  rows = [
      {**base, "name": "control", "run": "control", "flops": 0, "steps": 0,
       "heldout_mask_accuracy": None, "blimp": 49.7, "sst2": g(71.0, 70.2, 72.8),
       "device": "2 CPU cores"},
      {**base, "name": "mlm_half", "run": "mlm", "flops": 2e15, "steps": 10,
       "heldout_mask_accuracy": 0.30, "blimp": 57.0, "sst2": None},
      {**base, "name": "mlm", "run": "mlm", "flops": 4e15, "steps": 20,
       "heldout_mask_accuracy": 0.40, "blimp": 61.0, "sst2": g(77.0, 76.0, 78.0)},
      {**base, "name": "3ml", "run": "3ml", "objective": "3ml", "flops": 3e15,
       "steps": 20, "heldout_mask_accuracy": 0.2, "heldout_mask_rate": 0.5,
       "blimp": 58.0, "sst2": None},
  ]
  path = tmp_path / "encoders.png"
  drawn = encoder_rows.plot(rows, str(path))
  blimp, acc = drawn["BLiMP, 36 paradigms (%)"], drawn["held-out [MASK] accuracy at 15% (%)"]
  sst2 = drawn["SST-2 (median of 3 seeds)"]
  assert blimp["mlm"] == ([2000.0, 4000.0], [57.0, 61.0])  # TFLOPs, one line a run.
  assert blimp["control"] == ([], [49.7]) and sst2["control"] == ([], [71.0])
  assert sst2["mlm"] == ([4000.0], [77.0])  # Only the scored point.
  assert "3ml" in blimp and "3ml" not in acc  # Its 50% masking is another measure.
  assert acc["mlm"][1] == pytest.approx([30.0, 40.0])
  assert path.stat().st_size > 20_000
  # What a 7,200-pair mean can tell apart: about +-1.1 points near 60.
  assert encoder_rows.blimp_interval(60.0, 7200) == pytest.approx(1.13, abs=0.01)


def test_the_results_table_is_the_committed_rows(capsys):
  """studies/does-pretraining-pay.md carries the table the command prints from the
  JSON rows, so a row added or rescored there cannot leave the prose's table behind."""
  assert encoder_rows.main(["--out", str(ROWS), "--markdown"]) == 0
  table = capsys.readouterr().out.strip()
  rows = json.loads(ROWS.read_text())
  assert len(table.splitlines()) == len(rows) + 2
  assert table in (ROOT / "studies" / "does-pretraining-pay.md").read_text(), (
      "studies/does-pretraining-pay.md's encoder table differs from studies/results/"
      "device_encoders.json: paste the output of python studies/encoder_rows.py "
      "--out=studies/results/device_encoders.json --markdown")

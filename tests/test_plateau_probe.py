"""studies/plateau_probe.py: when a probe left the plateau, in steps and FLOPs."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "studies"))
import plateau_probe  # noqa: E402


def _row(step, accuracy, unigram=0.06, bigram=0.16, **extra):
  return {"step": step, "eval/mask_accuracy": accuracy, "eval/mask_loss": 6.0,
          "eval/unigram_accuracy": unigram, "eval/unigram_loss": 6.6,
          "eval/bigram_accuracy": bigram, **extra}


def test_crossing_step_interpolates_between_the_evaluations_around_it():
  # Ratios to unigram 1.0, 1.0, 1.5: 1.25 is crossed half-way from step 50 to 75.
  rows = [_row(25, 0.06), _row(50, 0.06), _row(75, 0.09)]
  assert plateau_probe.crossing_step(rows, 1.25) == pytest.approx(62.5)
  assert plateau_probe.crossing_step(rows, 1.5) == pytest.approx(75.0)
  assert plateau_probe.crossing_step(rows, 2.0) is None
  # Already above at the first evaluation: that evaluation's step, not earlier.
  assert plateau_probe.crossing_step([_row(25, 0.12)], 1.25) == 25.0


def test_table_reads_the_recorded_flops_without_the_probes_workdir(tmp_path):
  # The probe's workdir in the temporary folder is gone (a restarted machine);
  # the figure recorded with its results is enough for the table.
  name = "probe_whose_workdir_is_gone"
  assert not plateau_probe.probe_workdir(name).exists()
  rows = [_row(100, 0.06), _row(200, 0.09), _row(300, 0.18)]
  results = tmp_path / "probes.jsonl"
  results.write_text("".join(
      json.dumps(dict(r, name=name, train_flops_per_step=5e10)) + "\n" for r in rows))
  line = plateau_probe.table(str(results), [name]).splitlines()[-1]
  cells = [c.strip() for c in line.strip("|").split("|")]
  # GFLOP/step; left at the 200 evaluation (1.5x); interpolated 1.25x at step 150
  # = 7.5 TFLOP; above bigram (16%) at step 300 = 15 TFLOP.
  assert cells[:5] == [name, "50.0", "200 (10.00)", "150 (7.50)", "300 (15.00)"]
  assert cells[5] == "18.0% / 6.00 (step 300)"
  # Twice unigram: ratio 1.5 at step 200 and 3.0 at 300, so 2.0 a third of the way.
  assert cells[8] == "233 (11.67)"


def test_a_probe_without_data_stops_at_once_saying_so(tmp_path):
  # No data folder beside the checkout is assumed: without --data (or --source)
  # the probe says what is missing, in one line, before it trains a tokenizer
  # or a model.
  tokenizer, out = tmp_path / "tok" / "tokenizer.model", tmp_path / "probes.jsonl"
  done = subprocess.run(
      [sys.executable, plateau_probe.__file__, "--name=no_data", "--steps=1",
       f"--tokenizer={tokenizer}", f"--out={out}"],
      capture_output=True, text=True, timeout=120, check=False,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert done.returncode != 0
  assert done.stderr.splitlines() == [plateau_probe.MISSING_DATA], done.stderr
  assert plateau_probe.MISSING_DATA.startswith(
      "--data is required: the folder of the downloaded data")
  assert not tokenizer.parent.exists() and not out.exists()

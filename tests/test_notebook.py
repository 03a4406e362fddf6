"""The Colab quickstart runs top to bottom, so it never rots.

Executed with a real Jupyter kernel on a small budget (the notebook reads its
step and example counts from the environment), offline, as a new user runs it:
without MAELM_GLUE_DIR, so fine-tuning reads the sample the package ships. Its
transformers cell runs again under transformers 5.x, on the same export.
"""

import json
import os
import pathlib
import subprocess

import pytest

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("transformers")

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
TRANSFORMERS5_PYTHON = (os.environ.get("MAELM_TRANSFORMERS5_PYTHON")
                        or str(REPO / ".venv" / "transformers5" / "bin" / "python"))


def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch, plots_on):
  work = tmp_path / "work"
  # Small unless set (MAELM_QUICKSTART_STEPS=800 MAELM_QUICKSTART_EXAMPLES=4000:
  # the notebook's own defaults, for timing it). 8 steps still make every cell's
  # work (a warm-up, 4 evaluations, a checkpoint): this test 68.1 and 62.2 CPU-s
  # against 94.4 and 90.6 at 24 (alternating; benchmarks/test-suite-cost.md).
  steps = os.environ.get("MAELM_QUICKSTART_STEPS", "8")
  monkeypatch.setenv("MAELM_QUICKSTART_STEPS", steps)
  monkeypatch.setenv("MAELM_QUICKSTART_EXAMPLES",
                     os.environ.get("MAELM_QUICKSTART_EXAMPLES", "256"))
  monkeypatch.setenv("MAELM_QUICKSTART_DIR", str(work))
  monkeypatch.delenv("MAELM_GLUE_DIR", raising=False)  # The shipped sample.
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf_modules"))
  monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "1")  # A Colab CPU runtime has one.
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                          resources={"metadata": {"path": str(REPO / "notebooks")}}
                          ).execute()

  outputs = "\n".join(out.get("text", "") for cell in notebook.cells
                      if cell.cell_type == "code" for out in cell.get("outputs", []))
  for objective in ("mlm", "maelm"):
    assert (work / objective / "checkpoints" / steps).is_dir()
  rank = json.loads((work / "rank" / "rank.json").read_text())
  assert sorted(run["objective"] for run in rank["runs"].values()) == ["maelm", "mlm"]
  assert (work / "rank" / "effective_rank.png").stat().st_size > 10_000
  assert "accuracy" in (work / "sst2" / "eval_results.json").read_text()
  assert (work / "sample_glue" / "SST-2" / "train.tsv").is_file()
  difference = float(outputs.split("largest difference to maelm-jax:")[1].split()[0])
  assert difference < 1e-4
  assert "sentence vectors: (2, 128)" in outputs
  # Each command's log streams into its cell, its first lines too (the cell
  # printed only the last 14 lines once a run had ended).
  assert outputs.count("tokenizer: read all") == 1 and "Training a 3000-piece" in outputs

  # The last cell is transformers only: it runs as it is under transformers 5.
  if not os.path.exists(TRANSFORMERS5_PYTHON):
    if os.environ.get("MAELM_TRANSFORMERS5_PYTHON"):
      pytest.fail(f"MAELM_TRANSFORMERS5_PYTHON={TRANSFORMERS5_PYTHON} does not exist")
    pytest.skip("no transformers 5.x environment; `make test` builds it")
  last = [c for c in notebook.cells if c.cell_type == "code"][-1].source
  assert "from transformers import" in last
  done = subprocess.run(
      [TRANSFORMERS5_PYTHON, "-c", f"import pathlib\nWORK = pathlib.Path({str(work)!r})\n"
       + last + "\nimport transformers\nprint('transformers', transformers.__version__)"],
      capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
      env=dict(os.environ, HF_HUB_OFFLINE="1",
               HF_MODULES_CACHE=str(tmp_path / "hf_modules5")))
  assert done.returncode == 0, done.stderr[-3000:]
  assert "transformers 5." in done.stdout
  assert float(done.stdout.split("largest difference to maelm-jax:")[1].split()[0]) < 1e-4

"""The Colab quickstart runs top to bottom, so it never rots.

Executed with a real Jupyter kernel on a small budget (the notebook reads its
step and example counts from the environment), offline: SST-2 comes from
../shared/data when present, else from a small file in the SST-2 format.
"""

import json
import os
import pathlib
import random

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("transformers")

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "quickstart.ipynb"
SHARED_SST2 = REPO.parent / "shared" / "data" / "glue" / "SST-2"


def sst2_root(tmp_path) -> pathlib.Path:
  if (SHARED_SST2 / "train.tsv").exists():
    return SHARED_SST2.parent
  rng = random.Random(0)
  words = {1: "good great fine lovely".split(), 0: "bad dull awful boring".split()}
  task = tmp_path / "glue" / "SST-2"
  task.mkdir(parents=True)
  for name, count in (("train.tsv", 400), ("dev.tsv", 64)):
    rows = ["sentence\tlabel"]
    for _ in range(count):
      label = rng.randint(0, 1)
      rows.append(f"the film was {rng.choice(words[label])} and long\t{label}")
    (task / name).write_text("\n".join(rows) + "\n")
  return task.parent


def test_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
  work = tmp_path / "work"
  # Small unless set (MAELM_QUICKSTART_STEPS=800 MAELM_QUICKSTART_EXAMPLES=4000:
  # the notebook's own defaults, for timing it).
  steps = os.environ.get("MAELM_QUICKSTART_STEPS", "24")
  monkeypatch.setenv("MAELM_QUICKSTART_STEPS", steps)
  monkeypatch.setenv("MAELM_QUICKSTART_EXAMPLES",
                     os.environ.get("MAELM_QUICKSTART_EXAMPLES", "256"))
  monkeypatch.setenv("MAELM_QUICKSTART_DIR", str(work))
  monkeypatch.setenv("MAELM_GLUE_DIR", str(sst2_root(tmp_path)))
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
  difference = float(outputs.split("largest difference to maelm-jax:")[1].split()[0])
  assert difference < 1e-4
  assert "sentence vectors: (2, 128)" in outputs

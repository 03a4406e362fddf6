"""The fault-injection harness (maelm_jax.tools.chaos), short: a pretraining and its
fine-tuning killed in chosen phases, then compared bit for bit with
uninterrupted runs. The long random version is in benchmarks/faults.md."""

import json
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from maelm_jax.tools import chaos
from maelm_jax.run import checkpoints

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

PLANS = {
    "pretrain": [("compilation", "SIGKILL"), ("steps", "SIGTERM"),
                 ("checkpoint write", "SIGKILL"), ("pruning", "SIGKILL"),
                 ("first batches", "SIGKILL")],
    "glue": [("checkpoint write", "SIGKILL"), ("steps", "SIGTERM")],
}


@pytest.fixture(scope="module")
def harness(tmp_path_factory, tokenizer_file):
  out = tmp_path_factory.mktemp("chaos") / "out"
  summaries = chaos.chaos(str(out), runs=("pretrain", "glue"), steps=18, plans=PLANS,
                          tokenizer=tokenizer_file)
  return out, {s["run"]: s for s in summaries}


def test_killed_runs_end_bitwise_equal_to_uninterrupted_ones(harness):
  out, summaries = harness
  for mode, plan in PLANS.items():
    summary = summaries[mode]
    assert summary["failures"] == [], summary["failures"]
    assert summary["kills"] == len(plan)
    assert [k["signal"] for k in summary["kill_log"]] == [s for _, s in plan]
    state = summary["final_state"]
    assert state["differing_leaves"] == [] and state["differing_items"] == []
    assert state["leaves"] > 50 and state["bytes"] > 1_000_000  # Params and Adam.
    assert summary["steps_lost_beyond_checkpoint"] == 0
    assert summary["processes_left_behind"] == 0
    assert summary["sigterm_saved"] == "1/1"
    # Killed mid-write: the partial checkpoint was there, and thrown away.
    write = [k for k in summary["kill_log"] if k["target"] == "checkpoint write"][0]
    assert write["phase"] == "checkpoint write" and write["in_flight_bytes"] > 0
    assert write["committed_step"] < write["logged_step"] + 1
    assert summary["failed_starts"] == []
  # Killed while an old checkpoint was being deleted: the next life started.
  prune = [k for k in summaries["pretrain"]["kill_log"] if k["target"] == "pruning"][0]
  assert prune["phase"] == "pruning" and prune["exit_code"] == -9
  assert prune["resumed_from"] == prune["committed_step"]
  pretrain = summaries["pretrain"]
  assert pretrain["metrics"]["records"] == 18 and pretrain["metrics"]["train_steps_once"]
  assert [k["phase"] for k in pretrain["kill_log"]][0] == "compilation"
  report = json.loads((out / "chaos_report.json").read_text())
  assert [r["run"] for r in report["runs"]] == ["pretrain", "glue"]


def test_the_comparison_sees_one_changed_bit(harness, tmp_path):
  """A final state one float apart (the smallest step from one value) is
  named; so is a metrics record with another loss."""
  out, _ = harness
  reference, copy = out / "pretrain" / "reference", tmp_path / "copy"
  shutil.copytree(out / "pretrain" / "chaos", copy)
  step = checkpoints.latest_step(str(copy))
  state_dir = copy / "checkpoints" / str(step) / "state"
  state = checkpoints.read_arrays(str(state_dir))
  kernel = state["params"]["encoder"]
  path, leaf = next((p, x) for p, x in jax.tree_util.tree_flatten_with_path(kernel)[0]
                    if x.dtype == np.float32 and x.size > 100)
  leaf.flat[7] = np.nextafter(leaf.flat[7], np.float32(np.inf))
  shutil.rmtree(state_dir)
  ocp.PyTreeCheckpointer().save(str(state_dir), state)
  result = chaos.compare_final_state(str(reference), str(copy))
  assert result["differing_leaves"] == ["['params']['encoder']" +
                                        jax.tree_util.keystr(path)]

  lines = (copy / "metrics.jsonl").read_text().splitlines()
  record = json.loads(lines[4])
  record["train/loss"] = np.nextafter(record["train/loss"], 0.0)
  lines[4] = json.dumps(record)
  (copy / "metrics.jsonl").write_text("\n".join(lines) + "\n")
  assert chaos.compare_metrics(str(reference), str(copy))["differing_records"] == [4]


def test_every_launch_keeps_the_callers_xla_flags_but_its_device_count():
  env = chaos.life_env(2, {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                                        "--xla_backend_optimization_level=1",
                           "HOME": "/h"})
  assert env["XLA_FLAGS"] == ("--xla_force_host_platform_device_count=2 "
                              "--xla_backend_optimization_level=1")
  assert env["JAX_NUM_CPU_DEVICES"] == "2" and env["HOME"] == "/h"
  assert chaos.life_env(1, {})["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"


def test_lost_work_and_left_processes_are_failures():
  kills = [chaos.Kill(life=1, target="steps", signal="SIGKILL", phase="steps",
                      logged_step=11, trained=True, committed_step=9, resumed_from=6,
                      exit_code=-9, orphans=1)]
  clean = {"differing_leaves": [], "differing_items": [], "step": 20, "leaves": 1,
           "bytes": 4}
  summary = chaos.summarize("pretrain", {"kills": kills, "lives": 2, "misses": 0,
                                         "last_orphans": 0, "wall_seconds": 1.0,
                                         "quarantined": []}, clean,
                            {"records": 20, "differing_records": [],
                             "train_steps_once": True})
  assert summary["steps_lost_beyond_checkpoint"] == 3
  assert summary["steps_redone"] == 5
  assert summary["failures"] == ["work lost beyond the last committed checkpoint",
                                 "processes left behind by a dead run"]
  assert "lost" in chaos.table(summary)


def test_a_start_that_exits_with_an_error_is_a_failure():
  """A life that stopped by itself with an error (the report's: a half-deleted
  step blocked every start) fails the harness, whatever else matched."""
  kills = [chaos.Kill(life=1, target="steps", signal="SIGKILL", phase="steps",
                      logged_step=4, trained=True, committed_step=3, resumed_from=3,
                      exit_code=-9)]
  clean = {"differing_leaves": [], "differing_items": [], "step": 20, "leaves": 1,
           "bytes": 4}
  run = {"kills": kills, "lives": 3, "misses": 0, "last_orphans": 0,
         "wall_seconds": 1.0, "quarantined": [],
         "failed_starts": [{"life": 2, "exit_code": 1,
                            "error": "error: checkpoints/40: not a finished"}]}
  summary = chaos.summarize("pretrain", run, clean, {
      "records": 20, "differing_records": [], "train_steps_once": True})
  assert summary["failures"] == [
      "life 2 exited 1 without a signal: error: checkpoints/40: not a finished"]


def test_an_earlier_harness_output_is_never_written_over(tmp_path):
  (tmp_path / "chaos_report.json").write_text("{}")
  with pytest.raises(FileExistsError, match="not empty"):
    chaos.chaos(str(tmp_path), runs=("pretrain",), kills=1)
  assert (tmp_path / "chaos_report.json").read_text() == "{}"

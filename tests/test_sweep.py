"""Pretraining sweeps declared in configs, FLOP budgets, and the comparison
command end to end at toy size (two objectives, one seed, SST-2 format)."""

import json
import pathlib
import subprocess

import pytest

from maelm_jax import compare, sweep
from maelm_jax.run import config_lib
from maelm_jax.modeling import flops, model as model_lib
from tests.helpers import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

# A sweep config as a user writes one: the base, the runs, the fine-tuning protocol.
SWEEP_CONFIG = '''
import importlib.util
_spec = importlib.util.spec_from_file_location("p", "REPO/configs/pretrain.py")
pretrain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pretrain)

def get_config(arg=None):
  config = pretrain.get_config("objective=maelm,size=tiny")
  config.unlock()
  config.data.source = "pydoc:"
  config.data.eval_fraction = 0.1
  config.tokenizer.vocab_size = 600
  config.batch_size, config.seq_len = 8, 64
  config.model.dtype = "float32"
  config.total_flops = float(arg or 3) * BUDGET_PER_STEP
  config.warmup_steps = 1
  config.eval_every = config.checkpoint_every = config.log_every = 1
  config.eval_batches = 1
  config.baseline_tokens = 20_000
  return config

def get_sweep(arg=None):
  return [{"name": "mlm_seed0", "model.objective": "mlm", "seed": 0},
          {"name": "maelm_seed0", "model.objective": "maelm", "seed": 0}]

def get_finetune(arg=None):
  return {"config_file": "REPO/configs/glue.py",
          "common": {"learning_rate": 1e-3, "dtype": "float32", "batch_size": 16,
                      "pooling": "mean", "dropout": 0.0, "attention_dropout": 0.0},
          "tasks": {"sst2": {"num_epochs": 1, "max_seq_len": 24}}, "seeds": (1, 2),
          "learning_rates": (1e-3, 3e-3), "select_seeds": (1,)}
'''


def per_step(objective, **overrides):
  config = tiny_config(objective, **{"tokenizer.vocab_size": 600, "batch_size": 8,
                                     "seq_len": 64, **overrides})
  model_cfg = model_lib.ModelConfig.from_config(config.model, 600, 4)
  return flops.train_flops_per_step(model_cfg, 64, 8)


def write_sweep_config(tmp_path) -> str:
  # The budget unit is MLM's step, so MLM runs `arg` steps and MAE-LM (whose
  # decoder makes a step dearer) fewer.
  path = tmp_path / "my_sweep.py"
  path.write_text(SWEEP_CONFIG.replace("REPO", str(REPO)).replace(
      "BUDGET_PER_STEP", str(per_step("mlm"))))
  return str(path)


def test_a_flop_budget_sets_each_objectives_step_count():
  mlm, maelm = per_step("mlm"), per_step("maelm")
  assert maelm > mlm  # The self-attention decoder runs over the full length.
  budget = 10 * maelm
  for objective, cost in (("mlm", mlm), ("maelm", maelm)):
    config = tiny_config(objective, **{"tokenizer.vocab_size": 600, "batch_size": 8,
                                       "seq_len": 64, "total_flops": budget})
    assert config.total_steps == round(budget / cost)
    assert config_lib.train_flops_per_step(config) == cost
  assert tiny_config("mlm", total_flops=1.0).total_steps == 1  # At least one step.
  # A warm-up ratio follows each run's own step count.
  config = tiny_config("maelm", **{"tokenizer.vocab_size": 600, "batch_size": 8,
                                   "seq_len": 64, "total_flops": budget,
                                   "warmup_ratio": 0.25})
  assert (config.total_steps, config.warmup_steps) == (10, 2)


def test_sweep_expands_and_prints_one_launch_command_per_run(tmp_path):
  config_file = write_sweep_config(tmp_path) + ":6"
  runs = sweep.expand(config_file, {"learning_rate": 1e-3})
  assert [r["name"] for r in runs] == ["mlm_seed0", "maelm_seed0"]
  assert [r["config"].total_steps for r in runs][0] == 6
  assert runs[1]["config"].total_steps < 6
  assert runs[1]["config"].model.decoder_type == "self"  # The objective's default.
  assert all(r["config"].learning_rate == 1e-3 for r in runs)
  with pytest.raises(ValueError, match="set per run by the sweep"):
    sweep.expand(config_file, {"seed": 3})

  local, pod, slurm = (sweep.launch_commands(runs, config_file, "/shared/s", {}, launcher)
                       for launcher in sweep.LAUNCHERS)
  assert local[0].startswith("launch/local.sh --num_processes=")
  assert "--workdir=/shared/s/mlm_seed0" in local[0]
  assert "--config.model.objective=maelm" in local[1]
  assert "--skip_copy" not in pod[0] and "--skip_copy --skip_install" in pod[1]
  assert slurm[1].startswith("sbatch launch/slurm_gpu.sbatch -- --config=")


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
  """`python -m maelm_jax.compare` at toy size, once for the tests below."""
  tmp = tmp_path_factory.mktemp("compare")
  config_file = write_sweep_config(tmp) + ":4"
  from tests.test_finetune_e2e import write_sst2  # pylint: disable=g-import-not-at-top
  from tests.test_blimp import write_blimp  # pylint: disable=g-import-not-at-top
  write_sst2(tmp / "glue" / "SST-2")
  write_blimp(tmp / "blimp", pairs=4)
  out = tmp / "out"
  done = subprocess.run(
      [sys_executable(), "-m", "maelm_jax.compare", f"--config={config_file}",
       f"--out={out}", f"--glue_dir={tmp / 'glue'}", "--tasks=sst2",
       "--num_tokens=128", f"--blimp_dir={tmp / 'blimp'}", "--blimp_curve_pairs=2"],
      capture_output=True, text=True, timeout=900, cwd=REPO)
  assert done.returncode == 0, done.stderr[-3000:]
  return config_file, out, done


def sys_executable():
  import sys  # pylint: disable=g-import-not-at-top
  return sys.executable


def test_compare_writes_one_table_and_one_figure(comparison):
  _, out, done = comparison
  summary = json.loads((out / "comparison.json").read_text())
  rows = {r["run"]: r for r in summary["runs"]}
  assert set(rows) == {"mlm_seed0", "maelm_seed0"}
  assert rows["mlm_seed0"]["steps"] == 4 and rows["maelm_seed0"]["steps"] < 4
  # Equal compute: each run spent its budget to within one step.
  for name, cost in (("mlm_seed0", per_step("mlm")), ("maelm_seed0", per_step("maelm"))):
    assert abs(rows[name]["flops"] - 4 * per_step("mlm")) <= cost / 2
    assert 0 <= rows[name]["downstream"]["sst2"] <= 1
    assert 0 < rows[name]["rank_real_last"] <= 128
    assert rows[name]["mask_accuracy"] is not None
  assert {g["group"] for g in summary["groups"]} == {"mlm", "maelm"}
  table = (out / "comparison.md").read_text()
  assert "| mlm |" in table and "| maelm_seed0 |" in table
  assert (out / "comparison.png").stat().st_size > 10_000
  assert (out / "tokenizer" / "tokenizer.model").exists()  # One for both runs.
  assert "| mlm |" in done.stdout
  for name, row in rows.items():  # BLiMP of the newest checkpoint, 12 pairs.
    blimp_result = json.loads((out / "blimp" / name / f"step{row['steps']}_all.json")
                              .read_text())
    assert blimp_result["pairs"] == 12 and row["blimp"] == blimp_result["mean"]
    # One small BLiMP per kept checkpoint, for the curves.
    assert sorted(p.name for p in (out / "blimp_curve" / name).iterdir()) == sorted(
        f"step{s}_2.json" for s in range(row["steps"] - 2, row["steps"] + 1))
  assert (out / "curves.png").stat().st_size > 10_000


def test_compare_picks_each_encoders_rate_on_a_split_of_the_training_data(comparison):
  _, out, _ = comparison
  train = (out / "glue" / "SST-2" / "train.tsv").read_text().splitlines()
  scored = set((out / "glue" / "SST-2" / "dev.tsv").read_text().splitlines()[1:])
  select_train = (out / "glue_select" / "SST-2" / "train.tsv").read_text().splitlines()
  select_dev = (out / "glue_select" / "SST-2" / "dev.tsv").read_text().splitlines()
  assert select_train[0] == select_dev[0] == train[0]  # The header, kept.
  assert len(select_dev) - 1 == round(0.2 * (len(train) - 1))
  assert sorted(select_train[1:] + select_dev[1:]) == sorted(train[1:])
  assert not scored & set(select_dev[1:])  # Never the scored data.
  summary = json.loads((out / "comparison.json").read_text())
  for row in summary["runs"]:
    selection = json.loads((out / "select" / row["run"] / "report.json").read_text())
    by_rate = selection["tasks"]["sst2"]["by_learning_rate"]
    assert sorted(by_rate) == ["0.001", "0.003"]
    best = max(by_rate, key=lambda r: by_rate[r]["median"]["accuracy"])
    assert row["learning_rates"]["sst2"] == float(best)
    # The scored runs: the chosen rate only, every fine-tuning seed.
    runs = sorted(p.name for p in (out / "finetune" / row["run"] / "sst2").iterdir())
    assert runs == [f"lr{float(best):g}_seed1", f"lr{float(best):g}_seed2"]
    low, high = row["downstream_range"]["sst2"]
    assert low <= row["downstream"]["sst2"] <= high


def test_rerun_trains_nothing_and_another_config_is_refused(comparison, monkeypatch):
  config_file, out, _ = comparison
  tokenizer = str(out / "tokenizer" / "tokenizer.model")
  calls = []
  monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a))
  runs = sweep.run_sweep(config_file, str(out / "pretrain"),
                         {"tokenizer.path": tokenizer})
  assert calls == [] and len(runs) == 2
  with pytest.raises(ValueError, match="another config") as error:
    sweep.run_sweep(config_file, str(out / "pretrain"),
                    {"tokenizer.path": tokenizer, "learning_rate": 1e-4})
  assert "learning_rate" in str(error.value) and calls == []


def test_too_little_heldout_text_for_the_ranks_is_said_before_any_run(comparison,
                                                                      monkeypatch):
  """The effective rank comes last, after hours of pretraining and fine-tuning:
  a --num_tokens the held-out text cannot fill is refused first, with this
  command's flags (it ended the command after all that work)."""
  config_file, out, _ = comparison
  monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: pytest.fail("pretrained"))
  with pytest.raises(ValueError, match=r"fewer than --num_tokens=10000000, which the "
                     r"effective rank reads after the runs: lower --num_tokens .*"
                     r"--config.data.eval_fraction"):
    compare.compare(config_file, str(out), {}, glue_dir=str(out.parent / "glue"),
                    tasks=("sst2",), num_tokens=10**7)


def test_the_same_text_files_spelt_from_another_directory_are_the_same_run(
    tmp_path, monkeypatch):
  """A sweep re-run from another directory, or with the absolute path, is the
  same run (it was refused: 'text:/work/data/*.txt' -> 'text:../data/*.txt')."""
  (tmp_path / "data").mkdir()
  (tmp_path / "main").mkdir()
  monkeypatch.chdir(tmp_path / "main")
  saved = {"data": {"source": f"text:{tmp_path}/data/*.txt,{tmp_path}/more/*.gz"}}
  same = {"data": {"source": "text:../data/*.txt,../more/*.gz"}}
  other = {"data": {"source": "text:../data/*.jsonl,../more/*.gz"}}
  assert config_lib.config_differences(saved, same) == []
  assert config_lib.config_differences(saved, other) == [
      f"data.source: 'text:{tmp_path}/data/*.txt,{tmp_path}/more/*.gz' -> "
      "'text:../data/*.jsonl,../more/*.gz'"]
  assert config_lib.config_differences({"data": {"source": "pydoc:"}},
                                       {"data": {"source": "pydoc:"}}) == []


def test_compare_config_picks_objectives_and_its_untrained_control_is_the_init(tmp_path):
  """configs/compare.py `objectives=` and `random=1`: the control's checkpoint
  holds exactly the seed's initial weights (one step at learning rate 0)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import train, train_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import pretrained as pretrained_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from maelm_jax.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  config_file = str(REPO / "configs" / "compare.py")
  toy = {"data.source": "pydoc:", "data.eval_fraction": 0.05, "tokenizer.vocab_size": 600,
         "batch_size": 8, "seq_len": 64, "eval_batches": 1, "baseline_tokens": 20_000}
  runs = sweep.expand(config_file + ":objectives=mlm+maelmx,random=1,frac_3ml=0,seeds=3",
                      {**toy, "model.num_layers": 3})
  assert [r["name"] for r in runs] == ["mlm_seed3", "maelmx_seed3", "random_seed3"]
  maelmx, control = runs[1]["config"], runs[2]["config"]
  assert (maelmx.model.objective, maelmx.model.decoder_type) == ("maelm", "cross")
  assert maelmx.total_steps > 1 and control.total_steps == 1 and control.seed == 3
  assert all(r["config"].model.num_layers == 3 for r in runs)  # Overrides reach all.
  assert float(train_lib.learning_rate_schedule(control)(0)) == 0.0
  with pytest.raises(ValueError, match=r"objectives='mlm\+bert'.*unknown \['bert'\]"):
    sweep.expand(config_file + ":objectives=mlm+bert", toy)

  workdir = tmp_path / "random_seed3"
  train.train_and_evaluate(control, str(workdir))
  saved, step = pretrained_lib.restore_params(str(workdir))
  assert step == 1
  tokenizer = tokenizer_lib.Tokenizer(workdir / tokenizer_lib.TOKENIZER_FILENAME)
  model_cfg = model_lib.ModelConfig.from_config(control.model, tokenizer.vocab_size,
                                                tokenizer.mask_id)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  init, _ = train_lib.create_sharded_state(model_cfg, control.seq_len,
                                           train_lib.make_optimizer(control), mesh, 3)
  leaves = jax.tree.leaves(jax.tree.map(
      lambda a, b: np.array_equal(np.asarray(a), b), init.params, saved))
  assert leaves and all(leaves)


def test_comparison_figure_draws_the_untrained_control_as_a_level_line(tmp_path, monkeypatch):
  from matplotlib import axes as axes_lib  # pylint: disable=g-import-not-at-top
  group = lambda name, tflops, sst2, acc: {
      "group": name, "flops": tflops * 1e12, "pretraining_seeds": 1, "mask_accuracy": acc,
      "downstream": {"sst2": sst2}, "downstream_spread": {"sst2": [sst2, sst2]},
      "rank_real_last": 40.0, "blimp": 52.0 if name == compare.UNTRAINED_GROUP else None}
  summary = {"runs": [], "groups": [group("mlm", 10, 0.76, 0.17), group("mlm", 20, 0.78, 0.2),
                                    group(compare.UNTRAINED_GROUP, 0.05, 0.74, 0.001)]}
  levels = []
  original = axes_lib.Axes.axhline
  monkeypatch.setattr(axes_lib.Axes, "axhline", lambda self, y=0, *a, **k: (
      levels.append((self.get_title(), round(y, 6), k.get("label"))),
      original(self, y, *a, **k))[1])
  xlims = []
  monkeypatch.setattr(axes_lib.Axes, "set_xlim", lambda self, *a, **k: xlims.append(a))
  compare.plot(summary, ["sst2"], str(tmp_path / "c.png"))
  assert sorted(levels) == [("", 0.1, "untrained"), ("", 52.0, "untrained"),
                            ("", 74.0, "untrained")]
  assert xlims.count(((0, 21.0),)) == 3  # Each panel: no compute to the largest budget.
  assert (tmp_path / "c.png").stat().st_size > 10_000
  assert "| random | 0.1 | 1 | 0.1 | 52.0 | 74.0 (74.0-74.0) | 40.0 |" in compare.format_markdown(
      summary, ["sst2"])

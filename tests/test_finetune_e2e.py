"""Fine-tuning end to end, from a tiny model pretrained once per test session.

Tasks are synthetic but written in the real formats (GLUE TSV, SQuAD JSON), so
each run goes through the same readers, CLI and outputs as a real one. Runs that
only check plumbing use dropout 0: on XLA:CPU, dropout's random bits make the
train step compile 2-3x slower.
"""

import json
import os
import pathlib
import random
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from maelm_jax.run import checkpoints, config_lib
from maelm_jax.run import pretrained as pretrained_lib
from maelm_jax.modeling import model as model_lib
from maelm_jax.core import sharding
from maelm_jax.finetune import heads, run, squad_metrics, sweep
from tests import helpers
from tests.helpers import built_once, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "configs"))
import glue as glue_config  # noqa: E402
import squad as squad_config  # noqa: E402

# Real runs as processes, or compiles for TPU chips: `make test-quick` leaves
# this file out (pytest.ini's `slow`).
pytestmark = pytest.mark.slow

# ---------------------------------------------------------------- Fixtures --


@pytest.fixture(scope="session")
def pretrained(tmp_path_factory):
  """A 2-step tiny MAE-LM pretraining workdir, built once and shared by the
  pytest-xdist workers."""
  from maelm_jax.run import train  # pylint: disable=g-import-not-at-top

  def build(workdir):
    config = tiny_config("maelm", **{
        "data.source": "pydoc:", "data.eval_fraction": 0.05,
        "tokenizer.vocab_size": 600, "batch_size": 8, "seq_len": 64,
        "total_steps": 2, "warmup_steps": 1, "eval_batches": 1, "log_every": 1,
        "eval_every": 2, "checkpoint_every": 2, "model.dropout": 0.0,
        "model.attention_dropout": 0.0})
    train.train_and_evaluate(config, str(workdir))

  return built_once(tmp_path_factory, "tiny_maelm_pretrained", build)


POSITIVE, NEGATIVE = ("good", "great", "nice"), ("bad", "poor", "awful")
FILLER = ("the a of to in is it that for on with as this by be are from at or "
          "an which").split()


def sentiment_rows(count, seed):
  """(sentence, label): filler words and one positive or negative word."""
  rng = random.Random(seed)
  rows = []
  for i in range(count):
    words = rng.choices(FILLER, k=6)
    words.insert(rng.randrange(7), rng.choice(POSITIVE if i % 2 else NEGATIVE))
    rows.append((" ".join(words), i % 2))
  return rows


def write_sst2(directory, num_train=320, num_dev=40, num_test=10):
  directory.mkdir(parents=True)
  for name, count, seed in (("train.tsv", num_train, 0), ("dev.tsv", num_dev, 1)):
    with open(directory / name, "w") as f:
      f.write("sentence\tlabel\n")
      f.writelines(f"{s} \t{label}\n" for s, label in sentiment_rows(count, seed))
  with open(directory / "test.tsv", "w") as f:
    f.write("index\tsentence\n")
    f.writelines(f"{100 + i}\t{s}\n" for i, (s, _) in
                 enumerate(sentiment_rows(num_test, 2)))
  return directory


def glue_test_config(task, pretrained, data_dir, **overrides):
  config = glue_config.get_config(f"task={task}")
  config.init_from = str(pretrained)
  config.data.dir = str(data_dir)
  config.max_seq_len = 24
  return small_and_fast(config, overrides)


def small_and_fast(config, overrides):
  """One fp32 epoch of batch 16 without dropout, then `overrides` (dotted keys)."""
  config.batch_size = 16
  config.eval_batch_size = 16
  config.num_epochs = 1
  config.learning_rate = 1e-3
  config.dropout = 0.0
  config.attention_dropout = 0.0
  config.dtype = "float32"
  for key, value in overrides.items():
    config_lib.set_path(config, key, value)
  return config


def read_jsonl(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


# ----------------------------------------------------------------- GLUE --


def test_glue_cli_learns_sst2_format_and_writes_every_output(tmp_path, pretrained):
  data = write_sst2(tmp_path / "SST-2")
  workdir = tmp_path / "run"
  cmd = [sys.executable, "-m", "maelm_jax.main", "--config=configs/glue.py:task=sst2",
         f"--config.init_from={pretrained}", f"--config.data.dir={tmp_path}",
         f"--workdir={workdir}", "--config.max_seq_len=16", "--config.batch_size=16",
         "--config.eval_batch_size=16", "--config.num_epochs=2",
         "--config.learning_rate=1e-3", "--config.dtype=float32",
         "--config.dropout=0", "--config.attention_dropout=0",
         "--config.data.predict_test=True", "--config.log_every=5"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert (f"loaded encoder (token_embed, encoder) from step 2 of {pretrained}; maelm "
          "decoder (self, 1 layers) and LM head not loaded") in out.stderr

  results = json.loads((workdir / "eval_results.json").read_text())
  # 320 examples / 16 = 20 steps per epoch; dev is evaluated after each epoch.
  assert [(h["step"], h["epoch"]) for h in results["history"]] == [(20, 1), (40, 2)]
  assert (results["task"], results["step"], results["main_metric"]) == (
      "sst2", 40, "accuracy")
  assert results["accuracy"] == results["history"][-1]["accuracy"]
  assert results["best"]["accuracy"] == max(h["accuracy"] for h in results["history"])
  # The label is one word among six fillers: chance is 0.5. Measured: 1.0.
  assert results["best"]["accuracy"] >= 0.9
  # Beside the score, always answering dev's majority class (labels alternate).
  assert results["majority_accuracy"] == 0.5 and results["classes_predicted"] == 2
  assert "always the majority class: accuracy 0.5000" in out.stdout
  assert "WARNING" not in out.stdout

  # One prediction per dev example (40 = 2 full eval batches + a padded one).
  dev_labels = [label for _, label in sentiment_rows(40, 1)]
  records = read_jsonl(workdir / "eval_predictions.jsonl")
  assert [r["index"] for r in records] == list(range(40))
  assert [r["label"] for r in records] == dev_labels
  assert np.mean([r["prediction"] == r["label"] for r in records]) == pytest.approx(
      results["accuracy"])

  submission = (workdir / "glue_submission" / "SST-2.tsv").read_text().splitlines()
  assert submission[0] == "index\tprediction"
  assert [line.split("\t")[0] for line in submission[1:]] == [str(100 + i)
                                                              for i in range(10)]
  assert {line.split("\t")[1] for line in submission[1:]} <= {"0", "1"}

  logged = read_jsonl(workdir / "metrics.jsonl")
  assert [r["step"] for r in logged if "eval/accuracy" in r] == [20, 40]
  assert all(np.isfinite(r["train/loss"]) for r in logged if "train/loss" in r)
  assert json.loads((workdir / "config.json").read_text())["task"] == "sst2"
  assert "Done: sst2" in out.stdout
  assert checkpoints.latest_step(workdir) == 40  # Kept by default: exportable.


def mnli_files(directory):
  """MNLI-format files; the label is the last word of the hypothesis."""
  header = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\t"
            "sentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\t"
            "sentence2")
  labels = ("entailment", "neutral", "contradiction")
  cue = {"entailment": "yes", "neutral": "maybe", "contradiction": "no"}

  def rows(count, with_labels):
    out = []
    for i in range(count):
      label = labels[i % 3]
      row = f"{i}\t1\t1n\tfiction\t( a )\t( b )\t(ROOT a)\t(ROOT b)\tit is {i}\t" \
            f"so {cue[label]}"
      out.append(row + (f"\t{label}\t{label}" if with_labels else ""))
    return "\n".join(out) + "\n"

  directory.mkdir(parents=True)
  (directory / "train.tsv").write_text(f"{header}\tlabel1\tgold_label\n" + rows(48, True))
  (directory / "dev_matched.tsv").write_text(f"{header}\tlabel1\tgold_label\n" +
                                             rows(20, True))
  (directory / "dev_mismatched.tsv").write_text(f"{header}\tlabel1\tgold_label\n" +
                                                rows(19, True))
  (directory / "test_matched.tsv").write_text(f"{header}\n" + rows(5, False))
  (directory / "test_mismatched.tsv").write_text(f"{header}\n" + rows(6, False))
  diagnostic = directory.parent / "diagnostic.tsv"
  diagnostic.write_text("index\tsentence1\tsentence2\n" +
                        "".join(f"{i}\tthe cat\tthe dog\n" for i in range(7)))
  return diagnostic


def test_mnli_reports_matched_and_mismatched_and_writes_all_submissions(
    tmp_path, pretrained):
  diagnostic = mnli_files(tmp_path / "glue" / "MNLI")
  config = glue_test_config("mnli", pretrained, tmp_path / "glue",
                            **{"data.predict_test": True,
                               "data.diagnostic_file": str(diagnostic)})
  results = run.run(config, str(tmp_path / "run"))
  assert set(results) >= {"mnli_m/accuracy", "mnli_mm/accuracy"}
  assert results["main_metric"] == "mnli_m/accuracy"
  records = read_jsonl(tmp_path / "run" / "eval_predictions.jsonl")
  by_split = {s: [r for r in records if r["split"] == s] for s in ("mnli_m", "mnli_mm")}
  assert [len(v) for v in by_split.values()] == [20, 19]
  for split, split_records in by_split.items():
    assert [r["label"] for r in split_records] == [i % 3 for i in range(len(split_records))]
    assert np.mean([r["prediction"] == r["label"] for r in split_records]) == \
        pytest.approx(results[f"{split}/accuracy"])
  submission = tmp_path / "run" / "glue_submission"
  assert sorted(os.listdir(submission)) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
  for name, rows in (("MNLI-m.tsv", 5), ("MNLI-mm.tsv", 6), ("AX.tsv", 7)):
    lines = (submission / name).read_text().splitlines()
    assert len(lines) == rows + 1
    assert all(line.split("\t")[1] in ("entailment", "neutral", "contradiction")
               for line in lines[1:])


# ----------------------------------------------------------------- SQuAD --

NAMES = ("alice", "bob", "carol", "dave", "erin", "frank")
PLACES = ("paris", "rome", "oslo", "lima", "cairo", "quito")


def squad_v2_file(path, count, seed):
  """Articles in the official v2.0 schema; every third question unanswerable."""
  rng = random.Random(seed)
  paragraphs = []
  for i in range(count):
    name, place = rng.choice(NAMES), rng.choice(PLACES)
    context = (f"this is the story number {i} . the traveller {name} went to {place} "
               "by train and stayed there for a long time before going home again .")
    start = context.index(place)
    if i % 3 == 2:
      qa = {"id": f"q{i}", "question": "who flew to the moon ?", "answers": [],
            "is_impossible": True,
            "plausible_answers": [{"text": name, "answer_start": context.index(name)}]}
    else:
      qa = {"id": f"q{i}", "question": f"where did {name} go ?", "is_impossible": False,
            "answers": [{"text": place, "answer_start": start},
                        {"text": f"to {place}", "answer_start": start - 3}]}
    paragraphs.append({"context": context, "qas": [qa]})
  path.write_text(json.dumps({"version": "v2.0",
                              "data": [{"title": "t", "paragraphs": paragraphs}]}))
  return path


def squad_test_config(pretrained, train_file, eval_file, **overrides):
  config = squad_config.get_config("version=2.0")
  config.init_from = str(pretrained)
  config.data.train_file = str(train_file)
  config.data.eval_file = str(eval_file)
  config.max_seq_len = 32  # Contexts are ~35 tokens: several windows each.
  config.doc_stride = 8
  config.max_query_len = 8
  return small_and_fast(config, overrides)


def test_squad_v2_end_to_end_writes_official_outputs(tmp_path, pretrained):
  train_file = squad_v2_file(tmp_path / "train-v2.0.json", 64, seed=0)
  eval_file = squad_v2_file(tmp_path / "dev-v2.0.json", 21, seed=1)
  workdir = tmp_path / "run"
  results = run.run(squad_test_config(pretrained, train_file, eval_file), str(workdir))

  dataset = json.loads(eval_file.read_text())
  contexts = {p["qas"][0]["id"]: p["context"] for p in dataset["data"][0]["paragraphs"]}
  predictions = json.loads((workdir / "predictions.json").read_text())
  assert sorted(predictions) == sorted(contexts)  # Every question answered.
  assert all(text in contexts[qid] for qid, text in predictions.items())
  null_odds = json.loads((workdir / "null_odds.json").read_text())
  assert sorted(null_odds) == sorted(contexts)
  # A question is left unanswered exactly when its no-answer score beats 0.
  assert all((predictions[q] == "") == (null_odds[q] > 0.0) for q in predictions)

  on_disk = json.loads((workdir / "eval_results.json").read_text())
  assert on_disk["task"] == "squad_v2.0" and on_disk["main_metric"] == "f1"
  assert (on_disk["total"], on_disk["HasAns_total"], on_disk["NoAns_total"]) == (21, 14, 7)
  # The official metrics recomputed from predictions.json give the same numbers.
  gold = {p["qas"][0]["id"]: [a["text"] for a in p["qas"][0]["answers"]]
          for p in dataset["data"][0]["paragraphs"]}
  recomputed = squad_metrics.evaluate(gold, predictions, "2.0")
  for key in ("exact_match", "f1", "HasAns_f1", "NoAns_f1"):
    assert on_disk[key] == pytest.approx(recomputed[key]), key
  # The best threshold can only do better than the configured one (0).
  assert on_disk["best_f1"] >= on_disk["f1"] - 1e-9
  assert results["f1"] == on_disk["f1"]


# ---------------------------------------------------------------- Sweep --


def write_stsb(directory, num_train=32, num_dev=12):
  header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t" \
           "sentence2\tscore\n"
  rng = random.Random(0)
  directory.mkdir(parents=True)
  for name, count in (("train.tsv", num_train), ("dev.tsv", num_dev)):
    lines = [header]
    for i in range(count):
      score = rng.choice([0.0, 1.2, 2.5, 3.8, 5.0])
      filler = " ".join(rng.choices(FILLER, k=3))
      lines.append(f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t"
                   f"{'good' if score > 2 else 'bad'} {filler}\ta man\t"
                   f"{score:.3f}\n")
    (directory / name).write_text("".join(lines))


def test_sweep_runs_the_grid_resumes_and_reports(tmp_path, pretrained, monkeypatch):
  write_stsb(tmp_path / "glue" / "STS-B")
  sweep_dir = tmp_path / "sweep"
  overrides = {"init_from": str(pretrained), "data.dir": str(tmp_path / "glue"),
               "max_seq_len": 24, "batch_size": 16, "eval_batch_size": 16,
               "num_epochs": 1, "dropout": 0.0, "attention_dropout": 0.0,
               "dtype": "float32"}
  points = sweep.grid_configs(str(REPO / "configs" / "glue.py"), ["stsb"], overrides,
                              [1e-3], [1, 2])
  directories = sweep.run_grid(points, str(sweep_dir))
  assert [os.path.relpath(d, sweep_dir) for d in directories] == [
      "stsb/lr0.001_seed1", "stsb/lr0.001_seed2"]
  spearman, pearson = [], []
  for directory in directories:
    results = json.loads(open(os.path.join(directory, "eval_results.json")).read())
    assert results["learning_rate"] == 1e-3 and results["batch_size"] == 16
    assert set(results["best"]) == {"step", "epoch", "pearson", "spearman"}
    spearman.append(results["best"]["spearman"])
    pearson.append(results["best"]["pearson"])
  assert pearson[0] != pearson[1]  # The seeds really differ.

  # Running the grid again finds both results and runs nothing.
  with monkeypatch.context() as patch:
    patch.setattr(run, "run", lambda *a, **k: pytest.fail("re-ran a finished run"))
    assert sweep.run_grid(points, str(sweep_dir)) == directories

  # The same grid from another pretrained model: the finished runs are not its
  # results, so the sweep stops before running anything, naming the change.
  other = sweep.grid_configs(str(REPO / "configs" / "glue.py"), ["stsb"],
                             {**overrides, "init_from": str(tmp_path / "other")},
                             [1e-3], [1, 2])
  results_before = [open(os.path.join(d, "eval_results.json")).read()
                    for d in directories]
  with monkeypatch.context() as patch:
    patch.setattr(run, "run", lambda *a, **k: pytest.fail("ran a stale grid"))
    with pytest.raises(ValueError, match=r"2 run\(s\) .* another config(.|\n)*"
                       r"init_from: '.*' -> '.*other'"):
      sweep.run_grid(other, str(sweep_dir))
  assert [open(os.path.join(d, "eval_results.json")).read()
          for d in directories] == results_before
  # Re-running one finished fine-tune by hand starts it over: its records are
  # rewritten, not appended a second time.
  def records():
    return [sorted(json.loads(line)) + [json.loads(line)["step"]]
            for line in open(os.path.join(directories[0], "metrics.jsonl"))]
  first = records()
  run.run(points[0][3], directories[0])
  assert records() == first

  # The command line's report (no JAX work: it only reads the results).
  cmd = [sys.executable, "-m", "maelm_jax.finetune.sweep", "--report_only",
         f"--sweep_dir={sweep_dir}"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads((sweep_dir / "report.json").read_text())
  entry = report["tasks"]["stsb"]
  assert entry["median"]["spearman"] == pytest.approx(np.median(spearman))
  assert entry["median"]["pearson"] == pytest.approx(np.median(pearson))
  assert entry["num_seeds"] == 2 and report["glue_average_tasks"] == ["stsb"]
  assert report["glue_average"] == pytest.approx(np.median(spearman))
  assert "| stsb | 0.001 | 2 | spearman" in out.stdout
  assert (sweep_dir / "report.md").read_text().strip() in out.stdout


def fake_results(sweep_dir, task, learning_rate, seed, best, last=None,
                 main="accuracy"):
  directory = sweep_dir / task / sweep.run_name(learning_rate, seed)
  directory.mkdir(parents=True)
  last = last or best
  results = {"task": task, "learning_rate": learning_rate, "seed": seed,
             "main_metric": main, "best": {"step": 1, "epoch": 1, **best}, **last}
  (directory / "eval_results.json").write_text(json.dumps(results))


def test_report_takes_medians_over_seeds_and_the_best_learning_rate(tmp_path):
  for seed, (low, high) in enumerate([(0.60, 0.70), (0.70, 0.50), (0.65, 0.72)]):
    fake_results(tmp_path, "rte", 1e-5, seed, {"accuracy": low})
    fake_results(tmp_path, "rte", 2e-5, seed, {"accuracy": high},
                 last={"accuracy": high - 0.1})
  for seed, (m, mm) in enumerate([(0.80, 0.79), (0.82, 0.83)]):
    fake_results(tmp_path, "mnli", 2e-5, seed,
                 {"mnli_m/accuracy": m, "mnli_mm/accuracy": mm}, main="mnli_m/accuracy")
  fake_results(tmp_path, "wnli", 1e-5, 0, {"accuracy": 0.56})

  report = sweep.build_report(str(tmp_path))
  rte = report["tasks"]["rte"]
  # Medians: 1e-5 -> median(0.60, 0.70, 0.65) = 0.65; 2e-5 -> median(0.70,
  # 0.50, 0.72) = 0.70, the better one.
  assert rte["by_learning_rate"]["1e-05"]["median"]["accuracy"] == pytest.approx(0.65)
  assert (rte["learning_rate"], rte["median"]["accuracy"]) == (2e-5, pytest.approx(0.70))
  mnli = report["tasks"]["mnli"]["median"]
  assert mnli == {"mnli_m/accuracy": pytest.approx(0.81),
                  "mnli_mm/accuracy": pytest.approx(0.81)}
  # GLUE average: RTE 0.70 and MNLI-m 0.81; WNLI is left out, as in the papers.
  assert report["glue_average_tasks"] == ["mnli", "rte"]
  assert report["glue_average"] == pytest.approx((0.70 + 0.81) / 2)
  text = sweep.format_report(report)
  assert "| rte | 2e-05 | 3 | accuracy 70.00 |" in text
  assert "GLUE average over 2 of 8 tasks (missing: qqp, qnli, sst2, cola, mrpc, stsb): " \
         "75.50" in text

  # Scoring by the last epoch: 2e-5 medians drop to 0.60 < 0.65 at 1e-5.
  last = sweep.build_report(str(tmp_path), selection="last")
  assert last["tasks"]["rte"]["learning_rate"] == 1e-5


def test_a_complete_sweep_keeps_the_checkpoints_of_its_selected_runs_only(tmp_path):
  """Every seed of each task's best learning rate keeps its final checkpoint
  (what export_hf exports); the other rates' are deleted, their results kept."""
  checkpoint = lambda task, lr, seed: (tmp_path / task / sweep.run_name(lr, seed)
                                       / "checkpoints" / "40")
  for task, rates in (("rte", {1e-5: 0.6, 2e-5: 0.7}), ("sst2", {1e-5: 0.9, 2e-5: 0.8})):
    for lr, accuracy in rates.items():
      for seed in (1, 2):
        fake_results(tmp_path, task, lr, seed, {"accuracy": accuracy + seed / 100})
        checkpoint(task, lr, seed).mkdir(parents=True)
        (checkpoint(task, lr, seed) / "params").write_bytes(b"0" * 1000)
  report = sweep.build_report(str(tmp_path))
  pruned = sweep.prune_unselected(str(tmp_path), report)
  assert sorted(os.path.relpath(p, tmp_path) for p in pruned) == [
      "rte/lr1e-05_seed1", "rte/lr1e-05_seed2", "sst2/lr2e-05_seed1",
      "sst2/lr2e-05_seed2"]
  for task, kept, gone in (("rte", 2e-5, 1e-5), ("sst2", 1e-5, 2e-5)):
    for seed in (1, 2):
      assert (checkpoint(task, kept, seed) / "params").exists()
      assert not checkpoint(task, gone, seed).parent.exists()
      assert (tmp_path / task / sweep.run_name(gone, seed) / "eval_results.json").exists()
  assert sweep.prune_unselected(str(tmp_path), report) == []  # Nothing left to do.


def test_grid_keeps_each_tasks_defaults_under_the_overrides():
  points = sweep.grid_configs(str(REPO / "configs" / "glue.py"), ["rte", "mnli"],
                              {"data.dir": "/data/glue", "num_epochs": 4},
                              [1e-5, 3e-5], [1, 2])
  assert [(t, lr, s) for t, lr, s, _ in points] == [
      (t, lr, s) for t in ("rte", "mnli") for lr in (1e-5, 3e-5) for s in (1, 2)]
  rte, mnli = points[0][3], points[-1][3]
  assert (rte.task, rte.batch_size, mnli.task, mnli.batch_size) == ("rte", 16, "mnli", 32)
  assert rte.num_epochs == mnli.num_epochs == 4 and rte.data.dir == "/data/glue"
  assert (mnli.learning_rate, mnli.seed) == (3e-5, 2)
  defaults = sweep.grid_configs(str(REPO / "configs" / "glue.py"), ["wnli"], {}, [], [1])
  assert defaults[0][1] == glue_config.TASK_DEFAULTS["wnli"][1]


# ------------------------------------------------- State and early errors --


def test_state_starts_from_the_pretrained_encoder_with_a_new_head(pretrained,
                                                                  monkeypatch):
  loaded = pretrained_lib.load_pretrained(str(pretrained))
  mesh = sharding.make_mesh((2, 2, 2))
  calls = []
  traced = heads.SequenceClassifier.__call__
  monkeypatch.setattr(heads.SequenceClassifier, "__call__",
                      lambda self, *a, **k: calls.append(1) or traced(self, *a, **k))
  model = heads.SequenceClassifier(loaded.model_cfg, num_outputs=3)
  tx = optax.adamw(1e-3)
  # As a run starts: its program's layout, then the state built into it; one
  # trace of the model each (a fresh start once took five).
  layout = run.abstract_state(model, 16, tx, mesh)
  state, shardings = run.create_state(model, 16, loaded.params, tx, mesh, seed=0,
                                      layout=layout)
  assert len(calls) == 2
  assert jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), state) == \
      jax.tree.map(lambda x: (x.shape, x.dtype, x.sharding), layout[0])
  assert set(state.params) == {"backbone", "head"}
  assert set(state.params["backbone"]) == {"token_embed", "encoder"}
  for got, want in zip(jax.tree.leaves(state.params["backbone"]),
                       jax.tree.leaves(loaded.params)):
    np.testing.assert_array_equal(np.asarray(got), want)
  assert state.params["head"]["out"]["kernel"].shape == (loaded.model_cfg.hidden, 3)
  embedding = state.params["backbone"]["token_embed"]["embedding"]
  assert embedding.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  assert shardings.params["head"]["dense"]["kernel"].spec == \
      jax.sharding.PartitionSpec("fsdp", "tensor")


def test_heads_drop_out_only_in_training_and_never_pick_padding():
  cfg = model_lib.ModelConfig(vocab_size=64, num_layers=1, hidden=16, num_heads=2, mlp=32,
                              dtype=jax.numpy.float32)
  ids = np.tile(np.arange(2, 12, dtype=np.int32), (2, 1))
  ids[:, 7:] = 0  # [PAD]
  classifier = heads.SequenceClassifier(cfg, 3)
  # Everything jitted: op-by-op (eager) Flax init takes tens of seconds on CPU.
  params = jax.jit(classifier.init)(jax.random.PRNGKey(0), ids)
  logits = jax.jit(classifier.apply)(params, ids)
  assert logits.shape == (2, 3) and logits.dtype == np.float32
  # The head's two dropouts (the encoder's are the model's own business).
  head = lambda deterministic: heads.ClassificationHead(3, 16, 0.5, np.float32,
                                                        deterministic)
  first_token = np.ones((4, 16), np.float32)
  head_params = jax.jit(head(True).init)(jax.random.PRNGKey(0), first_token)
  train = jax.jit(lambda rng: head(False).apply(head_params, first_token,
                                                rngs={"dropout": rng}))
  assert not np.allclose(train(jax.random.PRNGKey(1)), train(jax.random.PRNGKey(2)))
  evaluate = jax.jit(head(True).apply)
  np.testing.assert_array_equal(evaluate(head_params, first_token),
                                evaluate(head_params, first_token))
  span = heads.SpanExtractor(cfg)
  start, end = jax.jit(span.apply)(jax.jit(span.init)(jax.random.PRNGKey(0), ids), ids)
  assert start.shape == end.shape == (2, 10)
  assert (start[:, 7:] <= -1e8).all() and (end[:, 7:] <= -1e8).all()
  assert (start[:, :7] > -1e8).all()


@pytest.fixture
def no_compile(monkeypatch):
  def forbidden(*args, **kwargs):
    raise AssertionError("reached compilation before rejecting the config")
  monkeypatch.setattr(run, "create_state", forbidden)


def fake_pretraining_workdir(path, max_positions=64):
  """Just enough of a pretraining workdir for the checks before loading."""
  (path / "checkpoints" / "2").mkdir(parents=True)
  (path / "checkpoints" / "2" / "_CHECKPOINT_METADATA").write_text("{}")  # Finished.
  (path / "config.json").write_text(json.dumps({"model": {"max_positions":
                                                          max_positions}}))
  return path


@pytest.mark.parametrize("overrides,error,message", [
    ({"init_from": ""}, ValueError, "--config.init_from is empty"),
    ({"init_from": "/nonexistent"}, FileNotFoundError,
     "config.json not found: --config.init_from must be the --workdir"),
    ({"batch_size": 13}, ValueError,  # (runs in the test process mesh 2 devices)
     "batch_size=13 is not divisible by the data-parallel size 2"),
    ({"max_seq_len": 128}, ValueError,
     "max_seq_len=128 exceeds the 64 positions .* --config.max_seq_len=64"),
    ({"data.dir": "/nonexistent"}, FileNotFoundError, "nor a SST-2/ directory"),
    ({"task": "sst3"}, ValueError, "unknown GLUE task 'sst3'"),
    ({"warmup_ratio": 1.5}, ValueError, "warmup_ratio=1.5 must be in"),
    ({"data.source": "csv"}, ValueError, "data.source='csv': use 'tsv'"),
    ({"layer_decay": 0.0}, ValueError, r"layer_decay=0.0 must be in \(0, 1\]"),
    ({"layer_decay": 1.5}, ValueError, r"layer_decay=1.5 must be in \(0, 1\]"),
    ({"init_step": 7}, ValueError,
     r"--config.init_step=7: .* no checkpoint of that step; it has steps \[2\]"),
])
def test_glue_config_errors_come_before_compilation(tmp_path, no_compile, overrides,
                                                    error, message):
  init_from = fake_pretraining_workdir(tmp_path / "pretrained")
  data = write_sst2(tmp_path / "SST-2", num_train=16, num_dev=4, num_test=1)
  config = glue_test_config("sst2", init_from, data.parent, **{"max_seq_len": 32})
  config.unlock()
  for key, value in overrides.items():
    config_lib.set_path(config, key, value)
  with pytest.raises(error, match=message):
    run.run(config, str(tmp_path / "run"))


def test_a_finetuning_run_as_init_from_is_named_before_compilation(tmp_path, no_compile):
  """A hurried chain (MNLI, then RTE from it) points init_from at a fine-tuning
  workdir: one line that says so and names the pretraining run it came from."""
  pretrained = fake_pretraining_workdir(tmp_path / "pretrained")
  finetuned = tmp_path / "mnli"
  (finetuned / "checkpoints").mkdir(parents=True)
  (finetuned / "config.json").write_text(json.dumps(
      {"mode": "glue", "task": "mnli", "init_from": str(pretrained)}))
  data = write_sst2(tmp_path / "SST-2", num_train=16, num_dev=4, num_test=1)
  config = glue_test_config("sst2", finetuned, data.parent, max_seq_len=32)
  with pytest.raises(ValueError, match=f"is a fine-tuning run, not a pretraining one: "
                     f".* \\(its init_from: {pretrained}\\)"):
    run.run(config, str(tmp_path / "run"))


def test_unknown_task_in_the_config_argument():
  with pytest.raises(ValueError, match="unknown GLUE task 'sts'"):
    glue_config.get_config("task=sts")
  with pytest.raises(ValueError, match="version=1.1 or version=2.0"):
    squad_config.get_config("version=3")


def test_squad_errors_come_before_compilation(tmp_path, pretrained, no_compile):
  v2 = squad_v2_file(tmp_path / "dev-v2.0.json", 3, seed=0)
  config = squad_test_config(pretrained, v2, tmp_path / "missing.json")
  with pytest.raises(FileNotFoundError, match="data.eval_file=.*missing.json"):
    run.run(config, str(tmp_path / "run"))
  config = squad_test_config(pretrained, v2, v2, max_query_len=29)
  with pytest.raises(ValueError, match="max_query_len=29 leaves no room"):
    run.run(config, str(tmp_path / "run"))
  # A v2.0 file under version=1.1 is caught when it is read, still before compiling.
  config = squad_test_config(pretrained, v2, v2, version="1.1")
  with pytest.raises(ValueError, match="unanswerable questions.*version=2.0"):
    run.run(config, str(tmp_path / "run"))


def test_finetuning_stopped_by_ctrl_c_resumes_exactly(tmp_path, pretrained):
  """Ctrl-C mid-epoch saves; the same command resumes and ends with the losses
  and scores of an uninterrupted run (dropout on: its bits come from the step)."""
  import signal
  import time
  data = write_sst2(tmp_path / "SST-2", num_train=320, num_dev=40)
  settings = {"num_epochs": 2, "log_every": 1, "dropout": 0.1,
              "attention_dropout": 0.1}
  reference = run.run(glue_test_config("sst2", pretrained, data.parent, **settings),
                      str(tmp_path / "reference"))
  workdir = tmp_path / "interrupted"
  cmd = [sys.executable, "-m", "maelm_jax.main", "--config=configs/glue.py:task=sst2",
         f"--workdir={workdir}", f"--config.init_from={pretrained}",
         f"--config.data.dir={data.parent}", "--config.max_seq_len=24",
         "--config.batch_size=16", "--config.eval_batch_size=16",
         "--config.learning_rate=1e-3", "--config.dtype=float32",
         *[f"--config.{k}={v}" for k, v in settings.items()]]

  def train_losses(directory):
    return [(r["step"], r["train/loss"]) for r in read_jsonl(directory / "metrics.jsonl")
            if "train/loss" in r]

  process = subprocess.Popen(helpers.with_sigint_default(cmd), cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 300
  while not (workdir / "metrics.jsonl").exists() or len(train_losses(workdir)) < 25:
    assert process.poll() is None, process.communicate()[1][-3000:]
    assert time.time() < deadline
    time.sleep(0.02)
  process.send_signal(signal.SIGINT)  # In epoch 2 (20 steps per epoch).
  _, stderr = process.communicate(timeout=300)
  assert process.returncode == 130, stderr[-3000:]
  assert "interrupted (Ctrl-C): saved a checkpoint at step" in stderr
  assert not (workdir / run.RESULTS_FILE).exists()
  stopped_at = checkpoints.latest_step(workdir)
  assert 25 <= stopped_at < 40
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"resumed from" in out.stderr and f"at step {stopped_at} (epoch 2)" in out.stderr
  # Restored straight into the abstract state: the pretrained encoder was read
  # (and a fresh state built) by the first launch only.
  assert "loaded encoder (token_embed, encoder) from step" in stderr
  assert "loaded encoder" not in out.stderr
  resumed = json.loads((workdir / run.RESULTS_FILE).read_text())
  ours, theirs = train_losses(workdir), train_losses(tmp_path / "reference")
  assert [s for s, _ in ours] == [s for s, _ in theirs] == list(range(1, 41))
  np.testing.assert_allclose([l for _, l in ours], [l for _, l in theirs],
                             rtol=1e-6, atol=1e-6)
  for a, b in zip(resumed["history"], reference["history"]):
    assert a == pytest.approx(b, rel=1e-6)
  assert resumed["accuracy"] == reference["accuracy"]
  # Done: the final checkpoint stays (keep_final_checkpoint, the default), the
  # parameters export_hf exports.
  assert checkpoints.latest_step(workdir) == 40


def test_pooling_reads_the_first_token_or_the_mean_of_real_tokens():
  hidden = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape(2, 4, 3)
  ids = jnp.array([[2, 7, 3, 0], [2, 5, 6, 3]])  # Row 0 ends in one [PAD].
  np.testing.assert_array_equal(heads.pool(hidden, ids, "cls"), hidden[:, 0])
  np.testing.assert_allclose(heads.pool(hidden, ids, "mean"),
                             [hidden[0, :3].mean(0), hidden[1].mean(0)])

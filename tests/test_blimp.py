"""BLiMP scoring: batched PLL against a plain loop over masked copies (every
objective, both variants), a model built to prefer one sentence, the
aggregation, the bigram baseline, a random model near chance, and the CLI."""

import functools
import json
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maelm_jax.evaluate import blimp
from maelm_jax.modeling import masking, model as model_lib
from tests.helpers import tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB = 40
OBJECTIVES = {  # name: (drop_masked, decoder_type)
    "mlm": (False, "none"), "maelm": (True, "self"), "3ml_cross": (True, "cross")}


def small_model(objective, seed=0):
  drop_masked, decoder = OBJECTIVES[objective]
  cfg = model_lib.ModelConfig(
      vocab_size=VOCAB, num_layers=2, hidden=32, num_heads=2, mlp=64,
      max_positions=128, ln_type="pre", relative_bias_init="local", dropout=0.0,
      attention_dropout=0.0, dtype=jnp.float32, drop_masked=drop_masked,
      decoder_type=decoder, decoder_relative_position_bias=True,
      tie_embeddings=False)
  fields = blimp.copies_as_masks(np.full((1, 8), 7, np.int32), np.array([[2]]),
                                 drop_masked, cfg.mask_id)
  params = jax.jit(model_lib.MaskedLM(cfg).init)(jax.random.PRNGKey(seed),
                                        masking.Masks(**fields))["params"]
  return cfg, nn.meta.unbox(params)


def sentences(num, seed=0, low=6, high=20):
  rng = np.random.default_rng(seed)
  rows = [np.concatenate([[2], rng.integers(5, VOCAB, rng.integers(low, high)), [3]])
          .astype(np.int32) for _ in range(num)]
  starts = [np.concatenate([[True], rng.random(len(r) - 2) < 0.6, [True]]) for r in rows]
  return rows, starts


@functools.lru_cache(maxsize=None)
def jitted_apply(cfg):
  """MaskedLM(cfg).apply, one compile per shape (not per operation), kept for
  every row a test scores: a new jit of a new module's method compiles again."""
  return jax.jit(model_lib.MaskedLM(cfg).apply)


def loop_pll(cfg, params, ids, starts, variant):
  """One unpadded copy at a time, built by hand from the definition."""
  apply = jitted_apply(cfg)
  total = 0.0
  n = len(ids)
  for i in range(1, n - 1):
    masked = [i]
    while variant == "word_l2r" and masked[-1] + 1 < n - 1 and not starts[masked[-1] + 1]:
      masked.append(masked[-1] + 1)
    if cfg.drop_masked:
      keep = [p for p in range(n) if p not in masked]
      encoder_ids, encoder_positions = ids[keep], np.asarray(keep)
    else:
      encoder_ids = ids.copy()
      encoder_ids[masked] = cfg.mask_id
      encoder_positions = np.arange(n)
    masks = masking.Masks(
        selected_positions=jnp.asarray([[i]]), selected_weights=jnp.ones((1, 1)),
        targets=jnp.asarray([[ids[i]]]), encoder_ids=jnp.asarray(encoder_ids[None]),
        encoder_positions=jnp.asarray(encoder_positions[None]),
        masked_positions=jnp.asarray([masked]))
    logits = apply({"params": params}, masks)[0, 0]
    total += float(jax.nn.log_softmax(logits)[ids[i]])
  return total


@pytest.mark.parametrize("objective", sorted(OBJECTIVES))
@pytest.mark.parametrize("variant", blimp.VARIANTS)
def test_batched_pll_equals_a_plain_loop(objective, variant):
  cfg, params = small_model(objective)
  rows, starts = sentences(3, seed=1, low=6, high=12)
  # A small batch: several calls per group, a padded last one, 8 shards.
  batched = blimp.pseudo_log_likelihoods(cfg, params, rows, starts, variant=variant,
                                         batch_size=8)
  expected = [loop_pll(cfg, params, r, s, variant) for r, s in zip(rows, starts)]
  np.testing.assert_allclose(batched, expected, rtol=2e-5, atol=2e-4)
  assert all(v < 0 for v in batched)


def test_word_l2r_masks_the_later_pieces_of_the_word():
  # [CLS] ▁a b c ▁d ▁e f [SEP]
  starts = np.array([1, 1, 0, 0, 1, 1, 0, 1], bool)
  assert blimp.masked_sets(starts, "token") == [(i,) for i in range(1, 7)]
  assert blimp.masked_sets(starts, "word_l2r") == [
      (1, 2, 3), (2, 3), (3,), (4,), (5, 6), (6,)]
  with pytest.raises(ValueError, match=r"--variant='pll'.*word_l2r"):
    blimp.masked_sets(starts, "pll")


def test_variants_differ_on_multi_piece_words():
  cfg, params = small_model("mlm")
  rows, _ = sentences(3, seed=2)
  one_word = [np.array([True] + [True, False, False] * 10)[:len(r) - 1].tolist()
              + [True] for r in rows]
  token = blimp.pseudo_log_likelihoods(cfg, params, rows, one_word, variant="token")
  word = blimp.pseudo_log_likelihoods(cfg, params, rows, one_word, variant="word_l2r")
  assert np.all(np.abs(token - word) > 1e-3)


def test_a_model_built_to_prefer_a_token_prefers_sentences_with_it():
  cfg, params = small_model("maelm")
  preferred, other = 11, 12
  params = jax.tree.map(lambda x: x, params)
  params["lm_head"]["bias"] = params["lm_head"]["bias"].at[preferred].set(20.0)
  base, starts = sentences(40, seed=3)
  good, bad = [], []
  for row in base:
    slot = len(row) // 2
    with_it, without = row.copy(), row.copy()
    with_it[slot], without[slot] = preferred, other
    good.append(with_it)
    bad.append(without)
  scores = blimp.pseudo_log_likelihoods(cfg, params, good + bad, starts + starts,
                                        variant="token")
  pairs = [blimp.Pair("p", "f", "t", "", "")] * len(base)
  assert blimp.aggregate(pairs, scores[:40], scores[40:])["mean"] == 100.0
  assert blimp.aggregate(pairs, scores[40:], scores[:40])["mean"] == 0.0


def test_a_random_model_is_near_chance_on_symmetric_pairs():
  # bad = good with two neighbours swapped; both are random sequences, so an
  # untrained model has no reason to prefer either: 50% in expectation.
  cfg, params = small_model("mlm", seed=4)
  good, starts = sentences(400, seed=5, low=8, high=14)
  bad = []
  rng = np.random.default_rng(6)
  for row in good:
    row = row.copy()
    i = rng.integers(1, len(row) - 2)
    row[i], row[i + 1] = row[i + 1], row[i]
    bad.append(row)
  scores = blimp.pseudo_log_likelihoods(cfg, params, good + bad, starts + starts,
                                        variant="token", batch_size=1024)
  accuracy = blimp.aggregate([blimp.Pair("p", "f", "t", "", "")] * 400,
                             scores[:400], scores[400:])["mean"]
  assert 42 < accuracy < 58


def test_aggregate_per_paradigm_term_field_and_mean():
  pairs = ([blimp.Pair("a", "syntax", "island", "", "")] * 4 +
           [blimp.Pair("b", "syntax", "island", "", "")] * 2 +
           [blimp.Pair("c", "morphology", "agreement", "", "")] * 2)
  good = np.array([1, 1, 1, 0, 1, 0, 5, 5.0])
  bad = np.array([0, 0, 0, 1, 0, 0, 1, 1.0])  # The tie (pair 6) counts as wrong.
  result = blimp.aggregate(pairs, good, bad)
  assert result["paradigms"] == {"a": 75.0, "b": 50.0, "c": 100.0}
  assert result["terms"] == {"agreement": 100.0, "island": 62.5}
  assert result["fields"] == {"morphology": 100.0, "syntax": 62.5}
  assert result["mean"] == pytest.approx(75.0) and result["pairs"] == 8


def test_bigram_model_is_a_distribution_and_learns_order():
  rng = np.random.default_rng(0)
  # Text where 7 is always followed by 8.
  rows = []
  for _ in range(200):
    body = rng.integers(5, VOCAB, 10)
    body[3], body[4] = 7, 8
    rows.append(np.concatenate([[2], body, [3]]))
  model = blimp.count_bigrams(rows, VOCAB, max_tokens=10**6)
  for left in (7, 20, 4):  # Seen with one successor, seen with many, never seen.
    total = sum(np.exp(model.log_prob(np.array([left, right])))
                for right in range(VOCAB))
    assert total == pytest.approx(1.0, abs=1e-9)
  assert model.log_prob(np.array([2, 7, 8, 3])) > model.log_prob(np.array([2, 8, 7, 3]))
  with pytest.raises(ValueError, match="--ngram_tokens=0"):
    blimp.count_bigrams([], VOCAB, 10)


def test_read_pairs_names_bad_files(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"holds no BLiMP files"):
    blimp.read_pairs(str(tmp_path))
  (tmp_path / "x.jsonl").write_text(
      '{"sentence_good": "A b.", "sentence_bad": "B a.", "UID": "x", "field": "f",'
      ' "linguistics_term": "t"}\n\n{"sentence_good": "A\n')
  with pytest.raises(ValueError, match=rf"{tmp_path / 'x.jsonl'}:3 is not valid JSON"):
    blimp.read_pairs(str(tmp_path))
  (tmp_path / "x.jsonl").write_text('{"sentence_good": "A b."}\n')
  with pytest.raises(ValueError, match=r"x.jsonl:1 has no \['sentence_bad'\]"):
    blimp.read_pairs(str(tmp_path))


# ----------------------------------------------------------------- The CLI --


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory, tokenizer_file):
  """One-step tiny MLM and MAE-LM pretraining workdirs on the pydoc corpus (the
  test run's tokenizer: none trained here)."""
  from maelm_jax.run import train  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("blimp")
  made = []
  for objective in ("mlm", "maelm"):
    workdir = root / f"tiny_{objective}"
    train.train_and_evaluate(tiny_config(objective, **{
        "data.source": "pydoc:", "data.eval_fraction": 0.05,
        "tokenizer.vocab_size": 600, "tokenizer.path": tokenizer_file, "seq_len": 64,
        "total_steps": 1, "eval_batches": 1, "eval_every": 1,
        "checkpoint_every": 1}), str(workdir))
    made.append(workdir)
  return made


def write_blimp(folder, paradigms=("agr_a", "agr_b", "island_c"), pairs=12):
  folder.mkdir()
  for n, uid in enumerate(paradigms):
    term = "island" if uid.startswith("island") else "agreement"
    with open(folder / f"{uid}.jsonl", "w") as f:
      for i in range(pairs):
        f.write(json.dumps({
            "sentence_good": f"The module {i} returns a value.",
            "sentence_bad": f"The module {i} return a values.",
            "field": "syntax" if n else "morphology", "linguistics_term": term,
            "UID": uid, "pairID": str(i)}) + "\n")
  return folder


def run_cli(*args):
  return subprocess.run([sys.executable, "-m", "maelm_jax.evaluate.blimp", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=600)


def test_cli_scores_every_workdir_and_the_bigram_baseline(tmp_path, workdirs):
  data = write_blimp(tmp_path / "blimp")
  out = tmp_path / "out"
  result = run_cli("--workdir=" + ",".join(map(str, workdirs)), f"--data={data}",
                   f"--out={out}", "--ngram_tokens=20000", "--max_pairs=10")
  assert result.returncode == 0, result.stderr[-3000:]
  results = json.loads((out / "blimp.json").read_text())
  assert list(results["models"]) == ["tiny_mlm", "tiny_maelm", "bigram"]
  assert results["variant"] == "word_l2r" and "--max_pairs=10" in results["command"]
  for name, entry in results["models"].items():
    assert entry["pairs"] == 30
    assert set(entry["paradigms"]) == {"agr_a", "agr_b", "island_c"}
    assert set(entry["terms"]) == {"agreement", "island"}
    assert set(entry["fields"]) == {"morphology", "syntax"}
    assert entry["mean"] == pytest.approx(np.mean(list(entry["paradigms"].values())))
  assert results["models"]["tiny_maelm"]["objective"] == "maelm"
  assert results["models"]["tiny_mlm"]["step"] == 1
  assert results["models"]["bigram"]["tokens"] >= 20000
  table = (out / "blimp.md").read_text()
  assert "| island | 1 |" in table and "| agreement | 2 |" in table
  assert (out / "blimp.png").stat().st_size > 10_000
  # Progress: each workdir's scoring ends in a line with its pairs and rate
  # (and, on the way, ETA lines: tests/test_progress.py).
  for name in ("tiny_mlm", "tiny_maelm"):
    assert f"blimp {name}: 30/30 pairs (100%)" in result.stderr, result.stderr[-3000:]
  assert "pairs/s" in result.stderr
  # A hurried rerun with other flags into the same --out: refused before any
  # work, the scores kept; --overwrite replaces them.
  before = (out / "blimp.json").read_bytes()
  again = run_cli(f"--workdir={workdirs[0]}", f"--data={data}", f"--out={out}",
                  "--ngram_tokens=0", "--max_pairs=2")
  assert again.returncode == 1 and "Traceback" not in again.stderr
  assert (f"error: --out={out} already holds blimp.json (made by: "
          f"{results['command']}); name another --out, or pass --overwrite") in again.stderr
  assert (out / "blimp.json").read_bytes() == before
  again = run_cli(f"--workdir={workdirs[0]}", f"--data={data}", f"--out={out}",
                  "--ngram_tokens=0", "--max_pairs=2", "--overwrite")
  assert again.returncode == 0, again.stderr[-3000:]
  assert json.loads((out / "blimp.json").read_text())["models"]["tiny_mlm"]["pairs"] == 6


def test_cli_bad_input_is_one_line_before_any_work(tmp_path, workdirs):
  data = write_blimp(tmp_path / "blimp")
  result = run_cli(f"--workdir={tmp_path / 'nowhere'}", f"--data={data}",
                   f"--out={tmp_path / 'out'}")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert f"error: --workdir {tmp_path / 'nowhere'} has no config.json" in result.stderr
  result = run_cli(f"--workdir={workdirs[0]}", f"--data={tmp_path / 'out'}",
                   f"--out={tmp_path / 'out'}")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert "holds no BLiMP files" in result.stderr
  assert not (tmp_path / "out").exists()


@pytest.mark.optimized
def test_real_blimp_untrained_model_is_near_chance(shared_data, workdirs):
  pairs = blimp.read_pairs(str(shared_data / "blimp"), max_pairs_per_paradigm=20)
  assert len(pairs) == 36 * 20
  run = blimp.load_run(str(workdirs[0]), None)  # One step: nearly its initialisation.
  good, bad = blimp.score_pairs(run.model_cfg, run.params, run.tokenizer, pairs)
  assert 40 < blimp.aggregate(pairs, good, bad)["mean"] < 62

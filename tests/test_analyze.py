"""Effective-rank analysis: the two definitions on matrices of known rank, the
per-layer representations of an encoder built to have a known rank, and the CLI
on a one-step pretraining workdir."""

import json
import math
import pathlib
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maelm_jax.evaluate import analyze
from maelm_jax.modeling import model as model_lib
from maelm_jax.data import tokenizer as tokenizer_lib
from tests import helpers
from tests.helpers import random_ids, tiny_config

REPO = pathlib.Path(__file__).resolve().parents[1]


def equal_singular_values(n, d, r, seed=0):
  """[n, d] with zero column means and exactly r singular values, all 1."""
  rng = np.random.default_rng(seed)
  u = rng.normal(size=(n, r))
  u, _ = np.linalg.qr(u - u.mean(axis=0))
  v, _ = np.linalg.qr(rng.normal(size=(d, r)))
  return u @ v.T


@pytest.mark.parametrize("r", [1, 4, 9, 20])
def test_equal_singular_values_give_rank_r(r):
  x = equal_singular_values(500, 64, r)
  np.testing.assert_allclose(np.linalg.svd(x, compute_uv=False)[:r], 1.0)
  assert analyze.effective_rank_entropy(x) == pytest.approx(r, abs=1e-6)
  # k of r equal components explain k/r: pca90 is r up to r = 9, then ceil(0.9 r).
  assert analyze.pca_rank(x) == math.ceil(0.9 * r)
  assert analyze.pca_rank(x, fraction=1.0) == r


def test_unequal_singular_values_rank_below_r():
  rng = np.random.default_rng(1)
  r = 12
  x = (rng.normal(size=(800, r)) * np.geomspace(1, 0.05, r)) @ rng.normal(size=(r, 48))
  assert np.linalg.matrix_rank(x) == r
  assert analyze.pca_rank(x) <= r
  assert 1 < analyze.effective_rank_entropy(x) < r


def test_constant_offset_does_not_change_the_rank():
  x = equal_singular_values(300, 32, 5)
  shifted = x + 10 * np.random.default_rng(2).normal(size=(1, 32))
  assert analyze.effective_rank_entropy(shifted) == pytest.approx(5, abs=1e-6)
  assert analyze.pca_rank(shifted) == analyze.pca_rank(x) == 5
  assert analyze.effective_rank_entropy(np.ones((10, 4))) == 0.0
  assert analyze.pca_rank(np.ones((10, 4))) == 0


def test_isotropic_gaussian_has_nearly_full_rank():
  x = np.random.default_rng(3).normal(size=(4096, 64))
  assert 60 < analyze.effective_rank_entropy(x) <= 64
  assert 50 < analyze.pca_rank(x) <= 64


def test_mask_text_masks_15_percent_of_real_tokens_only():
  ids = random_ids(6, 42, 100, num_pad=2)
  ids[:, 10] = tokenizer_lib.SEP_ID  # A document boundary inside the row.
  masked = analyze.mask_text(ids)
  is_mask = masked == tokenizer_lib.MASK_ID
  np.testing.assert_array_equal(is_mask.sum(axis=1), round(0.15 * 37))
  assert analyze.is_real(ids)[is_mask].all()
  np.testing.assert_array_equal(masked[~is_mask], ids[~is_mask])
  np.testing.assert_array_equal(analyze.mask_text(ids), masked)  # Fixed seed.


def subspace_encoder(ln_type, rank, hidden=32, vocab=40, seed=0):
  """Encoder params whose token embeddings span `rank` dimensions and whose
  absolute position table is zero."""
  cfg = model_lib.ModelConfig(vocab_size=vocab, num_layers=2, hidden=hidden,
                              num_heads=2, mlp=64, max_positions=32, ln_type=ln_type,
                              dtype=jnp.float32)
  ids = random_ids(2, 16, vocab)
  params = nn.meta.unbox(jax.jit(model_lib.Encoder(cfg).init)(jax.random.PRNGKey(seed),
                                                              ids)["params"])
  rng = np.random.default_rng(seed)
  params["token_embed"]["embedding"] = (rng.normal(size=(vocab, rank))
                                        @ rng.normal(size=(rank, hidden)))
  params["encoder"]["position_embed"]["embedding"] = np.zeros((32, hidden))
  return cfg, params


def numerical_rank(x):
  x = x - x.mean(axis=0)
  return np.linalg.matrix_rank(x, tol=1e-4 * np.abs(x).max())


@pytest.mark.parametrize("ln_type", ["pre", "post"])
def test_layer_representations_of_a_model_with_known_rank(ln_type):
  r = 5
  cfg, params = subspace_encoder(ln_type, r)
  ids = random_ids(20, 24, cfg.vocab_size, seed=1)
  positions = analyze.sample_positions(analyze.is_real(ids), 256, seed=0)
  reps = analyze.layer_representations(cfg, params, ids, {"real": positions},
                                       batch_size=8)["real"]
  names = analyze.layer_names(cfg)
  assert names == ["embed", "layer_1", "layer_2"] + (["final_ln"] if ln_type == "pre"
                                                      else [])
  assert reps.shape == (len(names), 256, cfg.hidden)
  # Layer 0 is the token embedding, of rank r. Post-LN's input LayerNorm keeps it:
  # subtracting each row's mean is a linear projection, and it rescales rows.
  assert numerical_rank(reps[0]) == r
  assert 1 < analyze.effective_rank_entropy(reps[0]) <= r
  assert 1 <= analyze.pca_rank(reps[0]) <= r
  # The layers mix neighbours non-linearly: their rank is no longer bounded by r.
  assert numerical_rank(reps[1]) > r
  # The last entry is what the encoder returns (the final LN or the last layer).
  out = helpers.apply(model_lib.Encoder(cfg), {"params": params}, ids)
  np.testing.assert_allclose(reps[-1], np.asarray(out)[positions], atol=1e-5)


# ----------------------------------------------------------------- The CLI --


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tokenizer_file):
  """A one-step tiny MLM pretraining workdir on the pydoc corpus (the test run's
  tokenizer: none trained here)."""
  from maelm_jax.run import train  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp("analyze") / "tiny_mlm"
  train.train_and_evaluate(tiny_config("mlm", **{
      "data.source": "pydoc:", "data.eval_fraction": 0.05,
      "tokenizer.vocab_size": 600, "tokenizer.path": tokenizer_file, "seq_len": 64,
      "total_steps": 1,
      "eval_batches": 1, "eval_every": 1, "checkpoint_every": 1,
      "model.dropout": 0.0, "model.attention_dropout": 0.0}), str(workdir))
  return workdir


def run_cli(*args):
  return subprocess.run([sys.executable, "-m", "maelm_jax.evaluate.analyze", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def test_cli_writes_ranks_of_every_layer_and_kind(tmp_path, pretrained):
  out = tmp_path / "rank"
  result = run_cli(f"--workdir={pretrained}", f"--out={out}", "--num_tokens=128",
                   "--batch_size=8")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "masked_text_mask" in result.stdout and "final_ln" in result.stdout
  ranks = json.loads((out / "rank.json").read_text())
  assert ranks["num_tokens"] == 128 and set(ranks["definitions"]) == {"entropy",
                                                                        "pca90"}
  assert "pydoc:" in ranks["source"] and "--num_tokens=128" in ranks["command"]
  run = ranks["runs"][str(pretrained)]
  assert run["objective"] == "mlm" and run["step"] == 1
  assert run["layers"] == ["embed", "layer_1", "layer_2", "final_ln"]
  assert set(run["rank"]) == set(analyze.KINDS)
  for kind in analyze.KINDS:
    for values in run["rank"][kind].values():
      assert len(values) == 4 and all(0 < v <= 128 for v in values[1:])
      # The embeddings: under rotary positions (the default) every [MASK] enters
      # the encoder as one vector, rank 0; real tokens are many.
      assert values[0] == 0 if kind == "masked_text_mask" else 0 < values[0] <= 128
  assert (out / "effective_rank.png").stat().st_size > 10_000


def test_bad_arguments_fail_before_compilation(tmp_path, pretrained, monkeypatch):
  def forbidden(*args, **kwargs):
    raise AssertionError("compiled before rejecting the arguments")
  monkeypatch.setattr(analyze, "_jitted_forward", forbidden)
  with pytest.raises(ValueError, match=r"fewer than --num_tokens=10000000; lower"):
    analyze.analyze([str(pretrained)], str(tmp_path), num_tokens=10**7)
  with pytest.raises(ValueError, match=r"below the hidden size 128"):
    analyze.analyze([str(pretrained)], str(tmp_path), num_tokens=64)
  with pytest.raises(ValueError, match=r"no checkpoint of --step=7; it has steps"):
    analyze.analyze([str(pretrained)], str(tmp_path), step=7)
  with pytest.raises(ValueError, match=r"names a workdir twice"):
    analyze.analyze([str(pretrained), str(pretrained)], str(tmp_path))
  (tmp_path / analyze.RESULTS_FILE).write_text('{"command": "maelm-analyze --x"}')
  with pytest.raises(FileExistsError, match=r"already holds rank.json \(made by: "
                     r"maelm-analyze --x\); name another --out, or pass --overwrite"):
    analyze.analyze([str(pretrained)], str(tmp_path), num_tokens=128)
  assert (tmp_path / analyze.RESULTS_FILE).read_text() == '{"command": "maelm-analyze --x"}'


def test_cli_missing_workdir_is_a_one_line_error(tmp_path):
  result = run_cli(f"--workdir={tmp_path / 'nowhere'}", f"--out={tmp_path / 'out'}")
  assert result.returncode == 1
  assert "Traceback" not in result.stderr
  assert f"error: --workdir {tmp_path / 'nowhere'} has no config.json" in result.stderr
  assert not (tmp_path / "out").exists()

"""model.scan_layers: one nn.scan over identical layers computes what the unrolled
layers compute, and every reader of checkpoints takes either layout."""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maelm_jax.run import pretrained as pretrained_lib
from maelm_jax.modeling import model as model_lib, param_layout
from tests import helpers
from tests.helpers import random_ids, tiny_config

VOCAB = 120


def build(objective, **overrides):
  config = tiny_config(objective, **{"model.dropout": 0.0,
                                     "model.attention_dropout": 0.0, **overrides})
  return model_lib.ModelConfig.from_config(config.model, vocab_size=VOCAB, mask_id=4)


def loss_and_grads(cfg, params, masks):
  def loss_fn(p):
    logits = model_lib.MaskedLM(cfg).apply({"params": p}, masks)
    return model_lib.masked_lm_loss(logits, masks.targets, masks.selected_weights)[0]
  return jax.jit(jax.value_and_grad(loss_fn))(params)


@pytest.mark.parametrize("objective,overrides", [
    ("mlm", {"model.num_layers": 3}),
    ("maelm", {"model.decoder_type": "cross", "model.decoder_layers": 2}),
    ("3ml", {"model.decoder_type": "self", "model.remat_policy": "dots_saveable",
             "model.ln_type": "pre"}),
])
def test_scanned_layers_compute_what_unrolled_layers_compute(objective, overrides):
  unrolled = build(objective, **overrides)
  scanned = model_lib.dataclasses.replace(unrolled, scan_layers=True)
  ids = random_ids(4, 32, VOCAB, num_pad=3)
  masks = helpers.draw_masks(unrolled, ids, VOCAB, seed=1)
  params = nn.meta.unbox(jax.jit(model_lib.MaskedLM(unrolled).init)(
      jax.random.PRNGKey(0), masks)["params"])
  stacked = param_layout.stack_layers(params)
  # The layout the scanned model itself creates.
  born = nn.meta.unbox(jax.jit(model_lib.MaskedLM(scanned).init)(
      jax.random.PRNGKey(0), masks)["params"])
  assert jax.tree.structure(born) == jax.tree.structure(stacked)
  assert jax.tree.map(jnp.shape, born) == jax.tree.map(jnp.shape, stacked)
  assert param_layout.is_scanned(stacked) and not param_layout.is_scanned(params)
  layers = unrolled.num_layers
  assert stacked["encoder"]["layers"]["mlp"]["wi"]["kernel"].shape[0] == layers

  loss, grads = loss_and_grads(unrolled, params, masks)
  scanned_loss, scanned_grads = loss_and_grads(scanned, stacked, masks)
  np.testing.assert_allclose(float(scanned_loss), float(loss), rtol=1e-6)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads),
                          jax.tree.leaves(param_layout.unstack_layers(scanned_grads))):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0,
                               atol=1e-6 * max(1.0, float(np.abs(a).max())),
                               err_msg=jax.tree_util.keystr(path))
  # The fine-tuning view (Encoder) too.
  encoder = model_lib.encoder_params
  hidden = helpers.apply(model_lib.Encoder(unrolled), {"params": encoder(params)},
                         jnp.asarray(ids))
  scanned_hidden = helpers.apply(model_lib.Encoder(scanned), {"params": encoder(stacked)},
                                 jnp.asarray(ids))
  np.testing.assert_allclose(scanned_hidden, hidden, rtol=1e-5, atol=1e-5)


def test_stack_and_unstack_are_inverse_and_leave_other_keys_alone():
  tree = {"token_embed": {"embedding": np.ones((5, 2))},
          "encoder": {"layer_0": {"w": np.zeros(3)}, "layer_1": {"w": np.ones(3)},
                      "layer_10_notes": {"w": np.full(2, 7.0)},
                      "final_ln": {"scale": np.ones(2)}},
          "decoder": {"layer_0": {"w": np.full(3, 2.0)}}}
  stacked = param_layout.stack_layers(tree)
  assert sorted(stacked["encoder"]) == ["final_ln", "layer_10_notes", "layers"]
  np.testing.assert_array_equal(stacked["encoder"]["layers"]["w"],
                                [[0, 0, 0], [1, 1, 1]])
  assert stacked["decoder"]["layers"]["w"].shape == (1, 3)
  back = param_layout.unstack_layers(stacked)
  assert jax.tree.structure(back) == jax.tree.structure(tree)
  for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(tree)):
    np.testing.assert_array_equal(a, b)
  assert param_layout.params_for(tree, False) == tree  # Already unrolled: unchanged.


def test_scanned_and_unrolled_runs_train_alike_for_several_steps():
  """The same weights in either layout, the real jitted train step (masking,
  dropout off, AdamW, clipping) for 4 steps: the same losses, the same weights."""
  from maelm_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import train_lib  # pylint: disable=g-import-not-at-top
  config = tiny_config("maelm", **{"model.dropout": 0.0, "model.attention_dropout": 0.0,
                                   "model.decoder_type": "cross"})
  unrolled = model_lib.ModelConfig.from_config(config.model, VOCAB, 4)
  scanned = model_lib.dataclasses.replace(unrolled, scan_layers=True)
  tx = train_lib.make_optimizer(config)
  mesh = sharding.make_mesh((2, 2, 2), jax.devices()[:8])
  state, shardings = train_lib.create_sharded_state(unrolled, 32, tx, mesh, 0)
  scanned_abstract, scanned_shardings = train_lib.abstract_sharded_state(
      scanned, 32, tx, mesh)
  stacked = jax.device_put(param_layout.stack_layers(jax.tree.map(np.asarray, state.params)),
                           scanned_shardings.params)
  # Own copies of step, rng, ...: each train step donates its state.
  scanned_state = jax.tree.map(jnp.copy, state).replace(
      params=stacked, opt_state=jax.jit(
          tx.init, out_shardings=scanned_shardings.opt_state)(stacked))
  del scanned_abstract
  initial_kernel = np.asarray(state.params["encoder"]["layer_1"]["mlp"]["wi"]["kernel"])
  step, _ = train_lib.jit_steps(unrolled, 32, tx, mesh, shardings)
  scanned_step, _ = train_lib.jit_steps(scanned, 32, tx, mesh, scanned_shardings)
  knots = train_lib.learning_rate_knots(config)
  losses, scanned_losses = [], []
  for i in range(4):
    batch = {"input_ids": random_ids(8, 32, VOCAB, seed=i)}
    state, metrics = step(state, batch, knots)
    scanned_state, scanned_metrics = scanned_step(scanned_state, batch, knots)
    losses.append(float(metrics["loss"]))
    scanned_losses.append(float(scanned_metrics["loss"]))
  np.testing.assert_allclose(scanned_losses, losses, rtol=1e-5)
  assert len(set(losses)) == 4  # Four different steps, not one repeated.
  moved = np.abs(np.asarray(state.params["encoder"]["layer_1"]["mlp"]["wi"]["kernel"])
                 - initial_kernel).max()
  assert moved > 1e-3, moved  # It trained.
  for a, b in zip(jax.tree.leaves(jax.tree.map(np.asarray, state.params)),
                  jax.tree.leaves(param_layout.unstack_layers(
                      jax.tree.map(np.asarray, scanned_state.params)))):
    np.testing.assert_allclose(np.asarray(b), a, atol=1e-5)


def _pretrain(workdir, **overrides):
  from maelm_jax.run import train  # pylint: disable=g-import-not-at-top
  config = tiny_config("maelm", **{
      "data.source": "pydoc:", "data.eval_fraction": 0.05,
      "tokenizer.vocab_size": 600, "batch_size": 8, "seq_len": 64,
      "warmup_steps": 1, "eval_batches": 1, "log_every": 1,
      "eval_every": 2, "checkpoint_every": 2, "mesh_shape": (2, 2, 2), **overrides})
  train.train_and_evaluate(config, str(workdir))


def test_a_scanned_run_feeds_init_from_fine_tuning_and_analysis(tmp_path):
  """Pretrained with scan_layers on a (data, fsdp, tensor) = (2, 2, 2) mesh; an
  unrolled run starts from it (init_from converts), and load_pretrained hands out
  either layout with the same numbers."""
  scanned_dir, unrolled_dir = tmp_path / "scanned", tmp_path / "unrolled"
  _pretrain(scanned_dir, total_steps=2, **{"model.scan_layers": True})
  assert pretrained_lib.saved_params_scanned(str(scanned_dir))
  assert json.loads((scanned_dir / "config.json").read_text())["model"]["scan_layers"]

  # A learning rate that cannot move the weights visibly: the new run's params
  # after one step are the scanned run's, unrolled.
  _pretrain(unrolled_dir, total_steps=1, learning_rate=1e-12,
            init_from=str(scanned_dir), **{"tokenizer.path": str(
                scanned_dir / "tokenizer.model")})
  assert not pretrained_lib.saved_params_scanned(str(unrolled_dir))
  source = pretrained_lib.load_pretrained(str(scanned_dir), encoder_only=False,
                                       scan_layers=False)
  assert not source.model_cfg.scan_layers and "layer_1" in source.params["encoder"]
  copied, _ = pretrained_lib.restore_params(str(unrolled_dir))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(source.params),
                          jax.tree.leaves(copied)):
    np.testing.assert_allclose(b, a, atol=1e-6, err_msg=jax.tree_util.keystr(path))

  # As saved (fine-tuning keeps the run's layout) and converted, the same encoder.
  as_saved = pretrained_lib.load_pretrained(str(scanned_dir))
  assert as_saved.model_cfg.scan_layers and "layers" in as_saved.params["encoder"]
  ids = jnp.asarray(random_ids(2, 24, as_saved.tokenizer.vocab_size))
  f32 = lambda cfg: model_lib.dataclasses.replace(cfg, dtype=jnp.float32)
  np.testing.assert_allclose(
      helpers.apply(model_lib.Encoder(f32(as_saved.model_cfg)),
                    {"params": as_saved.params}, ids),
      helpers.apply(model_lib.Encoder(f32(source.model_cfg)),
                    {"params": model_lib.encoder_params(source.params)}, ids),
      rtol=1e-5, atol=1e-5)

  # The export of the scanned run holds the weights the unrolled copy holds.
  pytest.importorskip("safetensors")
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  from maelm_jax.interop import export_hf  # pylint: disable=g-import-not-at-top
  exported = {}
  for run in (scanned_dir, unrolled_dir):
    export_hf.export(str(run), str(tmp_path / f"hf_{run.name}"))
    exported[run.name] = load_file(str(tmp_path / f"hf_{run.name}" / "model.safetensors"))
  assert sorted(exported["scanned"]) == sorted(exported["unrolled"])
  assert any(".1." in name for name in exported["scanned"])  # Per-layer tensors.
  for name, value in exported["unrolled"].items():
    np.testing.assert_allclose(exported["scanned"][name], value, atol=1e-6, err_msg=name)

  from maelm_jax.evaluate import analyze  # pylint: disable=g-import-not-at-top
  ranks = analyze.analyze([str(scanned_dir)], str(tmp_path / "rank"),
                          source="pydoc:", num_tokens=256)["runs"]
  assert ranks[str(scanned_dir)]["layers"] == ["embed", "layer_1", "layer_2",
                                               "final_ln"]

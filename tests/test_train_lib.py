"""Sharded training: same numbers on any mesh, accumulation, optimizer details."""

import dataclasses
import json
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from maelm_jax.modeling import flops, model as model_lib
from maelm_jax.core import sharding
from maelm_jax.run import train_lib
from tests import helpers
from tests.helpers import random_ids, tiny_config

VOCAB = 128


def run_steps(config, mesh_shape, steps=4, accum=1):
  cfg = model_lib.ModelConfig.from_config(config.model, VOCAB, 4)
  tx = train_lib.make_optimizer(config)
  n = int(np.prod(mesh_shape))
  mesh = sharding.make_mesh(mesh_shape, jax.devices()[:n])
  state, shardings = train_lib.create_sharded_state(cfg, config.seq_len, tx, mesh,
                                                    config.seed)
  step_fn, _ = train_lib.jit_steps(cfg, config.seq_len, tx, mesh, shardings, accum)
  losses = []
  for i in range(steps):
    # Tokens from a 16-word sub-vocabulary: learnable, so the loss must fall.
    ids = random_ids(config.batch_size, config.seq_len, 21, seed=i)
    state, metrics = step_fn(state, {"input_ids": ids},
                             train_lib.learning_rate_knots(config))
    losses.append(float(metrics["loss"]))
  return losses, state, shardings


@pytest.mark.parametrize("objective", ["maelm", "3ml", "mlm"])
def test_single_device_and_2x2x2_mesh_give_the_same_losses(objective):
  config = tiny_config(objective, total_steps=10, learning_rate=1e-2)
  single, _, _ = run_steps(config, (1, 1, 1))
  sharded, state, shardings = run_steps(config, (2, 2, 2))
  np.testing.assert_allclose(single, sharded, rtol=2e-5)
  assert single[-1] < single[0]  # And it learns something.
  # Parameters really are split: the embedding over fsdp (embed) and tensor (vocab).
  emb = state.params["token_embed"]["embedding"]
  assert emb.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
  assert emb.addressable_shards[0].data.shape == (VOCAB // 2, 64)
  assert sharding.fraction_replicated(state.params, shardings.params,
                                      min_size=4096) == 0.0


def test_a_state_is_laid_out_and_built_from_two_traces_of_its_model(monkeypatch):
  """The layout (what resume restores into) and the build each trace the model's
  init once, and agree leaf by leaf: shape, dtype and sharding. A model's init is
  a run's longest trace after its step's; a state once took three."""
  calls = []
  traced = model_lib.MaskedLM.__call__
  monkeypatch.setattr(model_lib.MaskedLM, "__call__",
                      lambda self, *a, **k: calls.append(1) or traced(self, *a, **k))
  config = tiny_config("maelm")
  cfg = model_lib.ModelConfig.from_config(config.model, VOCAB, 4)
  tx = train_lib.make_optimizer(config)
  mesh = sharding.make_mesh((2, 1, 1), jax.devices()[:2])
  abstract, shardings = train_lib.abstract_sharded_state(cfg, config.seq_len, tx, mesh)
  assert len(calls) == 1
  state, _ = train_lib.create_sharded_state(cfg, config.seq_len, tx, mesh, 0, shardings)
  assert len(calls) == 2
  assert jax.tree.structure(state) == jax.tree.structure(abstract)
  for built, planned in zip(jax.tree.leaves(state), jax.tree.leaves(abstract)):
    assert (built.shape, built.dtype, built.sharding) == \
        (planned.shape, planned.dtype, planned.sharding)
  assert not any(isinstance(x, nn.meta.AxisMetadata) for x in jax.tree.leaves(
      state, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata)))


def _sharding_constraints(jaxpr) -> list:
  """The sharding_constraint equations of a jaxpr and of every jaxpr inside it."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "sharding_constraint":
      found.append(eqn.params["sharding"].spec)
    for value in eqn.params.values():
      for sub in (value if isinstance(value, (tuple, list)) else [value]):
        inner = getattr(sub, "jaxpr", sub)
        if hasattr(inner, "eqns"):
          found.extend(_sharding_constraints(inner))
  return found


def test_the_train_step_lays_activations_out_by_their_logical_axes():
  """On a (data 2, fsdp 2, tensor 2) mesh the traced train step holds the model's
  activation constraints (it held none: XLA then took the activations' layout
  from the sharded weights, 4x the HBM bytes under fsdp on TPU): the rows over
  data x fsdp, the heads and the FFN's units over tensor; on one device, none."""
  config = tiny_config("mlm")
  cfg = model_lib.ModelConfig.from_config(config.model, VOCAB, 4)
  tx = train_lib.make_optimizer(config)
  specs = {}
  for shape in ((2, 2, 2), (1, 1, 1)):
    mesh = sharding.make_mesh(shape, jax.devices()[:int(np.prod(shape))])
    state, shardings = train_lib.create_sharded_state(cfg, config.seq_len, tx, mesh, 0)
    step_fn, _ = train_lib.jit_steps(cfg, config.seq_len, tx, mesh, shardings)
    ids = random_ids(config.batch_size, config.seq_len, 21)
    traced = step_fn.trace(state, {"input_ids": ids}, train_lib.learning_rate_knots(config))
    specs[shape] = _sharding_constraints(traced.jaxpr.jaxpr)
  assert specs[(1, 1, 1)] == []
  constrained = [tuple(spec) for spec in specs[(2, 2, 2)]]
  rows = ("data", "fsdp")
  # Per layer: the residual stream [B, L, D], q [B, L, H, d], the FFN's hidden units.
  assert constrained.count((rows, None, None)) >= 2 * cfg.num_layers, constrained
  assert (rows, None, "tensor", None) in constrained
  assert (rows, None, "tensor") in constrained


def test_gradient_accumulation_gives_the_same_update():
  config = tiny_config("maelm", **{"model.dropout": 0.0,
                                   "model.attention_dropout": 0.0})
  plain, state_a, _ = run_steps(config, (2, 1, 1), steps=3, accum=1)
  accum, state_b, _ = run_steps(config, (2, 1, 1), steps=3, accum=2)
  np.testing.assert_allclose(plain, accum, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(state_a.params), jax.tree.leaves(state_b.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("knobs", [{}, {"layer_decay": 0.8, "relative_updates": True}])
def test_a_pretraining_config_holds_every_optimizer_setting(knobs):
  """A pretraining config is passed to the optimizer as it is: it has each key
  of OptimizerConfig, and the two give one schedule and one optimizer state."""
  config = tiny_config(learning_rate=1e-3, warmup_steps=3, total_steps=30, **knobs)
  names = [f.name for f in dataclasses.fields(train_lib.OptimizerConfig)]
  settings = train_lib.OptimizerConfig(**{name: config[name] for name in names})
  np.testing.assert_array_equal(train_lib.learning_rate_knots(settings),
                                train_lib.learning_rate_knots(config))
  params = {"w": np.ones((4, 4), np.float32)}
  assert (jax.tree.structure(train_lib.make_optimizer(settings).init(params))
          == jax.tree.structure(train_lib.make_optimizer(config).init(params)))


def test_learning_rate_warmup_then_linear_decay():
  config = tiny_config(learning_rate=1e-3, warmup_steps=10, total_steps=110,
                       end_learning_rate_ratio=0.1)
  schedule = train_lib.learning_rate_schedule(config)
  assert float(schedule(0)) == 0.0
  assert float(schedule(5)) == pytest.approx(5e-4)
  assert float(schedule(10)) == pytest.approx(1e-3)
  assert float(schedule(60)) == pytest.approx(5.5e-4)
  assert float(schedule(110)) == pytest.approx(1e-4)


def test_a_run_shorter_than_its_warmup_warms_up_over_all_its_steps():
  # A quick try (total_steps=20) with the recipe's 200-step warm-up is accepted.
  config = tiny_config(learning_rate=1e-3, warmup_steps=200, total_steps=20)
  schedule = train_lib.learning_rate_schedule(config)
  assert float(schedule(0)) == 0.0
  assert float(schedule(10)) == pytest.approx(5e-4)
  assert float(schedule(20)) == pytest.approx(1e-3)


def test_weight_decay_skips_biases_and_layer_norm():
  params = {"encoder": {"layer_0": {"mlp": {"wi": {"kernel": 1, "bias": 2}},
                                    "mlp_ln": {"scale": 3, "bias": 4}}},
            "token_embed": {"embedding": 5}, "lm_head": {"bias": 6}}
  mask = train_lib.weight_decay_mask(params)
  flat = {jax.tree_util.keystr(p): v
          for p, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert flat["['encoder']['layer_0']['mlp']['wi']['kernel']"] is True
  assert flat["['encoder']['layer_0']['mlp']['wi']['bias']"] is False
  assert flat["['encoder']['layer_0']['mlp_ln']['scale']"] is False
  assert flat["['token_embed']['embedding']"] is True
  assert flat["['lm_head']['bias']"] is False


def _classifier_params(num_layers, scan_layers):
  from maelm_jax.finetune import heads  # pylint: disable=g-import-not-at-top
  cfg = model_lib.ModelConfig(vocab_size=50, hidden=16, num_layers=num_layers,
                              num_heads=2, mlp=32, scan_layers=scan_layers,
                              ln_type="pre")
  model = heads.SequenceClassifier(cfg, 2, pooling="mean")
  return nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0),
                                           jnp.ones((2, 8), jnp.int32))["params"])


def _by_name(tree):
  return {jax.tree_util.keystr(p): np.asarray(v)
          for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_encoder_depths_put_embeddings_at_0_layers_at_i_plus_1_head_on_top():
  depths, num_layers = train_lib.encoder_depths(_classifier_params(3, False))
  assert num_layers == 3
  flat = _by_name(depths)
  assert flat["['backbone']['token_embed']['embedding']"] == 0
  assert flat["['backbone']['encoder']['position_embed']['embedding']"] == 0
  assert flat["['backbone']['encoder']['relative_bias']['table']"] == 0
  assert flat["['backbone']['encoder']['layer_0']['mlp']['wi']['kernel']"] == 1
  assert flat["['backbone']['encoder']['layer_2']['self_attn_ln']['scale']"] == 3
  assert flat["['backbone']['encoder']['final_ln']['scale']"] == 4
  assert flat["['head']['out']['kernel']"] == 4
  # Scanned layers: one stacked leaf, a depth per layer along its leading axis.
  depths, num_layers = train_lib.encoder_depths(_classifier_params(3, True))
  flat = _by_name(depths)
  assert num_layers == 3
  np.testing.assert_array_equal(
      flat["['backbone']['encoder']['layers']['mlp']['wi']['kernel']"].ravel(),
      [1, 2, 3])
  assert flat["['backbone']['token_embed']['embedding']"] == 0
  assert flat["['head']['dense']['bias']"] == 4


@pytest.mark.parametrize("scan_layers", [False, True])
def test_layer_decay_scales_each_update_by_decay_to_the_distance_from_the_top(
    scan_layers):
  params = _classifier_params(2, scan_layers)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.3), params)
  updates = {}
  for decay in (1.0, 0.5):
    config = tiny_config(learning_rate=1e-2, warmup_steps=0, total_steps=10,
                         weight_decay=0.0)
    config.unlock()
    config.layer_decay = decay
    tx = train_lib.make_optimizer(config)
    updates[decay] = _by_name(  # As one program, not op by op.
        jax.jit(lambda g, p, tx=tx: tx.update(g, tx.init(p), p)[0])(grads, params))
  full, decayed = updates[1.0], updates[0.5]
  assert abs(full["['head']['out']['kernel']"]).min() > 0
  # L = 2: head x1, layer 1 (depth 2) x0.5, layer 0 x0.25, embeddings x0.125.
  expected = {"['head']['out']['kernel']": 1.0,
              "['backbone']['token_embed']['embedding']": 0.125}
  if scan_layers:
    expected["['backbone']['encoder']['layers']['mlp']['wi']['kernel']"] = (
        np.array([0.25, 0.5]).reshape(2, 1, 1))
  else:
    expected["['backbone']['encoder']['layer_0']['mlp']['wi']['kernel']"] = 0.25
    expected["['backbone']['encoder']['layer_1']['mlp']['wi']['kernel']"] = 0.5
  for name, factor in expected.items():
    np.testing.assert_allclose(decayed[name], full[name] * factor, rtol=1e-6)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_relative_updates_move_every_tensor_by_the_rate_times_its_norm(scan_layers):
  params = _classifier_params(2, scan_layers)
  # Weights at very different scales, as pretraining leaves them (in numpy: op
  # by op, each leaf's shape would be a compile of its own).
  params = jax.tree.map(lambda p: np.asarray(p) * np.float32(7.0) + np.float32(0.5),
                        params)
  params["head"]["out"]["bias"] = np.zeros_like(params["head"]["out"]["bias"])
  grads = jax.tree.map(lambda p: np.random.default_rng(0).normal(
      size=p.shape).astype(p.dtype), params)
  config = tiny_config(learning_rate=1e-2, warmup_steps=0, total_steps=10,
                       weight_decay=0.0)
  config.unlock()
  config.relative_updates = True
  tx = train_lib.make_optimizer(config)
  # One program: op by op, every leaf's few operations compiled on their own.
  updates = jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)
  flat_p, flat_u = _by_name(params), _by_name(updates)
  for name, p in flat_p.items():
    u = np.asarray(flat_u[name])
    if "layers" in name:  # Scanned: each layer's slice on its own.
      for i in range(p.shape[0]):
        np.testing.assert_allclose(np.linalg.norm(u[i]),
                                   1e-2 * np.linalg.norm(np.asarray(p[i])), rtol=1e-4)
    elif np.linalg.norm(p) > 0:
      np.testing.assert_allclose(np.linalg.norm(u), 1e-2 * np.linalg.norm(p), rtol=1e-4)
  # A zero tensor (a bias at init) takes the plain Adam step: lr per coordinate.
  bias_update = np.asarray(flat_u["['head']['out']['bias']"])
  np.testing.assert_allclose(np.abs(bias_update), 1e-2, rtol=1e-3)


@pytest.mark.parametrize("relative", [False, True])
def test_finetuning_configs_relative_updates_reach_the_optimizer(relative):
  """configs/glue.py's `relative_updates` is LAMB in the fine-tuning run's
  optimizer. (Until 2026-11-27 the fine-tuning loop dropped the key on its way to
  `make_optimizer`, and every run took plain AdamW steps.)"""
  import pathlib, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  from maelm_jax.finetune import run  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
  import glue  # pylint: disable=g-import-not-at-top
  config = glue.get_config("task=sst2")
  config.unlock()
  config.relative_updates, config.learning_rate = relative, 1e-2
  config.warmup_ratio, config.weight_decay = 0.0, 0.0
  tx = train_lib.make_optimizer(run.optimizer_config(config, total_steps=10))
  params = {"w": jnp.full((4,), 5.0)}  # Norm 10.
  grads = {"w": jnp.asarray([1.0, -2.0, 3.0, 0.5])}
  update = np.asarray(tx.update(grads, tx.init(params), params)[0]["w"])
  if relative:  # The rate is the relative change: 1e-2 of the norm.
    np.testing.assert_allclose(np.linalg.norm(update), 1e-2 * 10.0, rtol=1e-4)
  else:  # Adam's first step: the rate per coordinate.
    np.testing.assert_allclose(np.abs(update), 1e-2, rtol=1e-3)


def test_finetuning_runs_from_before_layer_decay_resume_as_they_ran():
  import pathlib, sys  # pylint: disable=g-import-not-at-top,multiple-imports
  from maelm_jax.run import config_lib  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "configs"))
  import glue  # pylint: disable=g-import-not-at-top
  now = glue.get_config("task=sst2").to_dict()
  saved = dict(now)
  del saved["layer_decay"]  # A config.json written before the knob: no decay.
  assert config_lib.config_differences(saved, now) == []
  decayed = {**now, "layer_decay": 0.8}
  assert config_lib.config_differences(saved, decayed) == ["layer_decay: 1.0 -> 0.8"]
  assert config_lib.resume_flags(saved, decayed) == ["--config.layer_decay=1.0"]


@pytest.mark.parametrize("objective,decoder,activation", [
    ("maelm", "self", "gelu"), ("3ml", "cross", "gelu"), ("mlm", "none", "gelu"),
    ("3ml", "cross", "geglu")])
def test_flop_model_matches_xla_cost_analysis(objective, decoder, activation):
  overrides = {"model.hidden": 256, "model.num_heads": 4, "model.mlp": 1024,
               "model.relative_position_bias": False,
               "model.mlp_activation": activation}
  if objective == "3ml":
    overrides["model.decoder_type"] = decoder
  config = tiny_config(objective, **overrides)
  cfg = model_lib.ModelConfig.from_config(config.model, 1000, 4)
  ids = random_ids(4, 128, 1000)
  masks = helpers.draw_masks(cfg, ids, 1000, seed=0)
  params = nn.meta.unbox(jax.jit(model_lib.MaskedLM(cfg).init)(jax.random.PRNGKey(0),
                                                      masks)["params"])
  forward = lambda p, m: helpers.apply(model_lib.MaskedLM(cfg), {"params": p}, m)
  cost = jax.jit(forward).lower(params, masks).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  ours = 4 * sum(flops.forward_flops_per_sequence(cfg, 128).values())
  # XLA also counts softmax, GELU, LayerNorm: matmuls are ~95% at this size.
  assert 0.9 < ours / cost["flops"] <= 1.0


def test_encoder_flops_shrink_with_masking():
  base = dict(vocab_size=8000, num_layers=12, hidden=768, num_heads=12, mlp=3072)
  mlm = model_lib.ModelConfig(**base, drop_masked=False, decoder_type="none",
                              decoder_layers=0)
  three_ml = model_lib.ModelConfig(**base, mask_ratio=0.5, random_replace_prob=0.1,
                                   keep_prob=0.1, decoder_layers=4)
  f_mlm = flops.forward_flops_per_sequence(mlm, 512)
  f_3ml = flops.forward_flops_per_sequence(three_ml, 512)
  assert f_3ml["encoder"] / f_mlm["encoder"] == pytest.approx(0.6, abs=0.03)
  assert flops.train_flops_per_step(mlm, 512, 2) == 3 * 2 * sum(f_mlm.values())


def test_first_principles_hbm_bytes_count_each_stack_at_its_length():
  """base MLM at 512, 32 rows and 110 M parameters a chip, counted by hand from
  the constants' rules; MAE-LM's encoder moves its visible tokens only, and its
  decoder's bias is [K, K] and [K, L - K_mask] (cross)."""
  base = dict(vocab_size=32000, num_layers=12, hidden=768, num_heads=12, mlp=3072)
  mlm = model_lib.ModelConfig(**base, **model_lib.OBJECTIVES["mlm"], decoder_layers=0)
  parts = flops.train_hbm_bytes_per_chip(mlm, 512, 32, 110e6)
  k = mlm.mask_counts(512).num_selected
  assert parts == {
      "weights and optimizer": 110e6 * (32 + 4),
      "activations": 12 * 60 * 32 * 512 * 768 * 2,
      "position bias": 12 * 10 * 12 * 512 * 512,
      "head": 16 * 32 * k * 32000}
  assert 20e9 < sum(parts.values()) < 30e9  # The "about 28-30" by hand.
  cross = model_lib.ModelConfig(**base, **{**model_lib.OBJECTIVES["3ml"],
                                          "decoder_type": "cross"}, decoder_layers=2)
  counts = cross.mask_counts(512)
  k, n = counts.num_selected, counts.encoder_len
  three_ml = flops.train_hbm_bytes_per_chip(cross, 512, 32, 110e6, grad_accum_steps=2)
  assert three_ml["activations"] == 60 * 32 * 768 * 2 * (12 * n + 2 * k)
  assert three_ml["position bias"] == 2 * 10 * 12 * (12 * n * n + 2 * (k * k + k * n))
  assert three_ml["weights and optimizer"] == 110e6 * (32 + 2 * 4)


def test_skipping_tokens_pays_for_the_decoder_only_in_a_deep_encoder():
  # tiny's width and head over 8000 pieces, a 1-layer decoder: at 2 layers 3ML's
  # step (head over half the tokens + decoder) costs more than MLM's, from ~6
  # layers the encoder positions it skips pay for them (benchmarks/flop_ratios.py).
  def ratio(objective, layers, **extra):
    shape = dict(vocab_size=8000, num_layers=layers, hidden=128, num_heads=2, mlp=512)
    mlm = model_lib.ModelConfig(**shape, **model_lib.OBJECTIVES["mlm"], decoder_layers=0)
    other = model_lib.ModelConfig(
        **shape, **{**model_lib.OBJECTIVES[objective], **extra}, decoder_layers=1)
    return (flops.train_flops_per_step(other, 128, 1)
            / flops.train_flops_per_step(mlm, 128, 1))

  three_ml = [ratio("3ml", n, decoder_type="cross") for n in (2, 4, 8, 12)]
  assert three_ml == sorted(three_ml, reverse=True)
  assert three_ml[0] > 1.4 and three_ml[2] < 0.9
  # MAE-LM's self-attention decoder runs over every position: it breaks even near 8.
  assert ratio("maelm", 2) > 1.2 and 0.95 < ratio("maelm", 8) < 1.0


def periodic_ids(batch, seq_len, vocab_size, period, seed):
  """`[CLS] a b c a b c ... [SEP]`: a random pattern per row, repeated. A masked
  token is the token `period` positions away, so context predicts it exactly,
  while its frequency alone predicts it with probability ~1/vocab."""
  rng = np.random.RandomState(seed)
  pattern = rng.randint(5, vocab_size, (batch, period))
  ids = np.tile(pattern, (1, seq_len // period + 1))[:, :seq_len].astype(np.int32)
  ids[:, 0], ids[:, -1] = 2, 3
  return ids


@pytest.mark.optimized  # 200-300 steps each: run, not compile, is its cost.
# Steps: what each objective needs to pass 0.9 with a margin. The 20-step means
# at steps 180-200 of a 200-step schedule: 3ml-cross 0.99 and 0.99 (two seeds),
# 3ml-self 0.98, MLM 1.0; MAE-LM 0.89 and 0.89, and 0.99 at 300 steps.
@pytest.mark.parametrize("objective,decoder,steps", [
    ("maelm", "self", 300), ("3ml", "self", 200), ("3ml", "cross", 200),
    ("mlm", "none", 200)])
def test_every_objective_learns_to_read_the_context(objective, decoder, steps):
  # Catches wiring that still lets the loss fall (token frequencies) but cuts the
  # masked slots off from the visible tokens: wrong gather/scatter indices,
  # positions lost between encoder and decoder, cross-attention to the wrong keys.
  # The learned table and local relative bias (the recipe's positions before
  # rotary ones): from scratch, rotary positions learn this period-3 copy more
  # slowly (20-step means 0.41-0.76 at 200 steps, MAE-LM 0.57 at 300); their
  # wiring is test_model's padding reference and the kernels' rotary tests.
  overrides = {"model.dropout": 0.0, "model.attention_dropout": 0.0,
               "model.position": "learned", "model.relative_position_bias": True,
               "learning_rate": 1e-3, "warmup_steps": 10, "total_steps": steps,
               "batch_size": 16}
  if decoder != "none":
    overrides["model.decoder_type"] = decoder
  config = tiny_config(objective, **overrides)
  cfg = model_lib.ModelConfig.from_config(config.model, VOCAB, 4)
  tx = train_lib.make_optimizer(config)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  state, shardings = train_lib.create_sharded_state(cfg, config.seq_len, tx, mesh, 0)
  step_fn, _ = train_lib.jit_steps(cfg, config.seq_len, tx, mesh, shardings)
  accuracies = []
  for i in range(config.total_steps):
    ids = periodic_ids(config.batch_size, config.seq_len, VOCAB, period=3, seed=i)
    state, metrics = step_fn(state, {"input_ids": ids},
                             train_lib.learning_rate_knots(config))
    accuracies.append(float(metrics["accuracy"]))
  # Chance is ~1/123; reading the neighbours' copies gets close to 1.
  assert np.mean(accuracies[:10]) < 0.1
  assert np.mean(accuracies[-20:]) > 0.9, accuracies[::20]


def test_pretraining_with_relative_updates_moves_each_scanned_layer_by_the_rate():
  """LAMB as a pretraining key: every tensor of an MAE-LM (its scanned encoder
  and decoder, each layer on its own) moves by the rate times its norm."""
  config = tiny_config("maelm", **{"model.scan_layers": True, "model.decoder_layers": 2,
                                   "learning_rate": 1e-2, "warmup_steps": 0,
                                   "weight_decay": 0.0, "relative_updates": True})
  cfg = model_lib.ModelConfig.from_config(config.model, VOCAB, 4)
  masks = train_lib._dummy_masks(cfg, config.seq_len)  # pylint: disable=protected-access
  params = nn.meta.unbox(jax.jit(model_lib.MaskedLM(cfg).init)(jax.random.PRNGKey(0),
                                                      masks)["params"])
  params = jax.tree.map(lambda p: p * 3.0 + 0.5, params)  # No zero tensors.
  grads = jax.tree.map(lambda p: jnp.asarray(np.random.default_rng(1).normal(
      size=p.shape), p.dtype), params)
  tx = train_lib.make_optimizer(config)
  # One program: op by op, every leaf's few operations compiled on their own.
  updates = jax.jit(lambda g, p: tx.update(g, tx.init(p), p)[0])(grads, params)
  flat_p, flat_u = _by_name(params), _by_name(updates)
  stacked = [name for name in flat_p if "['layers']" in name]
  assert any(name.startswith("['decoder']") for name in stacked)
  for name, p in flat_p.items():
    p, u = np.asarray(p), np.asarray(flat_u[name])
    for p_i, u_i in (zip(p, u) if name in stacked else [(p, u)]):
      np.testing.assert_allclose(np.linalg.norm(u_i), 1e-2 * np.linalg.norm(p_i),
                                 rtol=1e-4)


def test_a_longer_resumed_run_goes_on_from_the_rate_it_reached():
  """The first-day report: 200 steps, then the same run with total_steps=300
  went from 2e-5 at step 200 back up to 9.1e-4 at step 225 (the decay
  recomputed over 300 steps). Now the saved schedule holds up to the resume
  step, then the rate decays linearly from where it was to the end rate."""
  config = tiny_config(learning_rate=1e-3, warmup_steps=20, total_steps=200)
  saved = json.loads(config.to_json_best_effort())
  planned = train_lib.learning_rate_schedule(config)
  longer = tiny_config(learning_rate=1e-3, warmup_steps=20, total_steps=300)
  with longer.unlocked():
    longer, line = train_lib.continued_schedule(longer, saved, resume_step=150)
  schedule = train_lib.learning_rate_schedule(longer)
  for count in (0, 20, 100, 149, 150):  # Unchanged up to the resume step.
    assert float(schedule(count)) == pytest.approx(float(planned(count)))
  rates = [float(schedule(count)) for count in range(150, 301)]
  assert all(b <= a + 1e-12 for a, b in zip(rates, rates[1:]))  # Never back up.
  assert rates[0] == pytest.approx(float(planned(150)))
  assert rates[75] == pytest.approx(rates[0] / 2, rel=1e-3)  # Linear to 0 at 300.
  assert rates[-1] == pytest.approx(0.0, abs=1e-9)
  assert "total_steps 200 -> 300" in line and "from 0.000278 to 0 at step 300" in line
  assert "useful rate" not in line

  # Resumed again with the same total: the same schedule, nothing said.
  again = tiny_config(learning_rate=1e-3, warmup_steps=20, total_steps=300)
  with again.unlocked():
    again, nothing = train_lib.continued_schedule(
        again, json.loads(longer.to_json_best_effort()), resume_step=220)
  assert nothing is None
  assert float(train_lib.learning_rate_schedule(again)(260)) == pytest.approx(
      float(schedule(260)))


def test_a_finished_run_made_longer_is_told_its_rate_is_spent():
  config = tiny_config(learning_rate=1e-3, warmup_steps=20, total_steps=200)
  longer = tiny_config(learning_rate=1e-3, warmup_steps=20, total_steps=300)
  with longer.unlocked():
    longer, line = train_lib.continued_schedule(
        longer, json.loads(config.to_json_best_effort()), resume_step=200)
  assert float(train_lib.learning_rate_schedule(longer)(225)) == pytest.approx(0.0)
  assert "under a tenth of the peak" in line and "--config.init_from" in line


def _optax_schedule(config):
  """The schedule as it was built from optax's pieces before it became corners
  (train_lib.learning_rate_knots): the reference the corners must reproduce."""
  import optax  # pylint: disable=g-import-not-at-top
  peak = config.learning_rate
  end = peak * config.end_learning_rate_ratio
  segments = [tuple(s) for s in config.get("lr_schedule_segments") or ()]
  first_total = segments[0][1] if segments else config.total_steps
  warmup_steps = min(config.warmup_steps, first_total)
  schedule = optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(warmup_steps, 1)),
       optax.linear_schedule(peak, end, max(first_total - warmup_steps, 1))],
      [warmup_steps])
  for start, total in segments[1:]:
    rate = float(schedule(start))
    schedule = optax.join_schedules(
        [schedule, optax.linear_schedule(rate, end, max(total - start, 1))], [start])
  return schedule


@pytest.mark.parametrize("overrides", [
    dict(warmup_steps=20, total_steps=200, end_learning_rate_ratio=0.1),
    dict(warmup_steps=0, total_steps=50),
    dict(warmup_steps=200, total_steps=20),  # Shorter than its warm-up.
    dict(warmup_steps=1, total_steps=1),
    dict(warmup_steps=20, total_steps=300,
         lr_schedule_segments=((0, 200), (150, 300), (220, 400))),  # Resumed twice.
])
def test_the_schedules_corners_give_optaxs_schedule(overrides):
  config = tiny_config(learning_rate=1e-3, **overrides)
  knots = train_lib.learning_rate_knots(config)
  assert knots.dtype == np.float32 and knots.shape[1] == 2
  reference, host = _optax_schedule(config), train_lib.learning_rate_schedule(config)
  device = jax.jit(lambda c, k: jnp.interp(c.astype(jnp.float32), k[:, 0], k[:, 1]))
  last = int(knots[-1, 0]) + 5
  counts = np.arange(last)
  want = np.asarray([float(reference(c)) for c in counts])
  # To float32's rounding of the corners: a millionth of the peak rate.
  np.testing.assert_allclose([host(c) for c in counts], want, rtol=1e-6, atol=1e-9)
  np.testing.assert_allclose(jax.vmap(device, (0, None))(jnp.asarray(counts), knots),
                             want, rtol=1e-5, atol=1e-9)


def test_one_compiled_step_serves_every_schedule_and_follows_the_one_given():
  """Runs that differ in steps, warm-up or peak rate compile the same program
  (the schedule is the step's input); the optimizer's state is optax.adamw's,
  so checkpoints written before still restore; the step applies the rate of
  the corners it is given."""
  import optax  # pylint: disable=g-import-not-at-top
  short = tiny_config("maelm", learning_rate=1e-3, warmup_steps=0, total_steps=10,
                      **{"model.dropout": 0.0, "model.attention_dropout": 0.0})
  longer = tiny_config("maelm", learning_rate=2e-3, warmup_steps=0, total_steps=400,
                       **{"model.dropout": 0.0, "model.attention_dropout": 0.0})
  cfg = model_lib.ModelConfig.from_config(short.model, VOCAB, 4)
  mesh = sharding.make_mesh((1, 1, 1), jax.devices()[:1])
  texts, steps = [], []
  for config in (short, longer):
    tx = train_lib.make_optimizer(config)
    abstract, shardings = train_lib.abstract_sharded_state(cfg, config.seq_len, tx, mesh)
    step, _ = train_lib.jit_steps(cfg, config.seq_len, tx, mesh, shardings)
    batch = {"input_ids": jax.ShapeDtypeStruct((config.batch_size, config.seq_len),
                                               jnp.int32)}
    knots = train_lib.learning_rate_knots(config)
    texts.append(step.lower(abstract, batch, knots).as_text())
    steps.append(step)
  assert texts[0] == texts[1]

  params = {"w": jnp.ones((3, 4))}
  old = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
      optax.linear_schedule(0.0, 1e-3, 10), weight_decay=0.01,
      mask=train_lib.weight_decay_mask))
  assert (jax.tree.structure(train_lib.make_optimizer(short).init(params))
          == jax.tree.structure(old.init(params)))

  tx = train_lib.make_optimizer(short)
  state, shardings = train_lib.create_sharded_state(cfg, short.seq_len, tx, mesh, 0)
  start = jax.device_get(state.params)
  ids = {"input_ids": random_ids(short.batch_size, short.seq_len, 21, seed=0)}
  moved = {}
  for config in (short, longer):  # Peak rates 1e-3 and 2e-3, no warm-up.
    fresh = jax.tree.map(jnp.copy, state)
    after, _ = steps[0](fresh, ids, train_lib.learning_rate_knots(config))
    moved[config.learning_rate] = jax.tree.map(
        lambda a, b: np.asarray(a) - b, jax.device_get(after.params), start)
  for a, b, p in zip(jax.tree.leaves(moved[1e-3]), jax.tree.leaves(moved[2e-3]),
                     jax.tree.leaves(start)):
    # To the rounding of the float32 parameters the updates were added to.
    rounding = 4 * np.finfo(np.float32).eps * np.abs(p).max()
    np.testing.assert_allclose(b, 2 * a, rtol=1e-4, atol=rounding)
  assert max(np.abs(a).max() for a in jax.tree.leaves(moved[1e-3])) > 1e-4

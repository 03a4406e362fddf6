"""Pure pieces of training: state, optimizer, sharded init, train and eval steps.

Nothing here touches files or the data pipeline, so tests can build and run every
piece on any mesh.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from maelm_jax.modeling import attention, masking, param_layout
from maelm_jax.core import sharding
from maelm_jax.run import config_lib
from maelm_jax.modeling.model import MaskedLM, ModelConfig, masked_lm_loss

EVAL_SEED_OFFSET = 7919  # Eval masks come from their own stream, fixed for the run.


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32[2]; masks and dropout use fold_in(rng, step).
  # Steps whose loss or gradients were not finite; their update was not applied.
  nonfinite_count: jax.Array
  last_nonfinite_step: jax.Array  # 1-based step number, 0 if none.


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """What the optimizer and its schedule read (`make_optimizer`,
  `learning_rate_knots`): a pretraining config holds these keys under these
  names and is passed as it is; fine-tuning states them from its own config
  (`finetune.run.optimizer_config`)."""
  learning_rate: float  # The peak; with relative_updates, the relative change.
  total_steps: int
  warmup_steps: int
  end_learning_rate_ratio: float
  lr_schedule_segments: tuple  # Resumed runs' schedule (continued_schedule).
  weight_decay: float
  weight_decay_on: str  # "matrices" or "all".
  grad_clip_norm: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  layer_decay: float  # 1.0: off.
  relative_updates: bool


def learning_rate_knots(config) -> np.ndarray:
  """The learning-rate schedule as float32 [K, 2] corners (update count, rate):
  linear between them, flat after the last.

  Linear warm-up from 0, then linear decay to end_learning_rate_ratio * peak.
  A run shorter than its warm-up (a quick try with total_steps=20) warms up over
  all of its steps.

  A run resumed with another total_steps keeps the schedule it trained with up
  to the step it resumed from, then goes linearly from the rate there to the
  end rate at the new total_steps (`lr_schedule_segments`, written by
  `continued_schedule`): the rate never jumps back up.

  The train step takes the corners as an input (`make_train_step`), so runs
  that differ only in their schedule (steps, warm-up, peak rate) share one
  compiled step: a sweep over learning rates, a run resumed longer.
  """
  peak = config.learning_rate
  end = peak * config.end_learning_rate_ratio
  segments = [tuple(s) for s in config.lr_schedule_segments]
  first_total = segments[0][1] if segments else config.total_steps
  warmup_steps = min(config.warmup_steps, first_total)
  knots = [(0, 0.0), (warmup_steps, peak)] if warmup_steps > 0 else [(0, peak)]
  knots.append((max(first_total, warmup_steps + 1), end))
  for start, total in segments[1:]:
    # Optax counts the updates done: the update of step start + 1 is count start.
    rate = _rate_at(start, knots)
    knots = [k for k in knots if k[0] < start] + [(start, rate),
                                                  (max(total, start + 1), end)]
  return np.asarray(knots, np.float32)


def _rate_at(count, knots) -> float:
  knots = np.asarray(knots, np.float64)
  return float(np.interp(count, knots[:, 0], knots[:, 1]))


def schedule_of(knots: np.ndarray) -> Callable[[int], float]:
  """The rate of update `count` (0-based) on the host, read from the corners
  as the train step reads them."""
  return lambda count: _rate_at(count, knots)


def learning_rate_schedule(config) -> Callable[[int], float]:
  """`schedule_of` the config's `learning_rate_knots`."""
  return schedule_of(learning_rate_knots(config))


def scale_by_scheduled_rate(knots: np.ndarray) -> optax.GradientTransformationExtraArgs:
  """Updates times -rate(count), the rate linear between the corners `knots`
  (`learning_rate_knots`) or those given to the update as
  `learning_rate_knots=` (the train step's input). Its state is optax's
  `scale_by_learning_rate(schedule)`'s, so checkpoints of either restore."""
  default = np.asarray(knots, np.float32)

  def init_fn(params):
    del params
    return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

  def update_fn(updates, state, params=None, *, learning_rate_knots=None, **extra_args):
    del params, extra_args
    corners = default if learning_rate_knots is None else learning_rate_knots
    rate = jnp.interp(state.count.astype(jnp.float32), corners[:, 0], corners[:, 1])
    updates = jax.tree.map(lambda g: (-rate).astype(g.dtype) * g, updates)
    return updates, optax.ScaleByScheduleState(
        count=optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def continued_schedule(config, saved: dict | None, resume_step: int | None):
  """The schedule of a run resumed at `resume_step` whose saved config.json
  (`saved`) had another total_steps: (config with `lr_schedule_segments`
  extended, the one line that says so), or (config, None) when nothing changes.

  The saved segments are kept (a run continued twice goes on from where its
  last schedule had got to); `[resume_step, total_steps]` is added."""
  if not saved or resume_step is None:
    return config, None
  segments = tuple(tuple(s) for s in saved["lr_schedule_segments"])
  saved_total = segments[-1][1] if segments else saved["total_steps"]
  config.lr_schedule_segments = segments
  if config.total_steps == saved_total or resume_step >= config.total_steps:
    return config, None
  config.lr_schedule_segments = segments or ((0, saved_total),)  # As it trained.
  rate = learning_rate_schedule(config)(resume_step)
  config.lr_schedule_segments += ((resume_step, config.total_steps),)
  peak = config.learning_rate
  line = (f"total_steps {saved_total} -> {config.total_steps}: the learning rate keeps "
          f"its schedule up to step {resume_step}, then goes linearly from "
          f"{rate:.3g} to {peak * config.end_learning_rate_ratio:.3g} at step "
          f"{config.total_steps} (no new warm-up; docs/long-runs-and-faults.md)")
  if rate < 0.1 * peak:
    line += (f". That is under a tenth of the peak {peak:g}: to train on at a useful "
             "rate, start a new run from this one with --config.init_from=<this "
             "workdir> and a new --workdir")
  return config, line


WEIGHT_DECAY_RULES = ("matrices", "all")


def weight_decay_mask(params):
  """AdamW decays matrices and embeddings; not biases nor LayerNorm scales."""
  return jax.tree_util.tree_map_with_path(
      lambda path, _: path[-1].key not in ("bias", "scale"), params)


def _decay_mask(config):
  """config.weight_decay_on: 'matrices' (weight_decay_mask, BERT's rule) or 'all'
  (every parameter, as the MAE-LM release's fairseq AdamW does)."""
  return None if config.weight_decay_on == "all" else weight_decay_mask


def _dict_keys(path) -> tuple[str, ...]:
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def encoder_depths(tree) -> tuple[Any, int]:
  """Each leaf's depth in the encoder, for layer-wise learning-rate decay.

  Depth 0: what feeds the first layer (token and position embeddings, the
  relative-position table every layer reads, an input LayerNorm); depth i + 1:
  encoder layer i; depth L + 1: everything above the encoder (its final
  LayerNorm, a task head, a pretraining decoder). A stacked leaf of scanned
  layers (`encoder/layers`, leading axis L) gets an int array [L, 1, ...]. Paths
  are read by name, so this fits the fine-tuning models (`backbone/encoder`) and
  MaskedLM alike. Returns (depths, L).
  """
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  num_layers = 0
  for path, leaf in leaves:
    keys = _dict_keys(path)
    if "encoder" not in keys:
      continue
    below = keys[keys.index("encoder") + 1:]
    if below and below[0].startswith("layer_") and below[0][6:].isdigit():
      num_layers = max(num_layers, int(below[0][6:]) + 1)
    elif below and below[0] == "layers":
      num_layers = max(num_layers, leaf.shape[0])

  def depth(path, leaf):
    keys = _dict_keys(path)
    if "encoder" not in keys:
      # Embeddings live beside the encoder module; the rest sits above it.
      return 0 if keys and keys[-2:-1] == ("token_embed",) else num_layers + 1
    below = keys[keys.index("encoder") + 1:]
    if below[0].startswith("layer_") and below[0][6:].isdigit():
      return int(below[0][6:]) + 1
    if below[0] == "layers":
      shape = (leaf.shape[0],) + (1,) * (leaf.ndim - 1)
      return (np.arange(leaf.shape[0]) + 1).reshape(shape)
    return num_layers + 1 if below[0] == "final_ln" else 0

  return jax.tree_util.tree_map_with_path(depth, tree), num_layers


def scale_by_layer_decay(decay: float) -> optax.GradientTransformation:
  """Layer-wise learning-rate decay (ELECTRA, BEiT, DeBERTa fine-tuning).

  Multiplies each update by decay ** (L + 1 - depth) (`encoder_depths`): the
  task head and final LayerNorm at the full rate, each layer below at `decay`
  times the one above, the embeddings lowest. Placed after AdamW's weight decay,
  it scales the decay term too, as a per-layer learning rate does. It is meant
  to keep what pretraining put in the lower layers; at `tiny` on SST-2 and QNLI
  it did not help (studies/fine-tuning-protocol.md, "Settings that do not help").
  """

  def update(updates, state, params=None):
    del params
    depths, num_layers = encoder_depths(updates)
    updates = jax.tree.map(
        lambda u, d: u * jnp.asarray(decay ** (num_layers + 1 - np.asarray(d)),
                                     u.dtype), updates, depths)
    return updates, state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def scale_by_relative_size() -> optax.GradientTransformation:
  """LAMB's trust ratio (You et al. 2020) on AdamW's direction: each tensor's
  update is rescaled to its parameter's norm, so the learning rate is the
  *relative* change per step of every tensor, whatever its scale.

  Why fine-tuning wants it: pretraining grows the weights (at `tiny`, kernels
  and embeddings end 2-5x their initial RMS; studies/fine-tuning-protocol.md),
  so under plain AdamW, whose steps have a fixed absolute
  size, one learning rate moves a pretrained encoder 2-5x less, relatively, than
  a freshly initialised one. Why pretraining may want it: LAMB pretrained BERT
  at large batches, and the BabyLM winners (LTG-BERT) pretrain with it
  (`relative_updates` in configs/pretrain.py). A stacked leaf of scanned layers
  is normed per layer, as the unrolled layers are. Zero-norm tensors (biases at
  init) keep the plain update.
  """

  def update(updates, state, params):

    def rescale(path, u, p):
      # A scanned stack's leaf (the encoder's or a pretraining decoder's): reduce
      # all but the layer axis.
      per_layer = param_layout.SCANNED_LAYERS in _dict_keys(path)
      axes = tuple(range(1, p.ndim)) if per_layer else None
      param_norm = jnp.sqrt(jnp.sum(jnp.square(p.astype(jnp.float32)), axis=axes,
                                    keepdims=per_layer))
      update_norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32)), axis=axes,
                                     keepdims=per_layer))
      ratio = jnp.where((param_norm > 0) & (update_norm > 0),
                        param_norm / jnp.maximum(update_norm, 1e-30), 1.0)
      return (u * ratio).astype(u.dtype)

    return jax.tree_util.tree_map_with_path(rescale, updates, params), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(config) -> optax.GradientTransformationExtraArgs:
  """AdamW (or, with relative_updates, LAMB) with clipping and the schedule of
  `learning_rate_knots`, as `config` (an OptimizerConfig, or a pretraining
  config, which holds its keys) says. Its update takes `learning_rate_knots=` (the train
  step's input); without, it follows the config's own schedule. The state is
  optax.adamw's with a schedule."""
  layer_decay = config.layer_decay
  rate = scale_by_scheduled_rate(learning_rate_knots(config))
  if config.relative_updates:
    # AdamW's direction (decay included), each tensor's step rescaled to its
    # norm, times the schedule: LAMB.
    return optax.chain(
        optax.clip_by_global_norm(config.grad_clip_norm),
        optax.scale_by_adam(b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps),
        optax.add_decayed_weights(config.weight_decay, mask=_decay_mask(config)),
        scale_by_relative_size(),
        rate,
        *([scale_by_layer_decay(layer_decay)] if layer_decay != 1.0 else []),
    )
  return optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      optax.chain(  # optax.adamw, its rate from the schedule's corners.
          optax.scale_by_adam(b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps),
          optax.add_decayed_weights(config.weight_decay, mask=_decay_mask(config)),
          rate),
      *([scale_by_layer_decay(layer_decay)] if layer_decay != 1.0 else []),
  )


def _dummy_masks(cfg: ModelConfig, seq_len: int, batch: int = 1) -> masking.Masks:
  counts = cfg.mask_counts(seq_len)
  ids = jnp.full((batch, seq_len), 5, jnp.int32)
  return masking.draw_masks(jax.random.PRNGKey(0), ids, counts, mask_id=cfg.mask_id,
                            vocab_size=cfg.vocab_size)


def state_layout(init_boxed_state, tx, mesh, *init_args):
  """The shapes and shardings of the state `init_boxed_state(seed, *init_args)`
  builds, with nothing allocated. Shared by pretraining (`TrainState`) and
  fine-tuning (`finetune.run.FinetuneState`).

  `init_boxed_state` returns the state with its `params` still boxed (flax's
  logical-axis metadata, `nn.Partitioned`): one trace of the model gives both the
  shapes and the names the shardings come from (a model's init is its longest
  trace; a state once took three). Parameters are sharded by the logical axes
  their modules declare, the optimizer state like the parameters it belongs to,
  every other leaf (step, rng, counters) replicated. `init_args` may be
  `jax.ShapeDtypeStruct`s. Returns (abstract_state with shardings, state_shardings).
  """
  # Under the kernel mesh, as the steps are: init traces attention too, and its
  # kernel rules are the mesh's platform's (plan.py traces for TPU on a CPU). No
  # mesh context: the shardings come from the parameters' logical names and the
  # rules, given explicitly below (and flax's DenseGeneral boxes a flattened
  # kernel that a set mesh would reject: P('fsdp', 'tensor', None), rank 2).
  with attention.kernel_mesh(mesh):
    boxed = jax.eval_shape(init_boxed_state, jnp.uint32(0), *init_args)
  param_specs = nn.get_partition_spec(boxed.params)
  abstract = nn.meta.unbox(boxed)  # Shapes only, outside any mesh: no constraint.
  opt_specs = optax.tree_map_params(
      tx, lambda _, spec: spec, abstract.opt_state, param_specs,
      transform_non_params=lambda _: jax.sharding.PartitionSpec(),
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  specs = jax.tree.map(lambda _: jax.sharding.PartitionSpec(), abstract).replace(
      params=param_specs, opt_state=opt_specs)
  shardings = nn.logical_to_mesh_sharding(specs, mesh, sharding.LOGICAL_AXIS_RULES)
  abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          abstract, shardings)
  return abstract, shardings


def build_state(init_boxed_state, shardings, mesh, seed: int, *init_args):
  """Runs `init_boxed_state(seed, *init_args)`, unboxed, inside a jit whose
  `out_shardings` are `shardings` (`state_layout`'s), so each device creates only
  its own shards and no parameter is ever whole on one device. `init_args` must
  already be placed (their shardings are kept)."""
  def init_state(*args):
    return nn.meta.unbox(init_boxed_state(*args))

  with attention.kernel_mesh(mesh):
    return jax.jit(init_state, out_shardings=shardings)(jnp.uint32(seed), *init_args)


def abstract_sharded_state(model_cfg: ModelConfig, seq_len: int, tx, mesh):
  """The train state's shapes, dtypes and shardings, with nothing allocated:
  what a checkpoint is restored into (resume never builds a fresh state first).
  Returns (abstract_state, state_shardings)."""
  return state_layout(_boxed_state_init(model_cfg, seq_len, tx), tx, mesh)


def create_sharded_state(model_cfg: ModelConfig, seq_len: int, tx, mesh, seed: int,
                         shardings=None):
  """Builds the train state already sharded over `mesh`.

  jax.eval_shape -> logical partition specs -> mesh shardings -> jit(init) with
  out_shardings, so no parameter is ever materialised on a single device.
  `shardings`: the state's, when known (`abstract_sharded_state`'s): the model
  is then not traced once more to find them. Returns (state, state_shardings).
  """
  init = _boxed_state_init(model_cfg, seq_len, tx)
  if shardings is None:
    _, shardings = state_layout(init, tx, mesh)
  return build_state(init, shardings, mesh, seed), shardings


def init_params(model_cfg: ModelConfig, seq_len: int, rng: jax.Array):
  """Fresh, unboxed parameters of the pretraining model (unsharded). One jitted
  program: run op by op, an init compiles each of its few hundred operations on
  its own (3x the time on a CPU: benchmarks/eager_init_cpu.py)."""
  model = MaskedLM(model_cfg)
  return jax.jit(lambda r: nn.meta.unbox(
      model.init(r, _dummy_masks(model_cfg, seq_len))["params"]))(rng)


def _boxed_state_init(model_cfg: ModelConfig, seq_len: int, tx):
  """init(seed) -> TrainState whose params are still boxed (`state_layout`)."""
  model = MaskedLM(model_cfg)

  def init(seed_array):
    init_rng, state_rng = jax.random.split(jax.random.PRNGKey(seed_array))
    boxed = model.init(init_rng, _dummy_masks(model_cfg, seq_len))["params"]
    zero = jnp.zeros((), jnp.int32)
    return TrainState(step=zero, params=boxed, opt_state=tx.init(nn.meta.unbox(boxed)),
                      rng=state_rng, nonfinite_count=zero, last_nonfinite_step=zero)

  return init


def _split_microbatches(tree, num_micro: int):
  """[B, ...] -> [A, B/A, ...], microbatch i = rows i, i+A, i+2A, ...

  Strided, so each microbatch takes an equal share of every device's rows and no
  data moves between devices.
  """
  def split(x):
    x = x.reshape((x.shape[0] // num_micro, num_micro) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, tree)


def make_train_step(model_cfg: ModelConfig, seq_len: int, tx, grad_accum_steps: int = 1):
  """Returns train_step(state, batch, learning_rate_knots) -> (state, metrics);
  jit it with shardings. The knots are `learning_rate_knots(config)`: an input,
  not constants, so that one compiled step serves every schedule."""
  # The pipeline's rows are `[CLS] tokens [SEP] [PAD]...` (pipeline.PackRowsIterDataset).
  model = MaskedLM(model_cfg, deterministic=False, right_padded=True)
  counts = model_cfg.mask_counts(seq_len)

  def train_step(state: TrainState, batch, learning_rate_knots):
    step_rng = jax.random.fold_in(state.rng, state.step)
    mask_rng, dropout_rng = jax.random.split(step_rng)
    masks = masking.draw_masks(mask_rng, batch["input_ids"], counts,
                               mask_id=model_cfg.mask_id,
                               vocab_size=model_cfg.vocab_size)
    # Normalise by the token count of the whole global batch, so gradient
    # accumulation changes memory use, not the update.
    total_weight = jnp.maximum(masks.selected_weights.sum(), 1.0)

    def loss_fn(params, micro_masks, rng):
      logits = model.apply({"params": params}, micro_masks, rngs={"dropout": rng})
      loss_sum, correct, _ = masked_lm_loss(logits, micro_masks.targets,
                                            micro_masks.selected_weights)
      return loss_sum / total_weight, (loss_sum, correct)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if grad_accum_steps == 1:
      (_, (loss_sum, correct)), grads = grad_fn(state.params, masks, dropout_rng)
    else:
      micro = _split_microbatches(masks, grad_accum_steps)

      def accumulate(carry, inputs):
        grads_acc, loss_acc, correct_acc = carry
        index, micro_masks = inputs
        (_, (loss_sum, correct)), grads = grad_fn(
            state.params, micro_masks, jax.random.fold_in(dropout_rng, index))
        grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
        return (grads_acc, loss_acc + loss_sum, correct_acc + correct), None

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (grads, loss_sum, correct), _ = jax.lax.scan(
          accumulate, (zeros, 0.0, 0.0),
          (jnp.arange(grad_accum_steps), micro))

    loss = loss_sum / total_weight
    grad_norm = optax.tree.norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params,
                                   learning_rate_knots=learning_rate_knots)
    params = optax.apply_updates(state.params, updates)
    # A non-finite loss or gradient never reaches the parameters or the Adam
    # moments: the step is skipped and counted; the loop decides to go on or stop.
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep_new = lambda new, old: jax.tree.map(
        lambda a, b: jnp.where(finite, a, b), new, old)
    step = state.step + 1
    new_state = state.replace(
        step=step,
        params=keep_new(params, state.params),
        opt_state=keep_new(opt_state, state.opt_state),
        nonfinite_count=state.nonfinite_count + (~finite).astype(jnp.int32),
        last_nonfinite_step=jnp.where(finite, state.last_nonfinite_step, step))
    metrics = {"loss": loss, "accuracy": correct / total_weight,
               "grad_norm": grad_norm}
    return new_state, metrics

  return train_step


def draw_eval_masks(model_cfg: ModelConfig, input_ids, eval_rng, batch_index):
  """The held-out masks of batch `batch_index`: the same at every evaluation of a
  run (and for the baselines), so every number scores the same tokens."""
  return masking.draw_masks(jax.random.fold_in(eval_rng, batch_index), input_ids,
                            model_cfg.mask_counts(input_ids.shape[1]),
                            mask_id=model_cfg.mask_id,
                            vocab_size=model_cfg.vocab_size)


def make_eval_step(model_cfg: ModelConfig, seq_len: int):
  """Returns eval_step(params, batch, eval_rng, batch_index) -> sums.

  Two views of the same predictions: over all K selected positions (`loss_sum`,
  `correct`, `weight`), and over the `[MASK]`ed / dropped ones alone (`mask_*`).
  Only the latter is honest across objectives: MLM and 3ML also predict the
  kept tokens, which a model copies from its input.
  """
  del seq_len  # The batch carries it.
  model = MaskedLM(model_cfg, deterministic=True, right_padded=True)

  def eval_step(params, batch, eval_rng, batch_index):
    masks = draw_eval_masks(model_cfg, batch["input_ids"], eval_rng, batch_index)
    logits = model.apply({"params": params}, masks)
    loss_sum, correct, weight = masked_lm_loss(logits, masks.targets,
                                               masks.selected_weights)
    mask_weights = masks.selected_weights * masking.selected_is_masked(masks)
    mask_loss_sum, mask_correct, mask_weight = masked_lm_loss(
        logits, masks.targets, mask_weights)
    return {"loss_sum": loss_sum, "correct": correct, "weight": weight,
            "mask_loss_sum": mask_loss_sum, "mask_correct": mask_correct,
            "mask_weight": mask_weight}

  return eval_step


def with_kernel_mesh(step_fn, mesh):
  """`step_fn` traced under `attention.kernel_mesh(mesh)`, so that attention kernels
  (opaque to XLA's partitioner) run per shard of `mesh`."""
  @functools.wraps(step_fn)
  def traced_with_mesh(*args):
    with attention.kernel_mesh(mesh):
      return step_fn(*args)
  return traced_with_mesh


def jit_steps(model_cfg, seq_len, tx, mesh, state_shardings, grad_accum_steps=1):
  """jit-compiled train and eval steps with explicit shardings; state donated."""
  batch_shardings = {"input_ids": sharding.batch_sharding(mesh)}
  replicated = sharding.replicated(mesh)
  train_step = jax.jit(
      with_kernel_mesh(make_train_step(model_cfg, seq_len, tx, grad_accum_steps), mesh),
      in_shardings=(state_shardings, batch_shardings, replicated),
      out_shardings=(state_shardings, replicated),
      donate_argnums=0)
  eval_step = jax.jit(
      with_kernel_mesh(make_eval_step(model_cfg, seq_len), mesh),
      in_shardings=(state_shardings.params, batch_shardings, replicated, replicated),
      out_shardings=replicated)
  return train_step, eval_step


@dataclasses.dataclass
class Program:
  """What a run compiles, built by one function per kind of run
  (`pretrain_program`, `finetune.run.finetune_program`) that the run and the
  planner (plan.py) both call, so that the step a plan compiles for TPU chips is
  the step the run trains with."""
  tx: optax.GradientTransformation
  abstract_state: Any  # ShapeDtypeStructs with shardings: nothing allocated.
  state_shardings: Any
  # jitted (state, batch, learning_rate_knots) -> (state, metrics); state donated.
  train_step: Callable
  eval_step: Callable  # jitted; pretraining's eval step, fine-tuning's predict step.
  batch: dict  # name -> ShapeDtypeStruct of one global training batch, sharded.
  # The train step's schedule input: `learning_rate_knots` of the run's config.
  learning_rate_knots: np.ndarray = None
  # Pretraining with a mask rate that changes (config_lib.mask_ratios): the
  # train step of each stage, the last being `train_step` (the standard rate).
  stage_train_steps: tuple = ()


def pretrain_program(config, model_cfg: ModelConfig, mesh) -> Program:
  """The pretraining run's optimizer, sharded state layout and jitted steps."""
  tx = make_optimizer(config)
  abstract, shardings = abstract_sharded_state(model_cfg, config.seq_len, tx, mesh)
  train_step, eval_step = jit_steps(model_cfg, config.seq_len, tx, mesh, shardings,
                                    config.grad_accum_steps)
  batch = {"input_ids": jax.ShapeDtypeStruct(
      (config.batch_size, config.seq_len), jnp.int32,
      sharding=sharding.batch_sharding(mesh))}
  # One step per mask rate (each its own static mask count); parameters and
  # optimizer state are the same for all.
  stages = tuple(
      train_step if stage_cfg is model_cfg else
      jit_steps(stage_cfg, config.seq_len, tx, mesh, shardings,
                config.grad_accum_steps)[0]
      for stage_cfg in config_lib.stage_model_configs(config, model_cfg))
  return Program(tx, abstract, shardings, train_step, eval_step, batch,
                 learning_rate_knots(config), stages)

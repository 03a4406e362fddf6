"""The pretraining loop: one readable function in banner sections (big_vision style).

    python -m maelm_jax.main --config=configs/pretrain.py:objective=maelm,size=tiny \
        --workdir=/tmp/maelm
"""

from __future__ import annotations

import json
import math
import os
import time

from absl import logging
import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from maelm_jax import (config_lib, flops, metric_writers, pipeline, sharding,
                       sources, tokenizer as tokenizer_lib, train_lib)
from maelm_jax.model import ModelConfig


def check_batch_fits_mesh(config, mesh) -> None:
  """Device-dependent checks, run before anything is compiled."""
  dp = sharding.data_parallel_size(mesh)
  micro = config.batch_size // config.grad_accum_steps
  if micro % dp:
    raise ValueError(
        f"batch_size={config.batch_size} / grad_accum_steps="
        f"{config.grad_accum_steps} = {micro} sequences per microbatch is not "
        f"divisible by the data-parallel size {dp} (mesh data x fsdp = "
        f"{mesh.shape['data']} x {mesh.shape['fsdp']}); use a batch_size that is a "
        f"multiple of {dp * config.grad_accum_steps}")
  if config.batch_size % jax.process_count():
    raise ValueError(f"batch_size={config.batch_size} is not divisible by the "
                     f"{jax.process_count()} processes")


def check_corpus_fills_a_batch(source, tokenizer, seq_len, batch_size, what) -> None:
  """Fails fast on a corpus too small for one batch (reads only what it needs)."""
  needed = batch_size * (seq_len - 2)
  have = 0
  for start in range(0, len(source), 256):
    docs = [source[i] for i in range(start, min(start + 256, len(source)))]
    have += sum(len(ids) + 1 for ids in tokenizer.encode(docs))
    if have >= needed:
      return
  raise ValueError(
      f"the {what} split of data.source has about {have} tokens, fewer than one "
      f"batch needs ({batch_size} x {seq_len - 2}); add text, lower batch_size or "
      f"seq_len" + (", or raise data.eval_fraction" if what == "eval" else ""))


def write_config(config, workdir) -> None:
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2, sort_keys=True))


def _global_batch(mesh, local_batch):
  return {k: jax.make_array_from_process_local_data(sharding.batch_sharding(mesh), v)
          for k, v in local_batch.items()}


def evaluate(eval_step, params, eval_ds, mesh, eval_rng, num_batches):
  totals = {"loss_sum": 0.0, "correct": 0.0, "weight": 0.0}
  for index, batch in enumerate(eval_ds):
    if index >= num_batches:
      break
    out = eval_step(params, _global_batch(mesh, batch), eval_rng, jnp.int32(index))
    for key, value in jax.device_get(out).items():
      totals[key] += float(value)
  weight = max(totals["weight"], 1.0)
  return {"eval/loss": totals["loss_sum"] / weight,
          "eval/accuracy": totals["correct"] / weight}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Pretrains per `config` into `workdir`; returns the last logged metrics."""
  # ---------------------------------------------------------------- Set-up --
  config = config_lib.resolve(config)
  config_lib.validate(config)
  is_main = jax.process_index() == 0
  os.makedirs(workdir, exist_ok=True)
  if not os.access(workdir, os.W_OK):
    raise PermissionError(f"workdir {workdir} is not writable; pass another --workdir")
  mesh = sharding.make_mesh(config.mesh_shape)
  check_batch_fits_mesh(config, mesh)
  logging.info("mesh %s over %d devices (%d processes)", dict(mesh.shape),
               jax.device_count(), jax.process_count())

  # ------------------------------------------------------ Data & tokenizer --
  source_kwargs = dict(eval_fraction=config.data.eval_fraction,
                       text_field=config.data.text_field,
                       tfds_data_dir=config.data.tfds_data_dir or None)
  train_source = sources.open_source(config.data.source, "train", **source_kwargs)
  eval_source = sources.open_source(config.data.source, "eval", **source_kwargs)
  tokenizer = tokenizer_lib.load_or_train_tokenizer(
      workdir, lambda: pipeline.training_texts(train_source),
      vocab_size=config.tokenizer.vocab_size, model_type=config.tokenizer.model_type,
      path=config.tokenizer.path or None,
      max_sentences=config.tokenizer.max_sentences, seed=config.seed,
      is_writer=is_main)
  # Each process reads 1/process_count of the documents and needs its share of
  # the batch, so the whole split must hold a global batch.
  for source, split in ((train_source, "train"), (eval_source, "eval")):
    check_corpus_fills_a_batch(source, tokenizer, config.seq_len, config.batch_size,
                               split)
  local_batch = config.batch_size // jax.process_count()
  if is_main:
    write_config(config, workdir)

  def dataset(source, **kwargs):
    return pipeline.make_pretrain_dataset(
        source, tokenizer, seq_len=config.seq_len, batch_size=local_batch,
        process_index=jax.process_index(), process_count=jax.process_count(),
        **kwargs)

  train_ds = dataset(train_source, seed=config.seed, shuffle=True, repeat=True,
                     num_workers=config.data.num_workers)
  eval_ds = dataset(eval_source, seed=config.seed, shuffle=False, repeat=False)
  train_iter = iter(train_ds)

  # ------------------------------------------- Model, optimizer, sharded state --
  model_cfg = ModelConfig.from_config(config.model, tokenizer.vocab_size,
                                      tokenizer.mask_id)
  tx = train_lib.make_optimizer(config)
  state, state_shardings = train_lib.create_sharded_state(
      model_cfg, config.seq_len, tx, mesh, config.seed)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  logging.info("model %s/%s: %.2fM parameters; %s", config.model.objective,
               config.model.size, num_params / 1e6, model_cfg.mask_counts(config.seq_len))
  train_step, eval_step = train_lib.jit_steps(model_cfg, config.seq_len, tx, mesh,
                                              state_shardings,
                                              config.grad_accum_steps)
  eval_rng = jax.random.PRNGKey(config.seed + train_lib.EVAL_SEED_OFFSET)

  # ----------------------------------------------------------- Checkpoints --
  ckpt_dir = os.path.abspath(os.path.join(workdir, "checkpoints"))
  manager = ocp.CheckpointManager(
      ckpt_dir, item_names=("state", "data"),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints,
                                           enable_async_checkpointing=True))
  if manager.latest_step() is not None:
    restored_step = manager.latest_step()
    abstract = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                              sharding=s),
                            state, state_shardings)
    restored = manager.restore(restored_step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract),
        data=grain.checkpoint.CheckpointRestore(train_iter)))
    state = restored.state
    logging.info("resumed from %s at step %d", ckpt_dir, restored_step)

  def save(step):
    manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        data=grain.checkpoint.CheckpointSave(train_iter)))

  # ------------------------------------------------------------- Train loop --
  writer = metric_writers.MetricWriter(workdir, is_main)
  schedule = train_lib.learning_rate_schedule(config)
  step_flops = flops.train_flops_per_step(model_cfg, config.seq_len, config.batch_size)
  peak = flops.peak_flops(override=config.peak_flops_per_device or None)
  tokens_per_step = config.batch_size * config.seq_len
  start_step = int(jax.device_get(state.step))
  timer_start, timed_steps, last = None, 0, {}
  logging.info("training steps %d..%d; %.3g train FLOPs/step", start_step + 1,
               config.total_steps, step_flops)
  for step in range(start_step + 1, config.total_steps + 1):
    batch = _global_batch(mesh, next(train_iter))
    state, metrics = train_step(state, batch)
    if timer_start is None:  # Leave compilation out of the throughput.
      jax.block_until_ready(metrics)
      timer_start, timed_steps = time.perf_counter(), 0
    else:
      timed_steps += 1

    is_last = step == config.total_steps
    if step % config.log_every == 0 or is_last:
      metrics = jax.device_get(metrics)
      if not math.isfinite(float(metrics["loss"])):
        raise FloatingPointError(
            f"non-finite training loss {metrics['loss']} at step {step}; lower "
            "learning_rate or use model.dtype=float32. Checkpoints in "
            f"{ckpt_dir} are untouched.")
      elapsed = time.perf_counter() - timer_start
      steps_per_sec = timed_steps / elapsed if timed_steps and elapsed > 0 else 0.0
      last = {"train/loss": metrics["loss"], "train/accuracy": metrics["accuracy"],
              "train/grad_norm": metrics["grad_norm"],
              "lr": float(schedule(step - 1)),
              "tokens_per_sec": steps_per_sec * tokens_per_step,
              "mfu": steps_per_sec * step_flops / peak if peak else 0.0}
      if step % config.eval_every == 0 or is_last:
        last.update(evaluate(eval_step, state.params, eval_ds, mesh, eval_rng,
                             config.eval_batches))
      writer.write(step, last)
      if is_main:
        logging.info(metric_writers.format_console(step, config.total_steps, last))
      timer_start, timed_steps = time.perf_counter(), 0
    if step % config.checkpoint_every == 0 or is_last:
      save(step)

  manager.wait_until_finished()
  manager.close()
  writer.close()
  return last

"""Fine-tuning on GLUE or SQuAD: one loop for both (big_vision style sections).

    python -m maelm_jax.main --config=configs/glue.py:task=rte \
        --config.init_from=PRETRAIN_WORKDIR --config.data.dir=/data/glue/RTE \
        --workdir=runs/rte
    python -m maelm_jax.main --config=configs/squad.py:version=1.1 \
        --config.init_from=PRETRAIN_WORKDIR --config.data.train_file=train-v1.1.json \
        --config.data.eval_file=dev-v1.1.json --workdir=runs/squad

The tokenizer and the encoder (`token_embed`, `encoder`) come from the pretraining
workdir; the MAE-LM/3ML decoder and the LM head are not loaded. A freshly
initialised head is added (`heads.py`) and everything is trained with AdamW,
linear warm-up over `warmup_ratio` of the steps and linear decay, on the same
`('data', 'fsdp', 'tensor')` mesh and sharding rules as pretraining.

Every epoch evaluates all dev examples (the last batch is padded, never
dropped) and appends to `metrics.jsonl`. At the end the workdir holds:

  eval_results.json      {"task", "step", <last epoch's metrics>,
                          "best": {"step", "epoch", <metrics>}, "history": [...]}
  eval_predictions.jsonl GLUE: {"index", "prediction", "label"} per dev example
  glue_submission/*.tsv  GLUE, with data.predict_test: the server's format
  predictions.json       SQuAD: question id -> answer (official format)
  null_odds.json         SQuAD v2.0: question id -> no-answer score
  config.json            this run's config

Every configuration error is raised before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from maelm_jax.core import progress as progress_lib, sharding, storage
from maelm_jax.core import workdir as workdir_lib
from maelm_jax.modeling import attention
from maelm_jax.run import (checkpoints, compilation_cache, config_lib, metric_writers,
                           plots, run_session, train_lib)
from maelm_jax.run import pretrained as pretrained_lib
from maelm_jax.run import wandb_writer
from maelm_jax.finetune import heads, tasks
from maelm_jax.finetune.tasks import GlueProblem, SquadProblem

RESULTS_FILE = "eval_results.json"


class FinetuneState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any  # {backbone: {token_embed, encoder}, head | span_head: ...}
  opt_state: Any
  rng: jax.Array  # Dropout uses fold_in(rng, step).


# ------------------------------------------------------------ Validation --


def validate(config) -> None:
  """Static checks; each message names the fix."""
  errors = []

  def need(cond, msg):
    if not cond:
      errors.append(msg)

  need(bool(config.init_from),
       "--config.init_from is empty; set it to the --workdir of a maelm_jax "
       "pretraining run (its config.json, tokenizer.model and checkpoints are used)")
  need(8 <= config.max_seq_len, f"max_seq_len={config.max_seq_len} must be >= 8")
  need(config.batch_size >= 1, f"batch_size={config.batch_size} must be >= 1")
  need(config.mode != "glue" or config.pooling in heads.POOLINGS,
       f"pooling={config.get('pooling')!r} must be one of {heads.POOLINGS}")
  need(config.eval_batch_size >= 1,
       f"eval_batch_size={config.eval_batch_size} must be >= 1")
  need(config.num_epochs >= 1, f"num_epochs={config.num_epochs} must be >= 1")
  need(config.learning_rate > 0, f"learning_rate={config.learning_rate} must be > 0")
  need(0.0 < config.layer_decay <= 1.0,
       f"layer_decay={config.get('layer_decay')} must be in (0, 1]; 1.0 turns it "
       "off, 0.5-0.9 is usual")
  need(0.0 <= config.warmup_ratio < 1.0,
       f"warmup_ratio={config.warmup_ratio} must be in [0, 1), e.g. 0.06")
  for problem in config_lib.dropout_and_kernel_errors(config):
    need(False, problem)
  need(config.dtype in ("", "bfloat16", "float32"),
       f"dtype={config.dtype!r} must be '' (the pretrained model's), 'bfloat16' or "
       "'float32'")
  need(config.log_every >= 1, f"log_every={config.log_every} must be >= 1")
  need(config_lib.max_runtime_problem(config) is None,
       config_lib.max_runtime_problem(config))
  need(wandb_writer.problem(config) is None, wandb_writer.problem(config))
  if errors:
    raise ValueError("invalid config:\n  - " + "\n  - ".join(errors))


def check_fits_mesh(config, mesh) -> None:
  dp = sharding.data_parallel_size(mesh)
  for name in ("batch_size", "eval_batch_size"):
    size = config[name]
    if size % dp:
      raise ValueError(
          f"{name}={size} is not divisible by the data-parallel size {dp} (mesh data "
          f"x fsdp = {mesh.shape['data']} x {mesh.shape['fsdp']}); use a multiple of "
          f"{dp}, e.g. --config.{name}={max(dp, size // dp * dp)}")
    if size % jax.process_count():
      raise ValueError(f"{name}={size} is not divisible by the "
                       f"{jax.process_count()} processes")


def check_pretrained(config) -> None:
  """The pretraining workdir exists and its model takes `max_seq_len` tokens."""
  saved = workdir_lib.read_config(config.init_from)
  if saved is None:
    raise FileNotFoundError(
        f"{workdir_lib.config_path(config.init_from)} not found: --config.init_from "
        "must be the --workdir of a maelm_jax pretraining run")
  if saved.get("mode", "pretrain") != "pretrain" or "model" not in saved:
    raise ValueError(
        f"--config.init_from={config.init_from} is a fine-tuning run, not a "
        "pretraining one: pass the --workdir of the pretraining run it started from "
        f"(its init_from: {saved.get('init_from') or 'not recorded'})")
  max_positions = saved["model"]["max_positions"]
  if config.max_seq_len > max_positions:
    raise ValueError(
        f"max_seq_len={config.max_seq_len} exceeds the {max_positions} positions the "
        f"model in {config.init_from} was pretrained with; use "
        f"--config.max_seq_len={max_positions} or less")
  if checkpoints.latest_step(config.init_from) is None:
    raise FileNotFoundError(
        f"no checkpoint in {checkpoints.checkpoint_dir(config.init_from)}; "
        "--config.init_from must name a pretraining run that saved one")
  steps = checkpoints.committed_steps(config.init_from)
  if config.init_step >= 0 and config.init_step not in steps:
    raise ValueError(f"--config.init_step={config.init_step}: {config.init_from} has "
                     f"no checkpoint of that step; it has steps {steps} (or -1: the "
                     "newest)")


# --------------------------------------------------------- Sharded state --


def _boxed_state_init(model: nn.Module, max_seq_len: int, tx):
  """init(seed, backbone=None) -> FinetuneState whose params are still boxed
  (`train_lib.state_layout`): a new head around the given (pretrained) backbone
  params, or around the model's own random backbone when none is given (its
  shapes and logical names are what the layout needs)."""
  dummy_ids = jnp.zeros((1, max_seq_len), jnp.int32)

  def init(seed_array, backbone=None):
    init_rng, state_rng = jax.random.split(jax.random.PRNGKey(seed_array))
    params = dict(model.init(init_rng, dummy_ids)["params"])
    if backbone is not None:
      params["backbone"] = backbone  # XLA drops the unused random backbone init.
    return FinetuneState(step=jnp.zeros((), jnp.int32), params=params,
                         opt_state=tx.init(nn.meta.unbox(params)), rng=state_rng)

  return init


def abstract_state(model: nn.Module, max_seq_len: int, tx, mesh):
  """The fine-tuning state's shapes and shardings, nothing allocated and nothing
  read (what resume restores into). Returns (abstract_state, state_shardings)."""
  return train_lib.state_layout(_boxed_state_init(model, max_seq_len, tx), tx, mesh)


def create_state(model: nn.Module, max_seq_len: int, backbone_params, tx, mesh,
                 seed: int, layout=None):
  """The train state, already sharded: pretrained backbone + a new head.

  The mechanism of pretraining (`train_lib.state_layout` / `build_state`); the
  pretrained numpy arrays are placed straight into their shards, each process
  building only its own. `layout`: `abstract_state`'s (abstract, shardings) when
  known (the run's program has it), so the model is not traced once more.
  Returns (state, state_shardings).
  """
  abstract, shardings = layout or abstract_state(model, max_seq_len, tx, mesh)
  _check_backbone_shapes(abstract.params["backbone"], backbone_params)
  backbone = jax.tree.map(
      lambda x, s: jax.make_array_from_callback(x.shape, s, lambda i: x[i]),
      backbone_params, shardings.params["backbone"])
  return train_lib.build_state(_boxed_state_init(model, max_seq_len, tx), shardings,
                               mesh, seed, backbone), shardings


def _check_backbone_shapes(expected, loaded) -> None:
  expected_shapes = jax.tree.map(lambda x: tuple(x.shape), expected)
  loaded_shapes = jax.tree.map(lambda x: tuple(x.shape), loaded)
  if expected_shapes != loaded_shapes:
    raise ValueError(
        "the pretrained encoder's parameters do not fit the encoder built from its "
        f"config.json:\n  built:  {expected_shapes}\n  loaded: {loaded_shapes}\n"
        "the checkpoint and config.json of --config.init_from disagree")


# ----------------------------------------------------------------- Steps --


def finetune_model_config(config, pretrained_cfg):
  """The pretrained encoder's ModelConfig as fine-tuning runs it: its own
  dropout, attention kernel and (when set) matmul dtype."""
  return dataclasses.replace(
      pretrained_cfg, dropout=config.dropout,
      attention_dropout=config.attention_dropout,
      activation_dropout=config.activation_dropout,
      attention_impl=config.attention_impl,
      dtype=jnp.dtype(config.dtype) if config.dtype else pretrained_cfg.dtype)


def optimizer_config(config, total_steps: int) -> train_lib.OptimizerConfig:
  """The optimizer and schedule of a fine-tuning config over `total_steps`: its
  warm-up a share of them, BERT's decay rule, one schedule (never resumed longer)."""
  return train_lib.OptimizerConfig(
      learning_rate=config.learning_rate, total_steps=total_steps,
      warmup_steps=round(config.warmup_ratio * total_steps),
      end_learning_rate_ratio=config.end_learning_rate_ratio, lr_schedule_segments=(),
      weight_decay=config.weight_decay, weight_decay_on="matrices",
      grad_clip_norm=config.grad_clip_norm,
      adam_b1=config.adam_b1, adam_b2=config.adam_b2, adam_eps=config.adam_eps,
      layer_decay=config.layer_decay, relative_updates=config.relative_updates)


def finetune_program(config, problem, model_cfg, total_steps: int,
                     mesh) -> train_lib.Program:
  """The fine-tuning run's optimizer, sharded state layout and jitted steps;
  the planner (plan.py) builds the step it compiles with this same function."""
  schedule_config = optimizer_config(config, total_steps)
  tx = train_lib.make_optimizer(schedule_config)
  model = problem.make_model(model_cfg, deterministic=True)
  abstract, state_shardings = abstract_state(model, config.max_seq_len, tx, mesh)
  train_step, predict_step = make_steps(problem, model_cfg, tx, mesh, state_shardings)
  rows = sharding.batch_sharding(mesh)
  batch = {key: jax.ShapeDtypeStruct((config.batch_size,) + shape, dtype, sharding=rows)
           for key, (shape, dtype) in problem.batch_spec().items()}
  return train_lib.Program(tx, abstract, state_shardings, train_step, predict_step,
                           batch, train_lib.learning_rate_knots(schedule_config))


def make_steps(problem, model_cfg, tx, mesh, state_shardings):
  """jit-compiled train step (state donated; its learning-rate schedule an input,
  train_lib.learning_rate_knots) and predict step."""
  train_model = problem.make_model(model_cfg, deterministic=False)
  eval_model = problem.make_model(model_cfg, deterministic=True)

  def train_step(state, batch, learning_rate_knots):
    dropout_rng = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      outputs = train_model.apply({"params": params}, batch["input_ids"],
                                  rngs={"dropout": dropout_rng})
      return problem.loss(outputs, batch)

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params,
                                   learning_rate_knots=learning_rate_knots)
    params = optax.apply_updates(state.params, updates)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

  def predict_step(params, input_ids):
    return eval_model.apply({"params": params}, input_ids)

  rows = sharding.batch_sharding(mesh)
  batch_shardings = {key: rows for key in problem.batch_spec()}
  train_step = jax.jit(train_lib.with_kernel_mesh(train_step, mesh),
                       in_shardings=(state_shardings, batch_shardings,
                                     sharding.replicated(mesh)),
                       out_shardings=(state_shardings, sharding.replicated(mesh)),
                       donate_argnums=0)
  predict_step = jax.jit(train_lib.with_kernel_mesh(predict_step, mesh),
                         in_shardings=(state_shardings.params, rows),
                         out_shardings=sharding.replicated(mesh))
  return train_step, predict_step


def _process_share(rows: np.ndarray) -> np.ndarray:
  """Every process holds the whole data set; this is its contiguous block of a
  global batch's rows (or row indices), the part it contributes."""
  local = len(rows) // jax.process_count()
  start = jax.process_index() * local
  return rows[start:start + local]


def predict_all(predict_step, params, input_ids: np.ndarray, batch_size: int, mesh):
  """Model outputs for every row (the last batch padded with [PAD] rows)."""
  num_rows = len(input_ids)
  padded = max(1, math.ceil(num_rows / batch_size)) * batch_size
  input_ids = np.concatenate(
      [input_ids, np.zeros((padded - num_rows,) + input_ids.shape[1:], np.int32)])
  outputs = [predict_step(params, sharding.global_batch(
      mesh, {"ids": _process_share(input_ids[i:i + batch_size])})["ids"])
             for i in range(0, padded, batch_size)]
  outputs = jax.device_get(outputs)
  return jax.tree.map(lambda *chunks: np.concatenate(chunks)[:num_rows], *outputs)


# ------------------------------------------------------------------ Run --


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Fine-tunes and evaluates per `config`; returns the eval_results dict."""
  # ---------------------------------------------------------------- Set-up --
  if config.mode not in ("glue", "squad"):
    raise ValueError(f"config.mode={config.mode!r}: fine-tuning runs 'glue' or "
                     "'squad' (configs/glue.py, configs/squad.py)")
  config = config_lib.completed(config)
  validate(config)
  # A bucket workdir runs in its mirror, its checkpoints in the bucket (storage.py).
  with workdir_lib.removed_if_start_fails(workdir), storage.mirrored(workdir) as workdir:
    run_session.claim(config, workdir, config.mode)
    compilation_cache.configure(config)
    mesh = sharding.make_mesh(config.mesh_shape)
    check_fits_mesh(config, mesh)
    check_pretrained(config)
    problem = GlueProblem(config) if config.mode == "glue" else SquadProblem(config)
    with run_session.hold(workdir):  # One live run per workdir.
      return _run(config, workdir, problem, mesh)


def check_same_run(config, workdir: str) -> None:
  """A fine-tuning workdir is one run: starting it again (same config) starts it
  over; another config (another init_from, task, learning rate...) is refused,
  so that results of different runs never mix (the sweep asks first)."""
  run_session.check_same_config(config, workdir, config.mode)


def _run(config, workdir: str, problem, mesh) -> dict:
  is_main = jax.process_index() == 0

  # -------------------------------------------------- Pretrained encoder --
  # Its config and tokenizer now; its params only if there is nothing to resume.
  pretrained = pretrained_lib.load_pretrained(
      config.init_from, encoder_only=True, read_params=False,
      step=None if config.init_step < 0 else config.init_step)
  model_cfg = finetune_model_config(config, pretrained.model_cfg)

  # ------------------------------------------------------------------ Data --
  problem.load(pretrained.tokenizer)
  num_train = len(problem.train["input_ids"])
  steps_per_epoch = num_train // config.batch_size  # The remainder is reshuffled in.
  if steps_per_epoch == 0:
    raise ValueError(f"{num_train} training examples do not fill one batch of "
                     f"{config.batch_size}; lower --config.batch_size")
  total_steps = steps_per_epoch * config.num_epochs

  # ------------------------------------------- Model, optimizer, sharded state --
  # The same builder as the planner's (plan.py): what it compiled is what runs.
  program = finetune_program(config, problem, model_cfg, total_steps, mesh)
  tx, abstract = program.tx, program.abstract_state
  train_step, predict_step = program.train_step, program.eval_step
  model = problem.make_model(model_cfg, deterministic=True)
  # The train step's schedule input, and the rate logged: the same corners.
  schedule = train_lib.schedule_of(program.learning_rate_knots)
  knots = jax.device_put(program.learning_rate_knots, sharding.replicated(mesh))
  logging.info("%d epochs x %d steps of %d examples (%d warm-up steps); mesh %s",
               config.num_epochs, steps_per_epoch, config.batch_size,
               round(config.warmup_ratio * total_steps), dict(mesh.shape))

  # ------------------------------------------------ Checkpoints and resume --
  # The pretraining mechanism (checkpoints.restore_newest_readable), restoring
  # straight into the abstract state: a run stopped at any step (SIGTERM,
  # Ctrl-C, kill -9 after an epoch) resumes where it was, with the same losses:
  # the epoch order is a function of (seed, epoch) and dropout of (rng, step).
  # `progress` says where to go on from.
  manager = checkpoints.make_manager(workdir, config, item_names=("state", "progress"))
  with run_session.closed_on_error(manager):  # Until the session owns it.
    state, progress, restored_step = checkpoints.restore_newest_readable(
        manager, abstract, "progress", ocp.args.JsonRestore,
        "it was written by another fine-tuning setup", start_over=config.get(
            "start_over", False))
    if state is not None:
      logging.info("resumed from %s at step %d (epoch %d)", manager.directory,
                   restored_step, progress["epoch"])
    else:  # A fresh start: the pretrained encoder and a new head.
      pretrained_lib.read_pretrained_params(config.init_from, pretrained)
      pretrain_model = pretrained.config.model
      dropped = ("no decoder (MLM)" if pretrain_model.decoder_type == "none" else
                 f"{pretrain_model.objective} decoder ({pretrain_model.decoder_type}, "
                 f"{pretrain_model.decoder_layers} layers)")
      logging.info("loaded encoder (token_embed, encoder) from step %d of %s; %s and "
                   "LM head not loaded", pretrained.step, config.init_from, dropped)
      state, _ = create_state(model, config.max_seq_len, pretrained.params, tx, mesh,
                              config.seed, (abstract, program.state_shardings))
      pretrained.params = None  # The host copy is no longer needed.
    progress = progress or {"epoch": 1, "batches_done": 0, "history": []}
    # config.json and metrics.jsonl as of the step it goes on from (run_session.py),
    # once the checkpoints are known to fit (they were read, not touched).
    session = run_session.RunSession(workdir, config, manager, restored_step)

  # ------------------------------------------------------------- Train loop --
  def predict(input_ids):  # With the current `state` (rebound by the loop).
    return predict_all(predict_step, state.params, input_ids, config.eval_batch_size,
                       mesh)

  def save(step, epoch, batches_done):
    checkpoints.save(manager, step, state, progress=ocp.args.JsonSave(
        {"epoch": epoch, "batches_done": batches_done, "history": history}))

  try:
    history, evaluation = list(progress["history"]), None
    stop = stopped = False  # A signal arrived / the run stops before its end.
    step = int(jax.device_get(state.step))
    timer, timed_examples, compiled = time.perf_counter(), 0, False
    for epoch in range(progress["epoch"], config.num_epochs + 1):
      order = np.random.default_rng([config.seed, epoch]).permutation(num_train)
      first = progress["batches_done"] if epoch == progress["epoch"] else 0
      for i in range(first, steps_per_epoch):
        rows = order[i * config.batch_size:(i + 1) * config.batch_size]
        mine = _process_share(rows)  # Index only this process's rows.
        batch = sharding.global_batch(
            mesh, {key: value[mine] for key, value in problem.train.items()})
        state, train_metrics = train_step(state, batch, knots)
        step += 1
        if not compiled:  # Leave compilation out of the throughput.
          jax.block_until_ready(train_metrics)
          timer, timed_examples, compiled = time.perf_counter(), 0, True
          eta_from = (timer, step)  # Wall time per step, evaluations included.
        else:
          timed_examples += config.batch_size
        if step % config.log_every == 0 or i == steps_per_epoch - 1:
          train_metrics = jax.device_get(train_metrics)
          loss = float(train_metrics["loss"])
          if not math.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss} at step "
                                     f"{step}; lower --config.learning_rate or use "
                                     "--config.dtype=float32")
          elapsed = time.perf_counter() - timer
          logged = {"train/loss": loss,
                    "train/grad_norm": float(train_metrics["grad_norm"]),
                    "lr": float(schedule(step - 1)),
                    "examples_per_sec": timed_examples / max(elapsed, 1e-9)}
          session.write(step, logged)
          eta = progress_lib.eta(step - eta_from[1], total_steps - eta_from[1],
                                 time.perf_counter() - eta_from[0])
          logging.info(metric_writers.format_console(step, total_steps, logged, eta))
          timer, timed_examples = time.perf_counter(), 0
        stop = session.stop_requested(step)
        if stop and i < steps_per_epoch - 1:  # Mid-epoch: save where it is.
          save(step, epoch, i + 1)
          stopped = True
          break
      if stopped:
        break

      # ----------------------------------------------------- Evaluation --
      evaluation = problem.evaluate({s.name: predict(s.input_ids)
                                     for s in problem.eval_sets})
      history.append({"step": step, "epoch": epoch, **evaluation.metrics})
      session.write(step, {f"eval/{k}": v for k, v in evaluation.metrics.items()})
      logging.info("epoch %d/%d (step %d): %s", epoch, config.num_epochs, step,
                   ", ".join(f"{k} {v:.4f}" for k, v in evaluation.metrics.items()))
      if is_main:
        _plot(workdir, list(evaluation.metrics), results_name(config), session, step)
      save(step, epoch + 1, 0)
      timer, timed_examples = time.perf_counter(), 0
      if stop and epoch < config.num_epochs:  # Saved just above.
        stopped = True
        break
  finally:
    session.close()
  if stopped:
    return session.stopped(step)
  if evaluation is None:  # Resumed after the last epoch: its outputs again.
    evaluation = problem.evaluate({s.name: predict(s.input_ids)
                                   for s in problem.eval_sets})
  best = None
  for record in history:
    if best is None or record[problem.main_metric] > best[problem.main_metric]:
      best = record

  # ---------------------------------------------------------------- Outputs --
  results = {"task": results_name(config),
             "step": step, "epoch": config.num_epochs, **evaluation.metrics,
             "main_metric": problem.main_metric, "best": best, "history": history,
             "init_from": storage.absolute(config.init_from),
             "learning_rate": config.learning_rate, "seed": config.seed,
             "batch_size": config.batch_size, "num_epochs": config.num_epochs}
  if is_main:
    with open(os.path.join(workdir, RESULTS_FILE), "w") as f:
      json.dump(results, f, indent=2)
  test_predictions = problem.predict_test(predict)  # Every process runs the model.
  if is_main:
    problem.write_predictions(workdir, evaluation, test_predictions)
    if not config.keep_final_checkpoint:
      # Only needed to resume, and the run is done: at base size a fine-tune's
      # params + Adam state are ~1.3 GB, times every run of a sweep.
      storage.remove_tree(checkpoints.checkpoint_dir(workdir))
    print(summary(workdir, results, len(evaluation.outputs)
                  if config.mode == "glue" else 0), flush=True)
  return results


def results_name(config) -> str:
  """The task as results name it: sst2, mnli, ..., squad_v1.1."""
  return config.task if config.mode == "glue" else f"squad_v{config.version}"


def _plot(workdir: str, metrics: list[str], task: str, session, step: int) -> None:
  """The curves are a convenience: a failure to draw them never stops a run
  (nor are they drawn where MAELM_PLOTS=0)."""
  if not plots.enabled():
    return
  try:
    plots.plot_finetuning_curve(workdir, metrics, f"{task}: {workdir}")
  except Exception as error:  # pylint: disable=broad-except
    logging.warning("could not draw %s: %s", plots.FINETUNING_FILENAME, error)
    return
  session.writer.image(step, "finetuning_curve",
                       os.path.join(workdir, plots.FINETUNING_FILENAME))


def summary(workdir: str, results: dict, num_dev: int = 0) -> str:
  """The closing lines: the last and best main score, beside what always
  answering the majority class scores, and a warning when the classifier
  collapsed to one class or is within noise of that (tasks.collapse_warning)."""
  main, best = results["main_metric"], results["best"]
  prefix, _, name = main.rpartition("/")
  majority = results.get(f"{prefix + '/' if prefix else ''}{tasks.MAJORITY}{name}")
  warning = tasks.collapse_warning(results, main, num_dev)
  return "\n".join([
      "", "=" * 72, f"Done: {results['task']}",
      f"  last (step {results['step']}): {main} {results[main]:.4f}",
      f"  best (step {best['step']}, epoch {best['epoch']}): {main} {best[main]:.4f}",
      *([f"  always the majority class: {main} {majority:.4f}"]
        if majority is not None else []),
      *([f"  {warning}"] if warning else []),
      f"  results: {storage.display(os.path.abspath(workdir))}/{RESULTS_FILE}",
      "=" * 72])

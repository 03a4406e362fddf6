"""The pretraining loop: one readable function in banner sections (big_vision style).

    python -m maelm_jax.main --config=configs/pretrain.py:objective=maelm,size=tiny \
        --workdir=runs/maelm

A workdir is one run. Starting the same command again resumes it from its newest
good checkpoint (params, optimizer, step, rng and data-iterator position), and the
resumed run logs exactly the losses the uninterrupted run would have logged.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time

from absl import logging
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from maelm_jax.core import progress as progress_lib, sharding, storage, workdir as workdir_lib
from maelm_jax.data import corpus_report, pipeline, sources
from maelm_jax.modeling import flops, model as model_lib
from maelm_jax.run import (baselines, checkpoints, compilation_cache, config_lib,
                           metric_writers, plots, pretrained as pretrained_lib,
                           run_session, run_tokenizer, train_lib)


# --------------------------------------------------------------------------
# Checks that run before anything is compiled.
# --------------------------------------------------------------------------
def check_batch_fits_mesh(config, mesh) -> None:
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
    have += sum(len(ids) + 1 for ids in pipeline.document_ids(tokenizer, docs))
    if have >= needed:
      return
  raise ValueError(
      f"the {what} split of data.source has about {have} tokens, fewer than one "
      f"batch needs ({batch_size} x {seq_len - 2}); add text, lower batch_size or "
      f"seq_len" + (", or raise data.eval_fraction" if what == "eval" else ""))


def pretraining_model_config(config, vocab_size: int, mask_id: int):
  """The model as pretraining runs it: rows of one document padded to the length
  (`data.rows=complete_doc`) mask a share of their own tokens (masking.py)."""
  return dataclasses.replace(
      model_lib.ModelConfig.from_config(config.model, vocab_size, mask_id),
      mask_per_row=config.data.rows == "complete_doc")


def last_logged_metrics(workdir: str, step: int) -> dict:
  """Every value `metrics.jsonl` holds for `step`, merged (train and eval lines)."""
  merged = {}
  for record in workdir_lib.read_metrics(workdir, lambda r: r.get("step") == step):
    merged.update({k: v for k, v in record.items() if k != "step"})
  return merged


# --------------------------------------------------------------------------
# Helpers of the loop.
# --------------------------------------------------------------------------
def sum_over_eval_batches(step_fn, eval_ds, mesh, num_batches) -> dict:
  """Sums of `step_fn(global_batch, batch_index)`'s outputs over up to
  `num_batches` held-out batches.

  Each process reads its own documents, so the processes' eval streams can end at
  different batches. The eval step is a collective: every process must call it the
  same number of times, so they agree each step whether all still have a batch.
  """
  totals = collections.defaultdict(float)
  iterator = iter(eval_ds)
  for index in range(num_batches):
    batch = next(iterator, None)
    if not _all_processes_have(batch is not None):
      break
    out = step_fn(sharding.global_batch(mesh, batch), jnp.int32(index))
    for key, value in jax.device_get(out).items():
      totals[key] += float(value)
  return totals


def evaluate(eval_step, params, eval_ds, mesh, eval_rng, num_batches):
  """Held-out loss/accuracy over all selected positions and over the [MASK]ed /
  dropped ones alone (`eval/mask_*`, the honest figures; see baselines.py)."""
  totals = sum_over_eval_batches(
      lambda batch, index: eval_step(params, batch, eval_rng, index), eval_ds, mesh,
      num_batches)
  weight = max(totals["weight"], 1.0)
  mask_weight = max(totals["mask_weight"], 1.0)
  return {"eval/loss": totals["loss_sum"] / weight,
          "eval/accuracy": totals["correct"] / weight,
          "eval/mask_loss": totals["mask_loss_sum"] / mask_weight,
          "eval/mask_accuracy": totals["mask_correct"] / mask_weight}


def evaluate_baselines(config, model_cfg, train_source, tokenizer, eval_ds, mesh,
                       eval_rng) -> dict[str, float]:
  """Unigram and bigram baselines on the held-out positions `evaluate` scores.

  The tables are counted on the first `config.baseline_tokens` tokens of a
  seeded pass over the training split, read whole by every process, so every
  process holds the same tables.
  """
  started = time.perf_counter()
  logging.info("baselines: counting unigram and bigram tables on %d training "
               "tokens, then scoring the held-out positions...", config.baseline_tokens)
  rows = pipeline.make_pretrain_dataset(
      train_source, tokenizer, seq_len=config.seq_len, batch_size=64,
      seed=config.seed, shuffle=True, repeat=False)
  tables = baselines.count_ngrams((b["input_ids"] for b in rows),
                                  tokenizer.vocab_size, config.baseline_tokens)
  replicated = sharding.replicated(mesh)
  step = jax.jit(baselines.make_baseline_step(model_cfg),
                 in_shardings=({"input_ids": sharding.batch_sharding(mesh)},
                               replicated, replicated, replicated, replicated),
                 out_shardings=replicated)
  log_probs = jax.device_put(tables.unigram_log_probs, replicated)
  bigram_next = jax.device_put(tables.bigram_next, replicated)
  totals = sum_over_eval_batches(
      lambda batch, index: step(batch, eval_rng, index, log_probs, bigram_next),
      eval_ds, mesh, config.eval_batches)
  if not totals["mask_weight"]:
    # Every evaluation would score nothing and log zeros as if they were figures.
    raise ValueError(
        f"the held-out split does not fill one batch of {config.batch_size} x "
        f"{config.seq_len} from each of its "
        f"{config.data.num_streams or jax.process_count()} data streams (each "
        "stream packs its own share of the documents), so every evaluation would "
        "score nothing; raise --config.data.eval_fraction, or lower batch_size "
        "or seq_len")
  out = baselines.baseline_metrics(totals)
  logging.info("baselines (%.1fs) on %d held-out [MASK] positions (tables from %d "
               "training tokens; most frequent piece %r): unigram accuracy %.2f%%, "
               "unigram loss %.3f, bigram accuracy %.2f%%",
               time.perf_counter() - started, totals["mask_weight"],
               tables.num_tokens, tokenizer.id_to_piece(tables.unigram_argmax),
               100 * out["eval/unigram_accuracy"], out["eval/unigram_loss"],
               100 * out["eval/bigram_accuracy"])
  return out


def _plot(workdir, config, session, step) -> None:
  """The learning curve is a convenience: a failure to draw it never stops a run
  (nor is it drawn where MAELM_PLOTS=0)."""
  if not plots.enabled():
    return
  try:
    plots.plot_learning_curve(workdir, f"{config.model.objective} / "
                              f"{config.model.size}: {workdir}")
  except Exception as error:  # pylint: disable=broad-except
    logging.warning("could not draw %s: %s", plots.FILENAME, error)
    return
  session.writer.image(step, "learning_curve", os.path.join(workdir, plots.FILENAME))


def _all_processes_have(flag: bool) -> bool:
  if jax.process_count() == 1:
    return flag
  flags = multihost_utils.process_allgather(np.asarray(flag, np.int32))
  return bool(np.all(flags))


# --------------------------------------------------------------------------
# The loop.
# --------------------------------------------------------------------------
def describe_launch(config, workdir: str) -> list[str]:
  """What a launch would do, decided without reading the corpus, compiling or
  writing anything (`--config.dry_run=True`): model, masks, FLOPs, mesh, data,
  and the workdir's state."""
  mesh = sharding.make_mesh(config.mesh_shape)
  check_batch_fits_mesh(config, mesh)
  vocab, mask_id, vocab_from = run_tokenizer.planned_vocabulary(config, workdir)
  model_cfg = pretraining_model_config(config, vocab, mask_id)
  abstract = train_lib.pretrain_program(config, model_cfg, mesh).abstract_state
  sizes = {k: sum(x.size for x in jax.tree.leaves(v))
           for k, v in abstract.params.items()}
  encoder = sum(sizes.get(k, 0) for k in ("token_embed", "encoder"))
  step_flops = config_lib.mean_train_flops(config, model_cfg)
  rates = config_lib.mask_ratios(config)
  spec = config.data.source
  if spec.startswith("text:"):
    files = sources.text_files(spec[len("text:"):])
    data = (f"{spec} ({len(files)} files, "
            f"{sum(os.path.getsize(f) for f in files) / 1e6:.1f} MB on disk)")
  else:
    data = spec
  if not os.path.isdir(workdir) or (
      storage.remote_of(workdir) and not os.listdir(workdir)):
    state = "new (will be created)"
  else:
    try:
      run_session.claim(config, workdir, "pretrain")
      step = checkpoints.latest_step(workdir)
      state = (f"resumable at step {step}" if step is not None else
               "exists, no checkpoint: starts at step 1")
    except ValueError as error:
      state = f"REFUSED: {error}"
  return [
      "dry run: nothing trained, nothing written",
      f"  model      {config.model.objective}/{config.model.size}: "
      f"{sum(sizes.values()) / 1e6:.2f}M parameters ({encoder / 1e6:.2f}M kept for "
      f"fine-tuning: token_embed + encoder); vocabulary {vocab} ({vocab_from})",
      f"  masks      {model_cfg.mask_counts(config.seq_len)}"
      + (f"; the rate goes {' -> '.join(f'{r:g}' for r in rates)} in {len(rates)} "
         "equal stages (one compile each)" if len(rates) > 1 else ""),
      f"  compute    {step_flops:.3g} train FLOPs/step x {config.total_steps} steps = "
      f"{step_flops * config.total_steps:.3g} FLOPs; batch {config.batch_size} x "
      f"{config.seq_len} tokens",
      f"  mesh       {dict(mesh.shape)} over {jax.device_count()} devices "
      f"({jax.process_count()} processes)",
      f"  data       {data}",
      f"  workdir    {storage.display(os.path.abspath(workdir))}: {state}",
  ]


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Pretrains per `config` into `workdir` (a path or gs://BUCKET/PATH);
  returns the last logged metrics."""
  config = config_lib.resolve(config)
  config_lib.validate(config)
  # A bucket workdir runs in its mirror, its checkpoints in the bucket (storage.py).
  with workdir_lib.removed_if_start_fails(workdir), storage.mirrored(workdir) as workdir:
    if config.dry_run:
      lines = describe_launch(config, workdir)
      if jax.process_index() == 0:
        print("\n".join(lines), flush=True)
      return {"dry_run": True}
    run_session.claim(config, workdir, "pretrain")
    compilation_cache.configure(config)
    resume_step = checkpoints.latest_step(workdir)
    if config.init_from and resume_step is None:
      check_init_from(config.init_from)  # Before the corpus is read.
    # Another total_steps than the saved run's: the schedule goes on from where
    # it got to, said in one line (train_lib.continued_schedule).
    with config.unlocked():
      config, continued = train_lib.continued_schedule(
          config, workdir_lib.read_config(workdir), resume_step)
    if continued and jax.process_index() == 0:
      logging.warning("%s", continued)
    with run_session.hold(workdir):  # One live run per workdir.
      return _train_and_evaluate(config, workdir)


def check_init_from(init_from: str) -> None:
  """A new run's init_from is a run that saved a checkpoint (a resumed run reads
  its own checkpoint, whatever became of init_from since)."""
  if checkpoints.latest_step(init_from) is None:
    raise FileNotFoundError(
        f"--config.init_from={init_from} has no finished checkpoint (in "
        f"{checkpoints.checkpoint_dir(init_from)}): name the --workdir of a maelm_jax "
        "run that saved one, or of an import (maelm-import)")


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  # ---------------------------------------------------------------- Set-up --
  is_main = jax.process_index() == 0
  mesh = sharding.make_mesh(config.mesh_shape)
  check_batch_fits_mesh(config, mesh)
  logging.info("mesh %s over %d devices (%d processes)", dict(mesh.shape),
               jax.device_count(), jax.process_count())

  # ------------------------------------------------------ Data & tokenizer --
  source_kwargs = dict(eval_fraction=config.data.eval_fraction,
                       text_field=config.data.text_field,
                       tfds_data_dir=config.data.tfds_data_dir or None,
                       on_bad_text=config.data.on_bad_text)
  train_source = sources.open_source(config.data.source, "train", **source_kwargs)
  eval_source = sources.open_source(config.data.source, "eval", **source_kwargs)
  tokenizer = run_tokenizer.load_run_tokenizer(
      config, workdir, lambda: pipeline.training_texts(train_source),
      corpus_tokenizer=train_source.token_ids_tokenizer, is_writer=is_main)
  # Each process reads 1/process_count of the documents and needs its share of
  # the batch, so the whole split must hold a global batch.
  for source, split in ((train_source, "train"), (eval_source, "eval")):
    check_corpus_fills_a_batch(source, tokenizer, config.seq_len, config.batch_size,
                               split)
  if is_main:
    started = time.perf_counter()
    logging.info("corpus report: reading the %d training documents...", len(train_source))
    stats = corpus_report.report(train_source, tokenizer)
    logging.info("corpus report done in %.1fs", time.perf_counter() - started)
    for line in corpus_report.describe(stats, "train"):
      (logging.warning if line.startswith("WARNING") else logging.info)(line)
    with open(os.path.join(workdir, "corpus_report.json"), "w") as f:
      json.dump(stats, f, indent=2)
  local_batch = config.batch_size // jax.process_count()

  def dataset(source, **kwargs):
    return pipeline.make_pretrain_dataset(
        source, tokenizer, seq_len=config.seq_len, batch_size=local_batch,
        process_index=jax.process_index(), process_count=jax.process_count(),
        num_streams=config.data.num_streams,
        complete_docs=config.data.rows == "complete_doc", **kwargs)

  train_iter = iter(dataset(train_source, seed=config.seed, shuffle=True,
                            repeat=True, num_workers=config.data.num_workers))
  eval_ds = dataset(eval_source, seed=config.seed, shuffle=False, repeat=False)

  # ------------------------------------------- Model, optimizer, sharded state --
  model_cfg = pretraining_model_config(config, tokenizer.vocab_size, tokenizer.mask_id)
  # The same builder as the planner's (plan.py): what it compiled is what runs.
  program = train_lib.pretrain_program(config, model_cfg, mesh)
  tx, abstract_state = program.tx, program.abstract_state
  state_shardings = program.state_shardings
  num_params = sum(x.size for x in jax.tree.leaves(abstract_state.params))
  logging.info("model %s/%s: %.2fM parameters; %s", config.model.objective,
               config.model.size, num_params / 1e6, model_cfg.mask_counts(config.seq_len))

  # ------------------------------------------------ Checkpoints and resume --
  # Order: this workdir's newest good checkpoint (restored straight into the
  # sharded abstract state), else init_from, else fresh. config.json is written
  # only once the run is known to fit the workdir.
  manager = checkpoints.make_manager(workdir, config)
  with run_session.closed_on_error(manager):  # Until the session owns it.
    state, restored_step = checkpoints.restore_latest_good(
        manager, abstract_state, train_iter, start_over=config.start_over)
    if state is not None:
      logging.info("resumed from %s at step %d", manager.directory, restored_step)
    else:
      state, _ = train_lib.create_sharded_state(model_cfg, config.seq_len, tx, mesh,
                                                config.seed, state_shardings)
      if config.init_from:
        state = pretrained_lib.load_init_from(config, state, state_shardings)
    eval_step = program.eval_step
    eval_rng = jax.random.PRNGKey(config.seed + train_lib.EVAL_SEED_OFFSET)
    eval_baselines = evaluate_baselines(config, model_cfg, train_source, tokenizer,
                                        eval_ds, mesh, eval_rng)
    # config.json and metrics.jsonl as of the step it goes on from (run_session.py).
    session = run_session.RunSession(workdir, config, manager, restored_step)

  # ------------------------------------------------------------- Train loop --
  tracing = False  # A jax.profiler trace running (config.profile_steps).
  try:
    # The train step's schedule input, and the rate logged: the same corners.
    schedule = train_lib.schedule_of(program.learning_rate_knots)
    knots = jax.device_put(program.learning_rate_knots, sharding.replicated(mesh))
    # The mask rate's stages (config_lib.mask_ratios): one for a constant rate.
    stage_steps = program.stage_train_steps
    stage_flops = config_lib.stage_train_flops(config, model_cfg)
    stage_cfgs = config_lib.stage_model_configs(config, model_cfg)
    stage = None
    peak = flops.peak_flops(override=config.peak_flops_per_device or None)
    tokens_per_step = config.batch_size * config.seq_len
    start_step = int(jax.device_get(state.step))
    nonfinite_seen = int(jax.device_get(state.nonfinite_count))
    timer_start, timed_steps, last, in_flight = None, 0, {}, None
    profile = config_lib.profile_steps(config)
    profile_dir = os.path.join(workdir, "profile")
    if start_step >= config.total_steps:
      # Nothing left to train (the same command run again, or total_steps not
      # raised): say so, and report the run's last logged metrics.
      logging.info("this run already finished at step %d (total_steps=%d); raise "
                   "--config.total_steps to train on", start_step, config.total_steps)
      last = last_logged_metrics(workdir, start_step)
    else:
      logging.info("training steps %d..%d; %.3g train FLOPs/step", start_step + 1,
                   config.total_steps, config_lib.mean_train_flops(config, model_cfg))
    for step in range(start_step + 1, config.total_steps + 1):
      batch = sharding.global_batch(mesh, next(train_iter))
      step_stage = config_lib.mask_stage(step, config.total_steps, len(stage_steps))
      if step_stage != stage:
        stage, step_flops = step_stage, stage_flops[step_stage]
        train_step = stage_steps[stage]
        if len(stage_steps) > 1:  # Its first step compiles: left out of the timing.
          logging.info("mask rate stage %d of %d from step %d: %s", stage + 1,
                       len(stage_steps), step, stage_cfgs[stage].mask_counts(config.seq_len))
          if timer_start is not None:
            jax.block_until_ready(in_flight)
          timer_start = None
      if timer_start is None:
        logging.info("compiling the train step and running step %d...", step)
        compile_start = time.perf_counter()
      if profile and step == profile[0]:
        jax.profiler.start_trace(profile_dir)
        tracing = True
      state, metrics = train_step(state, batch, knots)
      if tracing and step == profile[1] - 1:
        jax.block_until_ready(metrics)
        jax.profiler.stop_trace()
        tracing = False
        logging.info("profile of steps %d..%d: %s (TensorBoard's profile plugin, "
                     "Perfetto, or python -m maelm_jax.tools.profiling %s)", profile[0],
                     step, profile_dir, profile_dir)
      # At most two steps in flight: wait for the previous one (the host still
      # prepares the next batch while this one runs). An unbounded queue of
      # dispatched steps deadlocked XLA:CPU's collectives on fake multi-device
      # meshes (an all-reduce rendezvous timeout after ~100 queued steps).
      if in_flight is not None:
        jax.block_until_ready(in_flight)
      in_flight = metrics
      if timer_start is None:  # Leave compilation out of the throughput.
        jax.block_until_ready(metrics)
        logging.info("step %d done in %.1fs (compilation included); training",
                     step, time.perf_counter() - compile_start)
        timer_start, timed_steps = time.perf_counter(), 0
        eta_from = (timer_start, step)  # Wall time per step, evaluations included.
      else:
        timed_steps += 1

      is_last = step == config.total_steps
      # An evaluation step is a log step too, whatever log_every is (eval_every=250
      # with log_every=100 evaluated only at 500, 1000, ... before).
      evaluated = step % config.eval_every == 0 or is_last
      if step % config.log_every == 0 or evaluated:
        metrics, count, bad_step = jax.device_get(
            (metrics, state.nonfinite_count, state.last_nonfinite_step))
        if count > nonfinite_seen:
          message = (f"{count - nonfinite_seen} step(s) with a non-finite loss or "
                     f"gradient up to step {step}, the last at step {bad_step}; "
                     "their updates were not applied")
          nonfinite_seen = int(count)
          if config.nonfinite_policy == "stop":
            raise FloatingPointError(
                f"{message}. Stopping (nonfinite_policy='stop'); checkpoints in "
                f"{manager.directory} are untouched. Lower learning_rate, use "
                "model.dtype=float32, or set --config.nonfinite_policy=skip.")
          logging.warning(message)
        elapsed = time.perf_counter() - timer_start
        steps_per_sec = timed_steps / elapsed if timed_steps and elapsed > 0 else 0.0
        last = {"train/loss": float(metrics["loss"]),
                "train/accuracy": float(metrics["accuracy"]),
                "train/grad_norm": float(metrics["grad_norm"]),
                "lr": float(schedule(step - 1)),
                "tokens_per_sec": steps_per_sec * tokens_per_step,
                "mfu": steps_per_sec * step_flops / peak if peak else 0.0}
        if evaluated:
          last.update(evaluate(eval_step, state.params, eval_ds, mesh, eval_rng,
                               config.eval_batches))
          last.update(eval_baselines)
        session.write(step, last)
        if is_main:
          eta = progress_lib.eta(step - eta_from[1], config.total_steps - eta_from[1],
                                 time.perf_counter() - eta_from[0])
          logging.info(metric_writers.format_console(step, config.total_steps, last, eta))
          if evaluated:
            logging.info("step %d: %s", step, baselines.plateau_status(last))
            _plot(workdir, config, session, step)
        timer_start, timed_steps = time.perf_counter(), 0

      if session.stop_requested(step):
        checkpoints.save(manager, step, state, train_iter)
        last.update(session.stopped(step))
        break
      if step % config.checkpoint_every == 0 or is_last:
        checkpoints.save(manager, step, state, train_iter)
  finally:
    if tracing:  # Stopped or ended inside the traced steps: keep what was traced.
      jax.profiler.stop_trace()
    session.close()
  return last

"""Config helpers: the `get_config(arg)` argument parser, objective presets and
validation that runs before anything is compiled.

Every error says what is wrong and which `--config.x=...` fixes it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re

import ml_collections

from maelm_jax.modeling import attention, model as model_lib
from maelm_jax.core import config_defaults as defaults
from maelm_jax.modeling import relative_position
from maelm_jax.run import wandb_writer


def load_config_module(path: str):
  """The config module at `path` (a `--config` value; `:args` are ignored)."""
  path = path.split(":", 1)[0]
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} not found, e.g. configs/glue.py")
  spec = importlib.util.spec_from_file_location("maelm_sweep_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def dropout_and_kernel_errors(c: ml_collections.ConfigDict,
                              prefix: str = "") -> list[str]:
  """Dropout rates and the attention kernel of a pretraining config's `model`
  (prefix 'model.') or of a fine-tuning config (prefix ''), as messages."""
  errors = []
  if not (0.0 <= c.dropout < 1.0 and 0.0 <= c.attention_dropout < 1.0):
    errors.append(f"{prefix}dropout and {prefix}attention_dropout must be in [0, 1)")
  activation = c.activation_dropout
  if not 0.0 <= activation < 1.0:
    errors.append(f"{prefix}activation_dropout={activation} must be in [0, 1)")
  return errors + attention.config_errors(
      c.attention_impl, dtype=c.dtype,
      attention_dropout=c.attention_dropout, key=f"{prefix}attention_impl")


def set_path(config: ml_collections.ConfigDict, dotted: str, value) -> None:
  """config['a']['b'] = value for dotted='a.b' (a sweep's or a command line's key)."""
  *parents, leaf = dotted.split(".")
  for key in parents:
    config = config[key]
  config[leaf] = value


def typed_set(config: ml_collections.ConfigDict, dotted: str, text: str) -> None:
  """config[dotted] = text, typed like the value it replaces, as `--config.a.b=text`
  is on the command line of every `python -m maelm_jax...`; for scripts (studies,
  benchmarks) that take the same overrides with argparse."""
  node = config
  *parents, leaf = dotted.split(".")
  for part in parents:
    if part not in node:
      raise KeyError(f"--config.{dotted}: no such config key ({part!r})")
    node = node[part]
  if leaf not in node:
    raise KeyError(f"--config.{dotted}: no such config key")
  old = node[leaf]
  if isinstance(old, bool):
    if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
      raise ValueError(f"--config.{dotted}={text}: expected True or False")
    value = text.lower() in ("1", "true", "yes")
  elif isinstance(old, str):
    value = text
  elif old is None or isinstance(old, (tuple, list)):
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text  # A plain string, e.g. pre.
  else:
    value = type(old)(text)
  node[leaf] = value


def split_overrides(argv: list[str], prefix: str = "--config.") -> tuple[
    list[str], list[tuple[str, str]]]:
  """`argv` without its `--config.KEY=VALUE` items, and those items as (KEY,
  VALUE), for argparse scripts that take the product's overrides."""
  rest, overrides = [], []
  for item in argv:
    if not item.startswith(prefix):
      rest.append(item)
    elif "=" not in item:
      raise ValueError(f"{item}: write {prefix}KEY=VALUE")
    else:
      key, value = item[len(prefix):].split("=", 1)
      overrides.append((key, value))
  return rest, overrides


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """`"objective=3ml,size=base"` -> ConfigDict, typed by the defaults (big_vision)."""
  out = ml_collections.ConfigDict(dict(defaults))
  for item in filter(None, (arg or "").split(",")):
    if "=" not in item:
      raise ValueError(f"config argument {item!r} is not key=value; "
                       f"known keys: {sorted(defaults)}")
    key, value = item.split("=", 1)
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; known: {sorted(defaults)}")
    default = defaults[key]
    if isinstance(default, bool):
      value = value.lower() in ("1", "true", "yes")
    elif default is not None:
      value = type(default)(value)
    if key == "size" and value not in model_lib.SIZES:  # Every config's model size.
      raise ValueError(f"size={value!r} is unknown; use one of {list(model_lib.SIZES)}")
    out[key] = value
  return out


def completed(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """An unlocked copy of `config` with the keys a config file written before them
  lacks (config_defaults.complete): what pretraining (`resolve`), fine-tuning and
  their plans read."""
  return ml_collections.ConfigDict(defaults.complete(config.to_dict()))


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Fills the objective's and the size's defaults into unset (None) knobs.

  Knobs are placeholders so that `--config.model.objective=mlm` on the command line
  switches every objective default with it, while an explicit
  `--config.model.mask_ratio=0.3` still wins.
  """
  config = completed(config)
  m = config.model
  if m.objective not in model_lib.OBJECTIVES:
    raise ValueError(f"model.objective={m.objective!r} is unknown; use one of "
                     f"{sorted(model_lib.OBJECTIVES)}, e.g. --config.model.objective=maelm")
  if m.size not in model_lib.SIZES:
    raise ValueError(f"model.size={m.size!r} is unknown; use one of "
                     f"{list(model_lib.SIZES)}, e.g. --config.model.size=tiny")
  for key, value in model_lib.OBJECTIVES[m.objective].items():
    if m.get(key) is None:
      m[key] = value
  if m.get("decoder_layers") is None:
    m.decoder_layers = 0 if m.decoder_type == "none" else model_lib.SIZES[m.size][4]
  if config.total_flops > 0:
    config.total_steps = steps_for_flops(config)
  if config.warmup_ratio > 0:
    config.warmup_steps = round(config.warmup_ratio * config.total_steps)
  return config


def profile_steps(config) -> tuple[int, int] | None:
  """config.profile_steps "A,B" as (A, B): trace steps A..B-1; None for ""."""
  text = str(config.profile_steps).strip()
  if not text:
    return None
  try:
    first, end = (int(part) for part in text.split(","))
  except ValueError:
    first = end = 0
  if not 1 <= first < end:
    raise ValueError(f"profile_steps={text!r}: give 'A,B' with 1 <= A < B, the "
                     "steps A..B-1 traced, e.g. --config.profile_steps=10,13")
  return first, end


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([hms])")


def max_runtime_problem(config) -> str | None:
  """max_runtime's one-line refusal, or None."""
  try:
    max_runtime_seconds(config)
  except ValueError as error:
    return str(error)
  return None


def max_runtime_seconds(config) -> float | None:
  """config.max_runtime ("90s", "9m", "1h30m", or a number of seconds) in
  seconds; None for "" (no limit)."""
  text = str(config.max_runtime).strip().lower()
  if not text:
    return None
  if re.fullmatch(r"\d+(?:\.\d+)?", text):
    seconds = float(text)
  elif re.fullmatch(r"(?:\d+(?:\.\d+)?[hms])+", text):
    unit = {"h": 3600.0, "m": 60.0, "s": 1.0}
    seconds = sum(float(n) * unit[u] for n, u in _DURATION.findall(text))
  else:
    seconds = 0.0
  if seconds <= 0:
    raise ValueError(f"max_runtime={text!r}: give a duration such as 90s, 9m or "
                     "1h30m, or a number of seconds ('': no limit)")
  return seconds


def mask_ratios(config: ml_collections.ConfigDict) -> tuple[float, ...]:
  """The mask rate of each stage of a pretraining run, in order.

  (model.mask_ratio,) for a constant rate. With model.mask_ratio_start > 0 the
  rate moves linearly from mask_ratio_start to mask_ratio (the standard rate,
  which the held-out evaluation always uses) over model.mask_ratio_stages equal
  shares of the run: GPT-BERT's and LTG-BERT's decaying masking rate, in steps,
  because each rate is its own static mask count and so its own compilation.
  """
  start = config.model.mask_ratio_start
  stages = config.model.mask_ratio_stages
  end = config.model.mask_ratio
  if not start or not 0 < start < 1 or not isinstance(stages, int) or stages < 2:
    return (end,)  # A constant rate (or a schedule `validate` refuses).
  between = (round(start + (end - start) * s / (stages - 1), 6) for s in range(stages - 1))
  return (*between, end)  # Ends at mask_ratio exactly: the evaluation's rate.


def train_flops_until(config: ml_collections.ConfigDict, step: int) -> float:
  """Train FLOPs of a resolved pretraining config's steps 1..`step`, each at its
  mask-rate stage's cost (where a FLOP axis puts step `step`)."""
  per_stage = stage_train_flops(config, _model_config(config))
  stages, total = len(per_stage), config.total_steps
  done = 0.0
  for index, per_step in enumerate(per_stage):
    # Stage `index` holds the steps s with (s - 1) * stages // total == index.
    first, last = -(-index * total // stages) + 1, -(-(index + 1) * total // stages)
    done += per_step * max(0, min(last, step) - first + 1)
  return done


def mask_stage(step: int, total_steps: int, num_stages: int) -> int:
  """The stage (index into `mask_ratios`) of 1-based `step`: equal shares of
  the run, from the step alone, so a resumed run is in the stage it left. Like
  the learning-rate schedule, the stages are shares of `total_steps`: a run
  resumed with another length follows the new length's stages."""
  return min(num_stages - 1, (step - 1) * num_stages // max(total_steps, 1))


def stage_model_configs(config, model_cfg) -> list:
  """`model_cfg` at each stage's mask rate (`mask_ratios`)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  return [model_cfg if rate == model_cfg.mask_ratio
          else dataclasses.replace(model_cfg, mask_ratio=rate)
          for rate in mask_ratios(config)]


def stage_train_flops(config, model_cfg) -> list[int]:
  """Train FLOPs of one step in each stage (flops.py): MAE-LM's and 3ML's
  encoders see fewer tokens at a higher mask rate, MLM's head more."""
  from maelm_jax.modeling import flops  # pylint: disable=g-import-not-at-top
  return [flops.train_flops_per_step(c, config.seq_len, config.batch_size)
          for c in stage_model_configs(config, model_cfg)]


def mean_train_flops(config, model_cfg) -> float:
  """Train FLOPs of one step, the mean over the mask-rate stages (equal shares
  of the run): what `total_flops` divides by."""
  per_stage = stage_train_flops(config, model_cfg)
  return sum(per_stage) / len(per_stage)


def _model_config(config):
  from maelm_jax.data import tokenizer  # pylint: disable=g-import-not-at-top
  return model_lib.ModelConfig.from_config(
      config.model, config.tokenizer.vocab_size, tokenizer.MASK_ID)


def train_flops_per_step(config: ml_collections.ConfigDict) -> int:
  """Train FLOPs of one step of a resolved pretraining config (flops.py), the
  mean over its mask-rate stages."""
  return round(mean_train_flops(config, _model_config(config)))


def steps_for_flops(config: ml_collections.ConfigDict) -> int:
  """The step count that spends `config.total_flops` (rounded, at least 1)."""
  return max(1, round(config.total_flops / train_flops_per_step(config)))


def validate(config: ml_collections.ConfigDict) -> None:
  """Static checks; device-dependent ones live in `train.check_batch_fits_mesh`."""
  m = config.model
  errors = []

  def need(cond, msg):
    if not cond:
      errors.append(msg)

  need(0.0 < m.mask_ratio < 1.0,
       f"model.mask_ratio={m.mask_ratio} must be in (0, 1), e.g. 0.15 (MLM/MAE-LM) "
       "or 0.5 (3ML)")
  start = config.model.mask_ratio_start
  stages = config.model.mask_ratio_stages
  need(start == 0.0 or (0.0 < start < 1.0 and start != m.mask_ratio),
       f"model.mask_ratio_start={start} must be 0 (a constant rate) or in (0, 1) "
       f"and not model.mask_ratio={m.mask_ratio} (where the rate ends), e.g. 0.3")
  need(start == 0.0 or (isinstance(stages, int) and 2 <= stages <= 16),
       f"model.mask_ratio_stages={stages} must be between 2 and 16: each stage's "
       "rate compiles its own step")
  need(start == 0.0 or not isinstance(stages, int) or config.total_steps >= stages,
       f"total_steps={config.total_steps} is fewer than model.mask_ratio_stages="
       f"{stages}: the last stages would never run; lower mask_ratio_stages")
  need(0.0 <= m.random_replace_prob < 1.0 and 0.0 <= m.keep_prob < 1.0 and
       m.random_replace_prob + m.keep_prob < 1.0,
       f"model.random_replace_prob={m.random_replace_prob} and model.keep_prob="
       f"{m.keep_prob} must be >= 0 with a sum below 1 (BERT uses 0.1 and 0.1)")
  need(m.decoder_type in model_lib.DECODER_TYPES,
       f"model.decoder_type={m.decoder_type!r} must be one of {model_lib.DECODER_TYPES}")
  if m.drop_masked:
    need(m.decoder_type != "none",
         f"objective {m.objective!r} removes masked tokens from the encoder "
         "(model.drop_masked=True), so a decoder must put [MASK] back: set "
         "--config.model.decoder_type=self or cross")
    need(m.decoder_type == "none" or m.decoder_layers >= 1,
         f"model.decoder_layers={m.decoder_layers}: decoder_type="
         f"{m.decoder_type!r} needs at least 1 decoder layer")
  else:
    need(m.decoder_type != "cross",
         "model.decoder_type='cross' needs model.drop_masked=True (objective maelm "
         "or 3ml): with MLM the encoder already sees every position")
  if m.objective == "mlm":
    need(m.decoder_type == "none" and m.decoder_layers == 0 and not m.drop_masked,
         "objective 'mlm' runs the head on the encoder directly; it takes no "
         f"decoder (got decoder_type={m.decoder_type!r}, decoder_layers="
         f"{m.decoder_layers}, drop_masked={m.drop_masked}). Use "
         "--config.model.objective=maelm or 3ml for a decoder")
  need(0.0 <= m.decoder_dropout < 1.0,
       f"model.decoder_dropout={m.decoder_dropout} must be in [0, 1)")
  for problem in dropout_and_kernel_errors(m, "model."):
    need(False, problem)
  need(m.position in model_lib.POSITIONS,
       f"model.position={m.get('position')!r} must be one of {model_lib.POSITIONS}")
  if m.position == "rope":
    heads = m.num_heads or model_lib.SIZES[m.size][2]
    hidden = m.hidden or model_lib.SIZES[m.size][1]
    need(hidden % heads == 0 and (hidden // heads) % 2 == 0,
         f"model.position='rope' turns pairs of a head's dimensions: the head size "
         f"({hidden} / {heads} heads) must be even")
  need(config.model.relative_bias_init in relative_position.RELATIVE_BIAS_INITS,
       f"model.relative_bias_init={m.get('relative_bias_init')!r} must be one of "
       f"{relative_position.RELATIVE_BIAS_INITS}")
  need(config.data.rows in ("packed", "complete_doc"),
       f"data.rows={config.data.get('rows')!r} must be 'packed' or 'complete_doc'")
  need(config.weight_decay_on in ("matrices", "all"),
       f"weight_decay_on={config.get('weight_decay_on')!r} must be 'matrices' or 'all'")
  need(0.0 < config.layer_decay <= 1.0,
       f"layer_decay={config.layer_decay} must be in (0, 1]; 1.0 turns it off")
  need(config.model.relative_bucket_fn in relative_position.BUCKET_FNS,
       f"model.relative_bucket_fn={m.get('relative_bucket_fn')!r} must be one of "
       f"{relative_position.BUCKET_FNS}")
  policy = config.model.remat_policy
  need(policy in model_lib.REMAT_POLICIES,
       f"model.remat_policy={policy!r} must be one of {tuple(model_lib.REMAT_POLICIES)}")
  need(not m.remat or policy in ("none", "full"),
       f"model.remat=True is remat_policy='full', but remat_policy={policy!r}: "
       "set only model.remat_policy")
  need(m.ln_type in model_lib.LN_TYPES,
       f"model.ln_type={m.ln_type!r} must be one of {model_lib.LN_TYPES}")
  need(config.model.mlp_activation in model_lib.MLP_ACTIVATIONS,
       f"model.mlp_activation={m.get('mlp_activation')!r} must be one of "
       f"{model_lib.MLP_ACTIVATIONS}")
  need(config.model.normformer in (True, False),
       f"model.normformer={m.get('normformer')!r} must be True or False")
  need(m.dtype in ("bfloat16", "float32"),
       f"model.dtype={m.dtype!r} must be 'bfloat16' or 'float32'")
  hidden = m.get("hidden") or model_lib.SIZES[m.size][1]
  heads = m.get("num_heads") or model_lib.SIZES[m.size][2]
  need(hidden % heads == 0,
       f"model.hidden={hidden} is not divisible by model.num_heads={heads}")
  need(8 <= config.seq_len <= m.max_positions,
       f"seq_len={config.seq_len} must be between 8 and model.max_positions="
       f"{m.max_positions}; raise --config.model.max_positions")
  need(config.total_steps >= 1, f"total_steps={config.total_steps} must be >= 1")
  try:
    profile_steps(config)
  except ValueError as error:
    raise ValueError(str(error)) from None
  need(max_runtime_problem(config) is None, max_runtime_problem(config))
  need(wandb_writer.problem(config) is None, wandb_writer.problem(config))
  need(config.total_flops >= 0,
       f"total_flops={config.get('total_flops')} must be >= 0 (0: use total_steps)")
  need(config.warmup_steps >= 0,
       f"warmup_steps={config.warmup_steps} must be >= 0")
  need(0.0 <= config.warmup_ratio < 1.0,
       f"warmup_ratio={config.get('warmup_ratio')} must be in [0, 1) (0: use "
       "warmup_steps)")
  need(config.learning_rate > 0, f"learning_rate={config.learning_rate} must be > 0")
  need(config.batch_size >= 1 and config.grad_accum_steps >= 1 and
       config.batch_size % config.grad_accum_steps == 0,
       f"batch_size={config.batch_size} must be a positive multiple of "
       f"grad_accum_steps={config.grad_accum_steps}")
  for name in ("log_every", "eval_every", "checkpoint_every"):
    need(config[name] >= 1, f"{name}={config[name]} must be >= 1")
  need(config.nonfinite_policy in ("stop", "skip"),
       f"nonfinite_policy={config.nonfinite_policy!r} must be 'stop' or 'skip'")
  need(config.keep_checkpoints >= 1 and config.checkpoint_keep_period >= 0,
       "keep_checkpoints must be >= 1 and checkpoint_keep_period >= 0")
  need(config.tokenizer.vocab_size > 5,
       f"tokenizer.vocab_size={config.tokenizer.vocab_size} is too small")
  need(config.tokenizer.model_type in ("unigram", "bpe"),
       f"tokenizer.model_type={config.tokenizer.model_type!r} must be 'unigram' or 'bpe'")
  if errors:
    raise ValueError("invalid config:\n  - " + "\n  - ".join(errors))


# Keys that may change when resuming a workdir: run length, cadence, hardware.
RESUMABLE_CHANGES = frozenset({
    "total_steps", "total_flops", "lr_schedule_segments", "compilation_cache_dir",
    "profile_steps", "wandb_project", "wandb_entity", "max_runtime",
    "log_every", "eval_every", "eval_batches", "checkpoint_every",
    "baseline_tokens",
    "keep_checkpoints", "checkpoint_keep_period", "mesh_shape",
    "peak_flops_per_device", "nonfinite_policy", "allow_config_change",
    "start_over", "dry_run",
    "data.num_workers", "data.tfds_data_dir", "tokenizer.path", "init_from",
    # How the same math is computed: attention kernel, what is recomputed.
    "model.attention_impl", "model.remat", "model.remat_policy",
})


def _flatten(d, prefix=""):
  out = {}
  for key, value in d.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      out.update(_flatten(value, name + "."))
    else:
      out[name] = list(value) if isinstance(value, (list, tuple)) else value
  return out


# A fine-tuning run is fixed by everything, init_from included; only where it
# runs may change.
FINETUNE_RESUMABLE_CHANGES = frozenset({"mesh_shape", "allow_config_change",
                                        "compilation_cache_dir",
                                        "wandb_project", "wandb_entity",
                                        "max_runtime", "start_over", "keep_final_checkpoint",
                                        "log_every", "attention_impl"})


def config_differences(saved: dict, current: dict,
                       resumable=RESUMABLE_CHANGES) -> list[str]:
  """Keys (other than `resumable`) whose values differ, as 'key: a -> b'."""
  saved = _flatten(defaults.complete(saved))
  current = _flatten(defaults.complete(current))
  return [f"{key}: {saved.get(key)!r} -> {current.get(key)!r}"
          for key in sorted(set(saved) | set(current))
          if key not in resumable
          and _same_place(saved.get(key)) != _same_place(current.get(key))]


def resume_flags(saved: dict, current: dict,
                 resumable=RESUMABLE_CHANGES) -> list[str]:
  """`--config.KEY=VALUE` for every differing key with a scalar saved value: the
  flags that make `current` the saved run's config again."""
  saved = _flatten(defaults.complete(saved))
  current = _flatten(defaults.complete(current))
  flags = []
  for key in sorted(set(saved) & set(current)):
    value = saved[key]
    if (key in resumable or _same_place(value) == _same_place(current[key])
        or not isinstance(value, (bool, int, float, str))):
      continue
    flags.append(f"--config.{key}={value}" if not isinstance(value, str) or value
                 else f"--config.{key}=''")
  return flags


def _same_place(value):
  """A `text:` source as the absolute glob it names, so that the same files
  spelt from another directory ('text:../data/*.txt', 'text:/home/me/data/*.txt')
  are the same config; anything else as it is."""
  if isinstance(value, str) and value.startswith("text:"):
    return "text:" + ",".join(os.path.abspath(os.path.expanduser(p)) if p else p
                              for p in value[len("text:"):].split(","))
  return value

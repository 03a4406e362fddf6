r"""Plan a run for TPU chips on a machine without one: compile the run's own train
step for a TPU slice on this (CPU) host, and say whether it fits in the chips'
memory and how fast it should run, before the slice is paid for.

    pip install -e '.[tpu]'   # libtpu, from PyPI (Linux x86-64)
    python -m maelm_jax.plan --config=configs/pretrain.py:objective=maelm,size=base \
        --topology=v5e:4x4 --config.mesh_shape='(4,4,1)' --config.batch_size=256 \
        --config.seq_len=512 --out=runs/plan

The same for a fine-tuning step (its model is the `init_from` run's, or a size):
    python -m maelm_jax.plan --config=configs/glue.py:task=sst2 --size=base \
        --topology=v5p:2x2x1 --config.batch_size=256

`--topology` takes libtpu's names (`v5e:4x4`, `v4:2x2x2`, `v5p:2x2x1`, `v6e:2x2`)
or Cloud TPU accelerator types (`v5litepod-16`, `v4-16`, `v5p-8`, `v6e-4`). The
mesh is the config's own `mesh_shape` over the slice's chips, and every
`--config.x` override works as in training. The step is built by the function
the run itself calls (`train_lib.pretrain_program`,
`finetune.run.finetune_program`), lowered from abstract state (nothing is
allocated) and compiled by libtpu's compiler for the named chips.

It prints a short table and writes `<out>/plan.json` (`PLAN_KEYS`). The step
time and MFU are a compile-time model, not a measurement: a roofline, the
largest of the step's FLOPs at the chip's peak, its HBM traffic at the chip's
bandwidth and its collectives' ring traffic at the chip's whole interconnect
bandwidth (flops.CHIPS). It is a bound: the real step is slower.

Exit status: 0 it fits; 3 it does not (at most 5 lines: the largest buffers,
the knobs that shrink them and the plan of the first that fits); 1 bad input
(no libtpu, an unknown topology, a bad config); 2 a bad command line.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import platform
import re
import sys
import time

# Plan on the host's CPU: with libtpu installed, jax would first look for a
# local TPU (slow, and noisy) before falling back to the CPU.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
# libtpu takes a machine-wide lock (a libtpu_lockfile in the system's temporary
# directory) so that two processes never drive one TPU; a plan drives none, and
# plans run side by side (tests, a table of plans, a launcher beside a notebook).
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from maelm_jax.core import cli  # noqa: E402

MARGIN = 0.05  # Of a chip's HBM left free: what libtpu reserves (0.25 of v5e's
# 16 GiB, by its compiler's own "available HBM (15.75G)"), the next batch's
# buffers and fragmentation.
PLAN_KEYS = ("topology", "chips", "chip_kind", "mesh", "hbm_bytes_per_chip",
             "bytes_per_chip", "fits", "xla_flops_per_chip", "model_flops_per_chip",
             "collectives", "attention", "compile_seconds", "estimated_step_seconds",
             "estimated_mfu", "hbm_traffic_bytes_per_chip",
             "hbm_traffic_by_category_per_chip", "hbm_first_principles_per_chip")
NOT_FIT_EXIT = 3
# libtpu's topology names; Cloud TPU accelerator types map onto them.
TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+x\d+(?:x\d+)?)$")
ACCELERATOR_TYPE = re.compile(r"^(v4|v5p|v5litepod|v5e|v6e)-(\d+)$")
ACCEPTED = ("libtpu's names: v4:2x2x1, v4:2x2x2, v5e:2x2, v5e:4x4, v5e:16x16, "
            "v5p:2x2x1, v5p:4x4x4, v6e:2x2, v6e:4x4 (chips per axis), or Cloud TPU "
            "accelerator types: v4-8, v5p-8, v5litepod-16, v6e-16")
# v4 and v5p chips hold two TensorCores that jax drives as one device.
_MEGACORE = ("v4", "v5p")


class PlanError(ValueError):
  """Bad input to the planner: said in one line, exit 1."""


# --------------------------------------------------------------------------
# Topologies.
# --------------------------------------------------------------------------
def _doubled(chips: int, dims: int) -> list[int]:
  """The slice shape Cloud TPU gives `chips` chips: powers of two, doubling the
  smallest axis, the last first (8 -> 2x4, 16 -> 4x4; 3D 8 -> 2x2x2, 32 -> 2x4x4)."""
  shape = [1] * dims
  while math.prod(shape) < chips:
    smallest = min(shape)
    shape[max(i for i, s in enumerate(shape) if s == smallest)] *= 2
  return sorted(shape)


def topology_name(name: str) -> str:
  """libtpu's topology name for `name`: already one (`v5e:4x4`), or a Cloud TPU
  accelerator type (`v5litepod-16` -> `v5e:4x4`; v4/v5p types count TensorCores,
  two per chip: `v4-16` -> `v4:2x2x2`)."""
  name = name.strip().lower()
  if TOPOLOGY.match(name):
    return name
  match = ACCELERATOR_TYPE.match(name)
  if not match:
    raise PlanError(f"unknown topology {name!r}; use {ACCEPTED}, or GPUs: h100:8, "
                    "h200:8, a100:8")
  version, count = match[1], int(match[2])
  version = "v5e" if version == "v5litepod" else version
  chips = count // 2 if version in _MEGACORE else count
  if chips < 1 or chips & (chips - 1):
    raise PlanError(f"{name!r} is not a slice size Cloud TPU offers (a power of two "
                    f"{'TensorCores' if version in _MEGACORE else 'chips'}); use {ACCEPTED}")
  if version in _MEGACORE:
    shape = [2, 2, 1] if chips <= 4 else _doubled(chips, 3)
  else:
    shape = _doubled(chips, 2)
  return f"{version}:{'x'.join(map(str, shape))}"


def libtpu_problem() -> str | None:
  """Why this machine cannot compile for TPU chips, in one line, or None."""
  if importlib.util.find_spec("libtpu") is not None:
    return None
  if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
    return (f"libtpu, which compiles for TPU chips, is built for Linux x86-64 only "
            f"(this is {platform.system()} {platform.machine()}); plan on such a machine")
  import jax  # pylint: disable=g-import-not-at-top
  return (f"libtpu is not installed; pip install 'jax[tpu]=={jax.__version__}' "
          "(or pip install -e '.[tpu]')")


# GPUs: `<kind>:<count>`, one host's GPUs (tools/gpu_targets.py).
GPU_TOPOLOGY = re.compile(r"^(h100|h200|a100):(\d+)$")


def cuda_plugin_problem() -> str | None:
  """Why this machine cannot compile for GPUs, in one line, or None."""
  if any(importlib.util.find_spec(f"jax_cuda{v}_plugin") for v in (12, 13)):
    return None
  import jax  # pylint: disable=g-import-not-at-top
  return ("jax's CUDA plugin, which compiles for GPUs, is not installed; pip install "
          f"'jax-cuda12-plugin=={jax.__version__}' (or pip install -e '.[plan-gpu]'); "
          "with cuDNN for the attention it plans; no GPU is needed")


def gpu_devices(kind: str, count: int) -> tuple[list, str]:
  """`count` GPUs of `kind` described on this host (nothing runs on them)."""
  from maelm_jax.tools import gpu_targets  # pylint: disable=g-import-not-at-top
  if not 1 <= count <= 8:
    raise PlanError(f"{kind}:{count}: plan one host's GPUs, 1 to 8")
  problem = cuda_plugin_problem()
  if problem:
    raise PlanError(problem)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    description = topologies.get_topology_desc(
        platform="cuda", topology=f"1x1x{count}",
        target_config=gpu_targets.target_config(kind))
  except Exception as error:  # pylint: disable=broad-except
    first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    raise PlanError(f"the CUDA plugin refused {kind}:{count} ({first[:200]})") from error
  return list(description.devices), f"{kind}:{count}"


def topology_devices(name: str) -> tuple[list, str]:
  """The devices of a TPU slice, or of one host's GPUs (`h100:8`), described on
  this host (nothing runs on them): (devices, the topology's name)."""
  gpus = GPU_TOPOLOGY.match(name.strip().lower())
  if gpus:
    return gpu_devices(gpus[1], int(gpus[2]))
  topology = topology_name(name)
  problem = libtpu_problem()
  if problem:
    raise PlanError(problem)
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  version = topology.split(":")[0]
  try:
    description = topologies.get_topology_desc(
        platform="tpu", topology_name=topology,
        chip_config_name="megacore" if version in _MEGACORE else "default")
  except Exception as error:  # pylint: disable=broad-except
    first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    raise PlanError(f"libtpu refused topology {topology!r} ({first[:200]}); use "
                    f"{ACCEPTED}") from error
  return list(description.devices), topology


# --------------------------------------------------------------------------
# The step, built as the run builds it.
# --------------------------------------------------------------------------
@dataclasses.dataclass
class Built:
  program: object  # train_lib.Program
  model_cfg: object  # model.ModelConfig
  mesh: object
  seq_len: int
  batch_size: int
  grad_accum_steps: int
  model_flops: float  # Train FLOPs of one step, the whole batch (flops.py).
  config: object = None  # The resolved pretraining config (None: fine-tuning).
  # The executable `plan_built` compiled (None before, or when the compiler ran
  # out of memory): a caller on the chips themselves can run what was planned
  # (benchmarks/roofline_check.py).
  compiled: object = None


def build(config, devices, size: str = "", vocab_size: int = 0) -> Built:
  """The run's own program for `config` over a mesh of `devices`: what
  `train._train_and_evaluate` / `finetune.run._run` build, from the same
  functions, without data, checkpoints or a workdir."""
  from maelm_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import flops  # pylint: disable=g-import-not-at-top
  from maelm_jax.run import config_lib, run_tokenizer, train, train_lib  # pylint: disable=g-import-not-at-top
  mode = config.get("mode", "pretrain")
  if mode == "pretrain":
    config = config_lib.resolve(config)
    config_lib.validate(config)
    mesh = sharding.make_mesh(config.mesh_shape, devices)
    train.check_batch_fits_mesh(config, mesh)
    vocab, mask_id, _ = run_tokenizer.planned_vocabulary(config, None)
    model_cfg = train.pretraining_model_config(config, vocab, mask_id)
    program = train_lib.pretrain_program(config, model_cfg, mesh)
    return Built(program, model_cfg, mesh, config.seq_len, config.batch_size,
                 config.grad_accum_steps,
                 flops.train_flops_per_step(model_cfg, config.seq_len,
                                            config.batch_size), config)
  if mode not in ("glue", "squad"):
    raise PlanError(f"config.mode={mode!r}: expected pretrain, glue or squad")
  return _build_finetune(config, devices, size, vocab_size)


def _build_finetune(config, devices, size, vocab_size) -> Built:
  from maelm_jax.run import config_lib, pretrained as pretrained_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import flops, model as model_lib  # pylint: disable=g-import-not-at-top
  from maelm_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from maelm_jax.finetune import run as finetune_run  # pylint: disable=g-import-not-at-top
  from maelm_jax.finetune.tasks import GlueProblem, SquadProblem  # pylint: disable=g-import-not-at-top
  if bool(config.init_from) == bool(size):
    raise PlanError("a fine-tuning plan takes its model from --config.init_from (a "
                    "pretraining workdir) or from --size (tiny, small, base, large), "
                    "one of the two")
  if size and size not in model_lib.SIZES:
    raise PlanError(f"--size={size!r}: use one of {sorted(model_lib.SIZES)}")
  config = config_lib.completed(config)  # As the run reads it.
  with config.unlocked():
    checked = config.copy_and_resolve_references()
    checked.init_from = checked.init_from or "(planned from --size)"
  finetune_run.validate(checked)
  if config.init_from:
    finetune_run.check_pretrained(config)
    pretrained = pretrained_lib.load_pretrained(
        config.init_from, encoder_only=True, read_params=False,
        step=None if config.init_step < 0 else config.init_step)
    pretrained_cfg = pretrained.model_cfg
  else:
    layers, hidden, heads, mlp, _ = model_lib.SIZES[size]
    pretrained_cfg = model_lib.ModelConfig(
        vocab_size=vocab_size or 32000, num_layers=layers, hidden=hidden,
        num_heads=heads, mlp=mlp, decoder_type="none")
  model_cfg = finetune_run.finetune_model_config(config, pretrained_cfg)
  mesh = sharding.make_mesh(config.mesh_shape, devices)
  finetune_run.check_fits_mesh(config, mesh)
  problem = (GlueProblem(config, check_data=False) if config.mode == "glue"
             else SquadProblem(config, check_data=False))
  # The schedule's length does not change the compiled step's shapes.
  program = finetune_run.finetune_program(config, problem, model_cfg, 1000, mesh)
  # Fine-tuning runs the encoder alone on all L tokens: no decoder, no masks.
  encoder_only = dataclasses.replace(model_cfg, decoder_type="none", mask_ratio=0.0,
                                     drop_masked=False, random_replace_prob=0.0,
                                     keep_prob=0.0)
  fwd = flops.encoder_forward_flops(encoder_only, config.max_seq_len)
  return Built(program, encoder_only, mesh, config.max_seq_len, config.batch_size, 1,
               3.0 * fwd * config.batch_size)


# --------------------------------------------------------------------------
# Compile and read the result.
# --------------------------------------------------------------------------
# libtpu's words for a step over the chip's memory (two forms seen).
_OOM = (re.compile(r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds"),
        re.compile(r"Used ([\d.]+)([KMGT]?) of [\d.]+[KMGT]? hbm"))
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _shard_elements(leaf) -> int:
  """Elements of one chip's shard of an abstract array."""
  return math.prod(leaf.sharding.shard_shape(leaf.shape) if leaf.sharding else leaf.shape)


def _shard_bytes(tree) -> int:
  import jax  # pylint: disable=g-import-not-at-top
  return sum(_shard_elements(leaf) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))


def largest_state_leaves(abstract_state, count: int = 2) -> list[tuple[int, str]]:
  """The largest per-chip shards of the state: (bytes, path)."""
  import jax  # pylint: disable=g-import-not-at-top
  leaves = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state):
    name = jax.tree_util.keystr(path, simple=True, separator="/")
    leaves.append((_shard_elements(leaf) * leaf.dtype.itemsize, name))
  return sorted(leaves, reverse=True)[:count]


_kernel_probe_cache: dict = {}


def kernel_uncounted_share(device) -> float:
  """The share of a Pallas TPU attention kernel's training FLOPs (forward and
  backward) that XLA's cost analysis does not count, measured by compiling the
  kernel alone for `device`: none for the project's kernel, whose calls state
  their cost (it recomputes the scores in its backward, so XLA counts more than
  the model); the stock kernel's backward states none (2/3 uncounted)."""
  key = device.device_kind
  if key not in _kernel_probe_cache:
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # pylint: disable=g-import-not-at-top
    from maelm_jax.modeling import attention  # pylint: disable=g-import-not-at-top
    b, h, n, d = 2, 2, 256, 128
    placed = NamedSharding(Mesh([device], ("x",)), PartitionSpec())
    qkv = jax.ShapeDtypeStruct((b, n, h, d), jnp.bfloat16, sharding=placed)
    bias = jax.ShapeDtypeStruct((b, h, n, n), jnp.float32, sharding=placed)
    loss = lambda q, k, v, a: attention.tpu_flash_attention(q, k, v, a).astype(
        jnp.float32).sum()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(
        qkv, qkv, qkv, bias).compile()
    counted = float(compiled.cost_analysis().get("flops", 0.0))
    model = 3 * 4 * b * h * n * n * d
    _kernel_probe_cache[key] = min(1.0, max(0.0, 1.0 - counted / model))
  return _kernel_probe_cache[key]


def _attention_by_site(choices) -> dict[str, dict]:
  sites = {}
  for choice in choices:
    site = sites.setdefault(choice["site"], {
        "implementation": choice["implementation"], "q_len": choice["q_len"],
        "kv_len": choice["kv_len"]})
    if choice["implementation"] != site["implementation"]:
      site["implementation"] = "mixed"
  for site in sites.values():
    if site["implementation"] == "tpu_flash":
      from maelm_jax.modeling import attention  # pylint: disable=g-import-not-at-top
      site["kernel_lengths"] = [attention.padded_length(site["q_len"]),
                                attention.padded_length(site["kv_len"])]
  return sites


def _stack_layers(model_cfg, site: str) -> int:
  return model_cfg.num_layers if site == "encoder" else model_cfg.decoder_layers


def _lower_train_step(program):
  """The train step of `program` (train_lib.Program) lowered for the abstract state, batch and schedule."""
  import jax  # pylint: disable=g-import-not-at-top
  knots = program.learning_rate_knots
  return program.train_step.lower(program.abstract_state, program.batch,
                                  jax.ShapeDtypeStruct(knots.shape, knots.dtype))


def _cost(built: Built) -> tuple[float, float]:
  """XLA's (FLOPs, bytes accessed) per chip of `built`'s compiled train step."""
  program = built.program
  cost = _lower_train_step(program).compile().cost_analysis() or {}
  return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def one_more_layer(built: Built, devices) -> tuple[dict, int]:
  """XLA's (FLOPs, bytes) per chip of one more layer of each stack of a scanned
  pretraining step, per microbatch, and the batch it was measured at. XLA's
  cost analysis counts a scanned stack's loop body once; this is what each
  further iteration costs by XLA's own count: the difference between small
  unscanned compiles of the same step with one and two layers in that stack, at
  the microbatch (at about half of it, scaled, where that does not compile). A
  stack of one layer has no further iteration and is not probed (MAE-LM's
  one-layer decoder: a compile fewer); with none left, nothing compiles."""
  config = built.config
  micro = built.batch_size // built.grad_accum_steps
  dp = built.mesh.shape["data"] * built.mesh.shape["fsdp"]
  stacks = {"encoder": "model.num_layers"}
  one = {"model.scan_layers": False, "model.num_layers": 1, "grad_accum_steps": 1,
         "total_flops": 0.0}
  if built.model_cfg.decoder_type != "none":
    stacks["decoder"] = "model.decoder_layers"
    one["model.decoder_layers"] = 1
  stacks = {stack: key for stack, key in stacks.items()
            if _stack_layers(built.model_cfg, stack) > 1}
  if not stacks:
    return {}, micro
  batch = micro
  while True:
    try:
      base = _cost(build(_with(config, {**one, "batch_size": batch}), devices))
      out = {}
      for stack, key in stacks.items():
        more = _cost(build(_with(config, {**one, "batch_size": batch, key: 2}), devices))
        out[stack] = tuple((m - b) * micro / batch for m, b in zip(more, base))
      return out, batch
    except Exception as error:  # pylint: disable=broad-except
      # Half, down to a multiple of the data-parallel size (the microbatch
      # need not be a power of two: 1744 on 16 chips is 109 rows a chip).
      smaller = batch // 2 // dp * dp
      if "RESOURCE_EXHAUSTED" not in str(error) or smaller < dp:
        raise
      batch = smaller


def first_principles_bytes(built: Built) -> dict[str, float]:
  """flops.train_hbm_bytes_per_chip for the built step: its parameters' shards
  on one chip, its rows over the data-parallel axes."""
  import jax  # pylint: disable=g-import-not-at-top
  from maelm_jax.core import sharding  # pylint: disable=g-import-not-at-top
  from maelm_jax.modeling import flops  # pylint: disable=g-import-not-at-top
  per_chip = sum(_shard_elements(leaf)
                 for leaf in jax.tree.leaves(built.program.abstract_state.params))
  parts = flops.train_hbm_bytes_per_chip(
      built.model_cfg, built.seq_len,
      built.batch_size / sharding.data_parallel_size(built.mesh), per_chip,
      built.grad_accum_steps)
  return {**parts, "total": sum(parts.values())}


def plan_built(built: Built, topology: str, devices, estimate: bool = True,
               chip=None) -> dict:
  """Compiles `built`'s train step for `devices` and reads what it costs.
  estimate=False: memory only (no probe compiles for a scanned step's FLOPs).
  chip: the constants to plan with (flops.Chip); default the devices' own kind's."""
  from maelm_jax.modeling import attention, flops  # pylint: disable=g-import-not-at-top
  from maelm_jax.tools import hlo_stats  # pylint: disable=g-import-not-at-top
  program, model_cfg, mesh = built.program, built.model_cfg, built.mesh
  chips = len(devices)
  chip = chip or flops.chip(devices[0].device_kind)
  if chip is None:
    raise PlanError(f"no constants for the chip {devices[0].device_kind!r}: add it "
                    "to flops.CHIPS (peak bf16 FLOP/s, HBM bytes and bandwidth)")
  with attention.recording_choices() as choices:
    lowered = _lower_train_step(program)
  started = time.perf_counter()
  compiled, oom = None, None
  try:
    compiled = lowered.compile()
  except Exception as error:  # pylint: disable=broad-except
    if "RESOURCE_EXHAUSTED" not in str(error):
      raise
    oom = str(error).strip()
  compile_seconds = time.perf_counter() - started
  built.compiled = compiled
  sites = _attention_by_site(choices)
  state_bytes = _shard_bytes(program.abstract_state)
  batch_bytes = _shard_bytes(program.batch)
  result = {
      "topology": topology, "chips": chips, "chip_kind": devices[0].device_kind,
      "mesh": dict(mesh.shape), "batch_size": built.batch_size,
      "seq_len": built.seq_len, "grad_accum_steps": built.grad_accum_steps,
      "hbm_bytes_per_chip": chip.hbm_bytes, "margin": MARGIN,
      "model_flops_per_chip": built.model_flops / chips,
      "attention": sites, "compile_seconds": round(compile_seconds, 1),
      "state_bytes_per_chip": state_bytes,
      "largest_state_shards": largest_state_leaves(program.abstract_state),
      "chip_constants": dataclasses.asdict(chip),
  }
  if compiled is None:
    match = next(filter(None, (pattern.search(oom) for pattern in _OOM)), None)
    temporaries = (float(match[1]) * _UNITS[match[2]]) if match else float("nan")
    result.update({
        "compile_error": oom.splitlines()[0], "fits": False,
        "bytes_per_chip": {"arguments": state_bytes + batch_bytes,
                           "temporaries": temporaries, "outputs": state_bytes,
                           "code": 0, "total": state_bytes + batch_bytes + temporaries},
        "xla_flops_per_chip": None, "collectives": None,
        "estimated_step_seconds": None, "estimated_mfu": None,
        "largest_buffers": []})
    return result

  memory = compiled.memory_analysis()
  arguments, outputs = memory.argument_size_in_bytes, memory.output_size_in_bytes
  temporaries, code = memory.temp_size_in_bytes, memory.generated_code_size_in_bytes
  # Donated state: the outputs reuse the arguments' buffers (alias).
  total = arguments + temporaries + code + outputs - memory.alias_size_in_bytes
  cost = compiled.cost_analysis() or {}
  counted_flops = float(cost.get("flops", 0.0))
  counted_bytes = float(cost.get("bytes accessed", 0.0))
  stats = hlo_stats.analyze(compiled.as_text(), chips)

  fits = total <= chip.hbm_bytes * (1 - MARGIN)
  memory_result = {
      "bytes_per_chip": {"arguments": arguments, "temporaries": temporaries,
                         "outputs": outputs, "aliased": memory.alias_size_in_bytes,
                         "code": code, "total": total,
                         # Tiled layouts: e.g. a 64-wide dimension fills 128 lanes.
                         "layout_padding": arguments - state_bytes - batch_bytes},
      "fits": fits, "largest_buffers": stats.largest_buffers,
      "collectives": stats.collectives,
      "tpu_custom_calls": {"per_step": stats.kernel_calls,
                           "in_program": stats.kernel_calls_in_text}}
  result.update(memory_result)
  if not estimate:
    return result

  # What XLA's count misses. (1) A scanned stack's further iterations: XLA's
  # own count of one more layer (small unscanned compiles). (2) The Pallas
  # kernels' backward: from the FLOP model. (3) Gradient accumulation is a loop
  # too: its body (all but the optimizer's update) runs once per microbatch.
  # (The HBM traffic is hlo_stats', which counts loops as often as they run.)
  micro = built.batch_size / built.grad_accum_steps
  attention_parts = flops.attention_flops_per_sequence(model_cfg, built.seq_len)
  notes, added_flops = [], 0.0
  if model_cfg.scan_layers and built.config is not None:
    layer_costs, probed = one_more_layer(built, devices)
    for stack, (layer_flops, _) in layer_costs.items():
      added_flops += (_stack_layers(model_cfg, stack) - 1) * layer_flops
    notes.append("scanned layers: each stack's further iterations by XLA's count of "
                 "one more layer (unscanned compiles of 1 and 2 layers"
                 + (f", at batch {probed} scaled to the microbatch)"
                    if probed != micro else ")"))
  elif model_cfg.scan_layers:
    notes.append("scanned layers: XLA counts one layer of each stack")
  kernel_sites = [s for s, v in sites.items() if v["implementation"] == "tpu_flash"]
  if kernel_sites:
    share = kernel_uncounted_share(devices[0])
    for site in kernel_sites:
      added_flops += share * 3 * attention_parts.get(site, 0) * micro / chips
    if share > 0:  # (The project's kernel states its cost; the stock one's backward none.)
      notes.append(f"Pallas kernels: the {share:.0%} of their FLOPs XLA does not "
                   "count (their backward), from the FLOP model")
  # HBM traffic: hlo_stats' count, every loop's body as often as it runs, a
  # sliced operand as its slice, an in-place update as the update (XLA's
  # `bytes accessed` counts each whole: 2x on `small`, hlo_stats docstring).
  accum = built.grad_accum_steps
  hardware_flops = (counted_flops + added_flops) * accum
  hbm_traffic = stats.hbm_bytes or counted_bytes
  if accum > 1:
    notes.append(f"grad accumulation: the loop's body x {accum}")
  model_flops_per_chip = built.model_flops / chips
  if hardware_flops < model_flops_per_chip:
    # A chip runs at least the model's FLOPs. XLA can count fewer: on a TPU where
    # it made loops of its own (collective matmuls: FSDP's weight gathers
    # decomposed into collective-permute loops, on v5e:4x4), whose bodies it
    # counts once; on a GPU, the library calls (cuBLAS, cuDNN) it counts not at all.
    cause = ("library calls it does not count" if devices[0].platform == "gpu"
             else "loops of its own, counted once")
    notes.append(f"XLA counted {hardware_flops / model_flops_per_chip:.0%} of the "
                 f"model's FLOPs ({cause}): the model's count is used")
    hardware_flops = model_flops_per_chip
  ring = sum(v["ring_bytes"] for v in stats.collectives.values())
  terms = {"flops": hardware_flops / chip.peak_flops,
           "hbm": hbm_traffic / chip.hbm_bandwidth,
           "collectives": ring / chip.interconnect_bandwidth}
  step = max(max(terms.values()), 1e-9)  # XLA reported no cost at all: no estimate.
  result.update({
      "xla_flops_per_chip": hardware_flops,
      "xla_flops_counted_per_chip": counted_flops, "xla_flops_notes": notes,
      "hbm_traffic_bytes_per_chip": hbm_traffic,
      # Where the bytes go (hlo_stats.category), and what a step that moved
      # only what it must would move (flops.train_hbm_bytes_per_chip).
      "hbm_traffic_by_category_per_chip": stats.hbm_by_category,
      "hbm_first_principles_per_chip": first_principles_bytes(built),
      "xla_bytes_accessed_per_chip": counted_bytes,
      "roofline_seconds": terms, "bound_by": max(terms, key=terms.get),
      "estimated_step_seconds": step,
      "estimated_tokens_per_second": built.batch_size * built.seq_len / step,
      "estimated_mfu": built.model_flops / chips / (step * chip.peak_flops),
  })
  return result


# --------------------------------------------------------------------------
# What to change when it does not fit.
# --------------------------------------------------------------------------
def _with(config, overrides: dict):
  """A copy of `config` with dotted overrides."""
  from maelm_jax.run import config_lib  # pylint: disable=g-import-not-at-top
  copy = config.copy_and_resolve_references()
  with copy.unlocked():
    for key, value in overrides.items():
      config_lib.set_path(copy, key, value)
  return copy


def _flag(key, value) -> str:
  text = f"'{tuple(value)}'" if isinstance(value, (tuple, list)) else value
  return f"--config.{key}={text}"


def knobs(config, result: dict) -> list[tuple[dict, float | None]]:
  """Overrides that shrink the step's memory, each with its estimated bytes per
  chip (None: only a compile says): first those that keep the global batch
  (gradient accumulation, fsdp over the slice, a remat policy, scanned layers),
  then a smaller batch. Estimates: temporaries scale with the microbatch,
  the state with its shards."""
  used = result["bytes_per_chip"]
  budget = result["hbm_bytes_per_chip"] * (1 - MARGIN)
  state = result["state_bytes_per_chip"]
  temporaries = used["temporaries"] + used.get("code", 0)
  rest = used["total"] - temporaries  # Arguments and outputs.
  mode = config.get("mode", "pretrain")
  batch, chips = result["batch_size"], result["chips"]
  mesh = result["mesh"]
  dp = mesh["data"] * mesh["fsdp"]
  accum = config.get("grad_accum_steps", 1)
  out = []
  if mode == "pretrain":
    candidate = None
    while batch % (accum * 2 * dp) == 0:
      accum *= 2
      # The accumulator of gradients: one more float32 copy of the params (a
      # third of params + Adam's two moments).
      candidate = ({"grad_accum_steps": accum},
                   rest + temporaries * config.grad_accum_steps / accum + state / 3)
      if candidate[1] <= budget:
        break
    if candidate:  # The first that fits, or the most the batch allows.
      out.append(candidate)
    accum = config.grad_accum_steps
  if mesh["fsdp"] * mesh["tensor"] < chips and mode == "pretrain":
    # fsdp over every chip the tensor axis leaves: the state in 1/chips shards.
    fsdp = {"mesh_shape": (1, chips // mesh["tensor"], mesh["tensor"])}
    shards = mesh["fsdp"] * mesh["tensor"]
    out.append((fsdp, rest - state + state * shards / chips + temporaries))
  model = config.get("model") if mode == "pretrain" else None
  remat = model is not None and (model.remat or model.remat_policy == "full")
  if model is not None and not remat:
    out.append(({"model.remat_policy": "full"}, None))
    if not model.scan_layers:
      out.append(({"model.remat_policy": "full", "model.scan_layers": True}, None))
  per_row = temporaries / batch
  smaller = batch
  while smaller % 2 == 0 and (smaller // 2) % (dp * accum) == 0:
    smaller //= 2
    if rest + per_row * smaller <= budget:
      break
  if smaller < batch:
    out.append(({"batch_size": smaller}, rest + per_row * smaller))
  return out


def _gb(value) -> str:
  return "?" if value is None or value != value else f"{value / 1e9:.1f} GB"


def _short(op_name: str) -> str:
  """An HLO op name without the jit/jvp/transpose wrappers."""
  parts = [p for p in op_name.split("/") if not re.match(r"(jit|jvp|transpose)\(", p)]
  return "/".join(re.sub(r"^(jvp|transpose)\((.*)\)$", r"\2", p) for p in parts)[-70:]


def refusal(config, result: dict, devices, size: str = "", vocab_size: int = 0,
            max_compiles: int = 3) -> list[str]:
  """At most 5 lines for a step that does not fit: what it needs, its largest
  buffers, the knobs, and the plan of the first knob that fits (compiled)."""
  used = result["bytes_per_chip"]
  lines = [f"does not fit: {_gb(used['total'])} per chip needed, "
           f"{_gb(result['hbm_bytes_per_chip'] * (1 - MARGIN))} usable of "
           f"{_gb(result['hbm_bytes_per_chip'])} on {result['chip_kind']} "
           f"({result['topology']}): arguments {_gb(used['arguments'])}, "
           f"temporaries {_gb(used['temporaries'])}"
           + (" (the compiler ran out of memory)" if "compile_error" in result else "")]
  largest = [f"{shape} {_gb(b)} ({_short(name)})"
             for b, shape, name in result.get("largest_buffers", [])[:2]]
  largest += [f"{name} {_gb(b)}" for b, name in result["largest_state_shards"][:2]]
  lines.append("largest buffers per chip: " + "; ".join(largest))
  candidates = knobs(config, result)
  lines.append("knobs: " + ", ".join(
      " ".join(_flag(k, v) for k, v in overrides.items())
      + (f" (~{_gb(estimate)})" if estimate is not None else "")
      for overrides, estimate in candidates))
  budget = result["hbm_bytes_per_chip"] * (1 - MARGIN)
  queue = ([c[0] for c in candidates if c[1] is not None and c[1] <= budget]
           + [c[0] for c in candidates if c[1] is None])
  compiles, fitted = 0, None
  while queue and compiles < max_compiles:
    overrides = queue.pop(0)
    try:
      trial = plan_built(build(_with(config, overrides), devices, size, vocab_size),
                         result["topology"], devices)
    except ValueError:
      continue
    compiles += 1
    if trial["fits"]:
      fitted = (overrides, trial)
      break
    accum = overrides.get("grad_accum_steps")
    # The estimate assumed temporaries shrink with the microbatch; they shrank
    # less: try twice the accumulation next, if the batch divides.
    if accum and result["batch_size"] % (
        2 * accum * result["mesh"]["data"] * result["mesh"]["fsdp"]) == 0:
      queue.insert(0, {**overrides, "grad_accum_steps": 2 * accum})
  if fitted:
    overrides, trial = fitted
    flags_text = " ".join(_flag(k, v) for k, v in overrides.items())
    lines.append(
        f"first that fits: {flags_text}: {_gb(trial['bytes_per_chip']['total'])} "
        f"per chip (compiled), est. {trial['estimated_step_seconds']:.3g} s/step, "
        f"MFU {trial['estimated_mfu']:.0%} (a bound)")
    result["first_that_fits"] = {"overrides": {k: list(v) if isinstance(v, tuple)
                                               else v for k, v in overrides.items()},
                                 "plan": trial}
  else:
    lines.append(f"none of the first {compiles} compiled fits alone; combine them, or "
                 "take a larger slice")
  return lines[:5]


# --------------------------------------------------------------------------
# The command.
# --------------------------------------------------------------------------
def table(result: dict) -> list[str]:
  used = result["bytes_per_chip"]
  lines = [f"plan: {result['topology']} ({result['chips']} x {result['chip_kind']}), "
           f"mesh {result['mesh']}, batch {result['batch_size']} x {result['seq_len']}"]
  lines.append(f"  memory/chip  {_gb(used['total'])} of {_gb(result['hbm_bytes_per_chip'])}"
               f" ({'fits' if result['fits'] else 'DOES NOT FIT'}, {MARGIN:.0%} kept "
               f"free): arguments {_gb(used['arguments'])}, temporaries "
               f"{_gb(used['temporaries'])}, outputs {_gb(used['outputs'])}")
  if result.get("xla_flops_per_chip"):
    lines.append(f"  flops/chip   XLA {result['xla_flops_per_chip']:.3g}, model "
                 f"{result['model_flops_per_chip']:.3g}")
    collectives = ", ".join(f"{k} {v['count']} ({_gb(v['bytes'])})"
                            for k, v in result["collectives"].items()) or "none"
    lines.append(f"  collectives  {collectives}")
    by_category = result.get("hbm_traffic_by_category_per_chip") or {}
    if by_category:
      lines.append(f"  hbm/chip     {_gb(result['hbm_traffic_bytes_per_chip'])} a step: "
                   + ", ".join(f"{k} {_gb(v)}" for k, v in sorted(
                       by_category.items(), key=lambda kv: -kv[1]) if v >= 5e7))
    needed = result.get("hbm_first_principles_per_chip")
    if needed:
      lines.append(f"  needed       about {_gb(needed['total'])} (first principles: "
                   + ", ".join(f"{k} {_gb(v)}" for k, v in needed.items()
                               if k != "total") + ")")
    lines.append(f"  estimate     {result['estimated_step_seconds'] * 1e3:.1f} ms/step, "
                 f"{result['estimated_tokens_per_second']:,.0f} tokens/s, MFU "
                 f"{result['estimated_mfu']:.1%} (a roofline bound by "
                 f"{result['bound_by']}; not a measurement)")
  if result.get("mask_rate_stages"):
    lines.append("  mask rate    " + ", ".join(
        f"{s['mask_ratio']:g} {_gb(s['bytes_per_chip'])}"
        for s in result["mask_rate_stages"])
        + " per chip (the first and the last stage; the estimate is the last's)")
  attention = ", ".join(f"{site} {v['implementation']} ({v['q_len']}x{v['kv_len']})"
                        for site, v in result["attention"].items())
  lines.append(f"  attention    {attention}")
  lines.append(f"  compiled in  {result['compile_seconds']:.0f} s")
  return lines


def first_mask_stage(built: Built):
  """(rate, a config whose one step is the first stage's) for a pretraining run
  whose mask rate changes over its stages, else None."""
  from maelm_jax.run import config_lib  # pylint: disable=g-import-not-at-top
  rates = config_lib.mask_ratios(built.config) if built.config is not None else ()
  if len(rates) < 2:
    return None
  rate = rates[0]
  return rate, _with(built.config, {"model.mask_ratio_start": 0.0,
                                    "model.mask_ratio": rate})


def _json_ready(value):
  if isinstance(value, dict):
    return {str(k): _json_ready(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_ready(v) for v in value]
  if isinstance(value, float) and value != value:
    return None
  return value


def run(config, topology: str, out: str = "", size: str = "",
        vocab_size: int = 0) -> tuple[int, dict, list[str]]:
  """(exit status, plan, lines to print)."""
  devices, name = topology_devices(topology)
  built = build(config, devices, size, vocab_size)
  result = plan_built(built, name, devices)
  refused, refused_config = result, config
  first = first_mask_stage(built) if result["fits"] else None
  if first is not None:
    # A decaying mask rate compiles one step per stage (config_lib.mask_ratios):
    # the plan above is the last stage's (the standard rate); the first stage,
    # the other end of the schedule, is compiled for its memory too, and the run
    # fits only if both do (the stages between lie between them). A knob the
    # refusal offers is checked on the stage that did not fit.
    rate, first_config = first
    stage = plan_built(build(first_config, devices), name, devices, estimate=False)
    result["mask_rate_stages"] = [
        {"mask_ratio": rate, "bytes_per_chip": stage["bytes_per_chip"]["total"],
         "fits": stage["fits"]},
        {"mask_ratio": built.model_cfg.mask_ratio,
         "bytes_per_chip": result["bytes_per_chip"]["total"], "fits": result["fits"]}]
    if not stage["fits"]:
      result["fits"] = False
      refused, refused_config = stage, first_config
  lines = table(result) if "compile_error" not in result else []
  status = 0
  if not result["fits"]:
    lines = refusal(refused_config, refused, devices, size, vocab_size)
    if refused is not result:
      lines[0] = f"the first mask-rate stage ({refused_config.model.mask_ratio:g}) " + lines[0]
      if "first_that_fits" in refused:  # (planned on that stage's config)
        result["first_that_fits"] = refused["first_that_fits"]
    status = NOT_FIT_EXIT
  if out:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "plan.json"), "w") as f:
      json.dump(_json_ready(result), f, indent=2)
  return status, result, lines


FLAGS = flags.FLAGS


def define_flags():
  """The command's flags, defined only when it runs (`--config` is also
  maelm_jax.main's, and both modules may be imported in one process)."""
  config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                  "configs/pretrain.py:objective=maelm,size=base",
                                  lock_config=True)
  flags.DEFINE_string("topology", None, "TPU slice: v5e:4x4, v4:2x2x2, v5p:2x2x1, "
                      "v6e:2x2, or an accelerator type such as v5litepod-16; or "
                      "one host's GPUs: h100:8, h200:8, a100:8")
  flags.DEFINE_string("out", "", "Directory for plan.json (empty: print only).")
  flags.DEFINE_string("size", "", "Fine-tuning without --config.init_from: the "
                      "encoder size (tiny, small, base, large).")
  flags.DEFINE_integer("vocab_size", 32000, "With --size: the vocabulary size.")
  flags.mark_flags_as_required(["config", "topology"])


def main() -> int:
  try:
    status, _, lines = run(FLAGS.config, FLAGS.topology, FLAGS.out, FLAGS.size,
                           FLAGS.vocab_size)
  except PlanError as error:
    sys.stderr.write(f"plan: {error}\n")
    return 1
  print("\n".join(lines), flush=True)
  if FLAGS.out and status == 0:
    print(f"  plan.json    {os.path.join(FLAGS.out, 'plan.json')}", flush=True)
  return status


# `python -m` and the maelm-plan command (setup.py's console scripts).
console = cli.command(main, define_flags)

if __name__ == "__main__":
  console()

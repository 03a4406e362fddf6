r"""Train-step throughput (tokens/s) of MLM, MAE-LM and 3ML at several sizes and lengths.

Measures the real compiled train step (`train_lib.jit_steps`: masking, forward,
backward, AdamW update, state donated) on random token ids, and writes a markdown
table into `benchmarks/cpu-speed-and-memory.md` between `<!-- throughput:start -->`
and `<!-- throughput:end -->` (the rest of the file is kept).

  python benchmarks/train_throughput.py                      # the defaults below
  python benchmarks/train_throughput.py --dtype float32,bfloat16
  python benchmarks/train_throughput.py --dry_run            # smoke test, ~30 s

On a GPU or TPU, the same script (bf16, the fused attention against the einsum,
scanned layers, and a profile of 3 steps of each objective of the last cell, whose
most expensive op kinds it prints and writes beside the table, `maelm_jax.tools.profiling`):

  python benchmarks/train_throughput.py --sizes=small,base --seq_lens=128,512 \
      --objectives=mlm,maelm,3ml-cross --dtype=bfloat16 --attention_impls=xla,auto \
      --scan_layers --dropout=0 --tokens_per_batch=65536 --profile_dir=runs/profile \
      --out=benchmarks/RESULTS_accelerator.md --json=runs/throughput.json

Method:
  * vocabulary 8192 (as the HF/PyTorch peers in the design notes);
    batch = tokens_per_batch // seq_len sequences of `[CLS] w.. [SEP]`, w >= 5;
    everything else is the real pretraining config (configs/pretrain.py), dropout
    and relative position bias included.
  * per (dtype, size, seq_len): every objective is compiled and run once (warm-up,
    not timed); then `repeats` rounds, each timing a window of `steps` steps of
    every objective in turn (round-robin, starting objective rotated per round),
    so load from other processes hits all objectives alike. A window ends with
    `jax.block_until_ready` on the state and metrics.
  * reported: the median over windows of tokens/s and of the step time, the spread
    (max-min)/median of tokens/s, the model FLOPs of a step
    (`flops.train_flops_per_step`, matmuls only, 3x forward), the achieved GFLOP/s,
    and the speed-up vs mlm at the same size/length, next to the speed-up the
    FLOP model predicts.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import pathlib
import platform
import re
import shlex
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "configs"))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import pretrain  # noqa: E402  (configs/pretrain.py)
from maelm_jax.run import config_lib, train_lib  # noqa: E402
from maelm_jax.modeling import flops  # noqa: E402
from maelm_jax.tools import profiling  # noqa: E402
from maelm_jax.core import sharding  # noqa: E402
from maelm_jax.modeling.model import SIZES, ModelConfig  # noqa: E402
from maelm_jax.data.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, SEP_ID  # noqa: E402

VOCAB_SIZE = 8192
START, END = "<!-- throughput:start -->", "<!-- throughput:end -->"
DEFAULT_OUT = "benchmarks/cpu-speed-and-memory.md"

# Benchmark name -> (config objective, extra model overrides).
OBJECTIVES = {
    "mlm": ("mlm", {}),
    "maelm": ("maelm", {}),
    "3ml": ("3ml", {}),
    "3ml-cross": ("3ml", {"decoder_type": "cross"}),
    "maelm-cross": ("maelm", {"decoder_type": "cross"}),
}
# A size is a name of model.SIZES or a shape "<layers>x<hidden>" (e.g. 8x384: heads
# of 64 dimensions, an MLP 4x wide, the decoder depth of `small`), so that a
# pretraining shape between the named sizes can be timed as it will run.
SHAPE = re.compile(r"^(\d+)x(\d+)$")


def size_overrides(size: str) -> tuple[str, dict]:
  """(model.SIZES name, config.model overrides) of a size or a shape name."""
  match = SHAPE.match(size)
  if not match:
    return size, {}
  layers, hidden = int(match[1]), int(match[2])
  return "small", {"num_layers": layers, "hidden": hidden,
                   "num_heads": max(1, hidden // 64), "mlp": 4 * hidden}


def _csv(kind):
  def parse(text):
    return [kind(x) for x in text.split(",") if x.strip()]
  return parse


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--sizes", type=_csv(str), default=["tiny", "small"],
                 help="comma-separated sizes from model.SIZES (default tiny,small)")
  p.add_argument("--seq_lens", type=_csv(int), default=[128, 512],
                 help="comma-separated sequence lengths (default 128,512)")
  p.add_argument("--objectives", type=_csv(str),
                 default=["mlm", "maelm", "3ml", "3ml-cross"],
                 help=f"comma-separated, from {list(OBJECTIVES)}")
  p.add_argument("--tokens_per_batch", type=int, default=4096,
                 help="batch = tokens_per_batch // seq_len sequences (default 4096)")
  p.add_argument("--dtype", type=_csv(str), default=["float32"],
                 help="float32 or bfloat16 matmuls; a comma list gives one table "
                      "each (default float32, the peers' setting)")
  p.add_argument("--attention_impls", type=_csv(str), default=["auto"],
                 help="model.attention_impl values, one table each (auto, xla, "
                      "cudnn); note dropout 0.1 makes auto the einsum in training")
  p.add_argument("--scan_layers", action="store_true",
                 help="model.scan_layers=True (nn.scan over the layers)")
  p.add_argument("--remat_policy", default="none",
                 help="model.remat_policy (none, full, dots_saveable, "
                      "dots_with_no_batch_dims_saveable)")
  p.add_argument("--dropout", type=float, default=None,
                 help="model.dropout and attention_dropout (default: the config's; "
                      "above 0 makes 'auto' run the einsum while training)")
  p.add_argument("--profile_dir", default="",
                 help="also record a jax.profiler trace of 3 steps of each "
                      "objective of the last cell there (TensorBoard / Perfetto)")
  p.add_argument("--steps", type=int, default=10, help="steps per timed window")
  p.add_argument("--repeats", type=int, default=3,
                 help="timed windows per objective (round-robin)")
  p.add_argument("--mesh", default="1,1,1",
                 help="('data','fsdp','tensor') sizes, one -1 allowed; default "
                      "1,1,1 = one device. -1,1,1 uses every device.")
  p.add_argument("--peak_flops", type=float, default=0.0,
                 help="peak FLOP/s per device for MFU; 0 = flops.peak_flops()")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--compile_threads", type=int, default=os.cpu_count() or 1,
                 help="compile the objectives of a cell in parallel (not timed)")
  p.add_argument("--note", default="",
                 help="free text written under the machine description")
  p.add_argument("--out", default=None,
                 help=f"markdown file to update (default {DEFAULT_OUT}; a "
                      "--dry_run writes nothing unless --out is given)")
  p.add_argument("--json", default="", help="also dump raw timings to this file, "
                 "rewritten after every cell (a run cut short keeps what it measured)")
  p.add_argument("--ceiling", type=int, default=0,
                 help="first time an N x N x N bf16 matrix product on the device "
                      "(8192 on a GPU: the measured ceiling MFU is also reported "
                      "against); 0 skips it")
  p.add_argument("--dry_run", action="store_true",
                 help="smoke test: first size and length only, steps=2, repeats=1")
  argv = sys.argv[1:] if argv is None else list(argv)
  # --config.KEY=VALUE: the product's overrides of the pretraining config, applied
  # last (e.g. --config.model.relative_position_bias=False).
  try:
    argv, args_overrides = config_lib.split_overrides(argv)
    for key, value in args_overrides:
      config_lib.typed_set(pretrain.get_config(), key, value)
  except (KeyError, ValueError) as e:
    p.error(str(e.args[0]))
  args = p.parse_args(argv)
  args.config_overrides = args_overrides
  if args.dry_run:
    args.sizes, args.seq_lens = args.sizes[:1], args.seq_lens[:1]
    args.steps, args.repeats = 2, 1
  for name in args.objectives:
    if name not in OBJECTIVES:
      p.error(f"unknown objective {name!r}; choose from {list(OBJECTIVES)}")
  for size in args.sizes:
    if size not in SIZES and not SHAPE.match(size):
      p.error(f"unknown size {size!r}; choose from {list(SIZES)} or a shape "
              "<layers>x<hidden> such as 8x384")
  from maelm_jax.modeling.attention import ATTENTION_IMPLS  # noqa: E402
  from maelm_jax.modeling.model import REMAT_POLICIES  # noqa: E402
  for impl in args.attention_impls:
    if impl not in ATTENTION_IMPLS:
      p.error(f"--attention_impls {impl!r}: use some of {ATTENTION_IMPLS}")
  if args.remat_policy not in REMAT_POLICIES:
    p.error(f"--remat_policy {args.remat_policy!r}: use one of {list(REMAT_POLICIES)}")
  for dtype in args.dtype:
    if dtype not in ("float32", "bfloat16"):
      p.error(f"--dtype {dtype!r}: use float32 or bfloat16")
  for seq_len in args.seq_lens:
    if not 8 <= seq_len <= args.tokens_per_batch:
      p.error(f"seq_len {seq_len} must be in [8, tokens_per_batch]")
  if args.steps < 1 or args.repeats < 1:
    p.error("--steps and --repeats must be >= 1")
  args.mesh = tuple(int(x) for x in args.mesh.split(","))
  return args


# ------------------------------------------------------------------ Setup --

def build_config(objective: str, size: str, seq_len: int, batch: int, dtype: str,
                 overrides=(), **knobs):
  """The real pretraining config with the benchmark's overrides, resolved.
  `knobs`: more config.model keys (attention_impl, scan_layers, ...)."""
  base_objective, model_overrides = OBJECTIVES[objective]
  size, shape = size_overrides(size)
  config = pretrain.get_config(f"objective={base_objective},size={size}")
  config.unlock()
  model_overrides = {**shape, **model_overrides, **knobs}
  config.seq_len = seq_len
  config.batch_size = batch
  config.tokenizer.vocab_size = VOCAB_SIZE
  config.model.dtype = dtype
  config.model.max_positions = max(config.model.max_positions, seq_len)
  for key, value in model_overrides.items():
    config.model[key] = value
  for key, text in overrides:
    config_lib.typed_set(config, key, text)
  config = config_lib.resolve(config)
  config_lib.validate(config)
  return config


def random_batch(batch: int, seq_len: int, seed: int):
  """Full rows `[CLS] w_1 .. w_{L-2} [SEP]` with w uniform in [5, 8192)."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(NUM_SPECIAL, VOCAB_SIZE, (batch, seq_len)).astype(np.int32)
  ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
  return ids


class Runner:
  """One compiled train step and its state, for one benchmark cell."""

  def __init__(self, objective, size, seq_len, batch, dtype, mesh, ids, seed,
               knobs=None, overrides=()):
    self.objective = objective
    config = build_config(objective, size, seq_len, batch, dtype, overrides,
                          **(knobs or {}))
    self.model_cfg = ModelConfig.from_config(config.model, VOCAB_SIZE, MASK_ID)
    tx = train_lib.make_optimizer(config)
    self.state, shardings = train_lib.create_sharded_state(
        self.model_cfg, seq_len, tx, mesh, seed)
    train_step, _ = train_lib.jit_steps(self.model_cfg, seq_len, tx, mesh, shardings,
                                        config.grad_accum_steps)
    self.batch = {"input_ids": jax.device_put(ids, sharding.batch_sharding(mesh))}
    self.knots = train_lib.learning_rate_knots(config)
    self.lowered = train_step.lower(self.state, self.batch, self.knots)
    self.counts = self.model_cfg.mask_counts(seq_len)
    self.model_flops = flops.train_flops_per_step(self.model_cfg, seq_len, batch)
    parts = flops.forward_flops_per_sequence(self.model_cfg, seq_len)
    self.flop_shares = {k: v / sum(parts.values()) for k, v in parts.items()}
    self.num_params = sum(x.size for x in jax.tree.leaves(self.state.params))
    self.tokens_per_step = batch * seq_len
    self.windows = []  # seconds per window

  def compile(self):
    """Ahead-of-time compile of the jitted step: the same program as calling it,
    and the XLA cost analysis comes for free. Thread-safe (XLA releases the GIL)."""
    t0 = time.perf_counter()
    self.step = self.lowered.compile()
    self.compile_s = time.perf_counter() - t0
    cost = self.step.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    self.xla_flops = float((cost or {}).get("flops", 0.0))
    # The compiled step's device memory: temporaries + arguments + outputs, less
    # what donation aliases (None where the backend does not say).
    memory = self.step.memory_analysis()
    self.memory_bytes = None if memory is None else (
        memory.temp_size_in_bytes + memory.argument_size_in_bytes
        + memory.output_size_in_bytes - memory.alias_size_in_bytes)
    return self

  def warm_up(self):
    """First execution (allocation, thread pools), not timed."""
    t0 = time.perf_counter()
    self.run(1)
    self.warmup_s = time.perf_counter() - t0

  def run(self, steps: int) -> float:
    t0 = time.perf_counter()
    metrics = None
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch, self.knots)
    jax.block_until_ready((self.state, metrics))
    elapsed = time.perf_counter() - t0
    loss = float(metrics["loss"])
    if not np.isfinite(loss):
      raise FloatingPointError(f"{self.objective}: non-finite loss {loss}")
    return elapsed


# ------------------------------------------------------------ Measurement --

class CpuMeter:
  """CPU time used by other processes over an interval, in cores (Linux only).

  /proc/stat's busy time of the whole machine minus this process's own
  user+system time: how much the machine was shared while we timed.
  """

  def __init__(self):
    self.start = self._sample()

  @staticmethod
  def _sample():
    try:
      with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
      hz = os.sysconf("SC_CLK_TCK")
      busy = sum(fields[:3]) + sum(fields[5:8])  # user nice system irq softirq steal
    except (OSError, ValueError, IndexError):
      return None
    t = os.times()
    return time.perf_counter(), busy / hz, t.user + t.system

  def others_cores(self) -> float | None:
    end = self._sample()
    if self.start is None or end is None or end[0] <= self.start[0]:
      return None
    elapsed = end[0] - self.start[0]
    others = (end[1] - self.start[1]) - (end[2] - self.start[2])
    return max(others, 0.0) / elapsed


def model_knobs(args, attention_impl: str) -> dict:
  knobs = {"attention_impl": attention_impl, "scan_layers": args.scan_layers,
           "remat_policy": args.remat_policy}
  if args.dropout is not None:
    knobs.update(dropout=args.dropout, attention_dropout=args.dropout)
  return knobs


def measure_cell(args, dtype, size, seq_len, mesh, attention_impl="auto",
                 profile_dir=""):
  """All objectives of one (dtype, size, seq_len), timed round-robin."""
  batch = args.tokens_per_batch // seq_len
  dp = sharding.data_parallel_size(mesh)
  if batch % dp:
    raise ValueError(f"batch {batch} (= {args.tokens_per_batch} // {seq_len}) is not "
                     f"divisible by the data-parallel size {dp}")
  ids = random_batch(batch, seq_len, args.seed)
  runners = [Runner(objective, size, seq_len, batch, dtype, mesh, ids, args.seed,
                    model_knobs(args, attention_impl), args.config_overrides)
             for objective in args.objectives]
  # Compiling is not measured; overlap it over the cores to save wall time.
  t0 = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(args.compile_threads) as pool:
    list(pool.map(Runner.compile, runners))
  print(f"  [{dtype} {size} L={seq_len}] compiled {len(runners)} steps in "
        f"{time.perf_counter() - t0:.1f}s wall", flush=True)
  for r in runners:
    r.warm_up()
    print(f"  [{dtype} {size} L={seq_len}] {r.objective:9s} compiled in "
          f"{r.compile_s:5.1f}s, warm-up step {r.warmup_s:5.2f}s, "
          f"{r.num_params / 1e6:.2f}M params", flush=True)
  meter = CpuMeter()
  for rep in range(args.repeats):
    order = runners[rep % len(runners):] + runners[:rep % len(runners)]
    for r in order:
      r.windows.append(r.run(args.steps))
    print(f"  [{dtype} {size} L={seq_len}] round {rep + 1}/{args.repeats}: " +
          ", ".join(f"{r.objective} {r.tokens_per_step * args.steps / r.windows[-1]:,.0f}"
                    for r in runners) + " tokens/s", flush=True)

  others = meter.others_cores()
  if profile_dir:
    for r in runners:
      path = os.path.join(profile_dir, f"{dtype}_{attention_impl}_{size}_{seq_len}_"
                          f"{r.objective}")
      with jax.profiler.trace(path):
        r.run(3)
      r.profile = (path, profiling.format_summary(path, top=3))
      print(f"  profile of 3 {r.objective} steps: {path}\n  {r.profile[1]}",
            flush=True)
  rows = []
  for r in runners:
    tps = [r.tokens_per_step * args.steps / w for w in r.windows]
    step_s = [w / args.steps for w in r.windows]
    rows.append(dict(
        dtype=dtype, size=size, seq_len=seq_len, objective=r.objective, batch=batch,
        encoder_len=r.counts.encoder_len, num_selected=r.counts.num_selected,
        params=r.num_params, tokens_per_s=statistics.median(tps),
        tokens_per_s_all=tps, spread=(max(tps) - min(tps)) / statistics.median(tps),
        step_s=statistics.median(step_s), model_flops=r.model_flops,
        xla_flops=r.xla_flops, flop_shares=r.flop_shares, compile_s=r.compile_s,
        memory_bytes=r.memory_bytes, attention_impl=attention_impl,
        # What the encoder's attention ran (decoder layers of odd length run
        # the einsum; model.ModelConfig.attention_backend).
        attention_backend=r.model_cfg.attention_backend(
            r.model_cfg.attention_dropout > 0, r.counts.encoder_len,
            r.counts.encoder_len),
        others_cores=others, profile=getattr(r, "profile", None)))
  mlm = next((row for row in rows if row["objective"] == "mlm"), None)
  for row in rows:
    row["gflops_per_s"] = row["model_flops"] / row["step_s"] / 1e9
    if mlm:
      row["speedup"] = row["tokens_per_s"] / mlm["tokens_per_s"]
      row["flop_speedup"] = mlm["model_flops"] / row["model_flops"]
  del runners
  return rows


def matmul_ceiling(n: int, windows: int = 5, products: int = 10) -> dict:
  """FLOP/s of an n^3 bf16 matrix product on the first device: the median of
  `windows` timed windows of `products` products each, after a warm-up, on
  random inputs (zeros ran 13% faster on an H200 here), rotating between two
  input pairs so that no product reads what the previous one left in cache."""
  device = jax.devices()[0]
  keys = jax.random.split(jax.random.key(0), 4)
  pairs = [tuple(jax.device_put(jax.random.normal(k, (n, n), jax.numpy.bfloat16),
                                device) for k in keys[i:i + 2]) for i in (0, 2)]
  product = jax.jit(lambda a, b: a @ b)
  for a, b in pairs:
    product(a, b).block_until_ready()
  seconds = []
  for _ in range(windows):
    t0 = time.perf_counter()
    out = [product(*pairs[i % 2]) for i in range(products)]
    jax.block_until_ready(out)
    seconds.append((time.perf_counter() - t0) / products)
    del out
  median = statistics.median(seconds)
  return dict(n=n, dtype="bfloat16", seconds=median, flops_per_s=2 * n ** 3 / median,
              spread=(max(seconds) - min(seconds)) / median, device=device.device_kind)


def device_peak_bytes() -> int | None:
  """The process's peak device memory so far (GPU/TPU allocators; None on CPU)."""
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # noqa: BLE001  (backends without memory_stats)
    return None
  return (stats or {}).get("peak_bytes_in_use")


def finish_rows(rows, info, peak, ceiling) -> None:
  """The fields a reader of the JSON needs without the table around it."""
  for r in rows:
    flop_rate = r["gflops_per_s"] * 1e9
    r.update(device=info["device"], tokens_per_sec=r["tokens_per_s"],
             mfu_spec=flop_rate / peak if peak else None,
             mfu_measured_ceiling=(flop_rate / ceiling["flops_per_s"]
                                   if ceiling else None),
             peak_memory_bytes=r.get("memory_bytes"), command=command_line())


def write_json(path: str, payload: dict) -> None:
  pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=2)
  os.replace(tmp, path)


# ---------------------------------------------------------------- Reports --

def machine_info(mesh) -> dict:
  cpu = "unknown"
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    cpu = platform.processor() or "unknown"
  dev = jax.devices()[0]
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count()
  return dict(cpu=cpu, cores=cores, jax=jax.__version__,
              jaxlib=getattr(jax.lib, "__version__", None) or _jaxlib_version(),
              python=platform.python_version(),
              device=f"{dev.platform}: {dev.device_kind}",
              devices=f"{mesh.devices.size} of {jax.device_count()}",
              mesh=dict(mesh.shape), xla_flags=os.environ.get("XLA_FLAGS", ""))


def _jaxlib_version():
  try:
    import jaxlib
    return jaxlib.__version__
  except Exception:  # pragma: no cover
    return "unknown"


def format_table(rows, peak) -> str:
  head = ("| size | seq | objective | batch | enc len | K | tokens/s (median) | spread "
          "| step ms | model GFLOP/step | GFLOP/s | MFU | speed-up vs mlm "
          "| FLOP-predicted | FLOPs enc/dec/head | XLA GFLOP/step | compile s "
          "| memory GB |")
  sep = "|" + "|".join(["---"] * 3 + ["--:"] * 11 + ["---", "--:", "--:", "--:"]) + "|"
  lines = [head, sep]
  for r in rows:
    speed = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
    pred = f"{r['flop_speedup']:.2f}x" if "flop_speedup" in r else "-"
    mfu = f"{r['gflops_per_s'] * 1e9 / peak:.1%}" if peak else "-"
    memory = "-" if r.get("memory_bytes") is None else f"{r['memory_bytes'] / 1e9:.2f}"
    shares = "/".join(f"{r['flop_shares'].get(k, 0.0):.0%}"
                      for k in ("encoder", "decoder", "head"))
    lines.append(
        f"| {r['size']} | {r['seq_len']} | {r['objective']} | {r['batch']} "
        f"| {r['encoder_len']} | {r['num_selected']} | {r['tokens_per_s']:,.0f} "
        f"| {r['spread']:.0%} | {r['step_s'] * 1e3:,.0f} "
        f"| {r['model_flops'] / 1e9:,.1f} | {r['gflops_per_s']:,.1f} | {mfu} "
        f"| {speed} | {pred} | {shares} | {r['xla_flops'] / 1e9:,.1f} "
        f"| {r['compile_s']:.1f} | {memory} |")
  return "\n".join(lines)


def command_line() -> str:
  script = os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())
  return " ".join(["python", shlex.quote(script)] + [shlex.quote(a) for a in sys.argv[1:]])


def format_section(args, info, tables, started, total_s, load_before, load_after,
                   peak, ceiling=None) -> str:
  settings = (f"steps={args.steps} per window, repeats={args.repeats}, "
              f"dropout={args.dropout}, scan_layers={args.scan_layers}, "
              f"remat_policy={args.remat_policy}, "
              f"tokens_per_batch={args.tokens_per_batch}, vocab={VOCAB_SIZE}, "
              f"mesh={info['mesh']}, seed={args.seed}" +
              "".join(f", {k}={v}" for k, v in args.config_overrides))
  out = [
      START,
      "## Train-step throughput",
      "",
      f"- Date: {started.strftime('%Y-%m-%d %H:%M %Z').strip()} "
      f"(total run time {total_s / 60:.1f} min)",
      f"- Machine: {info['cpu']}, {info['cores']} cores; {info['device']} "
      f"({info['devices']} devices used); jax {info['jax']}, jaxlib {info['jaxlib']}, "
      f"Python {info['python']}" +
      (f"; XLA_FLAGS=`{info['xla_flags']}`" if info["xla_flags"] else ""),
      f"- Load average (1/5/15 min) before: {load_before}; after: {load_after}",
  ]
  if ceiling:
    out.append(f"- Measured ceiling: a {ceiling['n']}^3 bf16 matrix product at "
               f"{ceiling['flops_per_s'] / 1e12:,.0f} TFLOP/s (median of 5 windows, "
               f"spread {ceiling['spread']:.0%}); MFU of the ceiling = MFU x "
               f"{peak / ceiling['flops_per_s']:.2f}")
  if args.note:
    out.append(f"- Note: {args.note}")
  out += [
      f"- Command (from the repository root): `{command_line()}`",
      f"- Settings: {settings}",
      "",
      "Train step = `train_lib.jit_steps` (masking, forward, backward, clip, AdamW), "
      "dropout as in `configs/pretrain.py` unless the settings say, random `[CLS] w.. [SEP]` rows. "
      "tokens/s counts all batch x seq tokens (not only the encoder's). "
      "enc len: tokens the encoder runs on per sequence; K: positions the head "
      "predicts. spread: (max-min)/median of tokens/s over the timed windows. "
      "Model GFLOP/step: `flops.train_flops_per_step` (matmuls, 3x forward). "
      f"MFU is against {peak / 1e9:,.0f} GFLOP/s (`flops.peak_flops`; on CPU a bf16 "
      "host peak, so a rough indicator only). FLOP-predicted: mlm's model FLOPs / "
      "this row's, the speed-up if time were proportional to matmul FLOPs. "
      "FLOPs enc/dec/head: how the model FLOPs split. XLA GFLOP/step: the compiled "
      "step's `cost_analysis()` (every op the backend counts, optimizer included).",
  ]
  for dtype, rows in tables:
    ran = sorted({r["attention_backend"] for r in rows})
    title = dtype if len(args.attention_impls) == 1 else (
        f"{dtype} (attention_impl; the encoder ran: {', '.join(ran)})")
    out += ["", f"### {title}", "", format_table(rows, peak)]
    loads = [(f"{r['size']}/{r['seq_len']}", r["others_cores"]) for r in rows
             if r["objective"] == rows[0]["objective"] and r["others_cores"] is not None]
    if loads:
      out += ["", "CPU used by other processes while this table was timed "
              f"(cores of {info['cores']}): " +
              ", ".join(f"{cell} {cores:.2f}" for cell, cores in loads) + "."]
  profiles = [r["profile"] for _, rows in tables for r in rows if r.get("profile")]
  if profiles:
    out += ["", "Where the time of 3 profiled steps went (device; host on CPU; `python -m "
            "maelm_jax.tools.profiling DIR`: XLA ops' exclusive time, grouped by kind):", ""]
    out += [f"- `{path}`: " + summary.replace("\n", ";") for path, summary in profiles]
  out.append(END)
  return "\n".join(out) + "\n"


def write_section(path: pathlib.Path, section: str) -> None:
  text = path.read_text() if path.exists() else ""
  if START in text and END in text and text.index(START) < text.index(END):
    before = text[:text.index(START)]
    after = text[text.index(END) + len(END):].lstrip("\n")
    text = before + section + ("\n" + after if after else "")
  else:
    if not text:
      text = "# Benchmark results\n\nSee `benchmarks/README.md` for what each " \
             "benchmark measures.\n"
    text = text.rstrip("\n") + "\n\n" + section
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(text)
  os.replace(tmp, path)


def _loadavg() -> str:
  try:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())
  except OSError:
    return "n/a"


def main(argv=None) -> int:
  args = parse_args(argv)
  started = datetime.datetime.now(datetime.timezone.utc)
  t_start = time.perf_counter()
  load_before = _loadavg()
  devices = jax.devices()
  mesh = sharding.make_mesh(args.mesh, devices[:1] if args.mesh == (1, 1, 1)
                            else devices)
  info = machine_info(mesh)
  peak = flops.peak_flops(list(mesh.devices.flat), override=args.peak_flops or None)
  print(f"{info['cpu']} ({info['cores']} cores), {info['device']}, jax {info['jax']}; "
        f"mesh {info['mesh']}", flush=True)

  ceiling = matmul_ceiling(args.ceiling) if args.ceiling else None
  if ceiling:
    print(f"{args.ceiling}^3 bf16 matrix product: {ceiling['flops_per_s'] / 1e12:,.0f} "
          f"TFLOP/s (spread {ceiling['spread']:.0%}); peak by the spec "
          f"{peak / 1e12:,.0f}", flush=True)

  def dump(tables, total_s):
    if args.json:
      write_json(args.json, {
          "machine": info, "command": command_line(), "date": started.isoformat(),
          "total_s": total_s, "peak_flops": peak, "ceiling": ceiling,
          "process_peak_bytes": device_peak_bytes(), "tables": dict(tables)})

  tables = []
  cells = [(dtype, impl) for dtype in args.dtype for impl in args.attention_impls]
  for index, (dtype, impl) in enumerate(cells):
    rows = []
    name = dtype if len(args.attention_impls) == 1 else f"{dtype}/{impl}"
    tables.append((name, rows))
    for size in args.sizes:
      for seq_len in args.seq_lens:
        last = index == len(cells) - 1 and (size, seq_len) == (args.sizes[-1],
                                                              args.seq_lens[-1])
        cell = measure_cell(args, dtype, size, seq_len, mesh, impl,
                            args.profile_dir if last else "")
        finish_rows(cell, info, peak, ceiling)
        rows += cell
        dump(tables, time.perf_counter() - t_start)
  total_s = time.perf_counter() - t_start

  section = format_section(args, info, tables, started, total_s, load_before,
                           _loadavg(), peak, ceiling)
  print()
  print(section)
  out = args.out or (None if args.dry_run else DEFAULT_OUT)
  if out:
    path = pathlib.Path(out)
    if not path.is_absolute():
      path = REPO / path
    write_section(path, section)
    print(f"wrote {path}")
  dump(tables, total_s)
  print(f"total {total_s / 60:.1f} min")
  return 0


if __name__ == "__main__":
  sys.exit(main())

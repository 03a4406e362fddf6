r"""Where a traced step's device time goes: XLA op time from a `jax.profiler` trace,
grouped into a few kinds (matmuls, attention kernels, elementwise fusions, ...).

  python -m maelm_jax.tools.profiling runs/profile/bfloat16_auto_base_512_mlm   # a trace dir
  python -m maelm_jax.tools.profiling DIR --top=10

`benchmarks/train_throughput.py --profile_dir=D` records the traces and prints this
summary for each. The rules, so the numbers can be checked against TensorBoard's
profile plugin or Perfetto:
- which events: the ones carrying an `hlo_op` stat (one XLA op's execution) on the
  accelerator planes (`/device:GPU:*`, `/device:TPU:*`); on a CPU-only trace, the
  host plane's XLA executor threads. Where a plane has an `XLA Ops` line (TPU, and
  traces post-processed by xprof) only that line is read, since the others repeat it.
- exclusive time: an op that encloses others on its line (a `while` over scanned
  layers, a call) is charged only for the time none of them ran, so nothing is
  counted twice.
- kind: the first pattern of `KINDS` that matches the op and kernel names, or the
  op's name without its `.N` suffix.

On a GPU, XLA replays runs of kernels as CUDA graphs ("command buffers"), and a
trace then shows one `command_buffer` op where the kernels were (a quarter of
`base`'s step on an H200). Profile with them off to see the kernels:
`XLA_FLAGS=--xla_gpu_enable_command_buffer= python benchmarks/train_throughput.py
... --profile_dir=D` (the step runs a few percent slower so).
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re

from absl import flags

from maelm_jax.core import cli

# (kind, pattern over "hlo_op kernel-name", lower-cased). Order matters: the first
# match wins, so attention kernels are found before the generic gemm pattern.
KINDS = (
    ("attention kernel (cuDNN / flash / splash)",
     r"fmha|flash|splash|cudnn.*attn|attention"),
    # On a GPU, cuBLAS gemms are custom-calls whose Hopper kernels are named nvjet_*.
    ("matmul (dot / gemm)", r"\bdot|gemm|cublas|matmul|convolution|\bconv|ynn_fusion|"
                            r"xnn|onednn|sm\d+_xmma|cutlass|nvjet|custom-call"),
    ("collective", r"all-reduce|all-gather|reduce-scatter|collective-permute|"
                   r"all-to-all|all_reduce|all_gather|reduce_scatter|nccl"),
    ("random bits (PRNG)", r"threefry|rng|philox|random"),
    ("reduction fusion", r"reduce|reduction"),
    ("copy / transpose / memcpy", r"copy|transpose|memcpy|memset|bitcast"),
    # (A scanned stack writes each layer's saved activations with dynamic update
    # slices and reads them back with dynamic slices.)
    ("scatter / gather / dynamic slices",
     r"scatter|gather|dynamic[-_]slice|dynamic[-_]update[-_]slice|sort"),
    ("elementwise fusion", r"fusion|wrapped_|loop_|elementwise"),
)
_SUFFIX = re.compile(r"[._]\d+$")


@dataclasses.dataclass(frozen=True)
class OpTime:
  name: str         # the op's name without `.N` (or its kind)
  seconds: float    # exclusive time, summed over the trace
  share: float      # of all op time in the trace
  count: int        # executions


def kind_of(hlo_op: str, kernel: str = "") -> str:
  text = f"{hlo_op} {kernel}".lower()
  for kind, pattern in KINDS:
    if re.search(pattern, text):
      return kind
  return base_name(hlo_op)


def base_name(hlo_op: str) -> str:
  name = hlo_op.lstrip("%")
  while _SUFFIX.search(name):
    name = _SUFFIX.sub("", name)
  return name


def xplane_files(trace_dir: str) -> list[str]:
  return sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"),
                          recursive=True))


def _exclusive_times(events):
  """[(start, end, hlo_op, kernel)] of one line -> [(hlo_op, kernel, exclusive s)].

  Events on one line nest properly (a parent spans its children), so a stack gives
  each event its duration minus its direct children's."""
  events = sorted(events, key=lambda e: (e[0], -e[1]))
  out, stack = [], []  # stack entries: [end, hlo_op, kernel, duration, children]

  def close(entry):
    end, hlo_op, kernel, duration, children = entry
    out.append((hlo_op, kernel, max(duration - children, 0.0)))
    if stack:
      stack[-1][4] += duration

  for start, end, hlo_op, kernel in events:
    while stack and stack[-1][0] <= start:
      close(stack.pop())
    stack.append([end, hlo_op, kernel, end - start, 0.0])
  while stack:
    close(stack.pop())
  return out


def op_events(trace_dir: str):
  """(hlo_op, kernel name, exclusive seconds) of every XLA op execution in the
  newest trace under `trace_dir` (see the module docstring for the rules)."""
  import jax  # pylint: disable=g-import-not-at-top
  files = xplane_files(trace_dir)
  if not files:
    raise FileNotFoundError(f"no *.xplane.pb under {trace_dir}: record one with "
                            "jax.profiler.trace(dir) around a few steps")
  data = jax.profiler.ProfileData.from_file(max(files, key=os.path.getmtime))
  planes = list(data.planes)
  device = [p for p in planes if p.name.startswith("/device:")]
  host = [p for p in planes if p.name.startswith("/host:CPU")]
  # A device plane can be there and empty: a process that loaded libtpu to plan
  # (python -m maelm_jax.plan) has TPU planes in its traces of CPU steps.
  return _plane_op_events(device) or _plane_op_events(host)


def _plane_op_events(planes) -> list[tuple[str, str, float]]:
  result = []
  for plane in planes:
    lines = list(plane.lines)
    xla_ops = [line for line in lines if line.name == "XLA Ops"]
    for line in xla_ops or lines:
      events = []
      for event in line.events:
        stats = dict(event.stats)
        hlo_op = stats.get("hlo_op")
        if hlo_op is None:
          continue
        start = event.start_ns * 1e-9
        events.append((start, start + event.duration_ns * 1e-9, str(hlo_op),
                       event.name))
      result.extend(_exclusive_times(events))
  return result


def summarize(events, by: str = "kind") -> list[OpTime]:
  """Op time grouped `by` "kind" (KINDS) or "op" (name without `.N`), most first."""
  seconds, counts = collections.Counter(), collections.Counter()
  for hlo_op, kernel, s in events:
    key = kind_of(hlo_op, kernel) if by == "kind" else base_name(hlo_op)
    seconds[key] += s
    counts[key] += 1
  total = sum(seconds.values()) or 1.0
  return [OpTime(k, s, s / total, counts[k]) for k, s in seconds.most_common()]


def format_summary(trace_dir: str, top: int = 3) -> str:
  events = op_events(trace_dir)
  total = sum(s for _, _, s in events)
  kinds = summarize(events, "kind")
  ops = summarize(events, "op")
  lines = [f"op time {total * 1e3:.1f} ms in {len(events)} op executions; "
           f"top {top} kinds: " + "; ".join(
               f"{k.name} {k.share:.0%}" for k in kinds[:top])]
  lines.append(f"  top {top} ops: " + "; ".join(
      f"{o.name} {o.share:.0%} ({o.count}x)" for o in ops[:top]))
  return "\n".join(lines)


def define_flags() -> None:
  flags.DEFINE_integer("top", 5, "How many op kinds and ops to list")


def main(trace_dirs: list[str]) -> None:
  for trace_dir in trace_dirs:
    print(trace_dir)
    print(format_summary(trace_dir, flags.FLAGS.top))


if __name__ == "__main__":
  cli.run(main, define_flags, positional="TRACE_DIR [TRACE_DIR ...]")

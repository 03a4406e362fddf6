"""What a compiled step's HLO text says about its cost: collectives (count and
bytes per kind, loops counted as many times as they run), Pallas kernel calls,
the largest buffers it produces, and its HBM traffic. Read by the planner
(plan.py).

XLA's own `cost_analysis()` counts each while-loop body once (a scanned layer
stack, gradient accumulation); here a loop's body counts `trip count` times,
read from its condition (`counter < N`).

HBM traffic (`hbm_bytes`): what each instruction outside a fusion writes plus
what it reads, fusions being the unit that goes through memory. XLA's `bytes
accessed` counts every operand whole; but a fusion that slices an operand reads
the slice, and one that updates a slice of a buffer in place (a scanned stack's
saved activations, the windowed matmuls of fsdp) writes the slice. Counted
whole, those made the `small` model's step at length 512 "read" 41.7 GB per chip
on v5e:2x2, about 20x its tensors (benchmarks/tpu-plans.md, "The HBM term").
Arrays the compiler keeps in the TPU core's VMEM (layout memory space `S(1)`)
never reach HBM and are left out; counted, they overstated the HBM time of
`base` MLM at 512 on v5e by about 1.3x.
"""

from __future__ import annotations

import collections
import dataclasses
import re

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
          "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
          "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
# An array with its layout, whose `S(n)` names a memory space other than HBM:
# on TPU `S(1)` is the core's VMEM, which the compiler uses for arrays that
# never reach HBM (`f32[8,128]{1,0:T(8,128)S(1)}`).
_ARRAY_LAYOUT = re.compile(
    r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\](?:\{([^}]*)\})?")
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
# Memory spaces on the chip itself (TPU VMEM), counted as no HBM traffic.
ON_CHIP_MEMORY_SPACES = frozenset({1})
# Integer scalars a loop's condition compares its counter with (XLA makes u32
# counters as well as s32 ones).
_SCALAR_INT = re.compile(r"[su](?:8|16|32|64)\[\]")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
_HEADER = re.compile(r"^(?:ENTRY )?%([\w.\-]+) ")
# Computations an instruction runs: a fusion's body (`calls`) holds values that
# never reach memory; the others' do.
_FUSED = re.compile(r"\bcalls=%([\w.\-]+)")
_CALLED = re.compile(r"\b(?:to_apply|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
KERNEL_TARGET = 'custom_call_target="tpu_custom_call"'
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def array_bytes(shape_text: str, leave_out_spaces=frozenset()) -> list[int]:
  """Bytes of each array in an HLO shape ('bf16[8,512]{1,0}', or a tuple),
  leaving out arrays whose layout puts them in one of `leave_out_spaces`."""
  sizes = []
  for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape_text):
    space = _MEMORY_SPACE.search(layout or "")
    if space and int(space[1]) in leave_out_spaces:
      continue
    count = 1
    for dim in filter(None, dims.split(",")):
      count *= int(dim)
    sizes.append(count * _BYTES.get(dtype, 1 if dtype.startswith("f8") else 4))
  return sizes


def _hbm_arrays(shape_text: str, on_chip) -> list:
  """[(bytes, dims)] of the arrays of a shape that live in HBM."""
  arrays = []
  for dtype, dims, layout in _ARRAY_LAYOUT.findall(shape_text):
    space = _MEMORY_SPACE.search(layout or "")
    if not (space and int(space[1]) in on_chip):
      shape = tuple(int(d) for d in dims.split(",") if d)
      arrays.append((array_bytes(f"{dtype}[{dims}]")[0], shape))
  return arrays


def _written_arrays(op: str, shape: str, on_chip=frozenset()) -> list[int]:
  """Bytes of each array an instruction produces in HBM (`on_chip` memory
  spaces left out). A GPU library call (cuBLAS, cuDNN: `(bf16[..],
  s8[4194304]) custom-call`) ends its result tuple with a byte-typed scratch
  workspace, not data a later op reads: left out."""
  sizes = array_bytes(shape, on_chip)
  if op == "custom-call" and shape.startswith("(") and len(sizes) > 1:
    last = _ARRAY.findall(shape)[-1]
    if last[0] in ("s8", "u8") and "," not in last[1]:
      sizes = sizes[:-1]
  return sizes


def group_size(line: str, default: int) -> int:
  """Devices in each replica group of a collective: `{{0,1,2,3}}`,
  `[2,4]<=[8]` (iota: groups x size) or `mesh['axis_0'=2,'axis_1'=4] {'axis_1'}`."""
  mesh = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
  if mesh:
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", mesh[1]))
    size = 1
    for axis in re.findall(r"'(\w+)'", mesh[2]):
      size *= int(sizes.get(axis, 1))
    return size
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", line)
  if iota:
    return int(iota[2])
  explicit = re.search(r"replica_groups=\{\{([\d,]*)\}", line)
  if explicit:
    return len(explicit[1].split(","))
  pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
  return 2 if pairs else default


def ring_bytes(kind: str, result_bytes: int, n: int) -> float:
  """Bytes each chip sends for one collective on a ring of n chips (the
  bandwidth-optimal algorithms): all-reduce 2(n-1)/n of the array, all-gather
  and all-to-all (n-1)/n, reduce-scatter (n-1) x its (scattered) result."""
  if n <= 1:
    return 0.0
  if kind == "all-reduce":
    return 2 * (n - 1) / n * result_bytes
  if kind == "reduce-scatter":
    return (n - 1) * result_bytes
  if kind == "collective-permute":
    return float(result_bytes)
  return (n - 1) / n * result_bytes


@dataclasses.dataclass
class _Instruction:
  name: str
  op: str
  bytes: int  # Of its result (all arrays of a tuple), in HBM.
  operands: list
  fused: str = ""  # A fusion's body.
  op_name: str = ""  # JAX's name of what it computes (its metadata).
  kernel: bool = False  # A Pallas (Mosaic) kernel or a cuDNN attention call.
  arrays: list = dataclasses.field(default_factory=list)  # [(bytes, dims)] in HBM
  target: str = ""  # A custom call's target (`__cublas$gemm`, `tpu_custom_call`).


@dataclasses.dataclass
class _Computation:
  collectives: list = dataclasses.field(default_factory=list)  # (kind, bytes, n)
  kernel_calls: int = 0
  calls: list = dataclasses.field(default_factory=list)  # (callee, times, in memory)
  max_constant: int = 0
  buffers: list = dataclasses.field(default_factory=list)  # (bytes, shape, op_name)
  instructions: list = dataclasses.field(default_factory=list)
  parameters: dict = dataclasses.field(default_factory=dict)  # index -> name
  root: str = ""


@dataclasses.dataclass
class HloStats:
  collectives: dict  # kind -> {"count", "bytes" (results), "ring_bytes" (sent)}
  kernel_calls: int  # tpu_custom_call executions per step (loops unrolled)
  kernel_calls_in_text: int  # tpu_custom_call instructions in the program text
  largest_buffers: list  # [(bytes, "dtype[shape]", op_name)] per chip
  loop_trip_counts: list  # trip count of each while loop
  hbm_bytes: float = 0.0  # HBM traffic per step per chip (module docstring)
  # The same, by CATEGORIES (`category`), each as often as it runs.
  hbm_by_category: dict = dataclasses.field(default_factory=dict)


def _parse(text: str, num_devices: int, on_chip=ON_CHIP_MEMORY_SPACES):
  computations, entry, current = {}, None, None
  whiles = []
  for line in text.splitlines():
    if not line.startswith(" "):
      header = _HEADER.match(line)
      if header and line.rstrip().endswith("{"):
        current = computations.setdefault(header[1], _Computation())
        if line.startswith("ENTRY"):
          entry = header[1]
      continue
    if current is None:
      continue
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, shape, op, rest = match.groups()
    fused = _FUSED.search(line)
    op_name, target = _OP_NAME.search(line), _TARGET.search(line)
    current.instructions.append(_Instruction(
        name, op, sum(_written_arrays(op, shape, on_chip)), _operands(rest),
        fused[1] if fused and op == "fusion" else "", op_name[1] if op_name else "",
        op == "custom-call" and (KERNEL_TARGET in line or "fmha" in line),
        _hbm_arrays(shape, on_chip), target[1] if target else ""))
    if op == "parameter":
      index = re.match(r"(\d+)\)", rest)
      if index:
        current.parameters[int(index[1])] = name
    if line.lstrip().startswith("ROOT "):
      current.root = name
    if op == "constant" and _SCALAR_INT.match(shape):
      value = re.match(r"(-?\d+)\)", rest)
      if value:
        current.max_constant = max(current.max_constant, int(value[1]))
    base = op[:-len("-start")] if op.endswith("-start") else op
    if base in COLLECTIVES:
      current.collectives.append((base, _result_bytes(op, shape),
                                  group_size(line, num_devices)))
    if op == "custom-call" and KERNEL_TARGET in line:
      current.kernel_calls += 1
    if op == "while":
      body = re.search(r"body=%([\w.\-]+)", line)
      condition = re.search(r"condition=%([\w.\-]+)", line)
      known = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
      if body and condition:
        whiles.append((current, body[1], condition[1], int(known[1]) if known else 0))
      continue
    for callee in _FUSED.findall(line):
      current.calls.append((callee, 1, False))
    for callee in _CALLED.findall(line):
      current.calls.append((callee, 1, True))
    for branches in _BRANCHES.findall(line):
      for callee in re.findall(r"%([\w.\-]+)", branches):
        current.calls.append((callee, 1, True))
    if op not in ("parameter", "get-tuple-element", "bitcast", "tuple", "constant",
                  "copy-done", "copy-start") and not op.endswith("-done"):
      sizes = array_bytes(shape)
      if sizes:
        name = _OP_NAME.search(line)
        dtype_shape = _ARRAY.search(shape)
        current.buffers.append((max(sizes), f"{dtype_shape[1]}[{dtype_shape[2]}]"
                                if dtype_shape else shape, name[1] if name else op))
  trips = []
  for caller, body, condition, known in whiles:
    # XLA's own count where it wrote one; else the bound the condition compares
    # the counter with (the largest integer constant it, or what it calls, holds).
    trip = known or max(_constants(computations, condition), 1)
    caller.calls.append((body, trip, True))
    trips.append(trip)
  return computations, entry, trips


def _operands(rest: str) -> list:
  """The %names an instruction's operand list holds (up to its closing paren)."""
  depth = 1
  for end, char in enumerate(rest):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0:
      return re.findall(r"%([\w.\-]+)", rest[:end])
  return re.findall(r"%([\w.\-]+)", rest)


# Instructions that move no data of their own: views, bookkeeping, and the
# loops and calls whose bodies are counted where they run.
_NO_TRAFFIC = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant",
               "while", "call", "conditional", "after-all", "partition-id",
               "replica-id", "opt-barrier")


def _slice_reads(body: _Computation, parameter: str, sizes: dict) -> int | None:
  """Bytes a fusion reads of its `parameter` when every use slices it or only
  passes it through to the output (XLA's async collective fusions hand buffers
  on that way); None when some use reads it whole."""
  users = [i for i in body.instructions if parameter in i.operands
           and not (i.name == body.root and i.op == "tuple")]
  if not users and any(i.name == body.root for i in body.instructions
                       if parameter in i.operands):
    return 0
  if not users or any(u.op not in ("slice", "dynamic-slice") or u.operands[0] != parameter
                      for u in users):
    return None
  return sum(u.bytes for u in users)


def _in_place(body: _Computation) -> dict:
  """{parameter: bytes written} for the buffers a fusion updates in place: a
  dynamic-update-slice of a parameter, at its root (alone or in a tuple)."""
  by_name = {i.name: i for i in body.instructions}
  root = by_name.get(body.root)
  outputs = ([by_name.get(n) for n in root.operands] if root is not None
             and root.op == "tuple" else [root])
  updated = {}
  for out in outputs:
    if (out is not None and out.op == "dynamic-update-slice"
        and len(out.operands) > 1 and out.operands[0] in body.parameters.values()):
      update = by_name.get(out.operands[1])
      updated[out.operands[0]] = (out.bytes, update.bytes if update else out.bytes)
  return updated


def _passed_through(body: _Computation) -> int:
  """Bytes of a fusion's outputs that are its parameters as they came in: the
  same buffers, not written."""
  root = next((i for i in body.instructions if i.name == body.root), None)
  if root is None or root.op != "tuple":
    return 0
  sizes = {i.name: i.bytes for i in body.instructions}
  return sum(sizes.get(name, 0) for name in root.operands
             if name in body.parameters.values())


def _square(dims) -> bool:
  """An array [.., L, L]: attention scores, or a position bias over them."""
  return len(dims) >= 2 and dims[-1] == dims[-2] and dims[-1] >= 128


def _traffic(computation: _Computation, computations: dict,
             kernels: bool = False) -> list:
  """[(HBM bytes, instruction, category or None)] one run of a computation
  moves: its fusions, copies, slices, kernels and async ops (the module
  docstring); the category where the instruction's own (`category`) is not
  the whole story: a kernel's arrays, and, in a step whose attention runs in
  kernels (`kernels`), an [.., L, L] array outside them, which can only be the
  position bias, its padding mask or its gradient (the kernels keep the
  scores on the chip)."""
  sizes = {i.name: i.bytes for i in computation.instructions}
  by_name = {i.name: i for i in computation.instructions}
  moved = []
  for inst in computation.instructions:
    op = inst.op
    if op in _NO_TRAFFIC or op.endswith("-start"):
      continue  # An async op's data moves once: counted at its -done.
    if op.endswith("-done"):
      moved.append((2 * inst.bytes, inst, None))  # Reads about what it writes.
      continue
    if op in ("slice", "dynamic-slice"):
      moved.append((2 * inst.bytes, inst, None))
      continue
    if op == "dynamic-update-slice" and len(inst.operands) > 1:
      moved.append((2 * sizes.get(inst.operands[1], 0), inst, None))
      continue
    if inst.kernel:
      moved.extend(_kernel_traffic(inst, by_name))
      continue
    square = any(_square(d) for o in [inst.name, *inst.operands] if o in by_name
                 for _, d in by_name[o].arrays)
    kind = ("position bias" if kernels else "attention scores") if square else None
    body = computations.get(inst.fused) if op == "fusion" else None
    if body is None:
      moved.append((inst.bytes + sum(sizes.get(o, 0) for o in inst.operands), inst,
                    kind))
      continue
    in_place = _in_place(body)
    written = inst.bytes - sum(full - update for full, update in in_place.values())
    written -= _passed_through(body)
    read = 0
    for index, operand in enumerate(inst.operands):
      parameter = body.parameters.get(index, "")
      if parameter in in_place:
        continue  # The untouched rest of the buffer stays where it is.
      sliced = _slice_reads(body, parameter, sizes)
      read += sizes.get(operand, 0) if sliced is None else min(
          sliced, sizes.get(operand, 0))
    moved.append((max(written, 0) + read, inst, kind))
  return moved


def _kernel_traffic(inst, by_name: dict) -> list:
  """An attention kernel's reads and writes, each array by what it holds: an
  array [.., L, L] (the query and key lengths) is the position bias (added
  into it, the padding mask) or its gradient; an array whose last dimension is
  not the head's (the first operand's, the queries') holds the softmax
  statistics (`l`, `m`, `di`, stored at the kernels' block widths); the rest
  are the queries, keys, values, outputs and their gradients. The scratch
  workspace of a cuDNN call is no data (`_written_arrays`)."""
  operands = [a for o in inst.operands if o in by_name for a in by_name[o].arrays]
  head = operands[0][1][-1:] if operands and operands[0][1] else ()
  results = inst.arrays
  if len(results) > 1 and len(results[-1][1]) == 1 and results[-1][0] and (
      inst.bytes < sum(b for b, _ in results)):
    results = results[:-1]
  moved = []
  for size, dims in operands + results:
    if _square(dims):
      kind = "position bias"
    elif head and dims[-1:] != head:
      kind = "attention statistics"
    else:
      kind = "attention kernels"
    moved.append((size, inst, kind))
  return moved


# The byte budget's categories (`HloStats.hbm_by_category`), in the order the
# plan prints them.
CATEGORIES = ("matmuls", "attention kernels", "attention statistics",
              "attention scores", "position bias", "normalisation and elementwise", "optimizer",
              "collectives", "copies", "other")
_MATMUL_OPS = ("convolution", "dot")
_COPY_OPS = ("copy", "copy-done", "transpose")


def category(inst, computations: dict) -> str:
  """Which line of the byte budget an instruction's traffic belongs to, from
  its op, what its fusion computes and JAX's name for it:
  - attention kernels: a Pallas (Mosaic) or cuDNN attention call;
  - attention scores: [.., L, L] arrays of attention XLA computes itself
    (no kernel; `_traffic` decides);
  - attention statistics: what the flash kernels' wrappers compute around them
    (the softmax statistics and `di` broadcast to the kernels' block shapes);
  - position bias: the relative bias, its padding mask and its gradient;
  - matmuls: dots and convolutions, with what XLA fused into them;
  - optimizer: the update, outside the model's forward and backward;
  - normalisation and elementwise: the rest of the model (LayerNorm, GELU,
    dropout, the loss, masking gathers)."""
  op, name = inst.op, inst.op_name
  base = op[:-len("-done")] if op.endswith("-done") else op
  base = base[:-len("-start")] if base.endswith("-start") else base
  if base in COLLECTIVES:
    return "collectives"
  if inst.kernel:
    return "attention kernels"
  if "flash_attention" in name or "splash" in name:
    return "attention statistics"
  if "relative_bias" in name or "position_bias" in name or "attention_bias" in name:
    return "position bias"
  body = computations.get(inst.fused) if op == "fusion" else None
  if op in _MATMUL_OPS or "gemm" in inst.target or (body is not None and any(
      i.op in _MATMUL_OPS for i in body.instructions)):
    return "matmuls"
  if op in _COPY_OPS or (body is not None and all(
      i.op in _COPY_OPS + ("parameter", "bitcast", "tuple")
      for i in body.instructions)):
    return "copies"
  if ("MaskedLM" in name or "jvp(" in name or "transpose(" in name
      or any(r in name for r in ("threefry", "_uniform", "_randint", "take_along_axis"))):
    return "normalisation and elementwise"  # (with the masks' and dropout's draws)
  if name.startswith("jit(") or name.startswith("state."):
    return "optimizer"
  return "other"


def _constants(computations, name: str, depth: int = 0) -> int:
  computation = computations.get(name)
  if computation is None or depth > 8:
    return 0
  return max([computation.max_constant] + [
      _constants(computations, callee, depth + 1) for callee, _, _ in computation.calls])


def _result_bytes(op: str, shape: str) -> int:
  """Bytes a collective produces. A synchronous one's shape is its result (a
  tuple when XLA combined several); an async start's: all-reduce-start, the
  results; all-gather-start, (operands, results), the results being the larger
  half; collective-permute-start, (operand, result, contexts)."""
  sizes = array_bytes(shape)
  if not op.endswith("-start") or op == "all-reduce-start":
    return sum(sizes)
  if op == "collective-permute-start":
    return max(sizes)
  return sum(sorted(sizes)[len(sizes) // 2:])


def analyze(text: str, num_devices: int,
            on_chip_memory_spaces=ON_CHIP_MEMORY_SPACES) -> HloStats:
  """Collectives, kernel calls, the largest buffers and the HBM traffic of
  compiled HLO text; arrays in `on_chip_memory_spaces` (TPU VMEM) move no HBM
  bytes."""
  computations, entry, trips = _parse(text, num_devices,
                                      frozenset(on_chip_memory_spaces))
  totals = collections.defaultdict(lambda: {"count": 0, "bytes": 0, "ring_bytes": 0.0})
  kernel_calls, buffers, in_memory, hbm = 0, [], set(), 0.0
  traffic = {}
  by_category = collections.Counter()
  kernels = KERNEL_TARGET in text or "fmha" in text

  def visit(name, times, materialized, depth=0):
    nonlocal kernel_calls, hbm
    computation = computations.get(name)
    if computation is None or depth > 64:
      return
    if materialized:
      if name not in traffic:
        moved = collections.Counter()
        for size, inst, kind in _traffic(computation, computations, kernels):
          moved[kind or category(inst, computations)] += size
        traffic[name] = moved
      for kind, size in traffic[name].items():
        by_category[kind] += times * size
        hbm += times * size
    for kind, size, n in computation.collectives:
      totals[kind]["count"] += times
      totals[kind]["bytes"] += times * size
      totals[kind]["ring_bytes"] += times * ring_bytes(kind, size, n)
    kernel_calls += times * computation.kernel_calls
    if materialized and name not in in_memory:
      in_memory.add(name)
      buffers.extend(computation.buffers)
    for callee, multiplier, callee_in_memory in computation.calls:
      visit(callee, times * multiplier, callee_in_memory, depth + 1)

  if entry is not None:
    visit(entry, 1, True)
  collectives = {kind: dict(totals[kind]) for kind in COLLECTIVES if totals[kind]["count"]}
  seen, largest = set(), []
  for size, shape, name in sorted(buffers, key=lambda b: -b[0]):
    if (shape, name) in seen:
      continue
    seen.add((shape, name))
    largest.append((size, shape, name))
    if len(largest) == 5:
      break
  return HloStats(collectives=collectives, kernel_calls=kernel_calls,
                  kernel_calls_in_text=text.count(KERNEL_TARGET),
                  largest_buffers=largest, loop_trip_counts=trips, hbm_bytes=hbm,
                  hbm_by_category={k: float(by_category[k]) for k in CATEGORIES
                                   if by_category[k]})

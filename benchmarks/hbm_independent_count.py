r"""A second count of a compiled step's HBM traffic, written apart from the
planner's (`maelm_jax/tools/hlo_stats.py`), to check it.

    XLA_FLAGS="--xla_dump_to=runs/hlo_mlm --xla_dump_hlo_as_text" \
    python -m maelm_jax.plan --config=configs/pretrain.py:objective=mlm,size=base \
        --topology=v5e:2x2 --config.mesh_shape='(4,1,1)' --config.batch_size=128 \
        --config.seq_len=512 --out=runs/plan_mlm
    python benchmarks/hbm_independent_count.py runs/hlo_mlm/*jit_train_step*after_optimizations.txt \
        --plan=runs/plan_mlm/plan.json

The rule, from the HLO text alone: every instruction outside a fusion body that
moves data (not a parameter, tuple, get-tuple-element, bitcast, constant, loop
or call) reads its operands and writes its result; a fusion parameter that the
body only slices is read as its slices; a fusion whose root updates a slice of a
parameter in place writes the update; arrays in memory space S(1) (the TPU
core's VMEM) are on the chip and count nothing; an async pair counts once, at
its -done, as its result read and written; a loop body counts as often as its
`known_trip_count` says (else the largest integer constant of its condition).
It prints the total in GB and, with --plan, the planner's figure and the ratio.
"""

from __future__ import annotations

import argparse
import json
import re

SIZES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2,
         "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16)\[([\d,]*)\](\{[^}]*\})?")
LINE = re.compile(r"^\s+(ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9\-]*)\((.*)$")
FREE = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "while",
        "call", "conditional", "after-all", "partition-id", "replica-id",
        "opt-barrier"}


def hbm_bytes(shape: str) -> int:
  total = 0
  for dtype, dims, layout in ARRAY.findall(shape):
    if layout and "S(1)" in layout:
      continue
    count = 1
    for dim in dims.split(","):
      count *= int(dim) if dim else 1
    total += count * SIZES.get(dtype, 4)
  return total


def read(path: str) -> dict:
  """{computation: [(name, shape, op, rest, is_root)]}, and the entry's name."""
  computations, current, entry = {}, None, None
  for line in open(path, encoding="utf-8"):
    if line and not line[0].isspace():
      head = re.match(r"^(ENTRY )?%(\S+) ", line)
      if head and line.rstrip().endswith("{"):
        current = computations.setdefault(head[2], [])
        entry = head[2] if head[1] else entry
      continue
    match = LINE.match(line)
    if match and current is not None:
      root, name, shape, op, rest = match.groups()
      current.append((name, shape, op, rest, bool(root)))
  return {"computations": computations, "entry": entry}


def operand_names(rest: str) -> list[str]:
  depth, end = 1, len(rest)
  for i, char in enumerate(rest):
    depth += (char == "(") - (char == ")")
    if depth == 0:
      end = i
      break
  return re.findall(r"%([\w.\-]+)", rest[:end])


def fusion_io(body, operands, sizes) -> tuple[int, int]:
  """(bytes read, bytes written-correction) of a fusion from its body."""
  params = {}
  for name, shape, op, rest, _ in body:
    if op == "parameter":
      params[name] = int(re.match(r"(\d+)", rest)[1])
  users = {p: [] for p in params}
  by_name = {i[0]: i for i in body}
  for name, shape, op, rest, _ in body:
    for o in operand_names(rest):
      if o in users:
        users[o].append((op, shape, operand_names(rest), name))
  root = next(i for i in body if i[4])
  roots = ([by_name[o] for o in operand_names(root[3]) if o in by_name]
           if root[2] == "tuple" else [root])
  updated = {}
  for r in roots:
    names = operand_names(r[3])
    if r[2] == "dynamic-update-slice" and names[0] in params:
      updated[names[0]] = (hbm_bytes(r[1]), hbm_bytes(by_name[names[1]][1])
                           if names[1] in by_name else hbm_bytes(r[1]))
  read_bytes, saved = 0, 0
  for p, index in params.items():
    if index >= len(operands):
      continue
    whole = sizes.get(operands[index], 0)
    if p in updated:
      saved += updated[p][0] - updated[p][1]
      continue
    uses = [u for u in users[p] if u[3] != root[0] or root[2] != "tuple"]
    if uses and all(u[0] in ("slice", "dynamic-slice") and u[2][0] == p for u in uses):
      read_bytes += min(whole, sum(hbm_bytes(u[1]) for u in uses))
    elif not uses:
      passed = root[2] == "tuple" and p in operand_names(root[3])
      read_bytes += 0 if passed else whole
      saved += hbm_bytes(next(i[1] for i in body if i[0] == p)) if passed else 0
    else:
      read_bytes += whole
  return read_bytes, saved


def count(path: str) -> float:
  program = read(path)
  computations = program["computations"]
  memo = {}

  def trips(rest: str) -> int:
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
    if known:
      return int(known[1])
    condition = re.search(r"condition=%([\w.\-]+)", rest)
    constants = [int(c) for _, shape, op, r, _ in computations.get(condition[1], [])
                 if op == "constant" and re.match(r"[su]\d+\[\]", shape)
                 for c in re.findall(r"^(-?\d+)\)", r)]
    return max(constants + [1])

  def moved(name: str) -> float:
    if name in memo:
      return memo[name]
    body = computations.get(name, [])
    sizes = {i[0]: hbm_bytes(i[1]) for i in body}
    total = 0.0
    for inst, shape, op, rest, _ in body:
      if op == "while":
        total += trips(rest) * moved(re.search(r"body=%([\w.\-]+)", rest)[1])
        continue
      for callee in re.findall(r"(?:to_apply|true_computation|false_computation)=%([\w.\-]+)", rest):
        total += moved(callee)
      branches = re.search(r"branch_computations=\{([^}]*)\}", rest)
      for callee in re.findall(r"%([\w.\-]+)", branches[1]) if branches else []:
        total += moved(callee)
      if op in FREE or op.endswith("-start"):
        continue
      operands = operand_names(rest)
      if op.endswith("-done") or op in ("slice", "dynamic-slice"):
        total += 2 * sizes[inst]
      elif op == "dynamic-update-slice":
        total += 2 * sizes.get(operands[1], 0)
      elif op == "fusion":
        called = re.search(r"calls=%([\w.\-]+)", rest)[1]
        read_bytes, saved = fusion_io(computations[called], operands, sizes)
        total += max(sizes[inst] - saved, 0) + read_bytes
      elif op == "custom-call" and shape.startswith("(") and re.search(
          r",\s*[su]8\[\d+\]\{?[^,]*\)$", shape):
        # A GPU library call's scratch workspace, last in its result: no data.
        scratch = ARRAY.findall(shape)[-1]
        total += sizes[inst] - int(scratch[1]) + sum(sizes.get(o, 0) for o in operands)
      else:
        total += sizes[inst] + sum(sizes.get(o, 0) for o in operands)
    memo[name] = total
    return total

  return moved(program["entry"])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("hlo", help="an after-optimizations HLO text dump")
  parser.add_argument("--plan", default="", help="the plan.json of the same step")
  args = parser.parse_args()
  total = count(args.hlo)
  print(f"independent count  {total / 1e9:.2f} GB a step per chip")
  if args.plan:
    with open(args.plan, encoding="utf-8") as f:
      planned = json.load(f)["hbm_traffic_bytes_per_chip"]
    print(f"planner            {planned / 1e9:.2f} GB  (planner / independent "
          f"{planned / total:.3f})")


if __name__ == "__main__":
  main()

"""GPU descriptions XLA's compiler plans for on a host with no GPU.

`jax.experimental.topologies.get_topology_desc(platform="cuda", ...)` takes a
target config, the text form of XLA's `GpuTargetConfigProto`: what the GPU
compiler would otherwise read from the device (its streaming multiprocessors,
their shared memory and registers, the memory's size and bandwidth, the compute
capability, the cuDNN version it plans its fused attention for). The numbers
below are the chips' published specifications, in the fields this jaxlib
(0.10.2) reads; fields it does not know are refused, so none is added.
`python -m maelm_jax.plan --topology=h100:8` uses them (docs/launching-and-planning.md).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class GpuSpec:
  name: str  # The device kind as jax reports it (flops.CHIPS matches on it).
  sm_count: int
  compute_capability: tuple[int, int]
  memory_bytes: int
  memory_bandwidth: float  # Bytes/s.
  l2_bytes: int
  clock_ghz: float
  shared_memory_per_sm: int
  shared_memory_per_block_optin: int


SPECS = {
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", 132, (9, 0), 84_942_979_072, 3.35e12,
                    50 * 2**20, 1.98, 233_472, 232_448),
    "h200": GpuSpec("NVIDIA H200", 132, (9, 0), 150_754_820_096, 4.8e12,
                    50 * 2**20, 1.98, 233_472, 232_448),
    "a100": GpuSpec("NVIDIA A100-SXM4-80GB", 108, (8, 0), 85_899_345_920, 2.039e12,
                    40 * 2**20, 1.41, 167_936, 166_912),
}
# The cuDNN version the compiler plans fused attention for (jax 0.10.2's
# CUDA 12 wheels ship cuDNN 9).
CUDNN_VERSION = (9, 10, 0)


def target_config(kind: str) -> str:
  """The target config text for a GPU kind ('h100', 'h200', 'a100')."""
  spec = SPECS[kind]
  major, minor = spec.compute_capability
  cudnn = dict(zip(("major", "minor", "patch"), CUDNN_VERSION))
  return "\n".join([
      "gpu_device_info {",
      "  threads_per_block_limit: 1024",
      "  threads_per_warp: 32",
      "  shared_memory_per_block: 49152",
      f"  shared_memory_per_core: {spec.shared_memory_per_sm}",
      "  threads_per_core_limit: 2048",
      f"  core_count: {spec.sm_count}",
      "  fpus_per_core: 128" if major >= 9 else "  fpus_per_core: 64",
      "  block_dim_limit_x: 2147483647",
      "  block_dim_limit_y: 65535",
      "  block_dim_limit_z: 65535",
      f"  memory_bandwidth: {int(spec.memory_bandwidth)}",
      f"  l2_cache_size: {spec.l2_bytes}",
      f"  clock_rate_ghz: {spec.clock_ghz}",
      f"  device_memory_size: {spec.memory_bytes}",
      f"  shared_memory_per_block_optin: {spec.shared_memory_per_block_optin}",
      f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
      "  registers_per_core_limit: 65536",
      "  registers_per_block_limit: 65536",
      "}",
      'platform_name: "CUDA"',
      "dnn_version_info { " + " ".join(f"{k}: {v}" for k, v in cudnn.items()) + " }",
      f'device_description_str: "{spec.name}"',
      ""])

"""FLOPs the model really does, for MFU.

Counts matmuls only (2 FLOPs per multiply-add); training is 3x the forward pass.
Every part is counted at the length it really runs on: the encoder on the L-K_mask
tokens it sees, the decoder on L (self) or on the K selected slots (cross), the head
on the K selected slots. MLM's encoder runs on all L.
"""

from __future__ import annotations

import jax

from maelm_jax.model import ModelConfig

# Peak dense bf16 FLOP/s per device (datasheets). CPU: measured on the 2-core dev
# VM for the whole host (bf16 inputs, fp32 accumulation); treat CPU MFU as a rough
# indicator only.
PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}
CPU_HOST_PEAK_FLOPS = 240e9


def _layer_flops(n_queries: int, n_keys: int, d: int, f: int) -> int:
  projections_and_mlp = 2 * n_queries * (4 * d * d + 2 * d * f)
  attention = 2 * 2 * n_queries * n_keys * d
  return projections_and_mlp + attention


def forward_flops_per_sequence(cfg: ModelConfig, seq_len: int) -> dict[str, int]:
  """Forward-pass FLOPs of one sequence, split by part."""
  counts = cfg.mask_counts(seq_len)
  d, f, k = cfg.hidden, cfg.mlp, counts.num_selected
  n_enc = counts.encoder_len
  parts = {"encoder": cfg.num_layers * _layer_flops(n_enc, n_enc, d, f)}
  if cfg.decoder_type == "self":
    parts["decoder"] = cfg.decoder_layers * _layer_flops(seq_len, seq_len, d, f)
  elif cfg.decoder_type == "cross":
    self_attention = _layer_flops(k, k, d, f)
    # Cross-attention: Q and output projections on the K queries, K/V projections
    # on the encoder outputs, and the scores/values of K queries x n_enc keys.
    cross = 2 * (2 * k * d * d) + 2 * (2 * n_enc * d * d) + 2 * 2 * k * n_enc * d
    parts["decoder"] = cfg.decoder_layers * (self_attention + cross)
  parts["head"] = 2 * k * (d * d + d * cfg.vocab_size)
  return parts


def train_flops_per_step(cfg: ModelConfig, seq_len: int, global_batch: int) -> int:
  return 3 * global_batch * sum(forward_flops_per_sequence(cfg, seq_len).values())


def peak_flops(devices=None, override: float | None = None) -> float:
  """Peak FLOP/s of all devices of the run (`override` is per device)."""
  devices = jax.devices() if devices is None else devices
  if override:
    return override * len(devices)
  kind = devices[0].device_kind
  if devices[0].platform == "cpu":
    return CPU_HOST_PEAK_FLOPS * jax.process_count()
  for name, value in sorted(PEAK_FLOPS.items(), key=lambda kv: -len(kv[0])):
    if name.lower() in kind.lower():
      return value * len(devices)
  return 0.0  # Unknown device: MFU is reported as 0; set config.peak_flops_per_device.

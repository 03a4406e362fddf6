"""FLOPs the model really does, for MFU.

Counts matmuls only (2 FLOPs per multiply-add); training is 3x the forward pass.
Every part is counted at the length it really runs on: the encoder on the L-K_mask
tokens it sees, the decoder on L (self) or on the K selected slots (cross), the head
on the K selected slots. MLM's encoder runs on all L.
"""

from __future__ import annotations

import dataclasses

import jax

from maelm_jax.modeling.model import ModelConfig

@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip, as MFU and the planner's roofline (plan.py) see it."""
  peak_flops: float  # Dense bf16 FLOP/s.
  hbm_bytes: float  # Memory per chip.
  hbm_bandwidth: float  # Bytes/s.
  # Inter-chip bytes/s per chip, all links, both directions (TPU ICI; NVLink).
  interconnect_bandwidth: float
  source: str


_GIB = 2**30
_DOCS = "Cloud TPU docs, system architecture of "
_V4 = Chip(275e12, 32 * _GIB, 1200e9, 6 * 90e9,
           _DOCS + "v4 (ICI: 6 links x 90 GB/s both ways, 'How to Scale Your Model')")
_V5E = Chip(197e12, 16 * _GIB, 819e9, 400e9, _DOCS + "v5e")
_V5P = Chip(459e12, 95 * _GIB, 2765e9, 1200e9, _DOCS + "v5p")
_V6E = Chip(918e12, 32 * _GIB, 1638e9, 800e9, _DOCS + "v6e")
_H100 = Chip(989e12, 80e9, 3.35e12, 900e9, "NVIDIA H100 SXM datasheet (dense bf16)")
# Device kinds as jax names them ("TPU v5 lite" is v5e, "TPU v5" v5p, "TPU v6
# lite" v6e), with the marketing names beside them; matched longest first.
CHIPS = {
    "TPU v4": _V4,
    "TPU v5 lite": _V5E,
    "TPU v5e": _V5E,
    "TPU v5p": _V5P,
    "TPU v5": _V5P,
    "TPU v6 lite": _V6E,
    "TPU v6e": _V6E,
    "A100": Chip(312e12, 80e9, 2.039e12, 600e9,
                 "NVIDIA A100 SXM 80GB datasheet (dense bf16)"),
    "H100": _H100,
    "H200": dataclasses.replace(_H100, hbm_bytes=141e9, hbm_bandwidth=4.8e12,
                                source="NVIDIA H200 SXM datasheet (dense bf16)"),
}
# CPU: measured on the 2-core dev VM for the whole host (bf16 inputs, fp32
# accumulation); treat CPU MFU as a rough indicator only.
CPU_HOST_PEAK_FLOPS = 240e9


def chip(device_kind: str) -> Chip | None:
  """The CHIPS entry of a device kind ('TPU v5 lite', 'NVIDIA H100 80GB HBM3')."""
  for name, value in sorted(CHIPS.items(), key=lambda kv: -len(kv[0])):
    if name.lower() in device_kind.lower():
      return value
  return None


def _attention_flops(n_queries: int, n_keys: int, d: int) -> int:
  """Scores and the weighted sum of values, over all heads."""
  return 2 * 2 * n_queries * n_keys * d


def _mlp_matrices(cfg: ModelConfig) -> int:
  """d x mlp matrices of the FFN: wi and wo, and GEGLU's gate (wi_0, wi_1, wo)."""
  return 3 if cfg.mlp_activation == "geglu" else 2


def _layer_flops(n_queries: int, n_keys: int, d: int, f: int,
                 mlp_matrices: int = 2) -> int:
  projections_and_mlp = 2 * n_queries * (4 * d * d + mlp_matrices * d * f)
  return projections_and_mlp + _attention_flops(n_queries, n_keys, d)


def attention_flops_per_sequence(cfg: ModelConfig, seq_len: int) -> dict[str, int]:
  """Forward FLOPs of the attention products alone (q k and p v, every layer) of
  one sequence, by call site: 'encoder', 'decoder' (its self-attention) and
  'cross'. What an attention kernel does that XLA may not count (plan.py)."""
  counts = cfg.mask_counts(seq_len)
  d, k, n_enc = cfg.hidden, counts.num_selected, counts.encoder_len
  sites = {"encoder": cfg.num_layers * _attention_flops(n_enc, n_enc, d)}
  if cfg.decoder_type == "self":
    sites["decoder"] = cfg.decoder_layers * _attention_flops(seq_len, seq_len, d)
  elif cfg.decoder_type == "cross":
    sites["decoder"] = cfg.decoder_layers * _attention_flops(k, k, d)
    sites["cross"] = cfg.decoder_layers * _attention_flops(k, n_enc, d)
  return sites


def forward_flops_per_sequence(cfg: ModelConfig, seq_len: int) -> dict[str, int]:
  """Forward-pass FLOPs of one sequence, split by part."""
  counts = cfg.mask_counts(seq_len)
  d, f, k = cfg.hidden, cfg.mlp, counts.num_selected
  n_enc, m = counts.encoder_len, _mlp_matrices(cfg)
  parts = {"encoder": cfg.num_layers * _layer_flops(n_enc, n_enc, d, f, m)}
  if cfg.decoder_type == "self":
    parts["decoder"] = cfg.decoder_layers * _layer_flops(seq_len, seq_len, d, f, m)
  elif cfg.decoder_type == "cross":
    self_attention = _layer_flops(k, k, d, f, m)
    # Cross-attention: Q and output projections on the K queries, K/V projections
    # on the encoder outputs, and the scores/values of K queries x n_enc keys.
    cross = 2 * (2 * k * d * d) + 2 * (2 * n_enc * d * d) + 2 * 2 * k * n_enc * d
    parts["decoder"] = cfg.decoder_layers * (self_attention + cross)
  parts["head"] = 2 * k * (d * d + d * cfg.vocab_size)
  return parts


def encoder_forward_flops(cfg: ModelConfig, seq_len: int) -> int:
  """Forward FLOPs of the encoder alone on all `seq_len` tokens of one sequence
  (fine-tuning's model, before its head)."""
  d, f = cfg.hidden, cfg.mlp
  return cfg.num_layers * _layer_flops(seq_len, seq_len, d, f, _mlp_matrices(cfg))


def train_flops_per_step(cfg: ModelConfig, seq_len: int, global_batch: int) -> int:
  return 3 * global_batch * sum(forward_flops_per_sequence(cfg, seq_len).values())


def peak_flops(devices=None, override: float | None = None) -> float:
  """Peak FLOP/s of all devices of the run (`override` is per device)."""
  devices = jax.devices() if devices is None else devices
  if override:
    return override * len(devices)
  if devices[0].platform == "cpu":
    return CPU_HOST_PEAK_FLOPS * jax.process_count()
  found = chip(devices[0].device_kind)
  # Unknown device: MFU is reported as 0; set config.peak_flops_per_device.
  return found.peak_flops * len(devices) if found else 0.0


# ---------------------------------------------------------------------------
# HBM bytes a training step needs, from first principles: what the planner's
# count of the compiled step (tools/hlo_stats.py) is compared with.
# ---------------------------------------------------------------------------
# A layer's elementwise and matmul passes over its [tokens, hidden] activations
# in bf16, forward and backward together (read or written: LayerNorms, the
# projections' inputs and outputs, the residual adds, GELU over the 4x-wide
# hidden counted as 4 passes each way, attention's q, k, v, o and their
# gradients with nothing [L, L] leaving a flash kernel).
ACTIVATION_PASSES_PER_LAYER = 60
# Per parameter on the chip: f32 weights, gradients and AdamW's two moments
# each read and written once (32 bytes), and the bf16 copy read by the forward
# and the backward pass of each microbatch (4).
OPTIMIZER_BYTES_PER_PARAMETER = 32
WEIGHT_READ_BYTES_PER_PARAMETER = 4
# A shared [1, H, Lq, Lk] position bias per layer: read in bf16 by the forward
# and the two backward kernels (3 x 2 bytes), its gradient summed over the
# batch inside the kernel and written once in f32 (4).
BIAS_BYTES_PER_ENTRY = 10
# The head's logits over the vocabulary at the predicted positions: written and
# read in f32 by the loss, the same for their gradient.
LOGIT_BYTES = 16


def train_hbm_bytes_per_chip(cfg: ModelConfig, seq_len: int, rows_per_chip: float,
                             params_per_chip: float, grad_accum_steps: int = 1
                             ) -> dict[str, float]:
  """HBM bytes one training step needs per chip, by part ('weights and
  optimizer', 'activations', 'position bias', 'head'), each stack at the
  length it runs on (the module docstring); `rows_per_chip` is the step's rows
  on one chip, all microbatches together. An estimate of what a step that
  moves nothing it need not would move: the planner prints it beside its count
  of the compiled step."""
  counts = cfg.mask_counts(seq_len)
  k, n_enc, h = counts.num_selected, counts.encoder_len, cfg.num_heads
  # (layers, tokens a row, [(query length, key length)] of its attention).
  stacks = [(cfg.num_layers, n_enc, [(n_enc, n_enc)])]
  if cfg.decoder_type == "self":
    stacks.append((cfg.decoder_layers, seq_len, [(seq_len, seq_len)]))
  elif cfg.decoder_type == "cross":
    stacks.append((cfg.decoder_layers, k, [(k, k), (k, n_enc)]))
  activations = bias = 0.0
  for layers, tokens, attentions in stacks:
    activations += (layers * ACTIVATION_PASSES_PER_LAYER * rows_per_chip * tokens
                    * cfg.hidden * 2)
    bias += layers * sum(BIAS_BYTES_PER_ENTRY * h * q * kv for q, kv in attentions)
  return {
      "weights and optimizer": params_per_chip * (
          OPTIMIZER_BYTES_PER_PARAMETER
          + WEIGHT_READ_BYTES_PER_PARAMETER * grad_accum_steps),
      "activations": activations,
      "position bias": bias * grad_accum_steps,
      "head": LOGIT_BYTES * rows_per_chip * k * cfg.vocab_size,
  }

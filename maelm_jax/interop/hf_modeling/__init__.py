"""PyTorch files an export writes beside the weights (see maelm_jax/interop/export_hf.py).

Never imported by maelm_jax: they need torch, which maelm_jax does not.
"""

"""The two layouts of a stack's layer parameters, and conversion between them:
unrolled (`layer_0`, `layer_1`, ...) and scanned (`layers`, each leaf with a
leading layer axis, as `model.ModelConfig.scan_layers` stores them). Every reader
of checkpoints (init_from, fine-tuning, analysis, export) takes either layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

SCANNED_LAYERS = "layers"


def _stack(*xs):
  # Host arrays (a checkpoint read on the host) stay on the host.
  if all(isinstance(x, np.ndarray) for x in xs):
    return np.stack(xs)
  return jnp.stack(xs)


def stack_layers(tree):
  """Unrolled parameters (`layer_0`, `layer_1`, ... in a stack) -> scanned
  (`layers`, each leaf with a leading layer axis). Anything else is kept."""
  if not isinstance(tree, dict):
    return tree
  if "layer_0" in tree:
    count = sum(1 for k in tree if k.startswith("layer_") and k[6:].isdigit())
    rest = {k: stack_layers(v) for k, v in tree.items()
            if not (k.startswith("layer_") and k[6:].isdigit())}
    layers = [tree[f"layer_{i}"] for i in range(count)]
    return {**rest, SCANNED_LAYERS: jax.tree.map(_stack, *layers)}
  return {k: stack_layers(v) for k, v in tree.items()}


def unstack_layers(tree):
  """The inverse of `stack_layers`."""
  if not isinstance(tree, dict):
    return tree
  if SCANNED_LAYERS in tree:
    stacked = tree[SCANNED_LAYERS]
    count = jax.tree.leaves(stacked)[0].shape[0]
    rest = {k: unstack_layers(v) for k, v in tree.items() if k != SCANNED_LAYERS}
    return {**rest, **{f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], stacked)
                       for i in range(count)}}
  return {k: unstack_layers(v) for k, v in tree.items()}


def params_for(params, scan_layers: bool):
  """`params` (either layout) in the layout a model with `scan_layers` reads."""
  return stack_layers(params) if scan_layers else unstack_layers(params)


def is_scanned(params) -> bool:
  return any(SCANNED_LAYERS in stack for stack in params.values()
             if isinstance(stack, dict))

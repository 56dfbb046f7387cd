"""The decoding cache shared by causal mixers: per-position buffers in the "cache" collection.

Decoding follows Flax's convention: `module.init(key, x_BxTxD, decode=True)` creates zeroed buffers for T
positions (and runs the ordinary forward pass); afterwards `module.apply({**variables, "cache": cache},
x_Bx1xD, decode=True, mutable=["cache"])` appends one position and mixes it with everything before it.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError


def append(module: nn.Module, **arrays: jax.Array):
  """Buffers each array (B×T×… at init, B×1×… when decoding) along the positions.

  Returns None in the init pass (buffers just created), else ({name: B×T×… buffer}, index of the new position).
  """
  if not module.causal:
    raise UserError(f"{type(module).__name__}: decoding needs causal=True")
  initialized = module.has_variable("cache", "index")
  index = module.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
  buffers = {name: module.variable("cache", name, jnp.zeros, a.shape, a.dtype) for name, a in arrays.items()}
  if not initialized:
    return None
  i = index.value
  for name, a in arrays.items():
    if a.shape[1] != 1:
      raise ValueError(f"{type(module).__name__}: decoding takes one position at a time, got {a.shape[1]}")
    buffers[name].value = jax.lax.dynamic_update_slice_in_dim(buffers[name].value, a, i, axis=1)
  index.value = i + 1
  return {name: b.value for name, b in buffers.items()}, i

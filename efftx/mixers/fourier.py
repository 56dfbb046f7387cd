"""FNet's Fourier mixing: y = Re(FFT2(x)) over (sequence, hidden), no parameters (Lee-Thorp et al., 2021)."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class FNet(nn.Module):
  """Fourier token mixing.

  FNet has no causal form (every output mixes every position), so `causal=True` raises ValueError.

  Padding: the DFT has no notion of a mask, so padded positions are set to zero before mixing. Outputs at real
  positions then do not depend on what the padded positions hold, but they do depend on the padded length L
  (the DFT's size), as in the reference implementation, which pads every sequence to one fixed length.
  """

  causal: bool = False

  def __post_init__(self):
    if self.causal:
      raise ValueError(
          "mixer 'fnet' cannot be causal: its 2-D DFT mixes every position with every other. "
          "Use a causal mixer (e.g. 'attention') or set config.model.causal=False.")
    super().__post_init__()

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    del deterministic  # no parameters, no dropout
    if mask is not None:
      x_BxLxD = jnp.where(mask[:, :, None], x_BxLxD, 0)
    # Computed in float32: not every backend has a bfloat16 FFT.
    y_BxLxD = jnp.fft.fft2(x_BxLxD.astype(jnp.float32), axes=(-2, -1)).real
    return y_BxLxD.astype(x_BxLxD.dtype)

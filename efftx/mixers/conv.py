"""Causal convolutions over the positions, shared by the convolutional and recurrent mixers.

- `ShortConv`: a depthwise causal convolution of a few taps with a bias, y_t = b + Σ_{j<W} w_j ⊙ x_{t−j}
  (torch's `Conv1d(C, C, W, groups=C, padding=W − 1)` cut to the first L outputs, and its default initialisation,
  U(±1/√W) for weights and bias; `use_bias=False`: no b, as fla's ShortConvolution by default). Decoding keeps the
  last W − 1 inputs: a state of constant size.
- `causal_long_conv`: y_t = Σ_{s≤t} k_{t−s} ⊙ u_s with a kernel as long as the sequence, per channel, through an
  FFT of length 2L (no wrap-around), in float32 — the `fftconv` of Hyena, H3 and BaseConv (zoology/mixers/hyena.py).
  `long_conv_step` is the same sum for one new position over the inputs buffered so far (efftx/mixers/cache.py).

Positions where `mask` is False (padding) enter as zeros, so padding at either end never reaches a real position.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError


def _torch_uniform(fan_in: int):
  bound = 1.0 / fan_in**0.5
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def depthwise_causal(x_BxLxC: jax.Array, w_WxC: jax.Array) -> jax.Array:
  """Σ_{j<W} w_j ⊙ x_{t−j} (zeros before the start), in x's dtype; w_0 weighs the current position."""
  W = w_WxC.shape[0]
  L = x_BxLxC.shape[1]
  padded_BxPxC = jnp.pad(x_BxLxC, [(0, 0), (W - 1, 0), (0, 0)])
  w_WxC = w_WxC.astype(x_BxLxC.dtype)
  return sum(w_WxC[j] * padded_BxPxC[:, W - 1 - j : W - 1 - j + L] for j in range(W))


class ShortConv(nn.Module):
  """Depthwise causal convolution with `width` taps and a bias over the last axis's `features` channels; taps_init
  and bias_init (initializers of the W×C taps, taps[0] weighing the current position, and of the C biases) replace
  torch's default where given (Griffin's Conv1D: N(0, 0.01/W) and zeros)."""

  features: int
  width: int
  causal: bool = True
  use_bias: bool = True
  taps_init: Callable | None = None
  bias_init: Callable | None = None

  @nn.compact
  def __call__(self, x_BxLxC: jax.Array, mask: jax.Array | None = None, decode: bool = False) -> jax.Array:
    # "taps", not "kernel": torch's init, and not one of the dense kernels the optimizer decays by name.
    w_WxC = self.param("taps", self.taps_init or _torch_uniform(self.width), (self.width, self.features))
    b_C = (
      self.param("bias", self.bias_init or _torch_uniform(self.width), (self.features,))
      if self.use_bias
      else jnp.zeros(())
    )
    if mask is not None:
      x_BxLxC = jnp.where(mask[:, :, None], x_BxLxC, 0)
    if decode:
      if not self.causal:
        raise UserError(f"{type(self).__name__}: decoding needs causal=True")
      initialized = self.has_variable("cache", "conv_state")
      B = x_BxLxC.shape[0]
      state = self.variable("cache", "conv_state", jnp.zeros, (B, self.width - 1, self.features), x_BxLxC.dtype)
      if initialized:
        if x_BxLxC.shape[1] != 1:
          raise ValueError(f"{type(self).__name__}: decoding takes one position at a time, got {x_BxLxC.shape[1]}")
        window_BxWxC = jnp.concatenate([state.value, x_BxLxC], axis=1)
        state.value = window_BxWxC[:, 1:]
        y_Bx1xC = jnp.einsum("bwc,wc->bc", window_BxWxC, w_WxC[::-1].astype(x_BxLxC.dtype))[:, None]
        return y_Bx1xC + b_C.astype(x_BxLxC.dtype)
    return depthwise_causal(x_BxLxC, w_WxC) + b_C.astype(x_BxLxC.dtype)


def causal_long_conv(u_BxLxD: jax.Array, k_LxD: jax.Array) -> jax.Array:
  """y_t = Σ_{s≤t} k_{t−s} ⊙ u_s per channel, float32, through rfft/irfft of length 2L (k: L' ≤ L taps or more;
  taps beyond L never reach an output)."""
  L = u_BxLxD.shape[1]
  k_LxD = k_LxD[:L].astype(jnp.float32)
  n = 2 * L
  u_f = jnp.fft.rfft(u_BxLxD.astype(jnp.float32), n=n, axis=1)
  k_f = jnp.fft.rfft(k_LxD, n=n, axis=0)
  return jnp.fft.irfft(u_f * k_f[None], n=n, axis=1)[:, :L]


def long_conv_step(u_BxTxD: jax.Array, index: jax.Array, k_LxD: jax.Array) -> jax.Array:
  """Σ_{s≤index} k_{index−s} ⊙ u_s for a buffer of T past inputs (entries after `index` ignored): B×1×D, float32."""
  T, K = u_BxTxD.shape[1], k_LxD.shape[0]
  lag_T = index - jnp.arange(T)
  seen_T = (lag_T >= 0) & (lag_T < K)
  taps_TxD = jnp.where(seen_T[:, None], k_LxD.astype(jnp.float32)[jnp.clip(lag_T, 0, K - 1)], 0.0)
  return jnp.einsum("btd,td->bd", u_BxTxD.astype(jnp.float32), taps_TxD)[:, None]

"""BaseConv (Arora et al., 2024, Zoology): a gated convolution with a residual inside the mixer,

    y = conv(u) ⊙ (u W + b) + u,

as zoology/mixers/base_conv.py `BaseConv.forward` (use_act=False) computes it, in two specs:
  - `base_conv`: conv is a depthwise causal convolution of `kernel_size` taps with a bias (zoology/mixers/
    convolution.py `ShortConvolution`, efftx.mixers.conv.ShortConv); decodes with the last kernel_size − 1 inputs.
  - `base_conv_long`: conv is `ImplicitLongConvolution` (the same file): a filter as long as the sequence, generated
    by an MLP (Linear 3→16, ReLU, Linear 16→D) from a 3-channel positional embedding of max_len positions, applied
    by an FFT convolution whose output keeps its input as a skip (zoology's `fft_conv`: k ∗ u + u). Decodes from
    the buffered inputs (efftx/mixers/cache.py), O(t·D) per step.
Zoology's Figure 2 (kernel_size=[3, -1] per layer) is the layer pattern `base_conv+base_conv_long`.

Causal only. Padded positions are zeroed before the convolution, so they never reach a real position. The long
filter and convolution are computed in float32, the projection in the input's dtype; output in the input's dtype.
Parameters: `projection` (Dense, kernel and bias), the short conv's `conv/taps` and `conv/bias` (torch's Conv1d
initialisation), the filter MLP's `filter_in` and `filter_out` (Dense; Zoology's `_init_weights` redraws these as
every nn.Linear, which config.model.init_std = 0.02 reproduces). Weight decay: the dense kernels and the short
conv's taps (Zoology's AdamW decays every parameter; efftx leaves biases undecayed).
Derivation: efftx/mixers/README.md#base_conv.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.fields import Field
from efftx.mixers import cache
from efftx.mixers.conv import ShortConv
from efftx.mixers.conv import causal_long_conv
from efftx.mixers.conv import long_conv_step
from efftx.mixers.spec import MixerSpec

FILTER_EMB = 3  # ImplicitLongConvolution's d_emb: time, and the real and imaginary parts of one band
FILTER_HIDDEN = 16  # its d_hidden: the filter MLP's width


def filter_positions(max_len: int, length: int) -> jax.Array:
  """The first `length` rows of the filter MLP's input for max_len positions (zoology's PositionalEmbedding, d_emb 3):
  z_t = [t / (max_len − 1), cos(ω_t), −sin(ω_t)] with ω_t = 10⁻⁴ · 2π t / max_len (the one band's frequency is
  linspace(1e-4, 0, 1) = 10⁻⁴), length × 3, float32."""
  t = jnp.arange(length, dtype=jnp.float32)
  bands = (FILTER_EMB - 1) // 2
  freqs = jnp.linspace(1e-4, bands - 1, bands, dtype=jnp.float32)  # torch.linspace(1e-4, bands − 1, bands)
  omega_LxF = freqs[None] * (2 * math.pi / max_len) * t[:, None]
  normalised = t / (max_len - 1) if max_len > 1 else jnp.zeros_like(t)  # torch.linspace(0, 1, max_len)
  return jnp.concatenate([normalised[:, None], jnp.cos(omega_LxF), -jnp.sin(omega_LxF)], axis=-1)


def _zero_padding(x_BxLxD: jax.Array, mask: jax.Array | None) -> jax.Array:
  return x_BxLxD if mask is None else jnp.where(mask[:, :, None], x_BxLxD, 0)


class BaseConv(nn.Module):
  """y = ShortConv(u) ⊙ projection(u) + u."""

  kernel_size: int = 3
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    D = x_BxLxD.shape[-1]
    u_BxLxD = _zero_padding(x_BxLxD, mask)
    conv_BxLxD = ShortConv(D, self.kernel_size, causal=self.causal, name="conv")(u_BxLxD, decode=decode)
    proj_BxLxD = nn.Dense(D, dtype=x_BxLxD.dtype, name="projection")(u_BxLxD)
    y_BxLxD = conv_BxLxD.astype(jnp.float32) * proj_BxLxD.astype(jnp.float32) + u_BxLxD.astype(jnp.float32)
    return y_BxLxD.astype(x_BxLxD.dtype)


class BaseConvLong(nn.Module):
  """y = (k ∗ u + u) ⊙ projection(u) + u with ImplicitLongConvolution's filter k (max_len taps)."""

  max_len: int = 512  # positions the filter covers (zoology's l_max); the model sets the sequence length
  causal: bool = True

  def filter(self, length: int, D: int) -> jax.Array:
    """The filter's first min(length, max_len) taps, float32 (length × D): MLP(z) as ImplicitLongConvolution.filter;
    taps beyond max_len are zero, as zoology's pos_emb(L) holds only max_len rows."""
    z_LxE = filter_positions(self.max_len, min(length, self.max_len))
    h_LxH = nn.relu(nn.Dense(FILTER_HIDDEN, name="filter_in")(z_LxE))
    return nn.Dense(D, name="filter_out")(h_LxH)

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    B, L, D = x_BxLxD.shape
    u_BxLxD = _zero_padding(x_BxLxD, mask)
    proj_BxLxD = nn.Dense(D, dtype=x_BxLxD.dtype, name="projection")(u_BxLxD)
    buffered = cache.append(self, u=u_BxLxD) if decode else None
    if buffered is not None:
      buffers, index = buffered
      u_BxTxD = buffers["u"]
      conv_BxLxD = long_conv_step(u_BxTxD, index, self.filter(u_BxTxD.shape[1], D))
    else:
      conv_BxLxD = causal_long_conv(u_BxLxD, self.filter(L, D))
    u32_BxLxD = u_BxLxD.astype(jnp.float32)
    y_BxLxD = (conv_BxLxD + u32_BxLxD) * proj_BxLxD.astype(jnp.float32) + u32_BxLxD
    return y_BxLxD.astype(x_BxLxD.dtype)


SPEC = MixerSpec(
  BaseConv,
  "BaseConv (Zoology): short causal conv(u) ⊙ (uW + b) + u; O(L·d·kernel_size + L·d²)",
  can_be_bidirectional=False,
  can_decode=True,
  decayed=("taps",),
  options={"kernel_size": Field("taps of the depthwise causal convolution (Zoology: 3)", at_least=1)},
)

SPEC_LONG = MixerSpec(
  BaseConvLong,
  "BaseConv (Zoology) with an implicit long conv: (k∗u + u) ⊙ (uW + b) + u, k an MLP of position; O(L log L·d + L·d²)",
  can_be_bidirectional=False,
  can_decode=True,
  options={},
)

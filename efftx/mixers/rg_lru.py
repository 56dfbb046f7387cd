"""Griffin's recurrent block (De et al., 2024) as google-deepmind/recurrentgemma computes it
(recurrentgemma/jax/modules.py `RecurrentBlock`, layers.py `Conv1D`, `RGLRU`, `BlockDiagonalLinear`):

    y = GeLU(linear_y(u));   x = conv_1d(linear_x(u))                     (width W each; conv: depthwise causal)
    r_t = σ(a_gate(x_t)),  i_t = σ(input_gate(x_t))                       (block-diagonal, one block per head)
    log a_t = −8 r_t ⊙ softplus(Λ)
    h_t = a_t ⊙ h_{t−1} + √(1 − a_t²) ⊙ (i_t ⊙ x_t)                       (at the first position: h_0 = i_0 ⊙ x_0)
    out = linear_out(h ⊙ y)

Causal only. The recurrence runs in float32 through the shared diagonal recurrence (efftx/mixers/diagonal.py); the
sequence's first real position is the reference's reset (segment_pos 0: the past multiplied by 0, the input by 1
instead of √(1 − a²)); padded positions neither decay nor write the state and enter the convolution as zeros, so
padding at either end changes nothing at real positions. √(1 − a²) as the reference's `sqrt_bound_derivative`: its
derivative bounded by 1000 (1 − a² is computed as −expm1(2 log a), equal in exact arithmetic, without float32's
cancellation near a = 1). Decoding keeps the convolution's last conv_width − 1 inputs, h (W, float32) and whether
the sequence has started: constant in the position. Initialisation as the reference: Λ so that at r = 1, a = ρ⁸
with ρ² uniform in [0.9², 0.999²] (`rnn_real_param_init`); the gates' blocks N(0, 1/W), the dense kernels
N(0, 1/fan_in), the convolution's taps N(0, 0.01/conv_width), biases zero. Weight decay: the dense and gate kernels
and the taps; Λ and the biases not. Derivation and correspondence: efftx/mixers/README.md#rg_lru.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import diagonal
from efftx.mixers.conv import ShortConv
from efftx.mixers.spec import MixerSpec

C = 8.0  # the reference's constant in log a = −c·r·softplus(Λ)
MIN_RAD, MAX_RAD = 0.9, 0.999  # the ring a^(1/c) is initialised on
MAX_SQRT_GRADIENT = 1000.0  # sqrt_bound_derivative's bound


def a_param_init(key, shape, dtype=jnp.float32):
  """layers.py rnn_real_param_init(0.9, 0.999): log r = ½ log(U·(0.999² − 0.9²) + 0.9² + 1e-8), Λ =
  softplus⁻¹(−log r)."""
  unif = jax.random.uniform(key, shape)
  log_r = 0.5 * jnp.log(unif * (MAX_RAD**2 - MIN_RAD**2) + MIN_RAD**2 + 1e-8)
  return jnp.log(jnp.exp(-log_r) - 1.0).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def sqrt_bound_derivative(x: jax.Array, max_gradient: float) -> jax.Array:
  """√x whose derivative is taken at max(x, 1/(4·max_gradient²)): at most max_gradient."""
  del max_gradient
  return jnp.sqrt(x)


def _sqrt_fwd(x, max_gradient):
  del max_gradient
  return jnp.sqrt(x), x


def _sqrt_bwd(max_gradient, x, g):
  return (g * 0.5 / jnp.sqrt(jnp.maximum(x, 1.0 / (4.0 * max_gradient**2))),)


sqrt_bound_derivative.defvjp(_sqrt_fwd, _sqrt_bwd)


class BlockDiagonal(nn.Module):
  """layers.py BlockDiagonalLinear: `heads` blocks of width/heads inputs → width/heads outputs, with a bias."""

  width: int
  heads: int

  @nn.compact
  def __call__(self, x_BxLxW: jax.Array) -> jax.Array:
    H, P = self.heads, self.width // self.heads
    # N(0, 1/(H·P)): variance_scaling's fan-in of an H × P × P array is H·P (the reference's, on the same shape).
    w_HxPxP = self.param("kernel", nn.initializers.variance_scaling(1.0, "fan_in", "normal"), (H, P, P))
    b_HxP = self.param("bias", nn.initializers.zeros, (H, P))
    x_BxLxHxP = x_BxLxW.reshape(*x_BxLxW.shape[:-1], H, P)
    y_BxLxHxP = jnp.einsum("blhi,hij->blhj", x_BxLxHxP, w_HxPxP.astype(x_BxLxW.dtype)) + b_HxP.astype(x_BxLxW.dtype)
    return y_BxLxHxP.reshape(x_BxLxW.shape)


class RGLRUBlock(nn.Module):
  """modules.py RecurrentBlock (real RG-LRU, the reference's default) with lru_width = d_model unless set."""

  num_heads: int = 1
  lru_width: int = 0  # 0: d_model
  conv_width: int = 4
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    if not self.causal:
      raise UserError("rg_lru: the module is causal (MIXERS['rg_lru'](causal=False) runs it both ways)")
    B, L, D = x_BxLxD.shape
    W = self.lru_width or D
    if W % self.num_heads:
      raise UserError(f"rg_lru: lru_width {W} must be divisible by num_heads={self.num_heads}")
    dtype = x_BxLxD.dtype
    real_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    dense = functools.partial(nn.Dense, kernel_init=nn.initializers.variance_scaling(1.0, "fan_in", "normal"))
    y_BxLxW = jax.nn.gelu(dense(W, dtype=dtype, name="linear_y")(x_BxLxD))  # tanh GeLU, as jax.nn.gelu's default
    conv = ShortConv(
      W,
      self.conv_width,
      taps_init=nn.initializers.variance_scaling(0.01, "fan_in", "normal"),
      bias_init=nn.initializers.zeros,
      name="conv_1d",
    )
    x_BxLxW = conv(dense(W, dtype=dtype, name="linear_x")(x_BxLxD), real_BxL, decode)

    gate_x_BxLxW = jax.nn.sigmoid(BlockDiagonal(W, self.num_heads, name="input_gate")(x_BxLxW).astype(jnp.float32))
    gate_a_BxLxW = jax.nn.sigmoid(BlockDiagonal(W, self.num_heads, name="a_gate")(x_BxLxW).astype(jnp.float32))
    a_param_W = self.param("a_param", a_param_init, (W,))
    log_a_BxLxW = -C * gate_a_BxLxW * jax.nn.softplus(a_param_W)
    multiplier_BxLxW = sqrt_bound_derivative(-jnp.expm1(2.0 * log_a_BxLxW), MAX_SQRT_GRADIENT)

    started_B = jnp.zeros((B,), bool)
    h0 = None
    if decode:
      initialized = self.has_variable("cache", "h")
      h_cache = self.variable("cache", "h", jnp.zeros, (B, W), jnp.float32)
      started = self.variable("cache", "started", jnp.zeros, (B,), bool)  # a real position seen
      if initialized:  # ShortConv has checked that L == 1
        h0, started_B = h_cache.value, started.value
    # The reset: the first real position (no real position before it, here or in the cache).
    reset_BxL = real_BxL & (jnp.cumsum(real_BxL, axis=1) == 1) & ~started_B[:, None]
    multiplier_BxLxW = jnp.where(reset_BxL[..., None], 1.0, multiplier_BxLxW)
    a_BxLxW = jnp.where(reset_BxL[..., None], 0.0, jnp.exp(log_a_BxLxW))
    b_BxLxW = x_BxLxW.astype(jnp.float32) * gate_x_BxLxW * multiplier_BxLxW
    h_BxLxW = diagonal.scan(a_BxLxW, b_BxLxW, h0, real_BxL)
    if h0 is not None:
      h_cache.value = h_BxLxW[:, -1]
      started.value = started_B | real_BxL[:, 0]
    joined_BxLxW = (h_BxLxW * y_BxLxW.astype(jnp.float32)).astype(dtype)
    return dense(D, dtype=dtype, name="linear_out")(joined_BxLxW)


def _relations(options: dict[str, Any], d_model: int | None, causal: bool) -> None:
  del causal
  width = options["lru_width"] or d_model
  if width is not None and width % options["num_heads"]:
    raise UserError(
      f"config.mixer.lru_width={width} (0: d_model) must be divisible by config.mixer.num_heads="
      f"{options['num_heads']} (mixer 'rg_lru' splits its gates into heads)"
    )


def _flops(options, L: int, d: int, causal: bool) -> float:
  """0: the block-diagonal gates are "kernel"s, counted with the projections; the rest is elementwise."""
  del options, L, d, causal
  return 0.0


SPEC = MixerSpec(
  RGLRUBlock,
  "Griffin's recurrent block: GeLU gate ⊙ RG-LRU(conv(x)), a gated real diagonal recurrence; O(L·d), a "
  "scan; decode state lru_width + conv",
  bidirectional_by_reversal=True,
  can_decode=True,
  relations=_relations,
  flops=_flops,
  options={
    "num_heads": Field("blocks of the block-diagonal gates (the reference's num_heads)", at_least=1),
    "lru_width": Field("width of the recurrence and its branches; 0: d_model (the reference's default)", at_least=0),
    "conv_width": Field("taps of the causal depthwise convolution before the RG-LRU", at_least=1),
  },
)

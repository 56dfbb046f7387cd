"""Mamba-1 (Gu & Dao, 2023) as mamba_ssm/modules/mamba_simple.py's `Mamba` computes it without its fused kernels
(the `selective_scan_fn` path, whose reference is ops/selective_scan_interface.py `selective_scan_ref`):

    x, z = in_proj(u)                                   (E = expand·d channels each, no bias)
    x = SiLU(conv1d(x))                                 (depthwise causal, d_conv taps, bias)
    dt, B, C = x_proj(x)                                (dt_rank, d_state, d_state; no bias)
    Δ = softplus(dt_proj(dt)),  A = −exp(A_log)         (Δ: E per position; A: E × d_state)
    h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t B_t x_t,  y_t = h_t C_t + D ⊙ x_t   (selective scan, h: E × d_state)
    out = out_proj(y ⊙ SiLU(z))

Causal only. The selective scan runs in float32 (the reference casts to float32 there too) through the shared
diagonal recurrence (efftx/mixers/diagonal.py); padded positions neither decay nor write the state, and enter the
convolution as zeros, so padding at either end changes nothing at real positions. Decoding keeps the last d_conv − 1
inputs of the convolution and the E × d_state state: constant in the position. Initialisation as the reference:
S4D-real A_log = log(1 … N), D = 1, dt_proj's bias the inverse softplus of Δ drawn log-uniformly in [dt_min, dt_max]
(floored at 1e-4), its weight U(±dt_rank^−½); the other projections and the convolution torch's defaults. Weight
decay: the dense kernels; A_log, D and the biases not (the reference marks A_log and D `_no_weight_decay`).
Derivation and correspondence: efftx/mixers/README.md#mamba.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import diagonal
from efftx.mixers.conv import ShortConv
from efftx.mixers.spec import MixerSpec

DT_INIT_FLOOR = 1e-4  # the reference's dt_init_floor


def _uniform(bound: float):
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def _torch_linear(key, shape, dtype=jnp.float32):
  """torch.nn.Linear's default weight: U(±1/√fan_in)."""
  return _uniform(1.0 / math.sqrt(shape[0]))(key, shape, dtype)


def _dt_bias(dt_min: float, dt_max: float):
  """softplus⁻¹(Δ), log Δ ~ U(log dt_min, log dt_max), Δ ≥ 1e-4: Δ + log(−expm1(−Δ))."""

  def init(key, shape, dtype=jnp.float32):
    lo, hi = math.log(dt_min), math.log(dt_max)
    dt = jnp.maximum(jnp.exp(jax.random.uniform(key, shape, jnp.float32) * (hi - lo) + lo), DT_INIT_FLOOR)
    return (dt + jnp.log(-jnp.expm1(-dt))).astype(dtype)

  return init


def selective_scan(u_BxLxE, delta_BxLxE, A_ExN, B_BxLxN, C_BxLxN, D_E, real_BxL=None, h0_BxExN=None):
  """(y_BxLxE, the last state B×E×N): h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t u_t, y_t = h_t·C_t + D u_t, float32."""
  u_BxLxE = u_BxLxE.astype(jnp.float32)
  a_BxLxExN = jnp.exp(delta_BxLxE[..., None] * A_ExN)
  b_BxLxExN = (delta_BxLxE * u_BxLxE)[..., None] * B_BxLxN.astype(jnp.float32)[:, :, None]
  h_BxLxExN = diagonal.scan(a_BxLxExN, b_BxLxExN, h0_BxExN, real_BxL)
  y_BxLxE = jnp.einsum("blen,bln->ble", h_BxLxExN, C_BxLxN.astype(jnp.float32)) + D_E * u_BxLxE
  return y_BxLxE, h_BxLxExN[:, -1]


class Mamba(nn.Module):
  """mamba_simple.Mamba's parameters (flax kernels are torch's weights transposed)."""

  d_state: int = 16
  expand: int = 2
  d_conv: int = 4
  dt_rank: int = 0  # 0: ⌈d_model / 16⌉ (the reference's "auto")
  dt_min: float = 0.001
  dt_max: float = 0.1
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    if not self.causal:
      raise UserError("mamba: the module is causal (MIXERS['mamba'](causal=False) runs it both ways)")
    B, L, D = x_BxLxD.shape
    E, N, R = self.expand * D, self.d_state, self.dt_rank or math.ceil(D / 16)
    dtype = x_BxLxD.dtype
    real_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    xz_BxLx2E = nn.Dense(2 * E, use_bias=False, kernel_init=_torch_linear, dtype=dtype, name="in_proj")(x_BxLxD)
    x_BxLxE, z_BxLxE = jnp.split(xz_BxLx2E, 2, axis=-1)
    conv = ShortConv(E, self.d_conv, name="conv1d")
    u_BxLxE = nn.silu(conv(x_BxLxE, real_BxL, decode))
    dbc_BxLxK = nn.Dense(R + 2 * N, use_bias=False, kernel_init=_torch_linear, dtype=dtype, name="x_proj")(u_BxLxE)
    dt_BxLxR, B_BxLxN, C_BxLxN = jnp.split(dbc_BxLxK, [R, R + N], axis=-1)
    # dt_proj in float32: the reference adds its bias (Δ's offset, ~−7 … −2) in float32 (delta_bias.float()).
    dt_proj = nn.Dense(
      E, kernel_init=_uniform(R**-0.5), bias_init=_dt_bias(self.dt_min, self.dt_max), dtype=jnp.float32, name="dt_proj"
    )
    delta_BxLxE = jax.nn.softplus(dt_proj(dt_BxLxR.astype(jnp.float32)))
    A_log = self.param("A_log", lambda key, shape: jnp.broadcast_to(jnp.log(jnp.arange(1.0, N + 1)), shape), (E, N))
    D_E = self.param("D", nn.initializers.ones, (E,))
    A_ExN = -jnp.exp(A_log)

    h0 = None
    if decode:
      initialized = self.has_variable("cache", "ssm_state")
      state = self.variable("cache", "ssm_state", jnp.zeros, (B, E, N), jnp.float32)
      if initialized:  # ShortConv has checked that L == 1
        h0 = state.value
    y_BxLxE, last_BxExN = selective_scan(u_BxLxE, delta_BxLxE, A_ExN, B_BxLxN, C_BxLxN, D_E, real_BxL, h0)
    if h0 is not None:
      state.value = last_BxExN
    y_BxLxE = (y_BxLxE * nn.silu(z_BxLxE.astype(jnp.float32))).astype(dtype)
    return nn.Dense(D, use_bias=False, kernel_init=_torch_linear, dtype=dtype, name="out_proj")(y_BxLxE)


def _relations(options: dict[str, Any], d_model: int | None, causal: bool) -> None:
  del d_model, causal
  if options["dt_min"] > options["dt_max"]:
    raise UserError(
      f"config.mixer.dt_min={options['dt_min']!r} must not exceed config.mixer.dt_max={options['dt_max']!r} "
      "(mixer 'mamba')"
    )


def _flops(options, L: int, d: int, causal: bool) -> float:
  """The readout y_t = h_t·C_t: E × N multiply-adds a position; the scan and the convolution are elementwise."""
  del L, causal
  return 2.0 * options["expand"] * d * options["d_state"]


SPEC = MixerSpec(
  Mamba,
  "Mamba-1: gated causal conv + input-dependent (selective) diagonal SSM, d_state per channel; "
  "O(L·d·d_state), a scan; decode state expand·d·d_state + conv",
  bidirectional_by_reversal=True,
  can_decode=True,
  relations=_relations,
  flops=_flops,
  keep_init=("dt_proj",),
  options={
    "d_state": Field("SSM state size N per channel (the reference's d_state)", at_least=1),
    "expand": Field("inner width E = expand·d_model of the SSM and the gate", at_least=1),
    "d_conv": Field("taps of the causal depthwise convolution before the SSM", at_least=1),
    "dt_rank": Field("rank of Δ's projection; 0: ⌈d_model/16⌉ (the reference's 'auto')", at_least=0),
    "dt_min": Field("smallest initial step Δ (log Δ drawn uniformly in [log dt_min, log dt_max])", above=0),
    "dt_max": Field("largest initial step Δ", above=0),
  },
)

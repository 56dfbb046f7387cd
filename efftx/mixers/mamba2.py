"""Mamba-2 (Dao & Gu, 2024), the SSD layer as state-spaces/mamba's mamba_ssm/modules/mamba2.py `Mamba2` (its
defaults: d_state 128, headdim 64, expand 2, ngroups 1, d_conv 4, chunk_size 256, rmsnorm with
norm_before_gate=False, no projection biases, conv bias). Per head h, with Δ_t = softplus(dt_t + dt_bias_h) and
a_h = −exp(A_log_h):

    state_t = exp(Δ_t a_h) state_{t−1} + B_t (Δ_t x_t)ᵀ,   y_t = stateᵀ C_t + D_h x_t
    out = out_proj(RMSNorm(y ⊙ SiLU(z)) · weight)     (over d_inner / ngroups channels per group; eps norm_eps)

z, xBC, dt = in_proj(u); xBC through a causal depthwise convolution (width d_conv, bias) and SiLU, then split into
x (heads of headdim), B and C (ngroups groups of d_state, head h in group h·ngroups // nheads). The recurrence is
efftx.mixers.recurrence's (q = C, k = B, v = Δ·x, g = Δ·a), float32. Padded positions are zeroed before in_proj
and skipped by the recurrence (and by the decoding cache's convolution window), so padding at either end changes
nothing at real positions. Decoding: the last d_conv − 1 convolution inputs and the nheads × d_state × headdim
state, constant in the position. Initialisation as the reference: A ~ U[1, 16], Δ log-uniform in [dt_min, dt_max]
(floored at 1e-4) stored through the inverse softplus in dt_bias, D = 1, projections and convolution at torch's
defaults; A_log, dt_bias, D and the norm's weight are not weight-decayed. Notes: efftx/mixers/README.md#mamba2.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import recurrence
from efftx.mixers.spec import MixerSpec


def _uniform(bound: float):
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def _torch_linear_init(key, shape, dtype=jnp.float32):
  """torch.nn.Linear's default weight, U(±1/√fan_in)."""
  return _uniform(1.0 / math.sqrt(shape[0]))(key, shape, dtype)


def heads(d_model: int, expand: int, headdim: int) -> tuple[int, int]:
  """(nheads, headdim used): a width expand·d_model below headdim is one head of that width."""
  d_inner = expand * d_model
  P = min(headdim, d_inner)
  return d_inner // P, P


class Mamba2(nn.Module):
  """Mamba-2's SSD mixer; parameter names as the reference (in_proj, conv1d, dt_bias, A_log, D, norm, out_proj)."""

  d_state: int = 128
  d_conv: int = 4
  expand: int = 2
  headdim: int = 64
  ngroups: int = 1
  dt_min: float = 0.001
  dt_max: float = 0.1
  chunk: int = 256
  norm_eps: float = 1e-5
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    if not self.causal:
      raise UserError("mamba2: the module is causal (MIXERS['mamba2'](causal=False) runs it both ways)")
    B, L, D = x_BxLxD.shape
    _relations(self._options(), D, True)
    H, P = heads(D, self.expand, self.headdim)
    G, N, W = self.ngroups, self.d_state, self.d_conv
    d_inner = H * P
    conv_dim = d_inner + 2 * G * N
    dtype = x_BxLxD.dtype
    real_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    u_BxLxD = jnp.where(real_BxL[..., None], x_BxLxD, 0)
    zxbcdt = nn.Dense(2 * d_inner + 2 * G * N + H, use_bias=False, kernel_init=_torch_linear_init, dtype=dtype,
                      name="in_proj")(u_BxLxD)  # fmt: skip
    z_BxLxI, xBC_BxLxE, dt_BxLxH = jnp.split(zxbcdt, [d_inner, d_inner + conv_dim], axis=-1)
    conv = ConvWeights(conv_dim, W, name="conv1d")
    kernel_WxE, bias_E = conv()
    dt_bias_H = self.param("dt_bias", self._dt_bias_init, (H,))
    A_log_H = self.param("A_log", lambda key, shape: jnp.log(jax.random.uniform(key, shape, jnp.float32, 1, 16)), (H,))
    D_H = self.param("D", nn.initializers.ones, (H,))
    norm_weight = self.param("norm", nn.initializers.ones, (d_inner,))

    xBC_BxLxE = xBC_BxLxE.astype(jnp.float32)
    state = None
    if decode:
      initialized = self.has_variable("cache", "conv_state")
      conv_state = self.variable("cache", "conv_state", jnp.zeros, (B, W - 1, conv_dim), jnp.float32)
      ssm_state = self.variable("cache", "ssm_state", jnp.zeros, (B, H, N, P), jnp.float32)
      if initialized:
        if L != 1:
          raise ValueError(f"mamba2: decoding takes one position at a time, got {L}")
        window_BxWxE = jnp.concatenate([conv_state.value, xBC_BxLxE], axis=1)
        conv_state.value = jnp.where(real_BxL[:, :, None], window_BxWxE[:, 1:], conv_state.value)
        state = ssm_state.value
    if state is None:
      window_BxWxE = jnp.pad(xBC_BxLxE, [(0, 0), (W - 1, 0), (0, 0)])
    xBC_BxLxE = jax.nn.silu(sum(kernel_WxE[w] * window_BxWxE[:, w : w + L] for w in range(W)) + bias_E)
    x_BxLxI, B_BxLxGN, C_BxLxGN = jnp.split(xBC_BxLxE, [d_inner, d_inner + G * N], axis=-1)
    x_BxLxHxP = x_BxLxI.reshape(B, L, H, P)
    group = lambda a: jnp.repeat(a.reshape(B, L, G, N), H // G, axis=2)  # head h reads group h // (H / G)
    delta_BxLxH = jax.nn.softplus(dt_BxLxH.astype(jnp.float32) + dt_bias_H)
    g_BxLxH = delta_BxLxH * -jnp.exp(A_log_H)
    v_BxLxHxP = delta_BxLxH[..., None] * x_BxLxHxP
    if state is not None:
      y_BxHxP, ssm_state.value = recurrence.gated_recurrence_step(
        state, group(C_BxLxGN)[:, 0], group(B_BxLxGN)[:, 0], v_BxLxHxP[:, 0], g_BxLxH[:, 0], real_BxL[:, 0]
      )
      y_BxLxHxP = y_BxHxP[:, None]
    else:
      y_BxLxHxP, _ = recurrence.chunked_gated_recurrence(  # B and C per group: their products once per group
        C_BxLxGN.reshape(B, L, G, N),
        B_BxLxGN.reshape(B, L, G, N),
        v_BxLxHxP,
        g_BxLxH,
        chunk=self.chunk,
        real_BxL=real_BxL,
      )
    y_BxLxI = (y_BxLxHxP + D_H[:, None] * x_BxLxHxP).reshape(B, L, d_inner)
    gated_BxLxGxQ = (y_BxLxI * jax.nn.silu(z_BxLxI.astype(jnp.float32))).reshape(B, L, G, d_inner // G)
    normed = gated_BxLxGxQ * jax.lax.rsqrt(jnp.mean(gated_BxLxGxQ**2, axis=-1, keepdims=True) + self.norm_eps)
    out_BxLxI = (normed.reshape(B, L, d_inner) * norm_weight).astype(dtype)
    return nn.Dense(D, use_bias=False, kernel_init=_torch_linear_init, dtype=dtype, name="out_proj")(out_BxLxI)

  def _options(self) -> dict[str, Any]:
    return {name: getattr(self, name) for name in SPEC_OPTIONS}

  def _dt_bias_init(self, key, shape):
    lo, hi = math.log(self.dt_min), math.log(self.dt_max)
    dt = jnp.maximum(jnp.exp(jax.random.uniform(key, shape, jnp.float32, lo, hi)), 1e-4)
    return dt + jnp.log(-jnp.expm1(-dt))  # the inverse of softplus


class ConvWeights(nn.Module):
  """The depthwise convolution's weights: kernel d_conv × channels (tap w multiplies the input d_conv − 1 − w
  positions back, torch's Conv1d weight[:, 0, w]) and bias, both U(±1/√d_conv) as torch's Conv1d initialises them."""

  features: int
  width: int

  @nn.compact
  def __call__(self):
    bound = 1.0 / math.sqrt(self.width)
    return (
      self.param("kernel", _uniform(bound), (self.width, self.features)),
      self.param("bias", _uniform(bound), (self.features,)),
    )


SPEC_OPTIONS = ("d_state", "d_conv", "expand", "headdim", "ngroups", "dt_min", "dt_max", "chunk", "norm_eps")


def _relations(options: dict[str, Any], d_model: int | None, causal: bool) -> None:
  del causal
  if options["dt_min"] > options["dt_max"]:
    raise UserError(
      f"config.mixer.dt_min={options['dt_min']!r} must not exceed config.mixer.dt_max={options['dt_max']!r} "
      "(mixer 'mamba2')"
    )
  if d_model is None:
    return
  H, P = heads(d_model, options["expand"], options["headdim"])
  if H * P != options["expand"] * d_model:
    raise UserError(
      f"mixer 'mamba2': expand·d_model = {options['expand']}·{d_model} must be divisible by config.mixer.headdim="
      f"{options['headdim']} (the heads' width)"
    )
  if H % options["ngroups"]:
    raise UserError(
      f"mixer 'mamba2': its {H} heads (expand·d_model / headdim) must be divisible by config.mixer.ngroups="
      f"{options['ngroups']}"
    )


SPEC = MixerSpec(
  Mamba2,
  "Mamba-2 SSD (mamba_ssm's Mamba2): conv + SiLU, per-head scalar-decay SSM state, gated RMSNorm; "
  "O(L·d·d_state); decode state expand·d·d_state + conv",
  bidirectional_by_reversal=True,
  can_decode=True,
  relations=_relations,
  options={
    "d_state": Field("SSM state size N per group (B and C widths)", at_least=1),
    "d_conv": Field("width of the causal depthwise convolution", at_least=1),
    "expand": Field("d_inner = expand·d_model", at_least=1),
    "headdim": Field(
      "channels per head (a width expand·d_model below it is one head of that width); must divide expand·d_model",
      at_least=1,
    ),
    "ngroups": Field("groups of heads sharing B and C; must divide the heads", at_least=1),
    "dt_min": Field("smallest initial step Δ (log-uniform in [dt_min, dt_max])", above=0),
    "dt_max": Field("largest initial step Δ", above=0),
    "chunk": Field("positions per chunk of the chunked recurrence (the reference's chunk_size)", at_least=1),
    "norm_eps": Field(
      "eps of the gated RMSNorm before out_proj (the reference's 1e-5; HF checkpoints: layer_norm_epsilon)", above=0
    ),
  },
)

"""Gated DeltaNet (Yang et al., 2025) as fla builds it (fla/layers/gated_deltanet.py, GatedDeltaNet with its
defaults: short convolutions, the gate computed in the kernel, β = σ(b), L2-normalised q and k):

    q, k, v = SiLU(ShortConv(W_q x)), SiLU(ShortConv(W_k x)), SiLU(ShortConv(W_v x))    (heads; k, q L2-normalised)
    β_t = σ(W_b x_t),   g_t = −exp(A_log) · softplus(W_a x_t + dt_bias)                   (per head)
    S_t = exp(g_t) S_{t−1};  S_t = S_t + k_t β_t (v_t − S_tᵀ k_t)ᵀ;  o_t = S_tᵀ q_t / √K   (efftx.mixers.recurrence)
    y = W_o (RMSNorm(o) ⊙ SiLU(W_g x))                                                     (per head, gated norm)

`gate=False` drops the decay (g = 0, no W_a, A_log, dt_bias): DeltaNet's delta rule in the same layer. Keys and
queries have d_model / num_heads channels per head, values expand_v times that (fla's head_v_dim =
head_dim · expand_v). Causal only. The recurrence runs chunked (`chunk` positions, a triangular solve inside, a
scan across) in float32; the projections in the input's dtype. Padded positions enter the convolutions as zeros
and neither write to nor decay the state. Decoding: the three convolutions' last conv_size − 1 inputs and the
H×K×V state, constant in the position. A_log and dt_bias are not weight-decayed (fla marks them _no_weight_decay).
Derivation and reference lines: efftx/mixers/README.md#gated_deltanet.
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
from efftx.mixers.conv import ShortConv
from efftx.mixers.spec import MixerSpec

DT_MIN, DT_MAX, DT_FLOOR = 0.001, 0.1, 1e-4  # fla's hard-coded dt initialisation
L2_EPS = 1e-6  # fla.modules.l2norm's eps: x / sqrt(Σ x² + eps)


def _a_log_init(key, shape, dtype=jnp.float32):
  """log A, A ~ U(0, 16) (fla's A_log)."""
  return jnp.log(jax.random.uniform(key, shape, dtype, 0.0, 16.0))


def _dt_bias_init(key, shape, dtype=jnp.float32):
  """softplus⁻¹(dt), dt log-uniform in [DT_MIN, DT_MAX] clamped at DT_FLOOR (fla's dt_bias)."""
  u = jax.random.uniform(key, shape, dtype)
  dt = jnp.maximum(jnp.exp(u * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN)), DT_FLOOR)
  return dt + jnp.log(-jnp.expm1(-dt))


def l2_normalize(x: jax.Array) -> jax.Array:
  """x / sqrt(Σ x² + eps) over the last axis, float32."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + L2_EPS)


def gated_rms_norm(o: jax.Array, gate: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm(o) · scale · SiLU(gate) over the last axis, float32 (fla's FusedRMSNormGated, activation swish)."""
  o = o.astype(jnp.float32)
  normed = o * jax.lax.rsqrt(jnp.mean(o * o, axis=-1, keepdims=True) + eps)
  return normed * scale * jax.nn.silu(gate.astype(jnp.float32))


class GatedDeltaNet(nn.Module):
  num_heads: int = 4
  expand_v: float = 2.0
  gate: bool = True
  conv_size: int = 4
  chunk: int = 64
  norm_eps: float = 1e-5
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    if not self.causal:
      raise UserError("gated_deltanet: the module is causal (MIXERS['gated_deltanet'](causal=False) runs it both ways)")
    B, L, D = x_BxLxD.shape
    H = self.num_heads
    if D % H:
      raise ValueError(f"gated_deltanet: d_model={D} is not divisible by num_heads={H}")
    K = D // H
    V = round(K * self.expand_v)
    if V != K * self.expand_v or V < 1:
      raise UserError(
        f"gated_deltanet: expand_v={self.expand_v} × head dim {K} = {K * self.expand_v}, not a whole number"
      )
    dtype = x_BxLxD.dtype
    real_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    dense = lambda features, name: nn.Dense(features, use_bias=False, dtype=dtype, name=name)

    def conv(name, features, a):
      y = ShortConv(features, self.conv_size, use_bias=False, name=name)(a, mask=real_BxL, decode=decode)
      return jax.nn.silu(y)

    q = conv("q_conv1d", H * K, dense(H * K, "q_proj")(x_BxLxD)).reshape(B, L, H, K)
    k = conv("k_conv1d", H * K, dense(H * K, "k_proj")(x_BxLxD)).reshape(B, L, H, K)
    v = conv("v_conv1d", H * V, dense(H * V, "v_proj")(x_BxLxD)).reshape(B, L, H, V)
    q = l2_normalize(q) * K**-0.5  # fla's default scale, applied in the kernel
    k = l2_normalize(k)
    beta_BxLxH = jax.nn.sigmoid(dense(H, "b_proj")(x_BxLxD).astype(jnp.float32))
    g_BxLxH = None
    if self.gate:
      A_log_H = self.param("A_log", _a_log_init, (H,))
      dt_bias_H = self.param("dt_bias", _dt_bias_init, (H,))
      a_BxLxH = dense(H, "a_proj")(x_BxLxD).astype(jnp.float32)
      g_BxLxH = -jnp.exp(A_log_H) * jax.nn.softplus(a_BxLxH + dt_bias_H)

    o = None
    if decode:
      initialized = self.has_variable("cache", "state")
      state = self.variable("cache", "state", jnp.zeros, (B, H, K, V), jnp.float32)
      if initialized:
        if L != 1:
          raise ValueError(f"{type(self).__name__}: decoding takes one position at a time, got {L}")
        g_BxH = None if g_BxLxH is None else g_BxLxH[:, 0]
        o_BxHxV, state.value = recurrence.delta_rule_step(
          state.value, q[:, 0], k[:, 0], v[:, 0], beta_BxLxH[:, 0], g_BxH, real_BxL[:, 0]
        )
        o = o_BxHxV[:, None]
    if o is None:
      o, _ = recurrence.chunked_delta_rule(q, k, v, beta_BxLxH, g_BxLxH, chunk=self.chunk, real_BxL=real_BxL)
    scale_V = self.param("norm_scale", nn.initializers.ones, (V,))
    gate = dense(H * V, "g_proj")(x_BxLxD).reshape(B, L, H, V)
    o = gated_rms_norm(o, gate, scale_V, self.norm_eps).reshape(B, L, H * V)
    return dense(D, "o_proj")(o.astype(dtype))


def _relations(options: dict[str, Any], d_model: int | None, causal: bool) -> None:
  del causal
  if d_model is not None:
    head = d_model // options["num_heads"]
    if head * options["expand_v"] != round(head * options["expand_v"]):
      raise UserError(
        f"config.mixer.expand_v={options['expand_v']!r} × the head dim {head} (d_model {d_model} / num_heads "
        f"{options['num_heads']}) must be a whole number (mixer 'gated_deltanet')"
      )


SPEC = MixerSpec(
  GatedDeltaNet,
  "Gated DeltaNet (fla's): short convs, L2-normed q, k, gated delta rule per head, gated RMSNorm; O(L·d²/heads), "
  "chunked; decode state expand_v·d²/heads + convs",
  bidirectional_by_reversal=True,
  can_decode=True,
  relations=_relations,
  options={
    "num_heads": Field("heads; must divide d_model (key dim per head d_model / num_heads)", at_least=1),
    "expand_v": Field("value dim per head ÷ key dim per head (fla: 2)", above=0),
    "gate": Field("True: the decay exp(g_t) (Gated DeltaNet); False: none (DeltaNet's delta rule)"),
    "conv_size": Field("taps of the short causal convolutions on q, k and v (fla: 4)", at_least=1),
    "chunk": Field("positions per chunk of the recurrence (a triangular solve inside, a scan across)", at_least=1),
    "norm_eps": Field("eps of the output's gated RMSNorm", above=0),
  },
)

"""Retention (Sun et al., 2023) as fla builds it (fla/layers/multiscale_retention.py, MultiScaleRetention with its
defaults: expand_k 1, expand_v 2, rotary q and k without xPos, no short convolution, a swish output gate fused with
a per-head RMSNorm):

    q, k = RoPE(W_q x), RoPE(W_k x)     (heads of K = d_model / num_heads channels; rotary base 10,000, halves)
    o_t  = Σ_{s≤t} γ_h^{t−s} (q_t · k_s / √K) v_s,   γ_h = 1 − 2^(−5−h)      (fla/ops/retention/naive.py)
    y    = W_o (RMSNorm(o) ⊙ SiLU(W_g x))                                      (per head of V = expand_v · K)

The sum is efftx.mixers.recurrence.chunked_gated_recurrence with the constant log-decay g = log γ_h per head:
S_t = γ_h S_{t−1} + k_t v_tᵀ, o_t = S_tᵀ q_t / √K, float32, chunked (quadratic inside `chunk` positions, a scan
across). Causal only. Rotary positions count real tokens (fla unpads), so padding at either end changes nothing
at real positions. Decoding: the H×K×V state and the number of real tokens seen, constant in the position.
Derivation and reference lines: efftx/mixers/README.md#retnet.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import recurrence
from efftx.mixers.gated_deltanet import gated_rms_norm
from efftx.mixers.spec import MixerSpec

ROPE_BASE = 10000.0  # fla.modules.rotary.RotaryEmbedding's base


def log_decays(num_heads: int) -> np.ndarray:
  """log γ_h = log(1 − 2^(−5−h)) per head, float32."""
  return np.log1p(-(2.0 ** (-5.0 - np.arange(num_heads)))).astype(np.float32)


def rotary(x_BxLxHxK: jax.Array, positions_BxL: jax.Array) -> jax.Array:
  """x cos θ + rotate_half(x) sin θ, θ = position · base^(−2i/K) on the two halves (rotate_half(x) = [−x₂, x₁]),
  float32 (fla's rotary_embedding_ref, not interleaved)."""
  K = x_BxLxHxK.shape[-1]
  inv_freq = 1.0 / ROPE_BASE ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K)
  angle_BxLxK = positions_BxL.astype(jnp.float32)[..., None] * jnp.concatenate([inv_freq, inv_freq])
  cos, sin = jnp.cos(angle_BxLxK)[:, :, None], jnp.sin(angle_BxLxK)[:, :, None]
  x = x_BxLxHxK.astype(jnp.float32)
  x1, x2 = x[..., : K // 2], x[..., K // 2 :]
  return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


class Retention(nn.Module):
  num_heads: int = 4
  expand_v: float = 2.0
  chunk: int = 64
  norm_eps: float = 1e-5
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    if not self.causal:
      raise UserError("retnet: the module is causal (MIXERS['retnet'](causal=False) runs it both ways)")
    B, L, D = x_BxLxD.shape
    H = self.num_heads
    if D % H:
      raise ValueError(f"retnet: d_model={D} is not divisible by num_heads={H}")
    K = D // H
    V = round(K * self.expand_v)
    if K % 2 or V != K * self.expand_v or V < 1:
      raise UserError(f"retnet: head dim {K} must be even (rotary) and expand_v={self.expand_v} × {K} a whole number")
    dtype = x_BxLxD.dtype
    real_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    dense = lambda features, name: nn.Dense(features, use_bias=False, dtype=dtype, name=name)
    q = dense(H * K, "q_proj")(x_BxLxD).reshape(B, L, H, K)
    k = dense(H * K, "k_proj")(x_BxLxD).reshape(B, L, H, K)
    v = dense(H * V, "v_proj")(x_BxLxD).reshape(B, L, H, V)
    seen_B = jnp.zeros((B,), jnp.int32)  # real tokens before this call (decoding)
    cached = None
    if decode:
      initialized = self.has_variable("cache", "state")
      state = self.variable("cache", "state", jnp.zeros, (B, H, K, V), jnp.float32)
      seen = self.variable("cache", "seen", jnp.zeros, (B,), jnp.int32)
      if initialized:
        if L != 1:
          raise ValueError(f"{type(self).__name__}: decoding takes one position at a time, got {L}")
        cached, seen_B = state, seen.value
        seen.value = seen.value + real_BxL[:, 0].astype(jnp.int32)
    positions_BxL = seen_B[:, None] + jnp.cumsum(real_BxL, axis=1, dtype=jnp.int32) - 1  # real tokens before each
    q = rotary(q, positions_BxL) * K**-0.5
    k = rotary(k, positions_BxL)
    g_H = jnp.asarray(log_decays(H))
    if cached is not None:
      o_BxHxV, cached.value = recurrence.gated_recurrence_step(
        cached.value, q[:, 0], k[:, 0], v[:, 0], jnp.broadcast_to(g_H, (B, H)), real_BxL[:, 0]
      )
      o = o_BxHxV[:, None]
    else:
      g_BxLxH = jnp.broadcast_to(g_H, (B, L, H))
      o, _ = recurrence.chunked_gated_recurrence(q, k, v, g_BxLxH, chunk=self.chunk, real_BxL=real_BxL)
    scale_V = self.param("norm_scale", nn.initializers.ones, (V,))
    gate = dense(H * V, "g_proj")(x_BxLxD).reshape(B, L, H, V)
    o = gated_rms_norm(o, gate, scale_V, self.norm_eps).reshape(B, L, H * V)
    return dense(D, "o_proj")(o.astype(dtype))


def _relations(options: dict[str, Any], d_model: int | None, causal: bool) -> None:
  del causal
  if d_model is not None:
    head = d_model // options["num_heads"]
    if head % 2:
      raise UserError(
        f"config.model.d_model={d_model} / config.mixer.num_heads={options['num_heads']} = {head}: mixer 'retnet' "
        "needs an even head dim (rotary rotates pairs of channels)"
      )
    if head * options["expand_v"] != round(head * options["expand_v"]):
      raise UserError(
        f"config.mixer.expand_v={options['expand_v']!r} × the head dim {head} must be a whole number (mixer 'retnet')"
      )


SPEC = MixerSpec(
  Retention,
  "RetNet multi-scale retention (fla's): rotary q, k, fixed decay 1 − 2^(−5−h) per head, swish-gated RMSNorm; "
  "O(L·d²/heads), chunked; decode state expand_v·d²/heads",
  bidirectional_by_reversal=True,
  can_decode=True,
  relations=_relations,
  options={
    "num_heads": Field("heads, each with its own decay; must divide d_model into even head dims", at_least=1),
    "expand_v": Field("value dim per head ÷ key dim per head (fla: 2)", above=0),
    "chunk": Field("positions per chunk of the recurrence (quadratic inside, a scan across)", at_least=1),
    "norm_eps": Field("eps of the output's gated RMSNorm", above=0),
  },
)

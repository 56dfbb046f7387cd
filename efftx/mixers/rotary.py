"""Rotary position embedding (RoPE; Su et al., RoFormer, 2021), in the rotate-half convention of GPT-NeoX and Llama
(transformers' `rotate_half` / `apply_rotary_pos_emb`): feature i of a head of width K is paired with feature
i + K/2, and the pair at position m is rotated by the angle m·θ_i, θ_i = base^(−2i/K). Applied to queries and keys
per head before their scores, q_m·k_n then depends on m and n only through n − m.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

BASE = 10_000.0


def rotate(x_BxLxHxK: jax.Array, positions_L: jax.Array, base: float = BASE) -> jax.Array:
  """x·cos(mθ) + rotate_half(x)·sin(mθ) at the positions m = positions_L (absolute indices), computed in float32
  and returned in x's dtype; rotate_half(x) = (−x₂, x₁) for the halves x = (x₁, x₂) of each head."""
  K = x_BxLxHxK.shape[-1]
  if K % 2:
    raise ValueError(f"rotary positions rotate pairs of features: the head width {K} must be even")
  inv_freq_J = 1.0 / (base ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K))  # J = K/2 frequencies
  angles_LxJ = positions_L.astype(jnp.float32)[:, None] * inv_freq_J[None, :]
  angles_Lx1xK = jnp.concatenate([angles_LxJ, angles_LxJ], axis=-1)[:, None, :]
  x32 = x_BxLxHxK.astype(jnp.float32)
  x1, x2 = jnp.split(x32, 2, axis=-1)
  rotated_BxLxHxK = jnp.concatenate([-x2, x1], axis=-1)
  return (x32 * jnp.cos(angles_Lx1xK) + rotated_BxLxHxK * jnp.sin(angles_Lx1xK)).astype(x_BxLxHxK.dtype)

"""Linear recurrences over the positions with a matrix state, shared by the recurrent mixers.

- `chunked_delta_rule` / `delta_rule_step`: the (gated) delta rule of DeltaNet and Gated DeltaNet (Yang et al.,
  2024; 2025), per head with a K×V state S:

      S_t = exp(g_t) S_{t−1};   S_t = S_t + k_t β_t (v_t − S_tᵀ k_t)ᵀ;   y_t = S_tᵀ q_t

  (g = None: no decay, DeltaNet). The chunked form is the WY/UT one of fla's chunk_gated_delta_rule: inside a
  chunk the writes solve a unit lower-triangular system in float32 (jax.scipy.linalg.solve_triangular), across
  chunks one jax.lax.scan carries S. Derivation: efftx/mixers/README.md#gated_deltanet.

States, decays and the intra-chunk products are float32 whatever the inputs' dtype; every exponent is a masked
segment sum of g ≤ 0 (masked before exp), so no exp overflows and no gradient meets inf·0. Padded positions
(real False) neither write nor decay (β → 0, g → 0): padding at either end changes nothing at real positions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _chunks(a: jax.Array, chunk: int) -> jax.Array:
  """B×L×… → B×N×chunk×… (N = ⌈L / chunk⌉), zeros after the end."""
  L = a.shape[1]
  n = -(-L // chunk)
  a = jnp.pad(a, [(0, 0), (0, n * chunk - L)] + [(0, 0)] * (a.ndim - 2))
  return a.reshape(a.shape[0], n, chunk, *a.shape[2:])


def chunked_delta_rule(
  q_BxLxHxK: jax.Array,
  k_BxLxHxK: jax.Array,
  v_BxLxHxV: jax.Array,
  beta_BxLxH: jax.Array,
  g_BxLxH: jax.Array | None = None,
  *,
  chunk: int,
  real_BxL: jax.Array | None = None,
  state_BxHxKxV: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """y_t = S_tᵀ q_t of the (gated) delta rule at every position, and the state after the last: (B×L×H×V, B×H×K×V),
  float32. g: log-decay ≤ 0 per head and position (None: no decay); chunk: positions per chunk (any, it need not
  divide L); state: the state before the first position (None: zeros)."""
  B, L, H, K = k_BxLxHxK.shape
  V = v_BxLxHxV.shape[-1]
  chunk = min(chunk, L)  # no work on padding beyond the sequence
  f32 = lambda a: a.astype(jnp.float32)
  beta_BxLxH = f32(beta_BxLxH)
  g_BxLxH = jnp.zeros((B, L, H), jnp.float32) if g_BxLxH is None else f32(g_BxLxH)
  if real_BxL is not None:
    beta_BxLxH = jnp.where(real_BxL[..., None], beta_BxLxH, 0.0)
    g_BxLxH = jnp.where(real_BxL[..., None], g_BxLxH, 0.0)
  # Heads before positions: B×N×H×C×… (the padding after L: β = 0, g = 0, no write, no decay).
  heads = lambda a: jnp.moveaxis(_chunks(f32(a), chunk), 3, 2)
  q, k, v = heads(q_BxLxHxK), heads(k_BxLxHxK), heads(v_BxLxHxV)
  beta, g = heads(beta_BxLxH), heads(g_BxLxH)  # B×N×H×C
  C = chunk
  G = jnp.cumsum(g, axis=-1)  # log of the decay from the chunk's start to each position (≤ 0)
  causal_CxC = jnp.tril(jnp.ones((C, C), bool))
  # exp(G_t − G_s) for s ≤ t, 0 above the diagonal: masked before exp (G_t − G_s > 0 there, possibly huge).
  decay = jnp.exp(jnp.where(causal_CxC, G[..., :, None] - G[..., None, :], -jnp.inf))  # B×N×H×C×C
  kk = jnp.einsum("bnhsk,bnhrk->bnhsr", k, k)
  # The writes u_s = β_s (v_s − e^{G_s} S_0ᵀ k_s − Σ_{r<s} e^{G_s − G_r} (k_s·k_r) u_r): (I + A) U = β V − β e^G K S_0.
  A = jnp.where(jnp.tril(causal_CxC, -1), beta[..., None] * kk * decay, 0.0)
  system = A + jnp.eye(C, dtype=jnp.float32)
  solve = lambda rhs: jax.scipy.linalg.solve_triangular(system, rhs, lower=True, unit_diagonal=True)
  u0 = solve(beta[..., None] * v)  # B×N×H×C×V: the writes from a zero state
  w = solve((beta * jnp.exp(G))[..., None] * k)  # B×N×H×C×K: U = u0 − w S_0
  qk = jnp.einsum("bnhtk,bnhsk->bnhts", q, k) * decay  # the intra-chunk weights, 0 above the diagonal
  q_decayed = q * jnp.exp(G)[..., None]
  G_last = G[..., -1]  # B×N×H
  k_to_end = k * jnp.exp(G_last[..., None] - G)[..., None]  # each key decayed to the chunk's end

  def step(S_BxHxKxV, xs):
    u0, w, qk, q_decayed, k_to_end, G_last = xs
    u = u0 - jnp.einsum("bhck,bhkv->bhcv", w, S_BxHxKxV)
    y = jnp.einsum("bhck,bhkv->bhcv", q_decayed, S_BxHxKxV) + jnp.einsum("bhts,bhsv->bhtv", qk, u)
    S = jnp.exp(G_last)[..., None, None] * S_BxHxKxV + jnp.einsum("bhck,bhcv->bhkv", k_to_end, u)
    return S, y

  S0 = jnp.zeros((B, H, K, V), jnp.float32) if state_BxHxKxV is None else f32(state_BxHxKxV)
  by_chunk = lambda a: jnp.moveaxis(a, 1, 0)
  S, y_NxBxHxCxV = jax.lax.scan(step, S0, tuple(map(by_chunk, (u0, w, qk, q_decayed, k_to_end, G_last))))
  y_BxLxHxV = jnp.moveaxis(y_NxBxHxCxV, 3, 2).transpose(1, 0, 2, 3, 4).reshape(B, -1, H, V)[:, :L]
  return y_BxLxHxV, S


def delta_rule_step(
  state_BxHxKxV: jax.Array,
  q_BxHxK: jax.Array,
  k_BxHxK: jax.Array,
  v_BxHxV: jax.Array,
  beta_BxH: jax.Array,
  g_BxH: jax.Array | None = None,
  real_B: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """One position of the (gated) delta rule, float32: (y_BxHxV, the state after it). A padded position (real
  False) leaves the state as it was."""
  f32 = lambda a: a.astype(jnp.float32)
  q, k, v, beta = f32(q_BxHxK), f32(k_BxHxK), f32(v_BxHxV), f32(beta_BxH)
  S = f32(state_BxHxKxV)
  if g_BxH is not None:
    S = jnp.exp(f32(g_BxH))[..., None, None] * S
  delta_BxHxV = beta[..., None] * (v - jnp.einsum("bhkv,bhk->bhv", S, k))
  S = S + k[..., :, None] * delta_BxHxV[..., None, :]
  if real_B is not None:
    S = jnp.where(real_B[:, None, None, None], S, f32(state_BxHxKxV))
  return jnp.einsum("bhkv,bhk->bhv", S, q), S

"""Linear recurrences over the positions with a matrix state, chunked for training and stepped for decoding (a
library for the recurrent mixers). Per head, with a K×V state S (the current token included):

- `chunked_gated_recurrence` / `gated_recurrence_step`: S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ, y_t = S_tᵀ q_t,
  g a log-decay ≤ 0, either one scalar per head (B×L×H: Mamba-2, RetNet) or one per key channel (B×L×H×K: GLA).
  Quadratic within a chunk, the K×V state carried across chunks (jax.lax.scan). Derivation:
  efftx/mixers/README.md#recurrence.
- `chunked_delta_rule` / `delta_rule_step`: the (gated) delta rule of DeltaNet and Gated DeltaNet (Yang et al.,
  2024; 2025): S_t = exp(g_t) S_{t−1}; S_t = S_t + k_t β_t (v_t − S_tᵀ k_t)ᵀ; y_t = S_tᵀ q_t (g = None: no decay,
  DeltaNet). The chunked form is the WY/UT one of fla's chunk_gated_delta_rule: inside a chunk the writes solve a
  unit lower-triangular system in float32 (jax.scipy.linalg.solve_triangular), across chunks one jax.lax.scan
  carries S. Derivation: efftx/mixers/README.md#gated_deltanet.

States, decays and the intra-chunk products are float32 whatever the inputs' dtype; every exponent is a masked
segment sum of g ≤ 0 (masked before exp), so strong decays underflow to their true ~0, nothing overflows, and no
gradient meets inf·0. Padded positions (real False) neither write nor decay, so padding at either end changes
nothing at real positions.
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


SUB_CHUNK = 16  # per-key decays: positions per sub-chunk (flash-linear-attention's chunk_gla BC)


def _masked_inputs(k, g, real):
  """k → 0 and g → 0 at padded positions (real False); g to float32."""
  g = g.astype(jnp.float32)
  if real is None:
    return k, g
  real = real.astype(bool)
  k = jnp.where(real.reshape(real.shape + (1,) * (k.ndim - real.ndim)), k, 0)
  g = jnp.where(real.reshape(real.shape + (1,) * (g.ndim - real.ndim)), g, 0.0)
  return k, g


def _lower(n: int, strict: bool = False) -> jax.Array:
  return jnp.tril(jnp.ones((n, n), bool), -1 if strict else 0)


def _segsum(x):
  """seg[..., i, j] = Σ_{j<m≤i} x_m for j ≤ i, −inf above: each entry a sum of its own terms (no difference of
  cumulative sums, whose rounding is that of the whole chunk's), masked before anything exponentiates it."""
  n = x.shape[-1]
  terms = jnp.where(_lower(n, strict=True), jnp.broadcast_to(x[..., :, None], x.shape + (n,)), 0.0)  # [m, j]: m > j
  return jnp.where(_lower(n), jnp.cumsum(terms, axis=-2), -jnp.inf)


def _suffix(x, axis):
  """Σ_{m>j} x_m along axis (exclusive), summed from the end."""
  total = jnp.flip(jnp.cumsum(jnp.flip(x, axis), axis), axis)
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, 1)
  return jax.lax.slice_in_dim(jnp.pad(total, pad), 1, x.shape[axis] + 1, axis=axis)


def _scalar_scores(q, k, g):
  """Within each chunk, Σ_k q_ik k_jk exp(Σ_{j<m≤i} g_m) for j ≤ i, 0 above: q, k ...×C×G×K (G groups of heads
  sharing q and k, G dividing H), g ...×C×H → ...×H×C×C. The products q·k are computed once per group."""
  H, G = g.shape[-1], q.shape[-2]
  decay = jnp.exp(_segsum(g.swapaxes(-1, -2)))  # ...×H×C(i)×C(j); exp(−inf) = 0 above the diagonal
  qk = jnp.einsum("...igk,...jgk->...gij", q, k)
  return (jnp.repeat(qk, H // G, axis=-3) if G != H else qk) * decay


def _vector_scores(q, k, g, sub: int):
  """The same with per-key decays (g ...×C×H×K), through sub-chunks of `sub` positions. Within a sub-chunk the
  decays per (i, j, key) are exponentiated after masking; between sub-chunks b < a they factor through r, the last
  position before sub-chunk a: q_i exp(Σ_{r<m≤i} g_m) · k_j exp(Σ_{j<m≤r} g_m), both exponents ≤ 0, the second
  the suffix of j's sub-chunk plus the totals of the sub-chunks between."""
  *lead, C, H, K = q.shape
  n = C // sub
  qs, ks, gs = (a.reshape(*lead, n, sub, H, K) for a in (q, k, g))
  # Diagonal blocks: ...×n×H×K×i×j decays.
  diag_decay = jnp.exp(_segsum(jnp.moveaxis(gs, -3, -1)))
  diag = jnp.einsum("...aihk,...ajhk,...ahkij->...ahij", qs, ks, diag_decay)
  # Off-diagonal blocks: query sub-chunk a, every key j of the chunk, kept where j's sub-chunk b < a.
  q_rel = qs * jnp.exp(jnp.cumsum(gs, axis=-3))  # Σ_{r<m≤i} g_m
  totals = jnp.moveaxis(gs.sum(-3), -3, -1)  # ...×H×K×n
  between = _segsum(totals)  # [c, b]: Σ_{b<m≤c} totals_m, −inf for b > c
  between = jnp.concatenate([jnp.full_like(between[..., :1, :], -jnp.inf), between[..., :-1, :]], axis=-2)  # c = a − 1
  between = jnp.where(_lower(n, strict=True), between, -jnp.inf)  # [a, b]: b < a only
  suffix = jnp.moveaxis(_suffix(gs, -3), (-2, -1), (-4, -3))  # ...×H×K×b×S
  rel = (between[..., :, :, None] + suffix[..., None, :, :]).reshape(*lead, H, K, n, C)  # ...×H×K×a×j
  k_rel = k[..., None, :, :, :] * jnp.exp(jnp.moveaxis(rel, (-4, -3), (-2, -1)))  # ...×a×C×H×K; 0 for b ≥ a
  off = jnp.einsum("...aihk,...ajhk->...haij", q_rel, k_rel).reshape(*lead, H, C, C)
  diag = jnp.broadcast_to(jnp.moveaxis(diag, -4, -3)[..., :, :, None, :], (*lead, H, n, sub, n, sub))
  same = (jnp.arange(C)[:, None] // sub) == (jnp.arange(C)[None, :] // sub)  # C×C: i and j in one sub-chunk
  scores = jnp.where(same, diag.reshape(*lead, H, C, C), off)  # off is 0 on those blocks
  return scores.reshape(*lead, H, C, C)


def chunked_gated_recurrence(q_BxLxHxK, k_BxLxHxK, v_BxLxHxV, g, *, chunk: int, real_BxL=None, state_BxHxKxV=None):
  """y_t = S_tᵀ q_t at every position and the state after the last: (y_BxLxHxV, final_state_BxHxKxV), float32.
  g: B×L×H (a decay per head) or B×L×H×K (per key channel), log-decays ≤ 0; real_BxL: False at padding (neither
  writes nor decays); state_BxHxKxV: the state before position 0 (zeros if None). Chunks of min(chunk, L)
  positions (per-key decays: rounded up to whole sub-chunks of 16); L need not be a multiple. With a per-head decay,
  q and k may have G < H heads (B×L×G×K, G dividing H): head h reads group h // (H / G), as Mamba-2's heads share
  B and C, and the chunks' q·k products are computed once per group."""
  B, L, G, K = q_BxLxHxK.shape
  H, V = v_BxLxHxV.shape[-2:]
  vector = g.ndim == 4
  if H % G or (vector and G != H):
    raise ValueError(f"chunked_gated_recurrence: q and k have {G} heads, v has {H} (per-key decays: equal; else G | H)")
  q, k, v = (a.astype(jnp.float32) for a in (q_BxLxHxK, k_BxLxHxK, v_BxLxHxV))
  k, g = _masked_inputs(k, g, real_BxL)
  C = max(1, min(chunk, L))
  if vector:
    sub = min(SUB_CHUNK, C)
    C = -(-C // sub) * sub
  N = -(-L // C)
  pad = [(0, 0), (0, N * C - L)]  # padded positions at the end: g = 0, k = 0, as masked ones
  q, k, v, g = (jnp.pad(a, pad + [(0, 0)] * (a.ndim - 2)) for a in (q, k, v, g))
  q, k, v, g = (a.reshape(B, N, C, *a.shape[2:]) for a in (q, k, v, g))
  gk = g if vector else g[..., None]  # B×N×C×H×(K or 1)
  scores_BxNxHxCxC = _vector_scores(q, k, g, sub) if vector else _scalar_scores(q, k, g)
  if G != H:  # the rest is per head: the decays differ
    q, k = (jnp.repeat(a, H // G, axis=3) for a in (q, k))
  y_intra = jnp.einsum("bnhij,bnjhv->bnihv", scores_BxNxHxCxC, v)
  # Each chunk's own contribution to the state at its end (decayed by the rest of the chunk, Σ_{m>j} g_m), and the
  # decay of the state across the chunk.
  written_BxNxHxKxV = jnp.einsum("bnjhk,bnjhv->bnhkv", k * jnp.exp(_suffix(gk, 2)), v)
  carried_BxNxHxK = jnp.exp(gk.sum(2)) * jnp.ones((K,), jnp.float32)

  def step(state, inputs):
    written, carried = inputs
    return carried[..., None] * state + written, state  # emits the state entering the chunk

  state0 = jnp.zeros((B, H, K, V), jnp.float32) if state_BxHxKxV is None else state_BxHxKxV.astype(jnp.float32)
  final, entering_NxBxHxKxV = jax.lax.scan(
    step, state0, (written_BxNxHxKxV.swapaxes(0, 1), carried_BxNxHxK.swapaxes(0, 1))
  )
  y_inter = jnp.einsum("bnihk,nbhkv->bnihv", q * jnp.exp(jnp.cumsum(gk, 2)), entering_NxBxHxKxV)  # Σ_{m≤i} g_m
  y = (y_intra + y_inter).reshape(B, N * C, H, V)[:, :L]
  return y, final


def gated_recurrence_step(state_BxHxKxV, q_BxHxK, k_BxHxK, v_BxHxV, g, real_B=None):
  """One position: (y_BxHxV, the new state), float32; g B×H or B×H×K; real_B False: the state is kept."""
  k, g = _masked_inputs(k_BxHxK.astype(jnp.float32), g, real_B)
  decay = jnp.exp(g if g.ndim == 3 else g[..., None])
  state = (
    decay[..., None] * state_BxHxKxV.astype(jnp.float32) + k[..., None] * v_BxHxV.astype(jnp.float32)[..., None, :]
  )
  return jnp.einsum("bhkv,bhk->bhv", state, q_BxHxK.astype(jnp.float32)), state

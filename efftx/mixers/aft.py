"""The Attention Free Transformer (Zhai et al., 2021): AFT-full, -local, -simple and -conv
(AFT-conv's module is in efftx/mixers/aft_conv.py; the machinery all four share is here). Per channel, over real
positions (t' ≤ t when causal), x_BxLxD → Y_BxLxD in x's dtype:

    Y_t = σ(Q_t) ⊙ Σ_t' exp(K_t' + w_{t,t'}) ⊙ V_t' / Σ_t' exp(K_t' + w_{t,t'})

w: learned for every pair (full), inside a window and 0 outside (local), none (simple), a kernel over t − t' (conv).
Sums in float32 after subtracting maxima of K and w: no overflow. Causal, causal_sums "stable" loses less than
e^{−87 + ρ} of a row's sum (ρ: w's range within the row), "global" nothing float32 keeps while the key spread plus
ρ is ≤ Δ(L) ≈ 70 − ln L, "auto" takes global within that. Time: AFT-full O(L²d) with O(Ld) memory, AFT-simple
O(Ld), AFT-local and -conv O(L·s·d) (s: window, kernel). The paper's formula: tests/test_aft.py. Derivation and
bounds: efftx/mixers/README.md#aft
"""

from __future__ import annotations

from collections.abc import Callable
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import banded
from efftx.mixers import cache
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import padded


def _project(x_BxLxD: jax.Array, key_features: int):
  """Q, V (D channels) and K (key_features channels) in float32; created in the calling module's scope."""
  D = x_BxLxD.shape[-1]
  q = nn.Dense(D, dtype=x_BxLxD.dtype, name="query")(x_BxLxD)
  k = nn.Dense(key_features, dtype=x_BxLxD.dtype, name="key")(x_BxLxD)
  v = nn.Dense(D, dtype=x_BxLxD.dtype, name="value")(x_BxLxD)
  return q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32)


def _exp_keys(k_BxLxC: jax.Array, mask_BxL: jax.Array | None) -> jax.Array:
  """exp(K − max_t' K) per channel, 0 at padded positions."""
  valid_BxLx1 = jnp.ones(k_BxLxC.shape[:2] + (1,), bool) if mask_BxL is None else mask_BxL[:, :, None]
  k_max_Bx1xC = jnp.max(jnp.where(valid_BxLx1, k_BxLxC, -jnp.inf), axis=1, keepdims=True)
  k_max_Bx1xC = jax.lax.stop_gradient(jnp.where(jnp.isfinite(k_max_Bx1xC), k_max_Bx1xC, 0.0))
  # Masked before the exp: a padded key far above the real ones would make exp inf, and the where's zero
  # gradient times inf is nan.
  return jnp.exp(jnp.where(valid_BxLx1, k_BxLxC - k_max_Bx1xC, -jnp.inf))


def _global_sum(x_BxLxC: jax.Array) -> jax.Array:
  """Σ_t' x_t' over all positions (broadcast over t); bidirectional only."""
  return jnp.sum(x_BxLxC, axis=1, keepdims=True)


@jax.custom_jvp
def _ratio(num: jax.Array, den: jax.Array) -> jax.Array:
  """num / den, differentiated as (dnum − ratio · dden) / den: den² appears nowhere, in the value or the gradient.

  Autodiff of num / den takes den² (0 in float32 once den < ~1e-19, then inf or nan), and a stop_gradient trick,
  (num/c) / (den/c) with c = den, does not survive jit: XLA's algebraic simplifier rewrites the quotient of quotients
  into one with den·den in the divisor, so the compiled forward pass underflows where the eager one does not.
  """
  return num / den


@_ratio.defjvp
def _ratio_jvp(primals, tangents):
  num, den = primals
  dnum, dden = tangents
  ratio = num / den
  return ratio, (dnum - ratio * dden) / den


def _finish(q_BxLxD, num_BxLxD, den_BxLxD, out_dtype) -> jax.Array:
  """σ(Q) ⊙ num / den, and the output projection. A row that sees no real position (a sequence of padding only;
  causal, padding at the start) has num = den = 0: it reads 0 / 1 = 0 (not nan), with finite gradients. No floor
  on den: a real row's denominator can be as small as e^-(range of w in the row) — e^-80 where the limit below
  lies — under any fixed floor one would pick (1e-30 is e^-69)."""
  y_BxLxD = jax.nn.sigmoid(q_BxLxD) * _ratio(num_BxLxD, jnp.where(den_BxLxD > 0, den_BxLxD, 1.0))
  return nn.Dense(q_BxLxD.shape[-1], dtype=out_dtype, name="out")(y_BxLxD.astype(out_dtype))


# The causal paths: sums of e^{K_t' − m_t} X_t' with m_t = max_{t'≤t} K_t' (efftx/mixers/README.md#aft).
# A padded position's key: e^{_NO_KEY − r} is 0 for any real reference r, and 1 (times X = 0) for r = _NO_KEY,
# where −inf would give inf − inf = nan.
_NO_KEY = -1e30


def _causal_inputs(k_BxLxC: jax.Array, v_BxLxD: jax.Array, mask_BxL: jax.Array | None, T: int):
  """Keys (padding at _NO_KEY) and X = [V, 1] per key channel, B×T×C×(D/C + 1), zero at padding, so that the
  numerator and the denominator are one sum; positions L … T − 1 are added as padding."""
  B, L, C = k_BxLxC.shape
  valid_BxLx1 = jnp.ones((B, L, 1), bool) if mask_BxL is None else mask_BxL[:, :, None]
  k_BxLxC = jnp.where(valid_BxLx1, k_BxLxC, _NO_KEY)
  x_BxLxCxG = jnp.concatenate([v_BxLxD.reshape(B, L, C, -1), jnp.ones((B, L, C, 1))], axis=-1)
  x_BxLxCxG = jnp.where(valid_BxLx1[..., None], x_BxLxCxG, 0.0)
  pad = [(0, 0), (0, T - L), (0, 0)]
  return jnp.pad(k_BxLxC, pad, constant_values=_NO_KEY), jnp.pad(x_BxLxCxG, pad + [(0, 0)])


def _causal_finish(q_BxLxD, s_BxTxCxG, out_dtype) -> jax.Array:
  """Y from the sums of X = [V, 1]: the numerator is the V part, the denominator the last entry (_finish: a row
  that sees no real position, padding at the start, has num = den = 0 and reads 0)."""
  B, L, D = q_BxLxD.shape
  s_BxLxCxG = s_BxTxCxG[:, :L]
  num_BxLxD = s_BxLxCxG[..., :-1].reshape(B, L, D)
  den_BxLxD = jnp.repeat(s_BxLxCxG[..., -1], D // s_BxLxCxG.shape[2], axis=-1)  # a head's key: its channels
  return _finish(q_BxLxD, num_BxLxD, den_BxLxD, out_dtype)


@jax.checkpoint  # the backward pass recomputes the scan from K and X
def _prefix_sums(k_BxTxC: jax.Array, x_BxTxCxG: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(m, S): m_t = max_{t'≤t} K_t' and S_t = Σ_{t'≤t} e^{K_t' − m_t} X_t', per key channel.

  A parallel prefix scan whose elements carry (running max, sums rescaled to it): combining (m1, s1), (m2, s2)
  gives (M, s1 e^{m1−M} + s2 e^{m2−M}), M = max(m1, m2); both factors are ≤ 1 and the largest key keeps e^0.
  The keys enter the max as constants and the sums as e^{K − sg(K)} = 1, so the gradient is that of the sums
  with each row's reference held fixed — the ratio num/den does not depend on it (as softmax's max shift).
  """
  k_sg = jax.lax.stop_gradient(k_BxTxC)

  def combine(a, b):
    (m1, s1), (m2, s2) = a, b
    m = jnp.maximum(m1, m2)
    return m, s1 * jnp.exp(m1 - m)[..., None] + s2 * jnp.exp(m2 - m)[..., None]

  return jax.lax.associative_scan(combine, (k_sg, jnp.exp(k_BxTxC - k_sg)[..., None] * x_BxTxCxG), axis=1)


# The terms a bias weighs: Σ_{t'} A(t, t') e^{K_t' − m_t} X_t' over blocks of columns that lie wholly before
# their block of rows. A is given per block — P×R×R, shared by the channels (AFT-full, AFT-local: einsum spec
# "pqc,bpckg->bpqkg"), or R×R×C, shared by the blocks (AFT-conv: "qck,bpckg->bpqkg") — by a function
# coef(rows_PxR, cols_PxR) of numpy position indices. Each piece is recomputed in the backward pass
# (jax.checkpoint) from K, m and X, which all pieces share, so the memory kept per layer is O(T·d), not a few
# T·d per level of the hierarchy.


def _visible_sums(k_cols, x_cols, ref, m_rows, a, spec: str) -> jax.Array:
  """ref (B×P×1×C) lies between the two blocks: ≥ every column's key, ≤ every row's m. Then
  e^{K − m} = e^{K − ref} · e^{ref − m}, both factors ≤ 1, and A applies in between as one matmul per block."""
  y = jnp.exp(k_cols - ref)[..., None] * x_cols
  return jnp.exp(ref - m_rows)[..., None] * jnp.einsum(spec, a, y)


@functools.partial(jax.checkpoint, static_argnums=(4,))
def _diagonal_sums(k_BxTxC, m_BxTxC, x_BxTxCxG, a_Tx1x1, spec: str) -> jax.Array:
  """A(t, t) e^{K_t − m_t} X_t."""
  y_BxTx1xCxG = (jnp.exp(k_BxTxC - m_BxTxC)[..., None] * x_BxTxCxG)[:, :, None]
  return jnp.einsum(spec, a_Tx1x1, y_BxTx1xCxG)[:, :, 0]


@functools.partial(jax.checkpoint, static_argnums=(4, 5))
def _half_block_sums(k_BxTxC, m_BxTxC, x_BxTxCxG, a_NxRxR, R: int, spec: str) -> jax.Array:
  """In every aligned block of 2R positions, the second half's rows against all of the first half; the
  reference is the prefix max where the first half ends."""
  B, T, C = k_BxTxC.shape
  G = x_BxTxCxG.shape[-1]
  N = T // (2 * R)
  k_BxNx2xRxC, m_BxNx2xRxC = k_BxTxC.reshape(B, N, 2, R, C), m_BxTxC.reshape(B, N, 2, R, C)
  x_BxNx2xRxCxG = x_BxTxCxG.reshape(B, N, 2, R, C, G)
  z_BxNxRxCxG = _visible_sums(
    k_BxNx2xRxC[:, :, 0], x_BxNx2xRxCxG[:, :, 0], m_BxNx2xRxC[:, :, 0, -1:], m_BxNx2xRxC[:, :, 1], a_NxRxR, spec
  )
  return jnp.stack([jnp.zeros_like(z_BxNxRxCxG), z_BxNxRxCxG], axis=2).reshape(B, T, C, G)


@functools.partial(jax.checkpoint, static_argnums=(4, 5))
def _previous_block_sums(k_BxTxC, m_BxTxC, x_BxTxCxG, a_NxRxR, R: int, spec: str) -> jax.Array:
  """Every aligned block of R positions against all of the block before it (nothing for the first block)."""
  B, T, C = k_BxTxC.shape
  N = T // R

  def previous(a, fill):  # block i − 1 beside block i; an empty block before the first
    a = jnp.concatenate([jnp.full_like(a[:, :R], fill), a[:, :-R]], axis=1)
    return a.reshape((B, N, R) + a.shape[2:])

  z_BxNxRxCxG = _visible_sums(
    previous(k_BxTxC, _NO_KEY),
    previous(x_BxTxCxG, 0.0),
    previous(m_BxTxC, _NO_KEY)[:, :, -1:],
    m_BxTxC.reshape(B, N, R, C),
    a_NxRxR,
    spec,
  )
  return z_BxNxRxCxG.reshape(x_BxTxCxG.shape)


def _block_triangle_sums(k_BxTxC, m_BxTxC, x_BxTxCxG, block: int, coef, spec: str) -> jax.Array:
  """Σ_{t' ≤ t, t' in t's aligned block of `block` positions} A(t, t') e^{K_t' − m_t} X_t' (block: a power of
  two dividing T), by a binary hierarchy: for R = block/2, block/4, …, 1 the second half of every aligned
  2R-block against all of its first half, and the diagonal t' = t. About block·T/2 multiply-adds per channel
  (the triangle, not the square), in log2(block) + 1 batched matmuls."""
  T = k_BxTxC.shape[1]
  t_Tx1 = np.arange(T)[:, None]
  out_BxTxCxG = _diagonal_sums(k_BxTxC, m_BxTxC, x_BxTxCxG, coef(t_Tx1, t_Tx1), spec)
  R = block // 2
  while R:
    rows_NxR = np.arange(T // (2 * R))[:, None] * 2 * R + R + np.arange(R)
    out_BxTxCxG += _half_block_sums(k_BxTxC, m_BxTxC, x_BxTxCxG, coef(rows_NxR, rows_NxR - R), R, spec)
    R //= 2
  return out_BxTxCxG


def _next_power_of_two(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


# The global path and the choice between the two (efftx/mixers/README.md#aft).
CAUSAL_SUMS = Field(
  "causal only: stable (each row's sums relative to its prefix maximum of K: any key range), "
  "global (relative to the sequence's maximum: plain masked matmuls, faster, but a row whose keys "
  "all lie ≳87 below a later key reads 0), auto (global where it loses nothing float32 keeps, "
  "else stable)",
  choices=("auto", "stable", "global"),
)


def _global_range(n: int) -> float:
  """Δ(n) = ln(2^-24 / (2 n·tiny)): the largest (M − m_t) + ρ at which the global path's underflow moves an
  output of n terms by at most 2^-24·max|V| (tiny: float32's smallest normal)."""
  return float(np.log(2.0**-24 / (2 * n * float(np.finfo(np.float32).tiny))))


def _key_spread(k_BxLxC: jax.Array, mask_BxL: jax.Array | None) -> jax.Array:
  """max over sequences and key channels of M − (the first real key) = max_t (M − m_t) over the rows that see a
  real key; 0 for a sequence of padding only. A scalar, without gradient."""
  B, L, _ = k_BxLxC.shape
  valid_BxL = jnp.ones((B, L), bool) if mask_BxL is None else mask_BxL.astype(bool)
  k_first_BxC = k_BxLxC[jnp.arange(B), jnp.argmax(valid_BxL, axis=1)]
  k_max_BxC = jnp.max(jnp.where(valid_BxL[:, :, None], k_BxLxC, -jnp.inf), axis=1)
  spread_BxC = jnp.where(jnp.any(valid_BxL, axis=1, keepdims=True), k_max_BxC - k_first_BxC, 0.0)
  return jax.lax.stop_gradient(jnp.max(spread_BxC))


def _global_terms(k_BxTxC: jax.Array, x_BxTxCxG: jax.Array) -> jax.Array:
  """e^{K_t' − M} X_t', M the largest key per sequence and key channel (keys from _causal_inputs: 0 at
  padding; a sequence of padding only has M = _NO_KEY and X = 0)."""
  k_max_Bx1xC = jax.lax.stop_gradient(jnp.max(k_BxTxC, axis=1, keepdims=True))
  return jnp.exp(k_BxTxC - k_max_Bx1xC)[..., None] * x_BxTxCxG


def _choose_sums(
  causal_sums: str, spread: jax.Array, rho: jax.Array, n: int, global_sums: Callable, stable_sums: Callable, *operands
):
  """global_sums(*operands) or stable_sums(*operands) as causal_sums says; "auto": the global path when the key
  spread plus the bias range ρ is ≤ Δ(n), decided once for the batch by jax.lax.cond (both are compiled)."""
  if causal_sums == "global":
    return global_sums(*operands)
  if causal_sums == "stable":
    return stable_sums(*operands)
  # Each branch recomputed in the backward pass: what the cond keeps is then the operands both take, not every
  # intermediate of either (jax shares only residuals of equal shape between branches).
  return jax.lax.cond(
    spread + rho <= _global_range(n), jax.checkpoint(global_sums), jax.checkpoint(stable_sums), *operands
  )


def _decode(module: nn.Module, q_Bx1xD, k_Bx1xC, v_Bx1xD, bias_row: Callable[[jax.Array, int], jax.Array]):
  """One position against cached K and V: w_{i,t'} for t' ≤ i from bias_row(i, T) (T or T×C). None at init."""
  cached = cache.append(module, cached_key=k_Bx1xC, cached_value=v_Bx1xD)
  if cached is None:
    return None
  buffers, i = cached
  k_BxTxC, v_BxTxD = buffers["cached_key"], buffers["cached_value"]
  T, C, D = k_BxTxC.shape[1], k_BxTxC.shape[2], v_BxTxD.shape[2]
  w_TxC = bias_row(i, T).reshape(T, -1)
  past_Tx1 = (jnp.arange(T) <= i)[:, None]
  logits_BxTxC = jnp.where(past_Tx1, k_BxTxC + w_TxC, -jnp.inf)
  e_BxTxC = jnp.where(past_Tx1, jnp.exp(logits_BxTxC - logits_BxTxC.max(axis=1, keepdims=True)), 0.0)
  e_BxTxD = jnp.repeat(e_BxTxC, D // C, axis=-1)  # a head-shared key (AFT-conv) weighs its head's channels
  num_Bx1xD = jnp.sum(e_BxTxD * v_BxTxD, axis=1, keepdims=True)
  den_Bx1xD = jnp.sum(e_BxTxD, axis=1, keepdims=True)
  return num_Bx1xD, den_Bx1xD


class _PositionBias(nn.Module):
  """w ∈ R^{max_len×max_len}: factorised u vᵀ (u, v ∈ R^{max_len×d'}, init N(0, 1e-2)) or a full matrix."""

  max_len: int
  bias_dim: int
  factorized: bool

  def setup(self):
    init = nn.initializers.normal(1e-2)
    if self.factorized:
      self.u = self.param("u", init, (self.max_len, self.bias_dim))
      self.v = self.param("v", init, (self.max_len, self.bias_dim))
    else:
      self.w = self.param("w", init, (self.max_len, self.max_len))

  def parameters(self) -> tuple[jax.Array, ...]:
    """(u, v) or (w,): what dense_from takes."""
    return (self.u, self.v) if self.factorized else (self.w,)

  @staticmethod
  def dense_from(parameters: tuple[jax.Array, ...], L: int) -> jax.Array:
    """w[:L, :L] from parameters() — a pure function, for use inside jax.lax.cond's branches."""
    if len(parameters) == 2:
      u, v = parameters
      return u[:L] @ v[:L].T
    return parameters[0][:L, :L]

  def dense(self, L: int) -> jax.Array:
    """w[:L, :L]."""
    return self.dense_from(self.parameters(), L)

  def row(self, i: jax.Array, T: int) -> jax.Array:
    """w[i, :T]."""
    if self.factorized:
      return self.v[:T] @ self.u[i]
    return self.w[i, :T]

  def band(self, rows_NxB: jax.Array, cols_NxC: jax.Array) -> jax.Array:
    """w[rows_NxB[n, i], cols_NxC[n, j]] as N×B×C (indices clipped into range; the caller masks the rest)."""
    rows_NxB = jnp.clip(rows_NxB, 0, self.max_len - 1)
    cols_NxC = jnp.clip(cols_NxC, 0, self.max_len - 1)
    if self.factorized:
      return jnp.einsum("nbe,nce->nbc", self.u[rows_NxB], self.v[cols_NxC])
    return self.w[rows_NxB[:, :, None], cols_NxC[:, None, :]]


def _check_len(name: str, L: int, max_len: int) -> None:
  if L > max_len:
    raise UserError(f"{name}: sequence length {L} exceeds max_len={max_len} (the position bias's size)")


class AFTFull(nn.Module):
  """AFT-full: a learned bias for every pair of positions."""

  causal: bool = False
  max_len: int = 512  # positions the bias covers
  aft_bias_dim: int = 64  # d' of the factorised bias w = u vᵀ
  aft_factorized: bool = True  # False: a full max_len × max_len bias matrix
  causal_sums: str = "auto"  # causal: "stable", "global" or "auto" (CAUSAL_SUMS)

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    _, L, D = x_BxLxD.shape
    _check_len("aft_full", L, self.max_len)
    q, k, v = _project(x_BxLxD, D)
    bias = _PositionBias(self.max_len, self.aft_bias_dim, self.aft_factorized, name="bias")
    if decode and (sums := _decode(self, q, k, v, bias.row)) is not None:
      return _finish(q, *sums, x_BxLxD.dtype)
    w_LxL = bias.dense(L)
    allowed_LxL = jnp.tril(jnp.ones((L, L), bool)) if self.causal else jnp.ones((L, L), bool)
    w_max_Lx1 = jax.lax.stop_gradient(jnp.max(jnp.where(allowed_LxL, w_LxL, -jnp.inf), axis=1, keepdims=True))
    exp_bias = lambda w_LxL: jnp.where(allowed_LxL, jnp.exp(w_LxL - w_max_Lx1), 0.0)
    if self.causal:
      # The branches take the bias's parameters and form e^w themselves: "auto" recomputes each branch in the
      # backward pass, and then keeps u and v (max_len × d'), not an L×L array.
      def global_sums(k_BxLxD, v_BxLxD, parameters):  # the lower triangle of e^w as a square matmul
        k_BxLxD, x_BxLxDx2 = _causal_inputs(k_BxLxD, v_BxLxD, mask, L)
        ew_LxL = exp_bias(_PositionBias.dense_from(parameters, L))
        return jnp.einsum("ts,bscg->btcg", ew_LxL, _global_terms(k_BxLxD, x_BxLxDx2))

      def stable_sums(k_BxLxD, v_BxLxD, parameters):  # one hierarchy of blocks (positions padded to a power of 2)
        T = _next_power_of_two(L)
        k_BxTxD, x_BxTxDx2 = _causal_inputs(k_BxLxD, v_BxLxD, mask, T)
        m_BxTxD = jax.lax.cummax(jax.lax.stop_gradient(k_BxTxD), axis=1)
        ew_TxT = jnp.pad(exp_bias(_PositionBias.dense_from(parameters, L)), [(0, T - L), (0, T - L)])
        coef = lambda rows_PxR, cols_PxR: ew_TxT[rows_PxR[:, :, None], cols_PxR[:, None, :]]
        return _block_triangle_sums(k_BxTxD, m_BxTxD, x_BxTxDx2, T, coef, "pqc,bpckg->bpqkg")[:, :L]

      w_min_Lx1 = jnp.min(jnp.where(allowed_LxL, w_LxL, jnp.inf), axis=1, keepdims=True)
      rho = jax.lax.stop_gradient(jnp.max(w_max_Lx1 - w_min_Lx1))
      s_BxLxDx2 = _choose_sums(
        self.causal_sums, _key_spread(k, mask), rho, L, global_sums, stable_sums, k, v, bias.parameters()
      )
      return _causal_finish(q, s_BxLxDx2, x_BxLxD.dtype)

    ew_LxL = exp_bias(w_LxL)
    ek_BxLxD = _exp_keys(k, mask)
    ekv_BxLxD = ek_BxLxD * v
    num_BxLxD = jnp.einsum("ts,bsd->btd", ew_LxL, ekv_BxLxD)
    den_BxLxD = jnp.einsum("ts,bsd->btd", ew_LxL, ek_BxLxD)
    return _finish(q, num_BxLxD, den_BxLxD, x_BxLxD.dtype)


class AFTSimple(nn.Module):
  """AFT-simple: no position bias; a softmax of K over positions weights V. O(Td) time and memory."""

  causal: bool = False

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    q, k, v = _project(x_BxLxD, x_BxLxD.shape[-1])
    if decode:
      if not self.causal:
        raise UserError("aft_simple: decoding needs causal=True")
      # Running sums of e^K ⊙ V and e^K, rescaled when the running max of K grows: constant memory per step.
      initialized = self.has_variable("cache", "num")
      shape = (x_BxLxD.shape[0], 1, x_BxLxD.shape[-1])
      k_max = self.variable("cache", "k_max", lambda: jnp.full(shape, -jnp.inf))
      num = self.variable("cache", "num", jnp.zeros, shape, jnp.float32)
      den = self.variable("cache", "den", jnp.zeros, shape, jnp.float32)
      if initialized:
        new_max = jnp.maximum(k_max.value, k)
        rescale, e = jnp.exp(k_max.value - new_max), jnp.exp(k - new_max)
        num.value, den.value, k_max.value = num.value * rescale + e * v, den.value * rescale + e, new_max
        return _finish(q, num.value, den.value, x_BxLxD.dtype)
    if self.causal:
      k_BxLxD, x_BxLxDx2 = _causal_inputs(k, v, mask, x_BxLxD.shape[1])
      return _causal_finish(q, _prefix_sums(k_BxLxD, x_BxLxDx2)[1], x_BxLxD.dtype)
    ek_BxLxD = _exp_keys(k, mask)
    num_BxLxD = _global_sum(ek_BxLxD * v)
    den_BxLxD = _global_sum(ek_BxLxD)
    return _finish(q, num_BxLxD, den_BxLxD, x_BxLxD.dtype)


def _causal_local(q_BxLxD, k_BxLxD, v_BxLxD, mask_BxL, bias: _PositionBias, window: int, causal_sums: str, out_dtype):
  """Causal AFT-local: e^{-r_t} · (running sums) + Σ_{0 ≤ t − t' < window} (e^{w_tt' − r_t} − e^{-r_t}) · …, with
  r_t = max(0, the row's w in the window) as in the bidirectional path, relative to the prefix max m_t (stable) or
  to the sequence's max (global).

  Stable: the window's terms are t's own block of b ≥ window positions (b a power of two; the hierarchy) and the
  block before it (all of it before t). Global: blocks of min(window, L) rows against their own block and the
  one before, as one matmul. The correction e^{w} − 1 may be negative; the row's total weights e^{w − r}, e^{-r}
  stay positive.
  """
  B, L, D = q_BxLxD.shape
  b = _next_power_of_two(min(window, L))
  T = -(-L // b) * b
  b_global = min(window, L)
  T_global = -(-L // b_global) * b_global
  T_band = max(T, T_global)
  W = min(window, T_band)

  t_Tx1 = np.arange(T_band)[:, None]
  in_band_TxW = t_Tx1 - np.arange(W) >= 0  # entry [t, j] is t' = t − j
  w_TxW = bias.band(t_Tx1, np.maximum(t_Tx1 - np.arange(W), 0)).reshape(T_band, W)
  r_Tx1 = jax.lax.stop_gradient(
    jnp.maximum(jnp.max(jnp.where(in_band_TxW, w_TxW, -jnp.inf), axis=1, keepdims=True), 0.0)
  )
  a_TxW = jnp.where(in_band_TxW, jnp.exp(w_TxW - r_Tx1) - jnp.exp(-r_Tx1), 0.0)
  # The range of a row's weights e^{w − r} (in the window) and e^{−r} (outside): r_t − min(0, its smallest w).
  w_min_Tx1 = jnp.minimum(jnp.min(jnp.where(in_band_TxW, w_TxW, jnp.inf), axis=1, keepdims=True), 0.0)
  rho = jax.lax.stop_gradient(jnp.max((r_Tx1 - w_min_Tx1)[:L]))

  def coef(rows_PxR, cols_PxC):  # P×R×C: the band's A(t, t') for t' = t − j, 0 ≤ j < W
    j_PxRxC = rows_PxR[:, :, None] - cols_PxC[:, None, :]
    in_band = (j_PxRxC >= 0) & (j_PxRxC < W)
    return jnp.where(in_band, a_TxW[rows_PxR[:, :, None], np.clip(j_PxRxC, 0, W - 1)], 0.0)

  spec = "pqc,bpckg->bpqkg"

  def global_sums(k_BxLxD, v_BxLxD):
    k_BxTxD, x_BxTxDx2 = _causal_inputs(k_BxLxD, v_BxLxD, mask_BxL, T_global)
    y_BxTxDx2 = _global_terms(k_BxTxD, x_BxTxDx2)
    N = T_global // b_global
    rows_NxB = np.arange(T_global).reshape(N, b_global)
    y_BxNxBxDx2 = y_BxTxDx2.reshape(B, N, b_global, D, 2)
    if N > 1 and W > 1:  # the window reaches into the block before
      before_BxNxBxDx2 = jnp.concatenate([jnp.zeros_like(y_BxNxBxDx2[:, :1]), y_BxNxBxDx2[:, :-1]], axis=1)
      y_BxNxCxDx2 = jnp.concatenate([before_BxNxBxDx2, y_BxNxBxDx2], axis=2)
      cols_NxC = np.concatenate([rows_NxB - b_global, rows_NxB], axis=1)
    else:
      y_BxNxCxDx2, cols_NxC = y_BxNxBxDx2, rows_NxB
    band_BxNxBxDx2 = jnp.einsum(spec, coef(rows_NxB, cols_NxC), y_BxNxCxDx2)
    s_BxTxDx2 = jnp.exp(-r_Tx1[:T_global])[:, :, None] * jnp.cumsum(y_BxTxDx2, axis=1) + band_BxNxBxDx2.reshape(
      B, T_global, D, 2
    )
    return s_BxTxDx2[:, :L]

  def stable_sums(k_BxLxD, v_BxLxD):
    k_BxTxD, x_BxTxDx2 = _causal_inputs(k_BxLxD, v_BxLxD, mask_BxL, T)
    m_BxTxD, s_BxTxDx2 = _prefix_sums(k_BxTxD, x_BxTxDx2)
    s_BxTxDx2 = jnp.exp(-r_Tx1[:T])[:, :, None] * s_BxTxDx2 + _block_triangle_sums(
      k_BxTxD, m_BxTxD, x_BxTxDx2, b, coef, spec
    )
    if T > b and W > 1:  # the window reaches into the block before
      rows_NxB = np.arange(T).reshape(-1, b)
      s_BxTxDx2 += _previous_block_sums(k_BxTxD, m_BxTxD, x_BxTxDx2, coef(rows_NxB, rows_NxB - b), b, spec)
    return s_BxTxDx2[:, :L]

  s_BxLxDx2 = _choose_sums(
    causal_sums, _key_spread(k_BxLxD, mask_BxL), rho, L, global_sums, stable_sums, k_BxLxD, v_BxLxD
  )
  return _causal_finish(q_BxLxD, s_BxLxDx2, out_dtype)


class AFTLocal(nn.Module):
  """AFT-local: the bias w_{t,t'} applies for |t − t'| < window and is 0 (not −∞) outside it.

  Σ_t' e^{w_tt'} X_t' = Σ_t' X_t' + Σ_{|t−t'|<s} (e^{w_tt'} − 1) X_t': a global (or running) sum plus a banded
  sum, computed on blocks of `window` positions that see their own and both neighbouring blocks — O(T·s·d)
  (causal: _causal_local).
  """

  causal: bool = False
  max_len: int = 512
  window: int = 32  # s: the bias applies for |t − t'| < s
  aft_bias_dim: int = 64
  aft_factorized: bool = True
  causal_sums: str = "auto"  # causal: "stable", "global" or "auto" (CAUSAL_SUMS)

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    B, L, D = x_BxLxD.shape
    _check_len("aft_local", L, self.max_len)
    q, k, v = _project(x_BxLxD, D)
    bias = _PositionBias(self.max_len, self.aft_bias_dim, self.aft_factorized, name="bias")
    window_row = lambda i, T: jnp.where(jnp.abs(jnp.arange(T) - i) < self.window, bias.row(i, T), 0.0)
    if decode and (sums := _decode(self, q, k, v, window_row)) is not None:
      return _finish(q, *sums, x_BxLxD.dtype)
    if self.causal:
      return _causal_local(q, k, v, mask, bias, self.window, self.causal_sums, x_BxLxD.dtype)
    ek_BxLxD = _exp_keys(k, mask)
    ekv_BxLxD = ek_BxLxD * v

    b, rows_NxB, cols_NxC, in_band_NxBxC = banded.band(L, self.window, causal=False)
    w_NxBxC = bias.band(rows_NxB, cols_NxC)
    # Row scale: max over the row's entries, which are w inside the band and 0 outside it.
    m_NxBx1 = jax.lax.stop_gradient(
      jnp.maximum(jnp.max(jnp.where(in_band_NxBxC, w_NxBxC, -jnp.inf), axis=-1, keepdims=True), 0.0)
    )
    band_NxBxC = jnp.where(in_band_NxBxC, jnp.exp(w_NxBxC - m_NxBx1) - jnp.exp(-m_NxBx1), 0.0)
    scale_1xLx1 = jnp.exp(-m_NxBx1).reshape(1, -1, 1)[:, :L]

    def banded_plus_global(x_BxLxD):
      banded_BxNxBxD = jnp.einsum("nqc,bncd->bnqd", band_NxBxC, banded.context(x_BxLxD, b))
      return banded.unblocks(banded_BxNxBxD, L) + scale_1xLx1 * _global_sum(x_BxLxD)

    return _finish(q, banded_plus_global(ekv_BxLxD), banded_plus_global(ek_BxLxD), x_BxLxD.dtype)


def _hierarchy_flops(channels: int, block: int, previous: bool) -> float:
  """Per row, of the causal sums over `channels` columns (_block_triangle_sums over a block, the diagonal, and
  _previous_block_sums if the window reaches the block before): (block − 1)/2 + 1 (+ block) multiply-adds each."""
  return channels * (block + 1 + 2 * block * previous)


def _flops_full(options, L: int, d: int, causal: bool) -> float:
  """Bidirectional, and causal on the global path (causal_sums "global", and "auto": the path taken unless keys
  or the bias span ≳60): e^w (L×L) times e^K ⊙ V and times e^K, 2·L·d each per token. Causal, stable: the lower
  triangle of the power-of-two padded length T, for V and the normaliser."""
  if not causal or options["causal_sums"] != "stable":
    return 4 * L * d
  T = _next_power_of_two(L)
  return _hierarchy_flops(2 * d, T, previous=False) * T / L


def _flops_simple(options, L: int, d: int, causal: bool) -> float:
  """Sums and a prefix scan: elementwise, no matmul."""
  del options, L, d, causal
  return 0.0


def _flops_local(options, L: int, d: int, causal: bool) -> float:
  """Bidirectional: each block of b = min(s, L) rows against its 3b context positions, for V and the
  normaliser. Causal, global path (causal_sums "global", and "auto"): against its own block and the one before
  (2b; b if there is one block or s = 1). Causal, stable: blocks of b = s rounded up to a power of two, the
  triangle within and the block before."""
  window = options["window"]
  if not causal:
    b = min(window, L)
    return 12 * b * d * padded(L, b) / L
  if options["causal_sums"] != "stable":
    b = min(window, L)
    T = padded(L, b)
    return 4 * d * (2 * b if T > b and window > 1 else b) * T / L
  b = _next_power_of_two(min(window, L))
  T = padded(L, b)
  return _hierarchy_flops(2 * d, b, previous=T > b and min(window, T) > 1) * T / L


_BIAS = {
  "aft_bias_dim": Field("d' of the factorised position bias w = u vᵀ", at_least=1),
  "aft_factorized": Field("False learns a full max_len × max_len bias instead of u vᵀ"),
}

SPEC_FULL = MixerSpec(
  AFTFull,
  "AFT with a learned bias per position pair; O(L²d) time; O(Ld) memory per sequence plus 3–5 L×L floats a layer "
  "for the bias, whatever the batch (efftx/mixers/README.md#aft)",
  can_decode=True,
  options={**_BIAS, "causal_sums": CAUSAL_SUMS},
  flops=_flops_full,
)
SPEC_SIMPLE = MixerSpec(
  AFTSimple, "AFT without bias (softmax of K over positions); O(Ld)", can_decode=True, options={}, flops=_flops_simple
)
SPEC_LOCAL = MixerSpec(
  AFTLocal,
  "AFT, bias inside a window, 0 outside; O(L·window·d)",
  can_decode=True,
  flops=_flops_local,
  options={
    "window": Field("s: the bias applies for |t − t'| < s, 0 outside (tokens; window 0 is aft_simple)", at_least=1),
    **_BIAS,
    "causal_sums": CAUSAL_SUMS,
  },
)

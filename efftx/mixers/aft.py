"""The Attention Free Transformer (Zhai et al., 2021): AFT-full, -local, -simple and -conv.

All four compute, per channel, a weighted average of V over positions with weights exp(K_t' + w_{t,t'}), gated
by sigmoid(Q_t):

    Y_t = σ(Q_t) ⊙ Σ_t' exp(K_t' + w_{t,t'}) ⊙ V_t' / Σ_t' exp(K_t' + w_{t,t'})

and differ in the position bias w: learned for every pair (full), only inside a window and 0 outside (local),
none (simple), or a per-head 1-D kernel over t − t' (conv). Sums run over real (unpadded) positions, and over
t' ≤ t when causal. The sums are computed in float32 whatever the compute dtype, after subtracting the maximum
of K over positions (per channel) and of w per row: the ratio is unchanged, exp cannot overflow.

Costs, as the paper claims: AFT-full O(T²d) time but O(Td) memory (two T×T by T×d matmuls, never a T×T×d
tensor); AFT-simple O(Td) (a sum, or a running sum when causal); AFT-local and AFT-conv O(Tsd) (a banded
block matmul, a depthwise convolution) plus the O(Td) global sum.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.mixers import banded
from efftx.mixers import cache
from efftx.mixers.spec import MixerSpec, Option

# Keeps 0/0 (a row with no real position, e.g. all padding) finite; real rows have denominators ≥ ~e^-88.
_TINY = 1e-30


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
  return jnp.where(valid_BxLx1, jnp.exp(k_BxLxC - k_max_Bx1xC), 0.0)


def _global_sum(x_BxLxC: jax.Array, causal: bool) -> jax.Array:
  """Σ_t' x_t' over all positions (broadcast over t), or over t' ≤ t when causal (a running sum)."""
  return jnp.cumsum(x_BxLxC, axis=1) if causal else jnp.sum(x_BxLxC, axis=1, keepdims=True)


def _finish(q_BxLxD, num_BxLxD, den_BxLxD, out_dtype) -> jax.Array:
  y_BxLxD = jax.nn.sigmoid(q_BxLxD) * num_BxLxD / jnp.maximum(den_BxLxD, _TINY)
  return nn.Dense(q_BxLxD.shape[-1], dtype=out_dtype, name="out")(y_BxLxD.astype(out_dtype))


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

  def dense(self, L: int) -> jax.Array:
    """w[:L, :L]."""
    if self.factorized:
      return self.u[:L] @ self.v[:L].T
    return self.w[:L, :L]

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
  max_len: int = 512             # positions the bias covers
  aft_bias_dim: int = 64         # d' of the factorised bias w = u vᵀ
  aft_factorized: bool = True    # False: a full max_len × max_len bias matrix

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    _, L, D = x_BxLxD.shape
    _check_len("aft_full", L, self.max_len)
    q, k, v = _project(x_BxLxD, D)
    bias = _PositionBias(self.max_len, self.aft_bias_dim, self.aft_factorized, name="bias")
    if decode and (sums := _decode(self, q, k, v, bias.row)) is not None:
      return _finish(q, *sums, x_BxLxD.dtype)
    ek_BxLxD = _exp_keys(k, mask)
    ekv_BxLxD = ek_BxLxD * v

    w_LxL = bias.dense(L)
    allowed_LxL = jnp.tril(jnp.ones((L, L), bool)) if self.causal else jnp.ones((L, L), bool)
    w_max_Lx1 = jax.lax.stop_gradient(jnp.max(jnp.where(allowed_LxL, w_LxL, -jnp.inf), axis=1, keepdims=True))
    ew_LxL = jnp.where(allowed_LxL, jnp.exp(w_LxL - w_max_Lx1), 0.0)
    num_BxLxD = jnp.einsum("ts,bsd->btd", ew_LxL, ekv_BxLxD)
    den_BxLxD = jnp.einsum("ts,bsd->btd", ew_LxL, ek_BxLxD)
    return _finish(q, num_BxLxD, den_BxLxD, x_BxLxD.dtype)


class AFTSimple(nn.Module):
  """AFT-simple: no position bias; a softmax of K over positions weights V. O(Td) time and memory."""

  causal: bool = False

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False) -> jax.Array:
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
    ek_BxLxD = _exp_keys(k, mask)
    num_BxLxD = _global_sum(ek_BxLxD * v, self.causal)
    den_BxLxD = _global_sum(ek_BxLxD, self.causal)
    return _finish(q, num_BxLxD, den_BxLxD, x_BxLxD.dtype)


class AFTLocal(nn.Module):
  """AFT-local: the bias w_{t,t'} applies for |t − t'| < window and is 0 (not −∞) outside it.

  Σ_t' e^{w_tt'} X_t' = Σ_t' X_t' + Σ_{|t−t'|<s} (e^{w_tt'} − 1) X_t': a global (or running) sum plus a banded
  sum, computed on blocks of `window` positions that see their own and both neighbouring blocks — O(T·s·d).
  """

  causal: bool = False
  max_len: int = 512
  window: int = 32               # s: the bias applies for |t − t'| < s
  aft_bias_dim: int = 64
  aft_factorized: bool = True

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    B, L, D = x_BxLxD.shape
    _check_len("aft_local", L, self.max_len)
    q, k, v = _project(x_BxLxD, D)
    bias = _PositionBias(self.max_len, self.aft_bias_dim, self.aft_factorized, name="bias")
    window_row = lambda i, T: jnp.where(jnp.abs(jnp.arange(T) - i) < self.window, bias.row(i, T), 0.0)
    if decode and (sums := _decode(self, q, k, v, window_row)) is not None:
      return _finish(q, *sums, x_BxLxD.dtype)
    ek_BxLxD = _exp_keys(k, mask)
    ekv_BxLxD = ek_BxLxD * v

    b, rows_NxB, cols_NxC, in_band_NxBxC = banded.band(L, self.window, self.causal)
    w_NxBxC = bias.band(rows_NxB, cols_NxC)
    # Row scale: max over the row's entries, which are w inside the band and 0 outside it.
    m_NxBx1 = jax.lax.stop_gradient(jnp.maximum(
        jnp.max(jnp.where(in_band_NxBxC, w_NxBxC, -jnp.inf), axis=-1, keepdims=True), 0.0))
    band_NxBxC = jnp.where(in_band_NxBxC, jnp.exp(w_NxBxC - m_NxBx1) - jnp.exp(-m_NxBx1), 0.0)
    scale_1xLx1 = jnp.exp(-m_NxBx1).reshape(1, -1, 1)[:, :L]

    def banded_plus_global(x_BxLxD):
      banded_BxNxBxD = jnp.einsum("nqc,bncd->bnqd", band_NxBxC, banded.context(x_BxLxD, b))
      return banded.unblocks(banded_BxNxBxD, L) + scale_1xLx1 * _global_sum(x_BxLxD, self.causal)

    return _finish(q, banded_plus_global(ekv_BxLxD), banded_plus_global(ek_BxLxD), x_BxLxD.dtype)


class AFTConv(nn.Module):
  """AFT-conv: h heads, each with one key channel and a learned kernel over t − t' of size s.

  Y = σ(Q) ⊙ (conv(e^K ⊙ V, e^w − 1) + Σ e^K ⊙ V) / (conv(e^K, e^w − 1) + Σ e^K), per head, with the kernel
  reparameterised w = γ (w − mean w) / std w + β, γ and β initialised to 0 (so training starts from
  AFT-simple). Bidirectional kernels are centred on t; causal ones cover t − s + 1 … t.
  """

  causal: bool = False
  num_heads: int = 4
  kernel_size: int = 7

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    B, L, D = x_BxLxD.shape
    H, S = self.num_heads, self.kernel_size
    q, k_BxLxH, v = _project(x_BxLxD, H)
    w_HxS = self.param("kernel", nn.initializers.normal(1.0), (H, S))
    gamma_Hx1 = self.param("gamma", nn.initializers.zeros, (H, 1))
    beta_Hx1 = self.param("beta", nn.initializers.zeros, (H, 1))
    w_HxS = gamma_Hx1 * (w_HxS - w_HxS.mean(-1, keepdims=True)) / (w_HxS.std(-1, keepdims=True) + 1e-5) + beta_Hx1

    def kernel_row(i, T):  # w_{i,t'} per head: the kernel at j = i − t', 0 beyond it (causal)
      j_T = i - jnp.arange(T)
      return jnp.where((j_T >= 0) & (j_T < S), w_HxS[:, jnp.clip(j_T, 0, S - 1)], 0.0).T

    if decode and (sums := _decode(self, q, k_BxLxH, v, kernel_row)) is not None:
      return _finish(q, *sums, x_BxLxD.dtype)
    ek_BxLxH = _exp_keys(k_BxLxH, mask)
    ekv_BxLxD = (ek_BxLxH[..., None] * v.reshape(B, L, H, D // H)).reshape(B, L, D)
    kernel_HxS = jnp.exp(w_HxS) - 1.0  # kernel[:, j] weighs t' = t − j (causal) or t' = t + j − (S − 1) // 2

    def conv(x_BxLxC, kernel_CxS):
      # Depthwise cross-correlation: out[t] = Σ_j in[t + j − left] k[j].
      if self.causal:
        kernel_CxS, left = kernel_CxS[:, ::-1], S - 1  # kernel[j] ↔ offset −j
      else:
        left = (S - 1) // 2
      C = x_BxLxC.shape[-1]
      return jax.lax.conv_general_dilated(
          x_BxLxC, kernel_CxS.T[:, None, :], window_strides=(1,), padding=[(left, S - 1 - left)],
          dimension_numbers=("NWC", "WIO", "NWC"), feature_group_count=C)

    num_BxLxD = conv(ekv_BxLxD, jnp.repeat(kernel_HxS, D // H, axis=0)) + _global_sum(ekv_BxLxD, self.causal)
    den_BxLxH = conv(ek_BxLxH, kernel_HxS) + _global_sum(ek_BxLxH, self.causal)
    den_BxLxD = jnp.repeat(den_BxLxH, D // H, axis=-1)
    return _finish(q, num_BxLxD, den_BxLxD, x_BxLxD.dtype)


_BIAS = {"aft_bias_dim": Option("d' of the factorised position bias w = u vᵀ", at_least=1),
         "aft_factorized": Option("False learns a full max_len × max_len bias instead of u vᵀ")}

SPEC_FULL = MixerSpec(AFTFull, "AFT with a learned bias per position pair; O(L²d) time, O(Ld) memory",
                      can_decode=True, options=_BIAS)
SPEC_SIMPLE = MixerSpec(AFTSimple, "AFT without bias (softmax of K over positions); O(Ld)", can_decode=True,
                        options={})
SPEC_LOCAL = MixerSpec(
    AFTLocal, "AFT, bias inside a window, 0 outside; O(L·window·d)", can_decode=True,
    options={"window": Option("s: the bias applies for |t − t'| < s, 0 outside (tokens; window 0 is aft_simple)",
                              at_least=1), **_BIAS})
SPEC_CONV = MixerSpec(
    AFTConv, "AFT, a learned kernel over t − t' per head; O(L·kernel·d)", can_decode=True,
    options={"num_heads": Option("heads, each with one key channel and its own kernel; must divide d_model",
                                 at_least=1),
             "kernel_size": Option("s: kernel length over t − t' per head (tokens)", at_least=1)})

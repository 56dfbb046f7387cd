"""AFT-conv (Zhai et al., 2021): AFT whose position bias is a learned kernel over relative positions, per head —
over t − t' on a sequence, or over the (row, column) offset of two cells of an image's patch grid (the form the
paper uses on ImageNet).

The shared AFT machinery (projections, the stable causal sums, decoding, the ratio and its gradient) is in
efftx/mixers/aft.py, whose docstring (and efftx/mixers/README.md#aft) gives the formulas and the numerics this
mixer inherits.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.aft import _block_triangle_sums
from efftx.mixers.aft import _causal_finish
from efftx.mixers.aft import _causal_inputs
from efftx.mixers.aft import _decode
from efftx.mixers.aft import _exp_keys
from efftx.mixers.aft import _finish
from efftx.mixers.aft import _global_sum
from efftx.mixers.aft import _hierarchy_flops
from efftx.mixers.aft import _next_power_of_two
from efftx.mixers.aft import _prefix_sums
from efftx.mixers.aft import _previous_block_sums
from efftx.mixers.aft import _project
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import padded


@jax.custom_jvp
def _std_of_var(var: jax.Array) -> jax.Array:
  """√var, differentiated as 0.5 / max(√var, tiny): the same derivative wherever var > 0 (√var ≥ 1e-23 there), a
  finite one at var = 0, where autodiff of √ is inf and inf · 0 = nan."""
  return jnp.sqrt(var)


@_std_of_var.defjvp
def _std_of_var_jvp(primals, tangents):
  (var,), (dvar,) = primals, tangents
  std = jnp.sqrt(var)
  return std, dvar * (0.5 / jnp.maximum(std, jnp.finfo(std.dtype).tiny))


def _reparameterise(w_HxN: jax.Array, gamma_Hx1: jax.Array, beta_Hx1: jax.Array) -> jax.Array:
  """The paper's w = γ (w − mean w) / std w + β over each head's N kernel entries (a 1e-5 floor under std).

  Where a head's entries are all equal (always so for a kernel of one entry), w − mean w is 0: the normalised part
  is 0 and w = β, as the formula reads in the limit, with finite gradients (_std_of_var); the raw kernel of s = 1
  then gets a zero gradient, as it does not enter w. Values and gradients are otherwise jnp.std's, bit for bit.
  """
  # One expression, in jnp.std's order of evaluation: the backward pass then adds the same terms in the same order.
  return (
    gamma_Hx1 * (w_HxN - w_HxN.mean(-1, keepdims=True)) / (_std_of_var(w_HxN.var(-1, keepdims=True)) + 1e-5) + beta_Hx1
  )


def _conv_1d(x_BxLxC: jax.Array, kernel_CxS: jax.Array) -> jax.Array:
  """Depthwise cross-correlation over positions, zero outside the sequence: out[t] = Σ_j x[t + j − (S−1)//2] k[j]."""
  C, S = kernel_CxS.shape
  left = (S - 1) // 2
  return jax.lax.conv_general_dilated(
    x_BxLxC,
    kernel_CxS.T[:, None, :],
    window_strides=(1,),
    padding=[(left, S - 1 - left)],
    dimension_numbers=("NWC", "WIO", "NWC"),
    feature_group_count=C,
  )


def _conv_2d(x_BxLxC: jax.Array, kernel_CxSxS: jax.Array, grid: tuple[int, int]) -> jax.Array:
  """Depthwise 2-D cross-correlation over the grid's cells, zero outside the grid:
  out[r, c] = Σ_{a,b} x[r + a − (S−1)//2, c + b − (S−1)//2] k[a, b]. The cells are the last R·C positions in raster
  order; the E = L − R·C positions before them get 0."""
  B, L, C = x_BxLxC.shape
  R, W = grid
  E, S = L - R * W, kernel_CxSxS.shape[-1]
  top = (S - 1) // 2
  x_BxRxWxC = x_BxLxC[:, E:].reshape(B, R, W, C)
  y_BxRxWxC = jax.lax.conv_general_dilated(
    x_BxRxWxC,
    kernel_CxSxS.transpose(1, 2, 0)[:, :, None, :],
    window_strides=(1, 1),
    padding=[(top, S - 1 - top)] * 2,
    dimension_numbers=("NHWC", "HWIO", "NHWC"),
    feature_group_count=C,
  )
  return jnp.pad(y_BxRxWxC.reshape(B, R * W, C), [(0, 0), (E, 0), (0, 0)])


def _causal_conv(q_BxLxD, k_BxLxH, v_BxLxD, mask_BxL, w_HxS, out_dtype):
  """Causal AFT-conv: as causal AFT-local with the kernel (offsets t − t' = 0 … S − 1, per head) as the band
  and r = max(0, max of the head's kernel)."""
  L, S = q_BxLxD.shape[1], w_HxS.shape[1]
  b = _next_power_of_two(S)
  T = -(-L // b) * b
  k_BxTxH, x_BxTxHxG = _causal_inputs(k_BxLxH, v_BxLxD, mask_BxL, T)
  m_BxTxH, s_BxTxHxG = _prefix_sums(k_BxTxH, x_BxTxHxG)
  r_Hx1 = jax.lax.stop_gradient(jnp.maximum(jnp.max(w_HxS, axis=1, keepdims=True), 0.0))
  c_SxH = (jnp.exp(w_HxS - r_Hx1) - jnp.exp(-r_Hx1)).T

  def coef(rows_PxR, cols_PxR):  # R×R×H: the same offsets t − t' in every block (a convolution)
    j_RxR = rows_PxR[0][:, None] - cols_PxR[0][None, :]
    return jnp.where(j_RxR[..., None] < S, c_SxH[np.minimum(j_RxR, S - 1)], 0.0)

  spec = "qck,bpckg->bpqkg"
  s_BxTxHxG = jnp.exp(-r_Hx1)[None, None] * s_BxTxHxG + _block_triangle_sums(k_BxTxH, m_BxTxH, x_BxTxHxG, b, coef, spec)
  if T > b and S > 1:  # the kernel reaches into the block before
    rows_NxB = np.arange(T).reshape(-1, b)
    s_BxTxHxG += _previous_block_sums(k_BxTxH, m_BxTxH, x_BxTxHxG, coef(rows_NxB, rows_NxB - b), b, spec)
  return _causal_finish(q_BxLxD, s_BxTxHxG, out_dtype)


class AFTConv(nn.Module):
  """AFT-conv: h heads, each with one key channel and a learned kernel of size s over relative positions.

  Y = σ(Q) ⊙ (conv(e^K ⊙ V, e^w − 1) + Σ e^K ⊙ V) / (conv(e^K, e^w − 1) + Σ e^K), per head, i.e. the paper's
  Y_t = σ(Q_t) ⊙ Σ_t' e^{K_t' + w_tt'} V_t' / Σ_t' e^{K_t' + w_tt'} with w_tt' the kernel at the offset of t' from t
  inside the kernel's reach and 0 (not −∞) beyond it: global connectivity stays. The kernel is reparameterised
  w = γ (w − mean w) / std w + β per head, γ and β initialised to 0 (so training starts from AFT-simple); a kernel
  of one entry (s = 1) is then w = β, a learned weight of each position on itself.

  Sequences (grid None): kernel[h, j] weighs t' = t + j − (s − 1)//2 (bidirectional: centred on t, one more entry
  after t than before it for even s); causal kernels cover t − s + 1 … t (kernel[h, j] weighs t' = t − j).

  Images (grid = (R, C), bidirectional only): the positions are E ≥ 0 extra leading positions (a [CLS] vector) then
  the R·C cells of the patch grid in raster order. Per head an s×s kernel (reparameterised over its s² entries):
  kernel[h, a, b] weighs the cell (r + a − (s − 1)//2, c + b − (s − 1)//2) for the cell (r, c) — the 1-D centring on
  each axis, so grid (1, L) is the sequence form whose kernel is the middle row of the s×s one. Cells beyond the
  grid's border are not neighbours (a zero-padded convolution); the extra positions have w = 0 against every
  position, both ways: they take part in the global sums only, as a position outside every window would. Padded
  positions (mask False) contribute nothing; a real row's sums run over the real positions.
  """

  causal: bool = False
  num_heads: int = 4
  kernel_size: int = 7
  grid: tuple[int, int] | None = None  # (rows, columns) of an image's patch grid; None: a sequence

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    B, L, D = x_BxLxD.shape
    H, S = self.num_heads, self.kernel_size
    if self.grid is not None:
      self._check_grid(L, decode)
    q, k_BxLxH, v = _project(x_BxLxD, H)
    kernel_shape = (H, S) if self.grid is None else (H, S, S)
    raw = self.param("kernel", nn.initializers.normal(1.0), kernel_shape)
    gamma_Hx1 = self.param("gamma", nn.initializers.zeros, (H, 1))
    beta_Hx1 = self.param("beta", nn.initializers.zeros, (H, 1))
    w_HxN = _reparameterise(raw.reshape(H, -1), gamma_Hx1, beta_Hx1)

    def kernel_row(i, T):  # w_{i,t'} per head: the kernel at j = i − t', 0 beyond it (causal)
      j_T = i - jnp.arange(T)
      return jnp.where((j_T >= 0) & (j_T < S), w_HxN[:, jnp.clip(j_T, 0, S - 1)], 0.0).T

    if decode and (sums := _decode(self, q, k_BxLxH, v, kernel_row)) is not None:
      return _finish(q, *sums, x_BxLxD.dtype)
    if self.causal:
      return _causal_conv(q, k_BxLxH, v, mask, w_HxN, x_BxLxD.dtype)
    ek_BxLxH = _exp_keys(k_BxLxH, mask)
    ekv_BxLxD = (ek_BxLxH[..., None] * v.reshape(B, L, H, D // H)).reshape(B, L, D)
    kernel_HxN = jnp.exp(w_HxN) - 1.0
    if self.grid is None:
      conv = _conv_1d
    else:
      conv = lambda x_BxLxC, kernel_CxN: _conv_2d(x_BxLxC, kernel_CxN.reshape(-1, S, S), self.grid)
    num_BxLxD = conv(ekv_BxLxD, jnp.repeat(kernel_HxN, D // H, axis=0)) + _global_sum(ekv_BxLxD)
    den_BxLxH = conv(ek_BxLxH, kernel_HxN) + _global_sum(ek_BxLxH)
    den_BxLxD = jnp.repeat(den_BxLxH, D // H, axis=-1)
    return _finish(q, num_BxLxD, den_BxLxD, x_BxLxD.dtype)

  def _check_grid(self, L: int, decode: bool) -> None:
    R, C = self.grid
    if self.causal or decode:
      raise UserError(
        f"aft_conv: a 2-D kernel over the {R}×{C} patch grid has no causal order "
        f"({'decoding' if decode else 'causal=True'} given); use it bidirectionally (causal=False)"
      )
    if R < 1 or C < 1 or L < R * C:
      raise UserError(
        f"aft_conv: a {R}×{C} patch grid needs {R * C} positions (after any leading [CLS]); the sequence has {L}"
      )


def _flops_conv(options, L: int, d: int, causal: bool) -> float:
  """Bidirectional: a depthwise convolution of length s over the d value channels and the h key channels.
  Causal: as AFT-local's, with blocks of s rounded up to a power of two, over d + h columns."""
  h, s = options["num_heads"], options["kernel_size"]
  if not causal:
    return 2 * s * (d + h)
  b = _next_power_of_two(s)
  T = padded(L, b)
  return _hierarchy_flops(d + h, b, previous=T > b and s > 1) * T / L


def flops_2d(options, L: int, d: int, cells: int | None = None) -> float:
  """On a patch grid (bidirectional only), per position: a depthwise s×s convolution over the d value channels and
  the h key channels, s² taps per cell (border cells counted whole, as the zero-padded convolution computes them),
  over the grid's `cells` = R·C of the L positions (default L; the leading [CLS] position convolves nothing)."""
  h, s = options["num_heads"], options["kernel_size"]
  return 2 * s * s * (d + h) * (L if cells is None else cells) / L


SPEC = MixerSpec(
  AFTConv,
  "AFT, a learned kernel over t − t' per head (s×s on an image's patch grid); O(L·kernel·d)",
  can_decode=True,
  flops=_flops_conv,
  flops_grid=flops_2d,
  options={
    "num_heads": Field("heads, each with one key channel and its own kernel; must divide d_model", at_least=1),
    "kernel_size": Field(
      "s: kernel length over t − t' per head (tokens); s×s cells on an image's patch grid", at_least=1
    ),
  },
)

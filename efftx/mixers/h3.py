"""H3 (Fu et al., 2023) as Zoology builds it (zoology/mixers/h3/h3.py `H3.forward`, without the fused fftconv):

    k̃ = S ∗ k + D_k ⊙ k                       (shift SSM, one per channel: a learned FIR filter of d_state taps)
    y_h = Σ_i q_{h,i} (K_h ∗ (k̃_{h,i} v_h) + D_h k̃_{h,i} v_h)   (diagonal SSM, S4D-Lin, one per head)
    out = output_linear(y)

with q, k, v = Dense(u), heads of head_dim channels (head h holds channels h·head_dim … (h+1)·head_dim − 1 of q, k, v;
the output channel of head h and index j is j·H + h, as the reference's rearrange 'b d h l -> b (d h) l' orders it).
S is ss_kernel_shift.py's kernel, S_l = Σ_m B_m C_{m+l} (B, C: d_state taps); K is ss_kernel_diag.py's bilinear S4D
kernel with d_state/2 complex modes, K_l = 2 Re Σ_n C_n B_n Δ/(1 − ΔA_n/2) Ā_n^l, Ā = (1 + ΔA/2)/(1 − ΔA/2),
A = −exp(inv_A_real) + i A_imag. Both kernels are cut at max_len taps (the reference's l_max). Initialisation as
ss_kernel.py's SSKernel with its defaults (measure diag-lin, mode shift for S); derivation and the correspondence
of every parameter: efftx/mixers/README.md#h3.

Causal only. Padded positions are zeroed in u, k and v before any convolution. The SSM kernels and convolutions
are computed in float32, the projections in the input's dtype; output in the input's dtype. Decoding runs the
reference's recurrences (H3.step): a shift register of d_state inputs per channel and head_dim² × d_state/2 complex
states per head, constant in the position. Weight decay: the dense kernels and both SSMs' C (Zoology's AdamW decays
every parameter; the SSMs' A, B and Δ are those the reference's own registration marks weight_decay 0, and D is a
skip scale, like the biases efftx does not decay). Zoology's `_init_weights` redraws q_proj, k_proj, v_proj and
output_linear (nn.Linear) from N(0, 0.02²), as config.model.init_std = 0.02 does here; output_linear is not
rescaled (it is not named out_proj).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.conv import causal_long_conv
from efftx.mixers.spec import MixerSpec


def _zero_padding(x_BxLxD: jax.Array, mask: jax.Array | None) -> jax.Array:
  return x_BxLxD if mask is None else jnp.where(mask[:, :, None], x_BxLxD, 0)


class ShiftSSM(nn.Module):
  """ss_kernel_shift.py's SSKernelShift for `features` channels: state x' = shift(x) + B u, output C·x'."""

  features: int
  state: int  # N

  def setup(self):
    # B = e_1 and C from torch's Conv1d initialisation (kaiming_uniform(a=√5) over fan-in N): U(±1/√N).
    self.B = self.param("B", lambda key, shape: jnp.zeros(shape).at[:, 0].set(1.0), (self.features, self.state))
    bound = 1.0 / math.sqrt(self.state)
    self.C = self.param(
      "C", lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -bound, bound), (self.features, self.state)
    )

  def kernel(self, length: int) -> jax.Array:
    """S_l = Σ_m B_m C_{m+l} for l < min(N, length), then zeros: length × features, float32 (the reference's rfft of
    size 2N)."""
    n = 2 * self.state
    B_f, C_f = jnp.fft.rfft(self.B, n=n), jnp.fft.rfft(self.C, n=n)
    k_DxK = jnp.fft.irfft(jnp.conj(B_f) * C_f, n=n)[:, : min(self.state, length)]
    return jnp.pad(k_DxK, [(0, 0), (0, length - k_DxK.shape[1])]).T

  def step(self, state_BxDxN: jax.Array, u_BxD: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(C·x', x') with x' = shift(x) + B u (SSKernelShift.step)."""
    shifted_BxDxN = jnp.pad(state_BxDxN[..., :-1], [(0, 0), (0, 0), (1, 0)])
    next_BxDxN = shifted_BxDxN + self.B * u_BxD[..., None]
    return jnp.einsum("bdn,dn->bd", next_BxDxN, self.C), next_BxDxN


class DiagSSM(nn.Module):
  """ss_kernel_diag.py's SSKernelDiag (bilinear, real_type exp) for `features` channels and `modes` complex modes,
  initialised as SSKernel does with measure diag-lin: A_n = −1/2 + iπn, B = 1, C ~ complex N(0, 1), log Δ ~
  U(log dt_min, log dt_max)."""

  features: int
  modes: int  # N/2
  dt_min: float
  dt_max: float

  def setup(self):
    H, M = self.features, self.modes
    lo, hi = math.log(self.dt_min), math.log(self.dt_max)
    self.log_dt = self.param("log_dt", lambda key, shape: jax.random.uniform(key, shape, jnp.float32, lo, hi), (H,))
    self.inv_A_real = self.param("inv_A_real", lambda key, shape: jnp.full(shape, math.log(0.5)), (H, M))
    self.A_imag = self.param("A_imag", lambda key, shape: jnp.broadcast_to(math.pi * jnp.arange(M), shape), (H, M))
    # B and C as (real, imaginary) pairs (torch.view_as_real); torch.randn's complex normal has variance 1/2 per part.
    self.B = self.param("B", lambda key, shape: jnp.zeros(shape).at[..., 0].set(1.0), (H, M, 2))
    self.C = self.param("C", lambda key, shape: math.sqrt(0.5) * jax.random.normal(key, shape), (H, M, 2))

  def discrete(self) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Ā, B̄ = B Δ/(1 − ΔA/2) and C (H × M complex64 each): SSKernelDiag._setup_step's bilinear discretisation."""
    dt_H = jnp.exp(self.log_dt)
    A_HxM = -jnp.exp(self.inv_A_real) + 1j * self.A_imag
    dtA_HxM = A_HxM * dt_H[:, None]
    B_HxM = jax.lax.complex(self.B[..., 0], self.B[..., 1])
    C_HxM = jax.lax.complex(self.C[..., 0], self.C[..., 1])
    return (1 + dtA_HxM / 2) / (1 - dtA_HxM / 2), B_HxM * dt_H[:, None] / (1 - dtA_HxM / 2), C_HxM

  def kernel(self, length: int) -> jax.Array:
    """K_l = 2 Re Σ_n C_n B̄_n exp(l log Ā_n), l < length: length × features, float32 (SSKernelDiag.forward)."""
    dA_HxM, dB_HxM, C_HxM = self.discrete()
    powers_HxMxL = jnp.exp(jnp.log(dA_HxM)[..., None] * jnp.arange(length, dtype=jnp.float32))
    return 2 * jnp.einsum("hm,hml->lh", C_HxM * dB_HxM, powers_HxMxL).real


class H3(nn.Module):
  d_state: int = 64  # N; 0: max_len
  head_dim: int = 1
  dt_min: float = 0.001
  dt_max: float = 0.1
  max_len: int = 512  # the kernels' length (zoology's l_max); the model sets the sequence length
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    B, L, D = x_BxLxD.shape
    P = self.head_dim
    if D % P:
      raise ValueError(f"h3: d_model={D} is not divisible by head_dim={P}")
    H, N = D // P, self.d_state or self.max_len
    if N < 2:
      raise UserError(f"h3: a state of {N} (d_state {self.d_state}, max_len {self.max_len}) has no SSM mode: need ≥ 2")
    u_BxLxD = _zero_padding(x_BxLxD, mask)
    q_BxLxD, k_BxLxD, v_BxLxD = (
      nn.Dense(D, dtype=x_BxLxD.dtype, name=name)(u_BxLxD) for name in ("q_proj", "k_proj", "v_proj")
    )
    # k and v carry their biases at padded positions: zeroed before they enter a convolution.
    k_BxLxD, v_BxLxD = (_zero_padding(a, mask).astype(jnp.float32) for a in (k_BxLxD, v_BxLxD))
    q_BxLxHxP = q_BxLxD.astype(jnp.float32).reshape(B, L, H, P)
    shift = ShiftSSM(D, N, name="ssm_k_kernel")
    diag = DiagSSM(H, N // 2, self.dt_min, self.dt_max, name="ssm_kernel")
    D_k = self.param("ssm_k_D", nn.initializers.normal(1.0), (D,))
    D_H = self.param("D", nn.initializers.normal(1.0), (H,))

    if decode:
      if not self.causal:
        raise UserError("h3: decoding needs causal=True")
      initialized = self.has_variable("cache", "shift_state")
      shift_state = self.variable("cache", "shift_state", jnp.zeros, (B, D, N), jnp.float32)
      ssm_state = self.variable("cache", "ssm_state", jnp.zeros, (B, H, P, P, N // 2), jnp.complex64)
      if initialized:
        if L != 1:
          raise ValueError(f"h3: decoding takes one position at a time, got {L}")
        shifted_BxD, shift_state.value = shift.step(shift_state.value, k_BxLxD[:, 0])
        k_BxHxP = (shifted_BxD + D_k * k_BxLxD[:, 0]).reshape(B, H, P)
        kv_BxHxPxP = k_BxHxP[..., :, None] * v_BxLxD[:, 0].reshape(B, H, 1, P)
        dA_HxM, dB_HxM, C_HxM = diag.discrete()
        state = dA_HxM[:, None, None] * ssm_state.value + dB_HxM[:, None, None] * kv_BxHxPxP[..., None]
        ssm_state.value = state
        y_BxHxPxP = 2 * jnp.einsum("bhijm,hm->bhij", state, C_HxM).real + D_H[:, None, None] * kv_BxHxPxP
        out_BxPxH = jnp.einsum("bhij,bhi->bjh", y_BxHxPxP, q_BxLxHxP[:, 0])
        return nn.Dense(D, dtype=x_BxLxD.dtype, name="output_linear")(out_BxPxH.reshape(B, 1, D).astype(x_BxLxD.dtype))

    length = min(L, self.max_len)  # the reference's L_kernel: taps beyond l_max are zero
    k_BxLxD = causal_long_conv(k_BxLxD, shift.kernel(length)) + D_k * k_BxLxD
    kv_BxLxHxPxP = k_BxLxD.reshape(B, L, H, P, 1) * v_BxLxD.reshape(B, L, H, 1, P)
    K_LxHxPxP = jnp.broadcast_to(diag.kernel(length)[:, :, None, None], (length, H, P, P))
    conv_BxLxHxPxP = causal_long_conv(kv_BxLxHxPxP.reshape(B, L, D * P), K_LxHxPxP.reshape(length, D * P))
    y_BxLxHxPxP = conv_BxLxHxPxP.reshape(B, L, H, P, P) + D_H[:, None, None] * kv_BxLxHxPxP
    out_BxLxPxH = jnp.einsum("blhij,blhi->bljh", y_BxLxHxPxP, q_BxLxHxP)
    return nn.Dense(D, dtype=x_BxLxD.dtype, name="output_linear")(out_BxLxPxH.reshape(B, L, D).astype(x_BxLxD.dtype))


def _relations(options: dict[str, Any], d_model: int | None, causal: bool) -> None:
  del causal
  if d_model is not None and d_model % options["head_dim"]:
    raise UserError(
      f"config.model.d_model={d_model} must be divisible by config.mixer.head_dim={options['head_dim']} "
      "(mixer 'h3' splits the width into heads of head_dim channels)"
    )
  if options["d_state"] == 1:
    raise UserError("config.mixer.d_state=1: mixer 'h3' needs d_state ≥ 2 (its diagonal SSM has d_state/2 modes)")
  if options["dt_min"] > options["dt_max"]:
    raise UserError(
      f"config.mixer.dt_min={options['dt_min']!r} must not exceed config.mixer.dt_max={options['dt_max']!r} "
      "(mixer 'h3')"
    )


SPEC = MixerSpec(
  H3,
  "H3 (Zoology): q ⊙ diagonal SSM(shift SSM(k) vᵀ) per head; O(L log L·d·head_dim + L·d²)",
  can_be_bidirectional=False,
  can_decode=True,
  decayed=("C",),
  relations=_relations,
  options={
    "d_state": Field(
      "SSM state size N: taps of the shift SSM, 2 × the complex modes of the diagonal one; 0: max_len, the "
      "sequence length (Zoology's Figure 2: d_state = L)",
      at_least=0,
    ),
    "head_dim": Field(
      "channels per head (head_dim² SSM states per head); must divide d_model (Figure 2: 2)", at_least=1
    ),
    "dt_min": Field("smallest initial SSM step Δ (log Δ drawn uniformly in [log dt_min, log dt_max])", above=0),
    "dt_max": Field("largest initial SSM step Δ", above=0),
  },
)

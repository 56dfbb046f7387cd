"""Hyena (Poli et al., 2023) as Zoology runs it (Arora et al., 2024: `zoology.mixers.hyena.Hyena(l_max=L)`, every
other argument at its default): order N = 2 gates around causal long convolutions whose filters an MLP generates
from positions,

    x_1 … x_N, v = ShortConv(in_proj(u))          (N + 1 chunks of d channels; short causal taps with a bias)
    v ← v ⊙ x_1;  for o < N − 1:  v ← (h_o ∗ v + D_o ⊙ v) ⊙ x_{o+2};  y = out_proj(v)

with h ∗ v the causal convolution over the whole sequence (an FFT of length 2L, efftx/mixers/conv.py) and the filter
h_t = MLP(z_t) ⊙ exp(−t̂ |δ|) (positional features z_t through Dense layers with sin(freq · ) activations, an
exponential decay per channel). Matches zoology/mixers/hyena.py (`Hyena.forward`, `Filter.filter`,
`fftconv_ref`, `PositionalEmbedding`, `ExponentialModulation`, `Sin`), tests/test_hyena.py against a float64 port;
order > 2 follows safari's standalone_hyena.py `HyenaOperator`, with Zoology's order of the gate chunks.

Causal only. Padded positions (mask False) are zeroed at every convolution's input, so padding at either end never
reaches a real position. The gates and long convolutions run in float32; the output has x's dtype. Decoding keeps
the short convolution's last inputs and each long convolution's inputs so far (efftx/mixers/cache.py).

Parameters: in_proj, out_proj and the filter MLP's Dense layers (implicit_filter_*, named by their index in Zoology's
nn.Sequential; with config.model.init_std = 0.02 redrawn as Zoology's _init_weights redraws every nn.Linear). The
others as the reference initialises them: short_filter's taps and bias, U(±1/√taps) as torch's Conv1d; filter_fn's
`freq` (w, shared by every sine as in the reference), `z` (the positional features: a parameter in the reference,
registered with lr 1e-5; `learn_pos_emb=False` keeps them constant) and `bias` (D, N(0, 1)). The time t̂ and the
decay rates δ are constants (buffers in the reference). Weight decay: AdamW decays the Dense kernels and
short_filter's taps (declared below: the weights of a depthwise convolution, decayed by Zoology's AdamW as every
parameter is); not D or freq (per-channel scales), z (positional features) or biases. efftx/mixers/README.md#hyena
has the filter's construction, the optimizer settings the reference declares, and the differences from safari.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import cache
from efftx.mixers.conv import ShortConv
from efftx.mixers.conv import causal_long_conv
from efftx.mixers.conv import long_conv_step
from efftx.mixers.spec import MixerSpec


def positional_features(max_len: int, emb_dim: int) -> tuple[np.ndarray, np.ndarray]:
  """(z: max_len × emb_dim, t̂: max_len × 1), float64: t̂ = linspace(0, 1, max_len), and z = [t̂, cos(f ω), −sin(f ω)]
  with ω_t = 2π t / max_len and (emb_dim − 1)/2 bands f = linspace(1e-4, bands − 1, bands)."""
  bands = (emb_dim - 1) // 2
  t_Mx1 = np.linspace(0.0, 1.0, max_len)[:, None]
  omega_Mx1 = 2 * np.pi * np.arange(max_len)[:, None] / max_len
  f_F = np.linspace(1e-4, bands - 1, bands)
  return np.concatenate([t_Mx1, np.cos(f_F * omega_Mx1), -np.sin(f_F * omega_Mx1)], axis=1), t_Mx1


def decay_rates(channels: int, fast_decay_pct: float, slow_decay_pct: float, target: float) -> np.ndarray:
  """δ per channel, float64: linspace(ln(target) / slow_decay_pct, ln(target) / fast_decay_pct, channels); the
  modulation exp(−t̂ |δ|) reaches `target` at t̂ = slow_decay_pct (first channel) … fast_decay_pct (last)."""
  return np.linspace(math.log(target) / slow_decay_pct, math.log(target) / fast_decay_pct, channels)


class ImplicitFilter(nn.Module):
  """The long filters of every channel, h: L × channels (float32), and the D term per channel (zeros without
  `use_bias`): Zoology's `Filter` (positional features → MLP with sine activations → exponential modulation)."""

  channels: int
  max_len: int
  emb_dim: int = 3
  filter_order: int = 64
  num_inner_mlps: int = 2
  linear_mixer: bool = False
  w: float = 1.0
  modulate: bool = True
  fast_decay_pct: float = 0.3
  slow_decay_pct: float = 1.5
  target: float = 1e-2
  shift: float = 0.0
  normalized: bool = False
  use_bias: bool = True
  learn_pos_emb: bool = True

  @nn.compact
  def __call__(self, L: int) -> tuple[jax.Array, jax.Array]:
    z_np, t_np = positional_features(self.max_len, self.emb_dim)
    if self.learn_pos_emb:
      z_MxE = self.param("z", lambda key: jnp.asarray(z_np, jnp.float32))
    else:
      z_MxE = jnp.asarray(z_np, jnp.float32)
    h_LxF = z_MxE[:L]
    if self.linear_mixer:
      h_LxC = nn.Dense(self.channels, use_bias=False, name="implicit_filter_0")(h_LxF)
    else:
      freq_1xF = self.param("freq", lambda key: jnp.full((1, self.filter_order), self.w, jnp.float32))
      for i in range(self.num_inner_mlps + 1):
        h_LxF = jnp.sin(freq_1xF * nn.Dense(self.filter_order, name=f"implicit_filter_{2 * i}")(h_LxF))
      h_LxC = nn.Dense(self.channels, use_bias=False, name=f"implicit_filter_{2 * self.num_inner_mlps + 2}")(h_LxF)
    if self.modulate:
      deltas_C = jnp.asarray(
        decay_rates(self.channels, self.fast_decay_pct, self.slow_decay_pct, self.target), jnp.float32
      )
      t_Lx1 = jnp.asarray(t_np[:L], jnp.float32)
      h_LxC = h_LxC * (jnp.exp(-t_Lx1 * jnp.abs(deltas_C)) + self.shift)
    if self.normalized:  # Zoology: the L1 norm over the channels, per position
      h_LxC = h_LxC / jnp.sum(jnp.abs(h_LxC), axis=-1, keepdims=True)
    d_C = self.param("bias", nn.initializers.normal(1.0), (self.channels,))
    return h_LxC, d_C if self.use_bias else jnp.zeros_like(d_C)


class _Inputs(nn.Module):
  """A long convolution's inputs so far, in the decoding cache."""

  causal: bool

  @nn.compact
  def __call__(self, u_Bx1xC: jax.Array):
    appended = cache.append(self, u=u_Bx1xC)
    return None if appended is None else (appended[0]["u"], appended[1])


class Hyena(nn.Module):
  """Hyena of `order` N: N gates and N − 1 long convolutions over d channels each (the module docstring)."""

  causal: bool = True
  max_len: int = 512  # filter positions (Zoology's l_max; the model sets it to the sequence length)
  order: int = 2
  filter_order: int = 64
  emb_dim: int = 3
  num_inner_mlps: int = 2
  linear_mixer: bool = False
  w: float = 1.0
  short_filter_order: int = 3
  modulate: bool = True
  fast_decay_pct: float = 0.3
  slow_decay_pct: float = 1.5
  target: float = 1e-2
  shift: float = 0.0
  normalized: bool = False
  filter_bias: bool = True
  learn_pos_emb: bool = True
  gate_dropout: float = 0.0
  filter_dropout: float = 0.0  # accepted at 0 only: Zoology's Filter makes its dropout and never applies it

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    if not self.causal:
      raise UserError("hyena: causal only (causal long convolutions); set config.model.causal=True")
    _, L, D = x_BxLxD.shape
    N = self.order
    if L > self.max_len:
      raise UserError(f"hyena: sequence length {L} exceeds max_len={self.max_len} (the filter's length)")
    u_BxLxE = nn.Dense((N + 1) * D, dtype=x_BxLxD.dtype, name="in_proj")(x_BxLxD)
    uc_BxLxE = ShortConv((N + 1) * D, self.short_filter_order, name="short_filter")(u_BxLxE, mask, decode)
    uc_BxLxE = uc_BxLxE.astype(jnp.float32)
    gates = [uc_BxLxE[..., i * D : (i + 1) * D] for i in range(N)]
    v_BxLxD = uc_BxLxE[..., N * D :] * gates[0]
    filter_fn = ImplicitFilter(
      (N - 1) * D,
      self.max_len,
      self.emb_dim,
      self.filter_order,
      self.num_inner_mlps,
      self.linear_mixer,
      self.w,
      self.modulate,
      self.fast_decay_pct,
      self.slow_decay_pct,
      self.target,
      self.shift,
      self.normalized,
      self.filter_bias,
      self.learn_pos_emb,
      name="filter_fn",
    )
    k_LxC = d_C = None
    for o in range(N - 1):
      v_BxLxD = nn.Dropout(self.gate_dropout)(v_BxLxD, deterministic=deterministic)
      if mask is not None:
        v_BxLxD = jnp.where(mask[:, :, None], v_BxLxD, 0.0)
      past = _Inputs(self.causal, name=f"long_conv_{o}")(v_BxLxD) if decode else None
      if k_LxC is None:  # decoding: the filter as long as the cache
        k_LxC, d_C = filter_fn(L if past is None else past[0].shape[1])
      k_LxD, d_D = k_LxC[:, o * D : (o + 1) * D], d_C[o * D : (o + 1) * D]
      conv_BxLxD = causal_long_conv(v_BxLxD, k_LxD) if past is None else long_conv_step(*past, k_LxD)
      v_BxLxD = (conv_BxLxD + v_BxLxD * d_D) * gates[o + 1]
    return nn.Dense(D, dtype=x_BxLxD.dtype, name="out_proj")(v_BxLxD.astype(x_BxLxD.dtype))


def _relations(options, d_model, causal) -> None:
  del d_model, causal
  if options["emb_dim"] % 2 == 0:
    raise UserError(
      f"config.mixer.emb_dim={options['emb_dim']}: mixer 'hyena' needs an odd emb_dim (t̂, then a cosine and a sine "
      "per band)"
    )


def _flops(options, L: int, d: int, causal: bool) -> float:
  """Per long convolution (order − 1 of them), per token: the rfft of its input and the irfft of the product, each
  of length 2L over d channels, 2 · 5 · 2L · log2(2L) · d / L. The filter (its MLP and rfft) is per-sequence work
  shared by the batch; the short convolution (3 taps) and the gates are elementwise: none counted."""
  del causal
  return (options["order"] - 1) * 20 * d * math.log2(2 * L)


SPEC = MixerSpec(
  Hyena,
  "Hyena (order 2): gates around a causal long convolution whose filter an MLP of positions generates; O(L log L · d)",
  can_be_bidirectional=False,
  can_decode=True,
  flops=_flops,
  relations=_relations,
  decayed=("taps",),
  options={
    "order": Field("N: gates (N + 1 chunks of in_proj, N − 1 long convolutions); Zoology: 2", at_least=2),
    "filter_order": Field("width of the filter MLP", at_least=1),
    "emb_dim": Field("positional features into the filter MLP: t̂, a cosine and a sine per band (odd)", at_least=3),
    "num_inner_mlps": Field("hidden Dense + sine layers of the filter MLP after its first", at_least=0),
    "linear_mixer": Field("True: the filter is one Dense layer of the positional features (no MLP, no sines)"),
    "w": Field("initial frequency of the filter MLP's sine activations sin(freq · x)"),
    "short_filter_order": Field("taps of the depthwise causal convolution after in_proj", at_least=1),
    "modulate": Field("multiply the filter by a decay exp(−rate · t̂) per channel (t̂ in [0, 1] along the filter)"),
    "fast_decay_pct": Field("t̂ at which the fastest channel's decay reaches `target`", above=0),
    "slow_decay_pct": Field("t̂ at which the slowest channel's decay reaches `target`", above=0),
    "target": Field(
      "the decay's value at those t̂: rates −ln(target) / pct, spread linearly over the channels", above=0, below=1
    ),
    "shift": Field("added to the decay: filter × (exp(−rate · t̂) + shift)"),
    "normalized": Field("divide the filter by its L1 norm over the channels at each position (Zoology)"),
    "filter_bias": Field("the D ⊙ v term beside each long convolution (Zoology Filter's `bias`)"),
    "learn_pos_emb": Field(
      "True: the filter's positional features z are a parameter at the run's learning rate (as Zoology trains "
      "them; the reference asks lr 1e-5); False: constants"
    ),
    "gate_dropout": Field(
      "dropout rate on each long convolution's input v ⊙ x (Zoology's `dropout`)", at_least=0, below=1
    ),
    "filter_dropout": Field("Zoology's filter_dropout, which its Filter never applies: 0 only", choices=(0.0,)),
  },
)

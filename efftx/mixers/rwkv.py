"""RWKV-4 time mixing (Peng et al., 2023) as Zoology runs it (zoology/mixers/rwkv.py, RWKVTimeMixer). Per channel,
with the token shift x'_t = μ ⊙ x_t + (1 − μ) ⊙ x_{t−1} (μ = time_mix_k, _v, _r) feeding k, v, r:

    wkv_t = (Σ_{i<t} e^{(t−1−i)w + k_i} v_i + e^{u + k_t} v_t) / (Σ_{i<t} e^{(t−1−i)w + k_i} + e^{u + k_t})
    y_t   = output(σ(r_t) ⊙ wkv_t),   w = −exp(time_decay), u = time_first

Causal only. The sums run in float32 whatever the compute dtype, as the reference's kernel does: a running
maximum of the exponents carried beside them (no overflow at any key range). Padded positions leave the state
and the token shift untouched, so padding at either end changes nothing at real positions. Training: one
jax.lax.scan over positions; decoding: the same step on a state of constant size (numerator, denominator,
maximum and the previous input, per channel). Initialisation: the reference's layer-dependent formulas
(layer_idx, n_layer). Derivation, reference lines and choices: efftx/mixers/README.md#rwkv
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.spec import MixerSpec

MIN_EXPONENT = -1e38  # the running maximum before any position (the reference kernel's MIN_VALUE)


def _torch_linear_init(key, shape, dtype=jnp.float32):
  """torch.nn.Linear's default weight, U(±1/√fan_in): what the reference's projections keep in Zoology's model."""
  bound = 1.0 / shape[0] ** 0.5
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def _ratios(layer_idx: int, n_layer: int) -> tuple[float, float]:
  """(ratio_0_to_1, ratio_1_to_almost0) of the reference's initialisation."""
  return layer_idx / (n_layer - 1), 1.0 - layer_idx / n_layer


def initial_time_decay(D: int, layer_idx: int, n_layer: int) -> np.ndarray:
  """−5 + 8 (h / (D − 1))^(0.7 + 1.3 ratio_0_to_1) for channel h (D = 1: −5)."""
  h = np.arange(D) / max(D - 1, 1)
  return (-5.0 + 8.0 * h ** (0.7 + 1.3 * _ratios(layer_idx, n_layer)[0])).astype(np.float32)


def initial_time_first(D: int) -> np.ndarray:
  """ln 0.3 + 0.5 ((h + 1) mod 3 − 1) for channel h: a zigzag around ln 0.3."""
  return np.float32(np.log(0.3)) + (0.5 * ((np.arange(D) + 1) % 3 - 1)).astype(np.float32)  # float32, as torch


def initial_time_mix(D: int, layer_idx: int, n_layer: int) -> dict[str, np.ndarray]:
  """(h / D)^ratio_1_to_almost0 for k, the same + 0.3 ratio_0_to_1 for v, (h / D)^(ratio_1_to_almost0 / 2) for r."""
  ratio_0_to_1, ratio_1_to_almost0 = _ratios(layer_idx, n_layer)
  h = (np.arange(D) / D).astype(np.float32)
  return {
    "time_mix_k": h**ratio_1_to_almost0,
    "time_mix_v": h**ratio_1_to_almost0 + np.float32(0.3 * ratio_0_to_1),
    "time_mix_r": h ** (0.5 * ratio_1_to_almost0),
  }


def _constant(value: np.ndarray):
  def init(key, shape, dtype=jnp.float32):
    del key
    assert shape == value.shape, (shape, value.shape)
    return jnp.asarray(value, dtype)

  return init


def wkv_step(w_D, u_D, state, k_BxD, v_BxD, real_B):
  """One position of the recurrence, in float32: (wkv_BxD, the state after it). The state (max, num, den) holds
  num = Σ_{i≤t} e^{(t−i)w + k_i − max} v_i and den = the same without v_i; a padded position (real False) leaves it
  as it was."""
  o, p, q = state
  no = jnp.maximum(o, u_D + k_BxD)  # the output's exponents: the past (o) and the bonus u + k_t
  a, b = jnp.exp(o - no), jnp.exp(u_D + k_BxD - no)
  wkv_BxD = (a * p + b * v_BxD) / (a * q + b)
  no = jnp.maximum(o + w_D, k_BxD)  # the state's: the past one step older (o + w) and k_t
  a, b = jnp.exp(o + w_D - no), jnp.exp(k_BxD - no)
  new = (no, a * p + b * v_BxD, a * q + b)
  return wkv_BxD, tuple(jnp.where(real_B[:, None], n, s) for n, s in zip(new, state))


STATE = ("max", "num", "den")  # the decoding cache's names of the state, besides "shift" (the previous input)


def initial_state(B: int, D: int):
  """The state before any position: (max, num, den), B×D each, float32."""
  return jnp.full((B, D), MIN_EXPONENT, jnp.float32), jnp.zeros((B, D), jnp.float32), jnp.zeros((B, D), jnp.float32)


def wkv(w_D, u_D, k_BxLxD, v_BxLxD, real_BxL):
  """wkv at every position from the empty state: one scan over positions, float32. The step is recomputed in the
  backward pass (jax.checkpoint): the scan keeps only its B×D state per position."""
  B, _, D = k_BxLxD.shape

  @jax.checkpoint
  def step(state, inputs):
    wkv_BxD, state = wkv_step(w_D, u_D, state, *inputs)
    return state, wkv_BxD

  _, wkv_LxBxD = jax.lax.scan(
    step, initial_state(B, D), (k_BxLxD.swapaxes(0, 1), v_BxLxD.swapaxes(0, 1), real_BxL.swapaxes(0, 1))
  )
  return wkv_LxBxD.swapaxes(0, 1)


class RWKVTimeMixer(nn.Module):
  """RWKV-4 time mixing; parameters and their initialisation as zoology.mixers.rwkv.RWKVTimeMixer."""

  n_layer: int = 12
  layer_idx: int = 0  # filled by the model: the layer's index (Zoology passes each block's)
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    if not self.causal:
      raise UserError("rwkv is causal only: set causal=True")
    if 0.7 + 1.3 * self.layer_idx / (self.n_layer - 1) <= 0:
      raise UserError(
        f"rwkv: layer_idx={self.layer_idx} with n_layer={self.n_layer}: the time_decay exponent 0.7 + 1.3·layer_idx "
        "/ (n_layer − 1) must be > 0 (the reference divides by zero there)"
      )
    B, L, D = x_BxLxD.shape
    time_decay_D = self.param("time_decay", _constant(initial_time_decay(D, self.layer_idx, self.n_layer)), (D,))
    time_first_D = self.param("time_first", _constant(initial_time_first(D)), (D,))
    mixes = initial_time_mix(D, self.layer_idx, self.n_layer)
    mix = {name: self.param(name, _constant(value), (D,)) for name, value in mixes.items()}
    real_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    x_BxLxD_f32 = jnp.where(real_BxL[..., None], x_BxLxD.astype(jnp.float32), 0.0)  # padding shifts in as zeros
    state = None
    if decode:
      initialized = self.has_variable("cache", "shift")
      shift = self.variable("cache", "shift", jnp.zeros, (B, D), jnp.float32)  # the previous real input
      cached = [self.variable("cache", name, jnp.array, value) for name, value in zip(STATE, initial_state(B, D))]
      if initialized:
        if L != 1:
          raise ValueError(f"{type(self).__name__}: decoding takes one position at a time, got {L}")
        previous_BxLxD = shift.value[:, None]
        shift.value = jnp.where(real_BxL[:, :1], x_BxLxD_f32[:, 0], shift.value)
        state = tuple(c.value for c in cached)
    if state is None:
      previous_BxLxD = jnp.pad(x_BxLxD_f32, [(0, 0), (1, 0), (0, 0)])[:, :-1]

    def shifted(name):  # μ x_t + (1 − μ) x_{t−1}, in the compute dtype for the projection
      return (x_BxLxD_f32 * mix[name] + previous_BxLxD * (1.0 - mix[name])).astype(x_BxLxD.dtype)

    dense = lambda name: nn.Dense(
      D, use_bias=False, kernel_init=_torch_linear_init, dtype=x_BxLxD.dtype, name=name
    )  # the reference's nn.Linear(D, D, bias=False)
    k_BxLxD = dense("key")(shifted("time_mix_k")).astype(jnp.float32)
    v_BxLxD = dense("value")(shifted("time_mix_v")).astype(jnp.float32)
    r_BxLxD = dense("receptance")(shifted("time_mix_r")).astype(jnp.float32)
    w_D = -jnp.exp(time_decay_D)
    if state is not None:
      wkv_BxD, state = wkv_step(w_D, time_first_D, state, k_BxLxD[:, 0], v_BxLxD[:, 0], real_BxL[:, 0])
      for c, value in zip(cached, state):
        c.value = value
      wkv_BxLxD = wkv_BxD[:, None]
    else:
      wkv_BxLxD = wkv(w_D, time_first_D, k_BxLxD, v_BxLxD, real_BxL)
    gated_BxLxD = (jax.nn.sigmoid(r_BxLxD) * wkv_BxLxD).astype(x_BxLxD.dtype)
    return dense("output")(gated_BxLxD)


def _flops(options, L: int, d: int, causal: bool) -> float:
  """The recurrence is elementwise: no matmul besides the projections."""
  del options, L, d, causal
  return 0.0


SPEC = MixerSpec(
  RWKVTimeMixer,
  "RWKV-4 time mixing (Zoology's): token shift, per-channel decaying WKV sums, σ(r) gate; O(L·d), a scan",
  can_be_bidirectional=False,
  can_decode=True,
  flops=_flops,
  keep_init=("key", "value", "receptance", "output"),
  options={
    "n_layer": Field("layers the initialisation formulas assume (Zoology never passes it: its default 12)", at_least=2),
  },
)

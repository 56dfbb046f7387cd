"""BaseConv (efftx/mixers/base_conv.py) against a float64 numpy port of Zoology's torch modules: zoology/mixers/
base_conv.py `BaseConv.forward` (use_act=False) with convolution.py's `ShortConvolution` (kernel_size ≥ 1) and
`ImplicitLongConvolution` (kernel_size −1: `PositionalEmbedding`, the filter MLP, `fft_conv` with its skip). The
flax parameters are copied into the port in torch's layouts (Linear weight out × in; Conv1d weight C × 1 × W, its
last tap on the current position).

Tolerance: the JAX side computes in float32; every output is a product of two sums of at most D + L terms (the
projection, the convolution) plus the input, so it lies within (2·(D + L) + 2)·eps32 of the output's size of the
float64 port (assert_close_sums; the FFT's rounding grows as log L, inside that).
"""

import math

import jax
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import assert_finite_grads_and_bfloat16_close
from efftx.mixers import MIXERS
from efftx.mixers import base_conv

D = 8


# ---------------------------------------------------------------------------------------------------------------
# The reference, ported from zoology/mixers/convolution.py and base_conv.py (float64, torch's layouts).


def _short_convolution(x_bld, weight_c1w, bias_c):
  """ShortConvolution.forward: nn.Conv1d(d, d, W, groups=d, padding=W − 1) over (b, d, l), cut to the first l."""
  W = weight_c1w.shape[-1]
  x_bdl = x_bld.transpose(0, 2, 1)
  l = x_bdl.shape[-1]
  padded = np.pad(x_bdl, [(0, 0), (0, 0), (W - 1, W - 1)])  # Conv1d pads both ends
  out = np.stack([(padded[..., t : t + W] * weight_c1w[:, 0]).sum(-1) for t in range(l + W - 1)], -1) + bias_c[:, None]
  return out[..., :l].transpose(0, 2, 1)


def _positional_embedding(emb_dim, seq_len):
  """PositionalEmbedding(emb_dim, seq_len).z[0]: seq_len × emb_dim."""
  t = np.linspace(0, 1, seq_len)[:, None]
  bands = (emb_dim - 1) // 2
  t_rescaled = np.linspace(0, seq_len - 1, seq_len)[:, None]
  w = 2 * math.pi * t_rescaled / seq_len
  f = np.linspace(1e-4, bands - 1, bands)[None]
  z = np.exp(-1j * f * w)
  return np.concatenate([t, z.real, z.imag], axis=-1)


def _fft_conv(u_bdl, k_dl):
  """fft_conv(u, k, dropout_mask=None, gelu=False): the FFT convolution plus its skip, y + u."""
  seqlen = u_bdl.shape[-1]
  fft_size = 2 * seqlen
  k_f = np.fft.rfft(k_dl, n=fft_size) / fft_size
  u_f = np.fft.rfft(u_bdl, n=fft_size)
  y = np.fft.irfft(u_f * k_f, n=fft_size, norm="forward")[..., :seqlen]
  return y + u_bdl


def _implicit_long_convolution(x_bld, sd, l_max):
  """ImplicitLongConvolution.forward: k = mlp(pos_emb(l)) (Linear, ReLU, Linear), then fft_conv."""
  z = _positional_embedding(3, l_max)[: x_bld.shape[1]]  # pos_emb(L) = z[:, :L]
  h = np.maximum(z @ sd["mlp.0.weight"].T + sd["mlp.0.bias"], 0)
  k_dl = (h @ sd["mlp.2.weight"].T + sd["mlp.2.bias"]).T
  return _fft_conv(x_bld.transpose(0, 2, 1), k_dl).transpose(0, 2, 1)


def _zoology_base_conv(u, sd, kernel_size, l_max):
  """BaseConv.forward with use_act=False: y = conv(u) ⊙ projection(u) + u."""
  if kernel_size == -1:
    u_conv = _implicit_long_convolution(u, sd, l_max)
  else:
    u_conv = _short_convolution(u, sd["conv.conv.weight"], sd["conv.conv.bias"])
  u_proj = u @ sd["projection.weight"].T + sd["projection.bias"]
  return u_conv * u_proj + u


def _state_dict(params):
  """The flax parameters under the reference's names and layouts, float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  sd = {"projection.weight": p["projection"]["kernel"].T, "projection.bias": p["projection"]["bias"]}
  if "conv" in p:  # taps[j] weighs x_{t−j}; Conv1d's weight[:, 0, W − 1] weighs x_t
    sd["conv.conv.weight"] = p["conv"]["taps"][::-1].T[:, None, :]
    sd["conv.conv.bias"] = p["conv"]["bias"]
  else:
    sd["mlp.0.weight"], sd["mlp.0.bias"] = p["filter_in"]["kernel"].T, p["filter_in"]["bias"]
    sd["mlp.2.weight"], sd["mlp.2.bias"] = p["filter_out"]["kernel"].T, p["filter_out"]["bias"]
  return sd


# ---------------------------------------------------------------------------------------------------------------


def _module(kernel_size, max_len):
  if kernel_size == -1:
    return MIXERS["base_conv_long"](causal=True, max_len=max_len)
  return MIXERS["base_conv"](causal=True, kernel_size=kernel_size)


def _params(module, x, seed=1):
  """Parameters of the module's shapes (jax.eval_shape: nothing compiled) drawn in numpy: dense kernels N(0, 1/fan-in),
  the short convolution's taps U(±1/√W) as torch's Conv1d, every bias N(0, 1) (flax starts dense biases at 0; the
  comparison should see them)."""
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(module.init, jax.random.key(0), x)["params"]

  def draw(path, leaf):
    if path[-1].key == "kernel":
      return rng.normal(size=leaf.shape) / math.sqrt(leaf.shape[0])
    if path[-1].key == "taps":
      return rng.uniform(-1, 1, size=leaf.shape) / math.sqrt(leaf.shape[0])
    return rng.normal(size=leaf.shape)

  return jax.tree.map(np.float32, jax.tree_util.tree_map_with_path(draw, shapes))


def _apply(module, params, xs, mask=None):
  """The module's outputs on each of xs, in one jitted program."""
  return jax.jit(lambda p, xs, mask: [module.apply({"params": p}, x, mask=mask) for x in xs])(params, xs, mask)


# kernel_size −1 is the implicit long convolution (Figure 2's second layer), max_len its l_max: above the length,
# or below it (the reference's filter then has only l_max taps). Lengths that are not powers of two: below.
@pytest.mark.parametrize("kernel_size,L,max_len", [(3, 1, 16), (4, 6, 16), (-1, 1, 13), (-1, 9, 5)])
def test_base_conv_equals_zoology(kernel_size, L, max_len):
  x = np.random.default_rng(0).normal(size=(2, L, D)).astype(np.float32)
  module = _module(kernel_size, max_len)
  params = _params(module, x)
  (y,) = _apply(module, params, [x])
  want = _zoology_base_conv(x.astype(np.float64), _state_dict(params), kernel_size, max_len)
  assert_close_sums(y, want, n_terms=2 * (D + L) + 2)


@pytest.mark.parametrize("kernel_size", [3, -1])
def test_padding_at_both_ends_reaches_no_real_position(kernel_size):
  """Real positions 2 … 7 of 11 (l_max 13): their outputs are the reference's on the sequence with zeros at the
  padding, and do not change when the padding holds anything else."""
  L = 11
  rng = np.random.default_rng(3)
  x = rng.normal(size=(2, L, D)).astype(np.float32)
  mask = np.zeros((2, L), bool)
  mask[:, 2:8] = True
  noisy = np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32)
  module = _module(kernel_size, 13)
  params = _params(module, x)
  y, y_noisy = _apply(module, params, [x, noisy], mask)
  zeroed = np.where(mask[..., None], x, 0).astype(np.float64)
  want = _zoology_base_conv(zeroed, _state_dict(params), kernel_size, 13)
  assert_close_sums(np.asarray(y)[mask], want[mask], n_terms=2 * (D + L) + 2)
  np.testing.assert_array_equal(np.asarray(y)[mask], np.asarray(y_noisy)[mask])


@pytest.mark.parametrize("kernel_size", [3, -1])
def test_gradients_are_finite_and_bfloat16_follows_float32(kernel_size):
  L = 11
  x = np.random.default_rng(4).normal(size=(2, L, D)).astype(np.float32)
  module = _module(kernel_size, L)

  assert_finite_grads_and_bfloat16_close(module, _params(module, x), x)


def test_initialisation_is_the_references():
  """Conv1d's U(±1/√W) taps and bias; the filter's input is PositionalEmbedding(3, l_max) row for row."""
  module = MIXERS["base_conv"](causal=True, kernel_size=4)
  variables = jax.jit(module.lazy_init)(jax.random.key(0), np.zeros((1, 3, 64), np.float32))
  for leaf in variables["params"]["conv"].values():
    assert 0.4 < np.abs(leaf).max() <= 0.5 and np.abs(leaf).mean() > 0.2  # U(±1/√4): 256 draws, mean |.| 0.25
  for l_max in (1, 64):
    np.testing.assert_allclose(
      base_conv.filter_positions(l_max, min(l_max, 5)), _positional_embedding(3, l_max)[:5], rtol=1e-6, atol=1e-7
    )

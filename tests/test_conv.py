"""efftx.mixers.conv (the causal convolutions Hyena, H3 and BaseConv share) against float64 numpy convolutions:
np.convolve over each channel, cut to the first L outputs (what zoology's fftconv and torch's Conv1d with padding
W − 1 compute), at length 4,096 as at 1 and 7, with padding at both ends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efftx.mixers import conv

EPS = float(jnp.finfo(jnp.float32).eps)


def _direct(u_BxLxD, k_LxD):
  u, k = np.asarray(u_BxLxD, np.float64), np.asarray(k_LxD, np.float64)
  L = u.shape[1]
  out = np.zeros(u.shape)
  for b in range(u.shape[0]):
    for d in range(u.shape[2]):
      out[b, :, d] = np.convolve(u[b, :, d], k[:, d])[:L]
  return out


@pytest.mark.parametrize("L", [1, 7, 4096])
def test_the_long_convolution_and_its_decoding_step_equal_a_direct_convolution(L):
  """A slowly and a quickly decaying kernel (Hyena's modulation spans both): the FFT's rounding is about
  log2(2L)·eps of the sum of |k|·|u| that reaches an output."""
  rng = np.random.default_rng(L)
  u = rng.normal(size=(2, L, 2)).astype(np.float32)
  t = np.arange(L)[:, None]
  k = (rng.normal(size=(L, 2)) * np.exp(-t * np.array([[1e-3, 0.5]]))).astype(np.float32)
  got = np.asarray(jax.jit(conv.causal_long_conv)(u, k), np.float64)
  want = _direct(u, k)
  bound = 4 * np.log2(2 * L) * EPS * _direct(np.abs(u), np.abs(k)).max()
  np.testing.assert_allclose(got, want, rtol=0, atol=bound)
  step = jax.jit(conv.long_conv_step)
  for i in sorted({0, L // 2, L - 1}):  # the sum for one new position over the buffered inputs, zeros after it
    buffered = np.where(np.arange(L)[None, :, None] <= i, u, 99.0).astype(np.float32)
    np.testing.assert_allclose(np.asarray(step(buffered, i, k))[:, 0], want[:, i], rtol=1e-5, atol=1e-5)


def test_the_short_convolution_ignores_padding_at_both_ends_and_decodes_the_same():
  module = conv.ShortConv(features=3, width=4)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 9, 3)).astype(np.float32)
  mask = np.ones((2, 9), bool)
  mask[0, :3] = False  # padding at the start
  mask[1, 6:] = False  # and at the end
  variables = module.init(jax.random.key(0), x)
  taps, bias = (np.asarray(variables["params"][n], np.float64) for n in ("taps", "bias"))
  y = np.asarray(module.apply(variables, np.where(mask[..., None], x, 50.0), mask=mask), np.float64)
  want = _direct(np.where(mask[..., None], x, 0.0), taps) + bias  # taps[j] weighs x_{t−j}
  np.testing.assert_allclose(y[mask], want[mask], rtol=1e-5, atol=1e-5)
  cache = module.init(jax.random.key(0), x, decode=True)["cache"]
  for t in range(9):
    y_t, mutated = module.apply({**variables, "cache": cache}, x[:, t : t + 1], decode=True, mutable=["cache"])
    cache = mutated["cache"]
    np.testing.assert_allclose(np.asarray(y_t)[:, 0], _direct(x, taps)[:, t] + bias, rtol=1e-5, atol=1e-5)
  assert cache["conv_state"].shape == (2, 3, 3)  # the last W − 1 inputs: the same size at every position

"""Griffin's recurrent block (efftx/mixers/rg_lru.py) against a float64 numpy port of google-deepmind/recurrentgemma:
recurrentgemma/jax/modules.py `RecurrentBlock.__call__`, layers.py `Conv1D.__call__` (training mode: the window loop
with its document mask), `BlockDiagonalLinear.__call__` and `RGLRU.__call__` (only_real), its scan written as the
step form h_t = a_t (1 − reset_t) h_{t−1} + x̂_t (scan.linear_scan's definition), and `rnn_real_param_init`. The
flax parameters are copied in under the reference's names (Conv1D's w[W − 1 − k] weighs x_{t−k}, efftx's taps[k]).
The reference sees no padding: it runs on each sequence's real positions alone, segment_pos = 0, 1, ….

Tolerance: the JAX side computes in float32. An output sums linear_out's W terms of h ⊙ GeLU(linear_y x); h sums
≤ 2L rounded terms; the gates and projections before it sum d_model, W/heads and conv_width terms once each, and
a, √(1 − a²), σ, softplus and GeLU add a relative eps each. So n_terms = 2d + 2W + 2L + conv_width + 16 of the
largest output (assert_close_sums).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import assert_finite_grads_and_bfloat16_close
from conftest import assert_gradients_match_central_differences
from conftest import compiled
from efftx.errors import UserError
from efftx.mixers import MIXERS

B, D, H, K = 2, 8, 2, 4  # batch, width (= lru_width), heads, conv width


# ---------------------------------------------------------------------------------------------------------------
# The reference, ported (float64, one sequence, L × width).


def _sigmoid(x):
  return 1 / (1 + np.exp(-x))


def _gelu_tanh(x):  # jax.nn.gelu(approximate=True)
  return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _conv1d(x, segment_pos, w, b):
  """Conv1D.__call__ with cache None: for each temporal_shift, the window x[0 : L − shift] masked at document
  boundaries, left-padded to L, times w[W − shift − 1]."""
  L, W = x.shape[0], w.shape[0]
  out = np.zeros_like(x)
  for shift in range(min(W, L)):
    window = x[: L - shift]
    not_boundary = (segment_pos != 0).astype(np.float64)
    window_mask = np.ones(L - shift)
    for s in range(1, shift + 1):
      window_mask = window_mask * not_boundary[s : L - shift + s]
    window = np.concatenate([np.zeros((shift, x.shape[1])), window * window_mask[:, None]])
    out = out + window * w[W - shift - 1][None]
  return out + b[None]


def _block_diagonal(x, w, b):
  h = w.shape[0]
  y = np.einsum("lhi,hij->lhj", x.reshape(x.shape[0], h, -1), w) + b
  return y.reshape(x.shape[0], -1)


def _rg_lru(x, segment_pos, p):
  """RGLRU.__call__ (only_real, cache None) with linear_scan as its loop."""
  gate_x = _sigmoid(_block_diagonal(x, p["input_gate"]["w"], p["input_gate"]["b"]))
  gate_a = _sigmoid(_block_diagonal(x, p["a_gate"]["w"], p["a_gate"]["b"]))
  log_a = -8.0 * gate_a * np.logaddexp(0.0, p["a_param"])
  a, a_squared = np.exp(log_a), np.exp(2 * log_a)
  gated_x = x * gate_x
  reset = (segment_pos == 0).astype(np.float64)[:, None]
  multiplier = reset + (1 - reset) * np.sqrt(1 - a_squared)
  normalized_x = gated_x * multiplier
  a = a * (1 - reset)
  h, ys = np.zeros(x.shape[1]), []
  for t in range(x.shape[0]):
    h = a[t] * h + normalized_x[t]
    ys.append(h)
  return np.stack(ys)


def _recurrent_block(x, p):
  """RecurrentBlock.__call__ on one sequence from its start."""
  segment_pos = np.arange(x.shape[0])
  dense = lambda name, v: v @ p[name]["kernel"] + p[name]["bias"]  # noqa: E731
  y = _gelu_tanh(dense("linear_y", x))
  h = _rg_lru(_conv1d(dense("linear_x", x), segment_pos, p["conv_1d"]["w"], p["conv_1d"]["b"]), segment_pos, p)
  return dense("linear_out", h * y)


def _reference_params(params):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  ref = {n: p[n] for n in ("linear_x", "linear_y", "linear_out", "a_param")}
  ref["conv_1d"] = {"w": p["conv_1d"]["taps"][::-1], "b": p["conv_1d"]["bias"]}
  for gate in ("input_gate", "a_gate"):
    ref[gate] = {"w": p[gate]["kernel"], "b": p[gate]["bias"]}
  return ref


def _reference(x, params, mask):
  ref = _reference_params(params)
  return [_recurrent_block(np.asarray(x[b], np.float64)[mask[b]], ref) for b in range(len(x))]


# ---------------------------------------------------------------------------------------------------------------

N_TERMS = lambda L: 4 * D + 2 * L + K + 16  # noqa: E731


def _padded_inputs(L=13, left=3, right=4, seed=0, width=D):
  """x ~ N(0, 1), noise ×10 at padded positions; the first sequence padded at the start, the second at the end."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, width)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[0, :left] = False
  mask[1, L - right :] = False
  return np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32), mask


def _params(module, x, a_param=None, seed=1):
  """The module's initial parameters with the biases moved off 0 and the convolution's taps ×10 (as training moves
  them: at N(0, 0.01/W) the convolution barely passes its input), so that the comparison sees every parameter;
  a_param, if given, sets Λ."""
  params = jax.tree.map(np.asarray, compiled(module).init(jax.random.key(seed), x)["params"])
  rng = np.random.default_rng(seed)
  for name in ("linear_x", "linear_y", "linear_out", "conv_1d", "input_gate", "a_gate"):
    params[name]["bias"] = params[name]["bias"] + 0.3 * rng.normal(size=params[name]["bias"].shape).astype(np.float32)
  params["conv_1d"]["taps"] = 10 * params["conv_1d"]["taps"]
  if a_param is not None:
    params["a_param"] = np.asarray(a_param, np.float32) + np.zeros_like(params["a_param"])
  return params


def _compare(module, params, x, mask):
  y = np.asarray(jax.jit(lambda p, x: module.apply({"params": p}, x, mask=mask))(params, x))
  for b, want in enumerate(_reference(x, params, mask)):
    assert_close_sums(y[b][mask[b]], want, n_terms=N_TERMS(x.shape[1]), err_msg=f"sequence {b}")
  return y


# Λ: the initialisation's (a^(1/8) ∈ [0.9, 0.999] at r = 1); strong decay (Λ = 10: a ≤ e^-40·σ(r), the past gone
# after a step); weak decay (Λ = −9: softplus 1.2e-4, a ≥ 0.999, 1 − a² ≥ ~1e-4 so √ is not at its derivative's
# bound).
@pytest.mark.parametrize("a_param", [None, 10.0, -9.0], ids=["init", "strong-decay", "weak-decay"])
def test_matches_the_reference_with_padding_at_both_ends(a_param):
  module = MIXERS["rg_lru"](causal=True, num_heads=H)
  x, mask = _padded_inputs()
  y = _compare(module, _params(module, x, a_param), x, mask)
  assert np.all(np.isfinite(y))


def test_length_4096_at_width_2():
  """One long case (width 2, one head), the first sequence padded by 100 at the start, the second at the end."""
  module = MIXERS["rg_lru"](causal=True)
  x, mask = _padded_inputs(L=4096, left=100, right=100, seed=6, width=2)
  _compare(module, _params(module, x), x, mask)


def test_gradients_equal_the_references_derivatives():
  """∂ Σ y·g / ∂ (Λ, the gates' biases, x) against central differences of the float64 port, at strong and weak
  decays on alternate channels; padded inputs get no gradient."""
  module = MIXERS["rg_lru"](causal=True, num_heads=H)
  x, mask = _padded_inputs(L=6, left=1, right=2, seed=2)
  params = _params(module, x, np.where(np.arange(D) % 2, 1.0, -7.0))
  checks = [(("a_param",), (c,)) for c in range(D)]
  checks += [((gate, "bias"), (c // 4, c % 4)) for gate in ("a_gate", "input_gate") for c in range(0, D, 3)]
  assert_gradients_match_central_differences(
    module,
    params,
    x,
    mask,
    lambda p, x: _reference(x, p, mask),
    checks,
    ((0, 1, 0), (0, 5, 3), (1, 0, 7), (1, 3, 2)),
    g_seed=3,
    atol=1e-7,
  )


def test_the_square_roots_derivative_is_bounded_as_the_references():
  """At a → 1 (Λ = −30: 1 − a² ≈ 1e-12) the derivative of √(1 − a²) is taken at 1/(4·1000²): finite, ≤ 1000."""
  from efftx.mixers.rg_lru import sqrt_bound_derivative  # pylint: disable=g-import-not-at-top

  d = jax.grad(lambda v: sqrt_bound_derivative(v, 1000.0))(jnp.float32(1e-12))
  np.testing.assert_allclose(d, 1000.0, rtol=1e-6)
  np.testing.assert_allclose(jax.grad(lambda v: sqrt_bound_derivative(v, 1000.0))(jnp.float32(0.25)), 1.0, rtol=1e-6)
  module = MIXERS["rg_lru"](causal=True, num_heads=H)
  x, _ = _padded_inputs(seed=7)
  assert_finite_grads_and_bfloat16_close(module, _params(module, x, -30.0), x)


def test_gradients_are_finite_and_bfloat16_follows_float32():
  module = MIXERS["rg_lru"](causal=True, num_heads=H)
  x, _ = _padded_inputs(seed=4)
  assert_finite_grads_and_bfloat16_close(module, _params(module, x), x)


def test_decoding_equals_the_forward_pass_in_a_cache_of_constant_size():
  """The cache (the convolution's last W − 1 inputs, h, whether the sequence has started) has the same shapes
  whatever the length; decoding sequences padded at the start, with their masks, gives the forward pass's outputs at
  the real positions (the first real position is the reset, whichever step it comes at)."""
  module = MIXERS["rg_lru"](causal=True, num_heads=H)
  init_decoding = functools.partial(module.init, decode=True)
  shapes = [
    jax.tree.map(jnp.shape, jax.eval_shape(init_decoding, jax.random.key(0), jnp.zeros((B, T, D)))["cache"])
    for T in (3, 64)
  ]
  assert shapes[0] == shapes[1] == {"conv_1d": {"conv_state": (B, K - 1, D)}, "h": (B, D), "started": (B,)}
  x, mask = _padded_inputs(L=9, left=2, right=0, seed=5)
  params = _params(module, x)
  cache_shapes = jax.eval_shape(init_decoding, jax.random.key(0), x)["cache"]

  @jax.jit
  def run(params, x):
    def step(cache, inputs):
      x_t, m_t = inputs
      y_t, mutated = module.apply(
        {"params": params, "cache": cache}, x_t[:, None], mask=m_t[:, None], decode=True, mutable=["cache"]
      )
      return mutated["cache"], y_t[:, 0]

    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)
    _, ys = jax.lax.scan(step, cache, (x.swapaxes(0, 1), mask.T))
    return module.apply({"params": params}, x, mask=mask), ys.swapaxes(0, 1)

  full, stepped = run(params, x)
  assert_close_sums(np.asarray(stepped)[mask], np.asarray(full)[mask], n_terms=N_TERMS(x.shape[1]))


def test_initialisation_is_the_references():
  """Λ: softplus(Λ) = −log r with r² uniform in [0.9², 0.999²] (rnn_real_param_init); the gates' blocks N(0, 1/W)
  (flax's variance_scaling counts the fan-in of an H × W/H × W/H array as H·W/H: the reference's too) and zero
  biases; linear_x, linear_y, linear_out N(0, 1/fan_in) with zero biases; the convolution N(0, 0.01/4) and zero
  bias. At width 256, 4 heads: hundreds of draws each."""
  d = 256
  p = jax.jit(MIXERS["rg_lru"](causal=True, num_heads=4).init)(jax.random.key(0), np.zeros((1, 3, d), np.float32))
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p["params"])
  r = np.exp(-np.logaddexp(0.0, p["a_param"]))
  assert np.all(r >= 0.9 - 1e-6) and np.all(r <= 0.999 + 1e-6)
  assert abs(np.mean(r**2) - (0.9**2 + 0.999**2) / 2) < 0.01
  for gate in ("input_gate", "a_gate"):
    assert p[gate]["kernel"].shape == (4, 64, 64) and abs(p[gate]["kernel"].std() * 16 - 1) < 0.05
    assert np.all(p[gate]["bias"] == 0)
  for name in ("linear_x", "linear_y", "linear_out"):
    assert abs(p[name]["kernel"].std() * 16 - 1) < 0.05 and np.all(p[name]["bias"] == 0)
  assert abs(p["conv_1d"]["taps"].std() / 0.05 - 1) < 0.05 and np.all(p["conv_1d"]["bias"] == 0)


def test_options_are_checked():
  assert type(MIXERS["rg_lru"](causal=False)).__name__ == "ByReversal"  # bidirectional: both ways by reversal
  with pytest.raises(UserError, match="divisible by config.mixer.num_heads=3"):
    MIXERS["rg_lru"].check({"num_heads": 3}, d_model=8, causal=True)
  with pytest.raises(UserError, match="lru_width=10"):
    MIXERS["rg_lru"].check({"num_heads": 4, "lru_width": 10}, d_model=8, causal=True)
  p = jax.eval_shape(MIXERS["rg_lru"](causal=True, lru_width=12, num_heads=3, conv_width=2).init, jax.random.key(0),
                     jnp.zeros((1, 2, D)))["params"]  # fmt: skip
  assert p["linear_out"]["kernel"].shape == (12, D) and p["conv_1d"]["taps"].shape == (2, 12)
  assert p["a_gate"]["kernel"].shape == (3, 4, 4)

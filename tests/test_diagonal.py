"""The diagonal recurrence h_t = a_t ⊙ h_{t−1} + b_t (efftx/mixers/diagonal.py) against a float64 loop over the
real positions, in every form (associative, sequential, chunked), in values and gradients. The gradients' reference
is JAX's own differentiation of a float64 jax.lax.scan of the step (jax.enable_x64), so it shares
nothing with the custom backward pass under test.

Tolerance: h_t = Σ_{s≤t} (Π_{s<r≤t} a_r) b_s is a sum of up to L terms, each a product of up to L factors; any
evaluation order rounds each partial sum and product once, so two orders agree within 2L·eps32 of the same sum taken
over |a|, |b| (assert_close_sums with n_terms 2L and the scale of that absolute recurrence). The gradient
g_t = ∂_t + a_{t+1} g_{t+1} is the same sum run backwards (∂/∂b = g), and ∂/∂a_t = g_t h_{t−1} multiplies two such
sums (4L terms).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from efftx.errors import UserError
from efftx.mixers import diagonal

FORMS = [dict(impl="associative"), dict(impl="sequential"), dict(impl="chunked", chunk=8)]
IDS = ["associative", "sequential", "chunked-8"]


def _loop(a, b, h0, real):
  """float64 numpy: h over the real positions, carried unchanged over padded ones."""
  h = np.array(h0, np.float64)
  out = np.zeros(np.broadcast(a, b).shape)
  for t in range(a.shape[1]):
    r = real[:, t].reshape((-1,) + (1,) * (h.ndim - 1))
    h = np.where(r, a[:, t] * h + b[:, t], h)
    out[:, t] = h
  return out


def _reference_grads(a, b, h0, real, g):
  """∂ Σ g·h / ∂ (a, b, h0), float64, by JAX's autodiff of a plain scan of the step."""
  with jax.enable_x64(True):

    def loss(a, b, h0):
      r = jnp.asarray(real).reshape(real.shape + (1,) * (a.ndim - 2))

      def body(h, t):
        h = jnp.where(r[:, t], a[:, t] * h + b[:, t], h)
        return h, h

      h_LxBxS = jax.lax.scan(body, h0, jnp.arange(a.shape[1]))[1]
      return jnp.sum(h_LxBxS.swapaxes(0, 1) * g)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*(jnp.asarray(v, jnp.float64) for v in (a, b, h0)))
    return [np.asarray(v) for v in grads]


def _inputs(B=2, L=37, S=(3, 2), low=0.0, high=1.0, seed=0):
  """a ~ U(low, high), b ~ N(0, 1), h0 ~ N(0, 1); the first sequence padded at the start (3), the second at the end
  (5)."""
  rng = np.random.default_rng(seed)
  a = rng.uniform(low, high, (B, L, *S)).astype(np.float32)
  b = rng.normal(size=(B, L, *S)).astype(np.float32)
  h0 = rng.normal(size=(B, *S)).astype(np.float32)
  real = np.ones((B, L), bool)
  real[0, :3] = False
  real[1, L - 5 :] = False
  g = rng.normal(size=(B, L, *S)).astype(np.float32)
  return a, b, h0, real, g


def _check(form, a, b, h0, real, g, min_abs=None):
  """Values and gradients of `form` against the references; with min_abs, also that every reference entry above it
  is nonzero here (no gradient lost to underflow or a wrong 0)."""
  L = a.shape[1]

  @jax.jit
  def run(a, b, h0):
    h, vjp = jax.vjp(lambda a, b, h0: diagonal.scan(a, b, h0, real, **form), a, b, h0)
    return h, vjp(g)

  h, (ga, gb, gh0) = run(a, b, h0)
  assert h.dtype == jnp.float32
  a64, b64, h064 = (np.asarray(v, np.float64) for v in (a, b, h0))
  scale_h = np.abs(_loop(np.abs(a64), np.abs(b64), np.abs(h064), real)).max()
  assert_close_sums(h, _loop(a64, b64, h064, real), n_terms=2 * L, scale=scale_h, err_msg="h")
  want_a, want_b, want_h0 = _reference_grads(a64, b64, h064, real, np.asarray(g, np.float64))
  abs_a, abs_b, _ = _reference_grads(np.abs(a64), np.abs(b64), np.abs(h064), real, np.abs(g).astype(np.float64))
  scale_g = np.abs(abs_b).max()
  assert_close_sums(gb, want_b, n_terms=2 * L, scale=scale_g, err_msg="d/db")
  assert_close_sums(gh0, want_h0, n_terms=2 * L, scale=scale_g, err_msg="d/dh0")
  assert_close_sums(ga, want_a, n_terms=4 * L, scale=np.abs(abs_a).max(), err_msg="d/da")
  for got in (h, ga, gb, gh0):
    assert np.all(np.isfinite(got))
  pad = ~real
  assert np.all(np.asarray(ga)[pad] == 0) and np.all(np.asarray(gb)[pad] == 0)  # padding takes no gradient
  if min_abs is not None:
    for got, want in ((h, _loop(a64, b64, h064, real)), (ga, want_a), (gb, want_b)):
      assert np.all(np.asarray(got)[np.abs(want) > min_abs] != 0)


@pytest.mark.parametrize("form", FORMS, ids=IDS)
def test_every_form_equals_the_loop_with_padding_at_both_ends(form):
  """L = 37 (chunks of 8 do not divide it), a state of 3×2 per position, an initial state, padding at both ends."""
  _check(form, *_inputs())


@pytest.mark.parametrize("form", FORMS, ids=IDS)
def test_strong_and_weak_decay(form):
  """a ∈ [0, 1e-6] (the past gone after a step; a exactly 0 at one position) and a ∈ [1 − 1e-6, 1] (nothing decays
  over the sequence: h a running sum): no NaN, and no entry the reference has above 1e-30 comes out 0."""
  a, b, h0, real, g = _inputs(low=0.0, high=1e-6, seed=1)
  a[:, 5] = 0.0
  _check(form, a, b, h0, real, g, min_abs=1e-30)
  a, b, h0, real, g = _inputs(low=1 - 1e-6, high=1.0, seed=2)
  a[:, 7] = 1.0
  _check(form, a, b, h0, real, g, min_abs=1e-30)


def test_length_4096_in_the_chosen_form():
  """One long sequence of width 2, a ∈ [0.99, 1] (memory of ~100 … 4096 steps), padded at both ends."""
  a, b, h0, real, g = _inputs(B=2, L=4096, S=(2,), low=0.99, high=1.0, seed=3)
  real[0, :100] = False
  real[1, -100:] = False
  _check({}, a, b, h0, real, g)


def test_the_scan_equals_the_step_looped():
  """diagonal.step, the decoding form, applied position by position gives the training form's h."""
  a, b, h0, real, _ = _inputs(L=9, seed=4)

  @jax.jit
  def both(a, b, h0):
    h, hs = h0, []
    for t in range(a.shape[1]):
      h = diagonal.step(h, a[:, t], b[:, t], real[:, t])
      hs.append(h)
    return diagonal.scan(a, b, h0, real), jnp.stack(hs, 1)

  scanned, stepped = both(a, b, h0)
  assert_close_sums(scanned, stepped, n_terms=2 * a.shape[1], scale=np.abs(stepped).max())


def test_bfloat16_inputs_run_in_float32_and_bad_options_are_refused():
  a, b, h0, real, _ = _inputs(L=5, seed=5)
  a16, b16 = jnp.asarray(a, jnp.bfloat16), jnp.asarray(b, jnp.bfloat16)
  h = jax.jit(lambda a, b: diagonal.scan(a, b, None, real))(a16, b16)
  assert h.dtype == jnp.float32
  want = _loop(np.asarray(a16, np.float64), np.asarray(b16, np.float64), np.zeros_like(h0), real)
  assert_close_sums(h, want, n_terms=10)
  with pytest.raises(UserError, match="impl='fast'"):
    diagonal.scan(a, b, impl="fast")
  with pytest.raises(UserError, match="chunk=0"):
    diagonal.scan(a, b, impl="chunked", chunk=0)

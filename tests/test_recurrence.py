"""efftx.mixers.recurrence against the naive recurrence, written from flash-linear-attention's fla/ops/gla/naive.py
(naive_recurrent_gla: h = h·exp(gk_t)[..., None] + k_t v_tᵀ, o_t = (q_t[..., None]·h).sum(−2), one position at a
time; its scale K^-½ is the caller's, here 1) and mamba_ssm/modules/ssd_minimal.py (a scalar A per head broadcast
over the state): in float64 numpy for the values, in float64 jnp (jax.enable_x64) for the gradients, position by
position — independent of the chunked code. Padded positions take g = 0, k = 0 (the reference runs the real
positions alone; with these, padding at either end is the same)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_gradients
from conftest import assert_close_sums
from efftx.mixers import recurrence

EPS = float(jnp.finfo(jnp.float32).eps)


def _naive(q, k, v, g, real, state=None):
  """float64 numpy, one position at a time: (y B×L×H×V, final state B×H×K×V)."""
  q, k, v, g = (np.asarray(a, np.float64) for a in (q, k, v, g))
  B, L, H, K = q.shape
  h = np.zeros((B, H, K, v.shape[-1])) if state is None else np.array(state, np.float64)
  y = np.zeros((B, L, H, v.shape[-1]))
  for t in range(L):
    decay = np.exp(g[:, t] if g.ndim == 4 else g[:, t, :, None])  # B×H×K
    decay = np.where(real[:, t, None, None], decay, 1.0)
    kv = k[:, t, :, :, None] * v[:, t, :, None, :] * real[:, t, None, None, None]
    h = h * decay[..., None] + kv
    y[:, t] = (q[:, t, :, :, None] * h).sum(-2)
  return y, h


def _naive_jnp(q, k, v, g, real, state):
  """The same in jnp (jax.lax.scan over positions), for float64 gradients."""

  def step(h, inputs):
    q_t, k_t, v_t, g_t, real_t = inputs
    decay = jnp.exp(g_t if g_t.ndim == 3 else g_t[..., None])
    decay = jnp.where(real_t[:, None, None], decay, 1.0)
    h = h * decay[..., None] + k_t[..., None] * v_t[..., None, :] * real_t[:, None, None, None]
    return h, (q_t[..., None] * h).sum(-2)

  h, y = jax.lax.scan(step, state, tuple(jnp.swapaxes(a, 0, 1) for a in (q, k, v, g, real)))
  return jnp.swapaxes(y, 0, 1), h


def _inputs(seed, B, L, H, K, V, vector, left=3, right=5):
  """q, k, v ~ N(0, 1); log-decays mixing strong (−20: the past gone in one step), weak (−1e-6: none over the
  sequence) and moderate (−U(0, 2)) ones per position and channel; the first sequence padded at the start, the
  second at the end; an initial state ~ N(0, 1)."""
  rng = np.random.default_rng(seed)
  q, k = (rng.normal(size=(B, L, H, K)).astype(np.float32) for _ in range(2))
  v = rng.normal(size=(B, L, H, V)).astype(np.float32)
  shape = (B, L, H, K) if vector else (B, L, H)
  g = np.choose(
    rng.integers(0, 3, size=shape), [np.full(shape, -20.0), np.full(shape, -1e-6), -rng.uniform(0, 2, shape)]
  )
  real = np.ones((B, L), bool)
  real[0, :left] = False
  real[-1, L - right :] = False
  state = rng.normal(size=(B, H, K, V)).astype(np.float32)
  return q, k, v, g.astype(np.float32), real, state


def _abs_scale(q, k, v, g, real, state):
  """The largest Σ|term| of an output: the naive recurrence on |q|, |k|, |v|, |state|."""
  return float(np.abs(_naive(*(np.abs(a) for a in (q, k, v)), g, real, np.abs(state))[0]).max())


CASES = [  # (H, K, V, L, chunk, vector)
  (1, 4, 3, 37, 8, False),  # one head, a chunk that does not divide L
  (2, 4, 3, 37, 5, True),  # per-key decays, chunks of 5 (sub-chunks of 5)
  (2, 8, 2, 45, 40, True),  # chunks rounded up to 48: three sub-chunks of 16
]


@pytest.mark.parametrize("H,K,V,L,chunk,vector", CASES)
def test_values_and_gradients_equal_the_naive_recurrence(H, K, V, L, chunk, vector):
  """Outputs and final state within float32's rounding of sums of L·K terms (each term's exp within a few eps):
  (L + K)·eps of the largest Σ|term|. Gradients of Σ y·w + Σ S·u (q, k, v, g, the initial state) against float64
  jax.grad of the naive scan, within the backward pass's twice as many terms."""
  q, k, v, g, real, state = _inputs(L + K, 2, L, H, K, V, vector)
  run = jax.jit(lambda *a: recurrence.chunked_gated_recurrence(*a[:4], chunk=chunk, real_BxL=real, state_BxHxKxV=a[4]))
  y, final = run(q, k, v, g, state)
  assert y.dtype == final.dtype == jnp.float32
  want_y, want_final = _naive(q, k, v, g, real, state)
  scale = _abs_scale(q, k, v, g, real, state)
  assert_close_sums(y, want_y, n_terms=L + K, scale=scale)
  assert_close_sums(final, want_final, n_terms=L + K, scale=scale)
  big = np.abs(want_y) > 1e-3 * np.abs(want_y).max()
  assert np.all(np.asarray(y)[big] != 0)  # no term lost to a wrong 0

  rng = np.random.default_rng(1)
  w, u = rng.normal(size=want_y.shape), rng.normal(size=want_final.shape)
  loss = lambda f: lambda *a: jnp.sum(f(*a)[0] * w) + jnp.sum(f(*a)[1] * u)
  got = jax.jit(jax.grad(loss(run), argnums=range(5)))(q, k, v, g, state)
  with jax.enable_x64(True):
    naive = lambda *a: _naive_jnp(*a[:4], real, a[4])
    want = jax.jit(jax.grad(loss(naive), argnums=range(5)))(*(np.asarray(a, np.float64) for a in (q, k, v, g, state)))
    want = jax.tree.map(np.asarray, want)
  assert all(bool(jnp.all(jnp.isfinite(a))) for a in got)
  assert_close_gradients(got, want, n_terms=2 * (L + K) + V)


@pytest.mark.parametrize("vector", [False, True])
def test_chunked_equals_the_step_form(vector):
  """gated_recurrence_step looped over the positions (the decoding path) gives the chunked outputs and state."""
  B, L, H, K, V = 2, 19, 2, 4, 3
  q, k, v, g, real, state = _inputs(7, B, L, H, K, V, vector)
  y, final = jax.jit(lambda *a: recurrence.chunked_gated_recurrence(*a, chunk=6, real_BxL=real, state_BxHxKxV=state))(
    q, k, v, g
  )

  @jax.jit
  def loop(q, k, v, g):
    def step(s, inputs):
      y_t, s = recurrence.gated_recurrence_step(s, *inputs)
      return s, y_t

    s, y = jax.lax.scan(step, jnp.asarray(state), tuple(jnp.swapaxes(a, 0, 1) for a in (q, k, v, g, real)))
    return jnp.swapaxes(y, 0, 1), s

  want_y, want_final = loop(q, k, v, g)
  scale = _abs_scale(q, k, v, g, real, state)
  assert_close_sums(y, want_y, n_terms=2 * (L + K), scale=scale)
  assert_close_sums(final, want_final, n_terms=2 * (L + K), scale=scale)


def test_bfloat16_inputs_sum_in_float32():
  """bfloat16 q, k, v: the outputs float32, within float32's rounding of the naive recurrence at the rounded inputs
  (the decays and state never pass through bfloat16); gradients finite."""
  B, L, H, K, V = 2, 29, 2, 4, 3
  q, k, v, g, real, state = _inputs(11, B, L, H, K, V, True)
  q16, k16, v16 = (jnp.asarray(a, jnp.bfloat16) for a in (q, k, v))
  run = jax.jit(lambda *a: recurrence.chunked_gated_recurrence(*a, chunk=16, real_BxL=real)[0])
  y = run(q16, k16, v16, g)
  assert y.dtype == jnp.float32
  rounded = [np.asarray(a, np.float32) for a in (q16, k16, v16)]
  want, _ = _naive(*rounded, g, real)
  assert_close_sums(y, want, n_terms=L + K, scale=_abs_scale(*rounded, g, real, np.zeros_like(state)))
  grads = jax.jit(jax.grad(lambda *a: run(*a).sum(), argnums=range(4)))(q16, k16, v16, g)
  assert all(bool(jnp.all(jnp.isfinite(a.astype(jnp.float32)))) for a in grads)


@pytest.mark.parametrize("vector", [False, True])
def test_a_sequence_of_4096_with_strong_and_weak_decays(vector):
  """Length 4,096 in chunks of 64, padding at both ends, strong, weak and moderate decays: within the bound above
  (a weak channel sums nearly every position), gradients finite."""
  B, L, H, K, V = 2, 4096, 1, 2, 2
  q, k, v, g, real, state = _inputs(13, B, L, H, K, V, vector, left=100, right=57)
  run = jax.jit(lambda *a: recurrence.chunked_gated_recurrence(*a, chunk=64, real_BxL=real)[0])
  y = run(q, k, v, g)
  want, _ = _naive(q, k, v, g, real)
  assert_close_sums(y, want, n_terms=L + K, scale=_abs_scale(q, k, v, g, real, np.zeros_like(state)))
  grads = jax.jit(jax.grad(lambda *a: run(*a).sum(), argnums=range(4)))(q, k, v, g)
  assert all(bool(jnp.all(jnp.isfinite(a))) for a in grads)


def test_padding_at_either_end_changes_nothing():
  """The same real positions padded at the start, at the end, or not at all: equal outputs there and final states."""
  B, L, H, K, V = 1, 12, 1, 3, 2
  q, k, v, g, _, _ = _inputs(17, B, L, H, K, V, True)
  noise = lambda a: np.random.default_rng(3).normal(size=a.shape).astype(np.float32) * 10
  pad = lambda a, left, right: np.concatenate([noise(a)[:, :left], a, noise(a)[:, :right]], axis=1)
  results = []
  run = jax.jit(functools.partial(recurrence.chunked_gated_recurrence, chunk=5))
  for left, right in ((0, 0), (5, 0), (3, 4)):
    real = np.concatenate([np.zeros((B, left), bool), np.ones((B, L), bool), np.zeros((B, right), bool)], axis=1)
    padded = [pad(a, left, right) for a in (q, k, v, g)]
    padded[3] = -np.abs(padded[3])
    y, final = run(*padded, real_BxL=real)
    results.append((np.asarray(y)[:, left : left + L], np.asarray(final)))
  for y, final in results[1:]:
    np.testing.assert_allclose(y, results[0][0], rtol=0, atol=(L + K) * EPS * 10 * np.abs(results[0][0]).max())
    np.testing.assert_allclose(final, results[0][1], rtol=0, atol=(L + K) * EPS * 10 * np.abs(results[0][1]).max())


def test_heads_sharing_q_and_k_in_groups_equal_the_naive_recurrence():
  """q and k with G = 2 groups for H = 6 heads (Mamba-2's shared B and C): head h reads group h // 3. Against the
  float64 loop on q and k repeated to every head; per-key decays refuse groups."""
  B, L, H, K, V, G = 2, 13, 6, 4, 3, 2
  q, k, v, g, real, state = _inputs(11, B, L, H, K, V, vector=False)
  q, k = q[:, :, ::3], k[:, :, ::3]  # one per group
  y, final = jax.jit(lambda *a: recurrence.chunked_gated_recurrence(*a, chunk=5, real_BxL=real, state_BxHxKxV=state))(
    q, k, v, g
  )
  heads = lambda a: np.repeat(np.asarray(a, np.float64), H // G, axis=2)
  want_y, want_final = _naive(heads(q), heads(k), v, g, real, state)
  scale = _abs_scale(heads(q), heads(k), v, g, real, state)
  assert_close_sums(y, want_y, n_terms=2 * (L + K), scale=scale)
  assert_close_sums(final, want_final, n_terms=2 * (L + K), scale=scale)
  with pytest.raises(ValueError, match="heads"):
    recurrence.chunked_gated_recurrence(q, k, v, jnp.zeros((B, L, H, K)), chunk=5)

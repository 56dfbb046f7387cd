"""The chunked (gated) delta rule (efftx/mixers/recurrence.py) against float64 ports of fla's naive recurrences,
written from the reference files (fla-org/flash-linear-attention): fla/ops/gated_delta_rule/naive.py
`naive_recurrent_gated_delta_rule` (per position: h ← h·exp(g_t); b_v ← β_t (v_t − Σ_k h·k_t); h ← h + k_t b_vᵀ;
o_t = q_t·h) and fla/ops/delta_rule/naive.py `delta_rule_recurrence` (the same without the decay). Both scale q by
`scale` (default K^−½); efftx's core leaves the scale to the mixer, so the ports run with scale = 1.

Padding: the reference has none (fla unpads); each sequence's real positions alone go through it.

Tolerance: float32 against float64. An output sums, over the positions it sees, products of K-term dot products
whose factors went through the chunk's triangular solve (a sum of up to `chunk` earlier writes, each of ≤ K + V
terms): the roundings add to first order, so n_terms = L + chunk + K + V at the output's size (assert_close_sums).
Measured: ≤ 1.7·eps of the output's size at L = 13 (bound 21–36), 4.2·eps at
L = 4,096 (bound 4,164).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from efftx.mixers import recurrence

EPS = float(jnp.finfo(jnp.float32).eps)


def _reference(q, k, v, beta, g=None, scale=1.0, initial_state=None, xp=np):
  """naive_recurrent_gated_delta_rule (g given) or delta_rule_recurrence (g None), one sequence's heads at a time:
  q, k L×H×K; v L×H×V; beta, g L×H. Written without in-place assignment, so that xp = jax.numpy (under float64)
  differentiates it. Returns (o L×H×V, final h H×K×V)."""
  L, H, K = k.shape
  h = xp.zeros((H, K, v.shape[-1])) if initial_state is None else initial_state
  q = q * scale
  outputs = []
  for i in range(L):
    if g is not None:
      h = h * xp.exp(g[i])[:, None, None]
    b_v = v[i] - (h * k[i][:, :, None]).sum(-2)
    b_v = b_v * beta[i][:, None]
    h = h + k[i][:, :, None] * b_v[:, None, :]
    outputs.append(xp.einsum("hd,hdm->hm", q[i], h))
  return xp.stack(outputs), h


def _inputs(seed=0, B=2, L=13, H=2, K=4, V=3, left=3, right=2, g_range=(0.0, 2.0), beta_range=(0.0, 1.0)):
  """q ~ N(0, 1), L2-normalised k (as the layers feed it), v ~ N(0, 1), β uniform in beta_range, g = −U(g_range);
  the first sequence padded at the start, the second at the end (padded entries noise ×10)."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, L, H, K))
  k = rng.normal(size=(B, L, H, K))
  k /= np.linalg.norm(k, axis=-1, keepdims=True)
  v = rng.normal(size=(B, L, H, V))
  beta = rng.uniform(*beta_range, size=(B, L, H))
  g = -rng.uniform(*g_range, size=(B, L, H))
  real = np.ones((B, L), bool)
  real[0, :left] = False
  real[1, L - right :] = False
  noisy = lambda a: np.where(real.reshape(B, L, *[1] * (a.ndim - 2)), a, 10 * rng.normal(size=a.shape))
  return tuple(noisy(a).astype(np.float32) for a in (q, k, v, beta, g)), real


def _chunked(chunk, gated=True):
  def run(q, k, v, beta, g, real, state=None):
    return recurrence.chunked_delta_rule(
      q, k, v, beta, g if gated else None, chunk=chunk, real_BxL=real, state_BxHxKxV=state
    )

  return jax.jit(run)


def _compare(inputs, real, chunk, gated=True, state=None):
  """The chunked form's outputs at real positions and final states against the reference on each sequence's real
  positions; returns the largest error relative to the output's size."""
  q, k, v, beta, g = inputs
  y, final = _chunked(chunk, gated)(q, k, v, beta, g, real, state)
  assert y.dtype == final.dtype == jnp.float32
  L, K, V = q.shape[1], q.shape[-1], v.shape[-1]
  worst = 0.0
  for b in range(len(q)):
    r = real[b]
    s0 = None if state is None else np.asarray(state[b], np.float64)
    want, want_final = _reference(
      *(np.asarray(a[b][r], np.float64) for a in (q, k, v, beta)),
      np.asarray(g[b][r], np.float64) if gated else None,
      initial_state=s0,
    )
    n = L + chunk + K + V
    assert_close_sums(np.asarray(y)[b][r], want, n_terms=n, err_msg=f"outputs of sequence {b}")
    assert_close_sums(np.asarray(final)[b], want_final, n_terms=n, err_msg=f"final state of sequence {b}")
    worst = max(worst, np.abs(np.asarray(y)[b][r] - want).max() / (EPS * np.abs(want).max()))
  return worst


@pytest.mark.parametrize(
  "gated,chunk",
  [(True, 1), (True, 5), (False, 5), (False, 16)],  # 5 does not divide 13; 16 > L: one chunk, mostly padding
  ids=["gated-1", "gated-5", "deltanet-5", "deltanet-16"],
)
def test_matches_fla_naive_recurrence_with_padding_at_both_ends(gated, chunk):
  inputs, real = _inputs()
  _compare(inputs, real, chunk, gated)


def test_one_head_and_an_initial_state():
  """H = 1, K ≠ V, and a state carried in (the reference's initial_state)."""
  inputs, real = _inputs(seed=1, H=1, K=5, V=2, L=9)
  state = np.random.default_rng(2).normal(size=(2, 1, 5, 2)).astype(np.float32)
  _compare(inputs, real, chunk=4, state=state)


@pytest.mark.parametrize(
  "g_range",
  [(20.0, 30.0), (1e-7, 1e-6), (1e3, 1e4)],
  ids=["strong-decay", "weak-decay", "decay-underflows"],
)
def test_strong_and_weak_decays(g_range):
  """Strong decay (g ≤ −20: the state forgets each step, e^{G} underflows within a chunk), weak (g ≈ −1e−6: every
  position kept) and g ≤ −1,000 (exp underflows to 0 at once): outputs right, not NaN, and where the decay is
  weak not wrongly 0; gradients finite."""
  inputs, real = _inputs(seed=3, g_range=g_range)
  _compare(inputs, real, chunk=5)
  q, k, v, beta, g = inputs
  y = np.asarray(_chunked(5)(q, k, v, beta, g, real)[0])
  if g_range[0] < 1:  # no decay: the first real position's write still shows at the last
    first = np.where(real[1])[0][0]
    assert np.abs(y[1, real[1]]).min() > 0 and first == 0
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(_chunked(5)(*a, real)[0] ** 2), argnums=(0, 1, 2, 3, 4)))(*inputs)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in grads)


@pytest.mark.parametrize("beta_range", [(0.0, 1e-6), (1 - 1e-6, 1.0)], ids=["beta-near-0", "beta-near-1"])
def test_beta_near_0_and_near_1(beta_range):
  """β ≈ 0: almost nothing written (outputs ~1e−6 of v, compared at their own size); β ≈ 1: each write replaces
  the state's value at k_t wholly (the triangular system at its most coupled)."""
  inputs, real = _inputs(seed=4, beta_range=beta_range, g_range=(0.0, 0.1))
  _compare(inputs, real, chunk=5)


def test_chunked_equals_the_step_looped():
  """delta_rule_step over the positions, from a given state, with padding at both ends (a padded step leaves the
  state as it was) gives the chunked form's outputs and final state."""
  inputs, real = _inputs(seed=5)
  state = np.random.default_rng(6).normal(size=(2, 2, 4, 3)).astype(np.float32)
  y, final = _chunked(4)(*inputs, real, state)

  @jax.jit
  def loop(q, k, v, beta, g, real, state):
    def step(S, xs):
      y, S = recurrence.delta_rule_step(S, *xs)
      return S, y

    S, ys = jax.lax.scan(step, state, tuple(jnp.swapaxes(a, 0, 1) for a in (q, k, v, beta, g, real)))
    return jnp.swapaxes(ys, 0, 1), S

  y_loop, final_loop = loop(*inputs, real, state)
  n = inputs[0].shape[1] + 4 + 4 + 3
  assert_close_sums(np.asarray(y)[real], np.asarray(y_loop)[real], n_terms=n)
  assert_close_sums(final, final_loop, n_terms=n)
  ungated = recurrence.delta_rule_step(state, *(a[:, 0] for a in inputs[:4]))  # g None: DeltaNet's step
  zero_decay = recurrence.delta_rule_step(state, *(a[:, 0] for a in inputs[:4]), np.zeros((2, 2), np.float32))
  np.testing.assert_array_equal(ungated[1], zero_decay[1])


def test_gradients_equal_the_float64_references():
  """d (Σ y·w + Σ S_L·w') / d (q, k, v, β, g, S_0) against jax.grad of the reference port in float64 (jax.numpy
  under enable_x64), chunk 5 over 13 positions with padding at both ends; padded entries get exactly 0."""
  inputs, real = _inputs(seed=7)
  rng = np.random.default_rng(8)
  state = rng.normal(size=(2, 2, 4, 3)).astype(np.float32)
  w = rng.normal(size=(2, 13, 2, 3)) * real[..., None, None]
  w_final = rng.normal(size=(2, 2, 4, 3))

  def loss(q, k, v, beta, g, state):
    y, final = recurrence.chunked_delta_rule(q, k, v, beta, g, chunk=5, real_BxL=real, state_BxHxKxV=state)
    return jnp.sum(y * w) + jnp.sum(final * w_final)

  got = jax.jit(jax.grad(loss, argnums=tuple(range(6))))(*inputs, state)
  with jax.enable_x64(True):

    def loss64(q, k, v, beta, g, state):
      total = 0.0
      for b in range(2):
        r = real[b]
        y, final = _reference(q[b][r], k[b][r], v[b][r], beta[b][r], g[b][r], initial_state=state[b], xp=jnp)
        total = total + jnp.sum(y * w[b][r]) + jnp.sum(final * w_final[b])
      return total

    args64 = [jnp.asarray(a, jnp.float64) for a in (*inputs, state)]
    want = [np.asarray(a) for a in jax.jit(jax.grad(loss64, argnums=tuple(range(6))))(*args64)]
  for name, a, b in zip(("q", "k", "v", "beta", "g", "state"), got, want):
    assert_close_sums(a, b, n_terms=13 + 5 + 4 + 3, err_msg=name)
  for a in got[:5]:
    assert np.all(np.asarray(a)[~real] == 0)


def test_a_sequence_of_4096_with_padding_at_both_ends():
  """Length 4,096, one head of K = V = 2, chunk 64, padding at both ends, a slowly decaying head (g ≈ −1e−3: the
  state sums ~1,000 positions) in the sum's bound."""
  inputs, real = _inputs(seed=9, L=4096, H=1, K=2, V=2, left=100, right=57, g_range=(0.0, 2e-3))
  _compare(inputs, real, chunk=64)

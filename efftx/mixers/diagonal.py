"""The diagonal linear recurrence shared by the recurrent mixers (Mamba's selective scan, Griffin's RG-LRU):

    h_t = a_t ⊙ h_{t−1} + b_t,   h_{−1} = h0 (zeros if not given),

over the positions (axis 1) of a, b: B×L×… of any trailing state shape, float32. At a padded position (real_BxL
False) a is taken as 1 and b as 0: the state passes through unchanged, so padding at either end never reaches a real
position, and the gradients reaching a, b there are 0.

`scan` computes every h_t for training (forms below), `step` one position for decoding. Forms (`impl`):
  - "associative": jax.lax.associative_scan over the pairs (a, b), combined as (a₁, b₁)·(a₂, b₂) = (a₁a₂, a₂b₁ + b₂):
    log₂ L levels of elementwise work, ~2× the recurrence's arithmetic and every level's arrays kept for the
    backward pass;
  - "sequential": one jax.lax.scan over positions;
  - "chunked": a jax.lax.scan over chunks of `chunk` positions, each an associative scan, the carry entering each
    chunk's position as A_t h (A_t: the product of the chunk's a up to t).
Each is differentiated through a custom backward pass: the gradient of a linear recurrence is the same recurrence
run backwards, g_t = ∂/∂h_t + a_{t+1} g_{t+1}, with ∂/∂b_t = g_t, ∂/∂a_t = g_t h_{t−1} and ∂/∂h0 = a_0 g_0, so
the backward pass costs one more scan of the same form and keeps only a, h (not the form's intermediates). The
default is the form measured fastest on a 2-core CPU (experiments/performance/DECISIONS.md: diagonal-scan-form).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from efftx.errors import UserError

IMPLS = ("associative", "sequential", "chunked")
DEFAULT_IMPL = "sequential"  # experiments/performance/DECISIONS.md: diagonal-scan-form
DEFAULT_CHUNK = 64


def _combine(first, second):
  a1, b1 = first
  a2, b2 = second
  return a1 * a2, a2 * b1 + b2


def _associative(a_LxS, b_LxS):
  """h_t from h_{−1} = 0 along axis 0."""
  return jax.lax.associative_scan(_combine, (a_LxS, b_LxS), axis=0)[1]


def _sequential(a_LxS, b_LxS):
  def body(h, ab):
    h = ab[0] * h + ab[1]
    return h, h

  return jax.lax.scan(body, jnp.zeros_like(b_LxS[0]), (a_LxS, b_LxS))[1]


def _chunked(a_LxS, b_LxS, chunk: int):
  L = a_LxS.shape[0]
  T = min(chunk, L)
  n = -(-L // T)
  pad = [(0, n * T - L)] + [(0, 0)] * (a_LxS.ndim - 1)
  a_NxTxS = jnp.pad(a_LxS, pad, constant_values=1.0).reshape(n, T, *a_LxS.shape[1:])
  b_NxTxS = jnp.pad(b_LxS, pad).reshape(n, T, *b_LxS.shape[1:])

  def body(h_S, ab):
    prod_TxS, local_TxS = jax.lax.associative_scan(_combine, ab, axis=0)
    h_TxS = prod_TxS * h_S + local_TxS
    return h_TxS[-1], h_TxS

  _, h_NxTxS = jax.lax.scan(body, jnp.zeros_like(b_LxS[0]), (a_NxTxS, b_NxTxS))
  return h_NxTxS.reshape(n * T, *b_LxS.shape[1:])[:L]


def _run(impl: str, chunk: int, a_LxS, b_LxS):
  if impl == "associative":
    return _associative(a_LxS, b_LxS)
  if impl == "sequential":
    return _sequential(a_LxS, b_LxS)
  return _chunked(a_LxS, b_LxS, chunk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _recurrence(impl, chunk, a_LxS, b_LxS, h0_S):
  """h_t = a_t h_{t−1} + b_t along axis 0, from h0."""
  return _run(impl, chunk, a_LxS, b_LxS.at[0].add(a_LxS[0] * h0_S))


def _recurrence_fwd(impl, chunk, a_LxS, b_LxS, h0_S):
  h_LxS = _recurrence(impl, chunk, a_LxS, b_LxS, h0_S)
  return h_LxS, (a_LxS, h_LxS, h0_S)


def _recurrence_bwd(impl, chunk, residuals, g_LxS):
  a_LxS, h_LxS, h0_S = residuals
  # g_t = ∂_t + a_{t+1} g_{t+1}: the recurrence over reversed positions, with a shifted by one.
  next_a_LxS = jnp.concatenate([a_LxS[1:], jnp.zeros_like(a_LxS[:1])])
  g_LxS = _run(impl, chunk, next_a_LxS[::-1], g_LxS[::-1])[::-1]
  previous_h_LxS = jnp.concatenate([h0_S[None], h_LxS[:-1]])
  return g_LxS * previous_h_LxS, g_LxS, a_LxS[0] * g_LxS[0]


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def _check(impl: str, chunk: int) -> None:
  if impl not in IMPLS:
    raise UserError(f"diagonal scan impl={impl!r}: one of {', '.join(IMPLS)}")
  if chunk < 1:
    raise UserError(f"diagonal scan chunk={chunk}: need ≥ 1")


def scan(
  a_BxLxS: jax.Array,
  b_BxLxS: jax.Array,
  h0_BxS: jax.Array | None = None,
  real_BxL: jax.Array | None = None,
  *,
  impl: str = DEFAULT_IMPL,
  chunk: int = DEFAULT_CHUNK,
) -> jax.Array:
  """h at every position, B×L×S (S: any trailing shape), float32."""
  _check(impl, chunk)
  a_BxLxS = a_BxLxS.astype(jnp.float32)
  b_BxLxS = jnp.broadcast_to(b_BxLxS.astype(jnp.float32), a_BxLxS.shape)
  a_BxLxS = jnp.broadcast_to(a_BxLxS, b_BxLxS.shape)
  if real_BxL is not None:
    real_BxLxS = real_BxL.reshape(real_BxL.shape + (1,) * (a_BxLxS.ndim - 2)).astype(bool)
    a_BxLxS = jnp.where(real_BxLxS, a_BxLxS, 1.0)
    b_BxLxS = jnp.where(real_BxLxS, b_BxLxS, 0.0)
  h0_BxS = jnp.zeros_like(b_BxLxS[:, 0]) if h0_BxS is None else h0_BxS.astype(jnp.float32)
  h_LxBxS = _recurrence(impl, chunk, a_BxLxS.swapaxes(0, 1), b_BxLxS.swapaxes(0, 1), h0_BxS)
  return h_LxBxS.swapaxes(0, 1)


def step(h_BxS: jax.Array, a_BxS: jax.Array, b_BxS: jax.Array, real_B: jax.Array | None = None) -> jax.Array:
  """One position for decoding: a ⊙ h + b in float32, or h unchanged where real_B is False."""
  new_BxS = a_BxS.astype(jnp.float32) * h_BxS.astype(jnp.float32) + b_BxS.astype(jnp.float32)
  if real_B is None:
    return new_BxS
  return jnp.where(real_B.reshape(real_B.shape + (1,) * (new_BxS.ndim - 1)).astype(bool), new_BxS, h_BxS)

"""The diagonal linear recurrence shared by the recurrent mixers (Mamba's selective scan, Griffin's RG-LRU):

    h_t = a_t ⊙ h_{t−1} + b_t,   h_{−1} = h0 (zeros if not given),

over the positions (axis 1) of a, b: B×L×… of any trailing state shape, float32. At a padded position (real_BxL
False) a is taken as 1 and b as 0: the state passes through unchanged, so padding at either end never reaches a real
position, and the gradients reaching a, b there are 0.

`scan` computes every h_t for training, `step` one position for decoding. The training form is one jax.lax.scan over
positions, differentiated by a custom backward pass: the gradient of a linear recurrence is the same recurrence run
backwards, g_t = ∂_t + a_{t+1} g_{t+1}, with ∂/∂b_t = g_t, ∂/∂a_t = g_t h_{t−1} and ∂/∂h0 = a_0 g_0, so the
backward pass is one more scan and keeps only a, h and h0. The form was chosen by measurement against
jax.lax.associative_scan and a chunked form (experiments/performance/DECISIONS.md: diagonal-scan-form).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _sequential(a_LxS, b_LxS):
  """h_t = a_t h_{t−1} + b_t along axis 0 from h_{−1} = 0."""

  def body(h, ab):
    h = ab[0] * h + ab[1]
    return h, h

  return jax.lax.scan(body, jnp.zeros_like(b_LxS[0]), (a_LxS, b_LxS))[1]


@jax.custom_vjp
def _recurrence(a_LxS, b_LxS, h0_S):
  """h_t = a_t h_{t−1} + b_t along axis 0, from h0."""
  return _sequential(a_LxS, b_LxS.at[0].add(a_LxS[0] * h0_S))


def _recurrence_fwd(a_LxS, b_LxS, h0_S):
  h_LxS = _recurrence(a_LxS, b_LxS, h0_S)
  return h_LxS, (a_LxS, h_LxS, h0_S)


def _recurrence_bwd(residuals, g_LxS):
  a_LxS, h_LxS, h0_S = residuals
  # g_t = ∂_t + a_{t+1} g_{t+1}: the recurrence over reversed positions, with a shifted by one.
  next_a_LxS = jnp.concatenate([a_LxS[1:], jnp.zeros_like(a_LxS[:1])])
  g_LxS = _sequential(next_a_LxS[::-1], g_LxS[::-1])[::-1]
  previous_h_LxS = jnp.concatenate([h0_S[None], h_LxS[:-1]])
  return g_LxS * previous_h_LxS, g_LxS, a_LxS[0] * g_LxS[0]


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def scan(
  a_BxLxS: jax.Array,
  b_BxLxS: jax.Array,
  h0_BxS: jax.Array | None = None,
  real_BxL: jax.Array | None = None,
) -> jax.Array:
  """h at every position, B×L×S (S: any trailing shape), float32."""
  a_BxLxS = a_BxLxS.astype(jnp.float32)
  b_BxLxS = jnp.broadcast_to(b_BxLxS.astype(jnp.float32), a_BxLxS.shape)
  a_BxLxS = jnp.broadcast_to(a_BxLxS, b_BxLxS.shape)
  if real_BxL is not None:
    real_BxLxS = real_BxL.reshape(real_BxL.shape + (1,) * (a_BxLxS.ndim - 2)).astype(bool)
    a_BxLxS = jnp.where(real_BxLxS, a_BxLxS, 1.0)
    b_BxLxS = jnp.where(real_BxLxS, b_BxLxS, 0.0)
  h0_BxS = jnp.zeros_like(b_BxLxS[:, 0]) if h0_BxS is None else h0_BxS.astype(jnp.float32)
  h_LxBxS = _recurrence(a_BxLxS.swapaxes(0, 1), b_BxLxS.swapaxes(0, 1), h0_BxS)
  return h_LxBxS.swapaxes(0, 1)


def step(h_BxS: jax.Array, a_BxS: jax.Array, b_BxS: jax.Array, real_B: jax.Array | None = None) -> jax.Array:
  """One position for decoding: a ⊙ h + b in float32, or h unchanged where real_B is False."""
  new_BxS = a_BxS.astype(jnp.float32) * h_BxS.astype(jnp.float32) + b_BxS.astype(jnp.float32)
  if real_B is None:
    return new_BxS
  return jnp.where(real_B.reshape(real_B.shape + (1,) * (new_BxS.ndim - 1)).astype(bool), new_BxS, h_BxS)

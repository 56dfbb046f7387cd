"""GLA against a float64 numpy port of flash-linear-attention's fla/layers/gla.py `GatedLinearAttention.forward`
(q/k/v/g projections, gk = logsigmoid(gk_proj(x)) / gate_logit_normalizer, FusedRMSNormGated: RMSNorm(o)·w·g·σ(g)
per head, o_proj) with fla/ops/gla/naive.py `naive_recurrent_gla` (scale K^-½, h = h·exp(gk) + k vᵀ, o = q·h) one
position at a time, on each sequence's real positions alone."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_finite_grads_and_bfloat16_close
from conftest import assert_gradients_match_central_differences
from conftest import compiled
from efftx.errors import UserError
from efftx.mixers import MIXERS

EPS = float(jnp.finfo(jnp.float32).eps)
B, D = 2, 16


def _reference(x, p, H, normalizer=16.0):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  x = np.asarray(x, np.float64)
  L = len(x)
  q, k, v, g = (x @ p[n]["kernel"] for n in ("q_proj", "k_proj", "v_proj", "g_proj"))
  gk = x @ p["gk_proj_0"]["kernel"] @ p["gk_proj_1"]["kernel"] + p["gk_proj_1"]["bias"]
  gk = -np.log1p(np.exp(-gk)) / normalizer
  K, V = q.shape[1] // H, v.shape[1] // H
  q, k, gk = (a.reshape(L, H, K) for a in (q, k, gk))
  v, g = v.reshape(L, H, V), g.reshape(L, H, V)
  h = np.zeros((H, K, V))
  o = np.zeros((L, H, V))
  for t in range(L):
    h = h * np.exp(gk[t])[..., None] + k[t][..., None] * v[t][:, None, :]
    o[t] = (q[t][..., None] * K**-0.5 * h).sum(-2)
  o = o / np.sqrt((o**2).mean(-1, keepdims=True) + 1e-5) * p["g_norm_weight"] * g / (1 + np.exp(-g))
  return o.reshape(L, H * V) @ p["o_proj"]["kernel"]


def _padded_inputs(seed, L, left, right):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[0, :left] = False
  mask[1, L - right :] = False
  return np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32), mask


@pytest.mark.parametrize("options", [dict(num_heads=2, chunk=20), dict()], ids=["two-heads-chunk-20", "defaults"])
def test_matches_the_reference_forward_with_padding_at_both_ends(options):
  """Within 8·(D + L·d_k + d_v)·eps of the largest output: the projections' sums, the recurrence's L·d_k-term sums
  and the norm's."""
  module = MIXERS["gla"](causal=True, **options)
  _compare(module, *_padded_inputs(0, 37, 3, 5), H=options.get("num_heads", 4))


def test_a_sequence_of_4096_with_padding_at_both_ends():
  """Length 4,096 in 64 chunks of 64, two heads, 100 and 57 padded positions; the first head's gate bias at +12
  (log σ ≈ −6e-6: decays within 1e-6 of 1, a state that sums every position), the second at its initial decays:
  the same bound, its L·d_k terms grown with the length."""
  module = MIXERS["gla"](causal=True, num_heads=2, chunk=64)

  def weak(params):
    gate = params["gk_proj_1"]
    K = gate["bias"].shape[0] // 2
    return {**params, "gk_proj_1": {**gate, "bias": gate["bias"].at[:K].set(12.0)}}

  _compare(module, *_padded_inputs(7, 4096, 100, 57), H=2, change=weak)


def _compare(module, x, mask, H, change=lambda params: params):
  L = x.shape[1]
  variables = {"params": change(compiled(module).init(jax.random.key(0), x)["params"])}
  y = np.asarray(compiled(module).apply(variables, x, mask=mask), np.float64)
  for b in range(B):
    want = _reference(x[b][mask[b]], variables["params"], H)
    bound = 8 * (D + L * D // 2 // H + D // H) * EPS * np.abs(want).max()
    np.testing.assert_allclose(y[b][mask[b]], want, rtol=0, atol=bound, err_msg=f"sequence {b}")


def test_decoding_equals_the_forward_pass_with_a_cache_of_constant_size():
  module = MIXERS["gla"](causal=True, num_heads=2)
  init_decoding = functools.partial(module.init, decode=True)
  shapes = [
    jax.tree.map(jnp.shape, jax.eval_shape(init_decoding, jax.random.key(0), jnp.zeros((B, T, D)))["cache"])
    for T in (1, 1000)
  ]
  assert shapes[0] == shapes[1]
  x, mask = _padded_inputs(1, 9, 2, 0)
  variables = compiled(module).init(jax.random.key(0), x)
  full = np.asarray(compiled(module).apply(variables, x, mask=mask))
  cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
  step = jax.jit(
    lambda c, x_t, m_t: module.apply({**variables, "cache": c}, x_t, mask=m_t, decode=True, mutable=["cache"])
  )
  for t in range(x.shape[1]):
    y_t, mutated = step(cache, x[:, t : t + 1], mask[:, t : t + 1])
    assert jax.tree.map(jnp.shape, mutated["cache"]) == shapes[0]
    cache = mutated["cache"]
    real = mask[:, t]
    np.testing.assert_allclose(np.asarray(y_t)[real, 0], full[real, t], rtol=1e-5, atol=1e-5, err_msg=f"{t}")


def test_gradients_equal_the_references_derivatives():
  """∂ Σ y·g / ∂ (the decay's bias, a column of its low-rank projection, the norm's weight, x) against central
  differences of the float64 port, at strong (e^-5 a step) and weak (e^-0.00002) decays on alternate key channels,
  in chunks of 4 over 6 positions (the last chunk partial), padding at both ends; padded inputs get no gradient."""
  module = MIXERS["gla"](causal=True, num_heads=2, chunk=4)
  x, mask = _padded_inputs(4, 6, 1, 2)
  params = compiled(module).init(jax.random.key(0), x)["params"]
  params["gk_proj_1"]["bias"] = jnp.asarray(np.where(np.arange(8) % 2, 8.0, -80.0), jnp.float32)
  checks = [(("gk_proj_1", "bias"), (c,)) for c in range(8)] + [(("gk_proj_1", "kernel"), (r, 3)) for r in range(16)]
  checks += [(("g_norm_weight",), (c,)) for c in range(0, 8, 3)]
  assert_gradients_match_central_differences(
    module,
    params,
    x,
    mask,
    lambda p, x: [_reference(x[b][mask[b]], p, 2) for b in range(B)],
    checks,
    ((0, 1, 0), (0, 5, 3), (1, 0, 7), (1, 3, 12)),
    g_seed=5,
    atol=1e-6,
  )


def test_gradients_finite_and_bfloat16_close():
  module = MIXERS["gla"](causal=True, num_heads=2, chunk=8)
  x, _ = _padded_inputs(2, 11, 0, 0)
  assert_finite_grads_and_bfloat16_close(module, compiled(module).init(jax.random.key(0), x)["params"], x)


def test_options_are_checked():
  spec = MIXERS["gla"]
  assert type(spec(causal=False)).__name__ == "ByReversal"  # bidirectional: both ways by reversal
  with pytest.raises(UserError, match="expand_k"):
    spec.check({"num_heads": 4}, 20, True)  # key width 10

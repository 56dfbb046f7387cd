"""Mamba-2 against a float64 numpy port of state-spaces/mamba's reference forward, written from
mamba_ssm/ops/triton/ssd_combined.py `mamba_split_conv1d_scan_ref` (in_proj split [z, xBC, dt], causal depthwise
conv1d + SiLU, split [x, B, C], dt = softplus(dt + dt_bias), the SSM, D skip), the SSM as mamba2.py `Mamba2.step`'s
recurrence (dA = exp(dt·A), state = state·dA + dt·x Bᵀ, y = state C + D x) one position at a time, layernorm_gated.py
`rms_norm_ref` (norm_before_gate=False: RMSNorm(y·SiLU(z)) per group of d_inner / ngroups) and out_proj; run on each
sequence's real positions alone."""

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
from efftx.mixers import mamba2

EPS = float(jnp.finfo(jnp.float32).eps)
B, D = 2, 16


def _silu(a):
  return a / (1 + np.exp(-a))


def _reference(u, p, headdim, ngroups, d_state, d_conv):
  """One sequence (L×D, real positions only), float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
  u = np.asarray(u, np.float64)
  L = len(u)
  H, P = mamba2.heads(u.shape[1], 2, headdim)
  d_inner, G, N = H * P, ngroups, d_state
  zxbcdt = u @ p["in_proj"]["kernel"]  # nn.Linear(bias=False): torch's weight is the flax kernel transposed
  z, xBC, dt = np.split(zxbcdt, [d_inner, 2 * d_inner + 2 * G * N], axis=-1)
  w, b = p["conv1d"]["kernel"], p["conv1d"]["bias"]  # w[k]: torch's weight[:, 0, k]
  padded = np.concatenate([np.zeros((d_conv - 1, xBC.shape[1])), xBC])
  xBC = _silu(np.stack([sum(w[k] * padded[t + k] for k in range(d_conv)) for t in range(L)]) + b)
  x, Bm, Cm = np.split(xBC, [d_inner, d_inner + G * N], axis=-1)
  x = x.reshape(L, H, P)
  Bm, Cm = Bm.reshape(L, G, N), Cm.reshape(L, G, N)
  dt = np.log1p(np.exp(dt + p["dt_bias"]))
  A = -np.exp(p["A_log"])
  state = np.zeros((H, P, N))
  y = np.zeros((L, H, P))
  for t in range(L):
    for h in range(H):
      g = h // (H // G)
      state[h] = state[h] * np.exp(dt[t, h] * A[h]) + dt[t, h] * np.outer(x[t, h], Bm[t, g])
      y[t, h] = state[h] @ Cm[t, g] + p["D"][h] * x[t, h]
  y = y.reshape(L, d_inner) * _silu(z)
  yg = y.reshape(L, G, d_inner // G)
  y = (yg / np.sqrt((yg**2).mean(-1, keepdims=True) + 1e-5)).reshape(L, d_inner) * p["norm"]
  return y @ p["out_proj"]["kernel"]


def _padded_inputs(seed, L, left, right):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[0, :left] = False
  mask[1, L - right :] = False
  return np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32), mask


@pytest.mark.parametrize(
  "options",
  [dict(headdim=8, ngroups=2, d_state=4, chunk=5), dict()],  # 4 heads in 2 groups, chunks of 5; the defaults
  ids=["groups", "defaults"],
)
def test_matches_the_reference_forward_with_padding_at_both_ends(options):
  """Real positions within float32's rounding: the projections' D- and d_inner-term sums and the recurrence's
  L·d_state-term ones, at most (D + d_inner + L·d_state)·eps of the largest |output| × 8 (the norm divides by a
  root-mean-square as small as the gated values: measured below 1e-5 relative)."""
  _compare(options, *_padded_inputs(0, 23, 3, 5))


def test_a_sequence_of_4096_with_padding_at_both_ends():
  """Length 4,096 in 64 chunks of 64, 4 heads in 2 groups, 100 and 57 padded positions; two heads' dt_bias at −12
  (Δ ≈ 6e-6: decays within about 1e-4 of 1, a state that sums every position), two at their initial (strong) decays: the
  same bound, its L·d_state terms grown with the length."""
  weak = lambda p: {**p, "dt_bias": p["dt_bias"].at[:2].set(-12.0)}
  _compare(dict(headdim=8, ngroups=2, d_state=4, chunk=64), *_padded_inputs(7, 4096, 100, 57), change=weak)


def _compare(options, x, mask, change=lambda params: params):
  L = x.shape[1]
  module = MIXERS["mamba2"](causal=True, **options)
  variables = {"params": change(compiled(module).init(jax.random.key(0), x)["params"])}
  y = np.asarray(compiled(module).apply(variables, x, mask=mask), np.float64)
  resolved = {**MIXERS["mamba2"].defaults(), **options}
  for b in range(B):
    want = _reference(
      x[b][mask[b]], variables["params"], resolved["headdim"], resolved["ngroups"], resolved["d_state"], 4
    )
    bound = 8 * (D + 2 * D + L * resolved["d_state"]) * EPS * np.abs(want).max()
    np.testing.assert_allclose(y[b][mask[b]], want, rtol=0, atol=bound, err_msg=f"sequence {b}")


def test_initialisation_is_the_references():
  """A = exp(A_log) in [1, 16], Δ = softplus(dt_bias) in [1e-3, 0.1], D = 1, norm weight 1."""
  module = MIXERS["mamba2"](causal=True, headdim=4)
  params = compiled(module).init(jax.random.key(0), np.zeros((1, 2, D), np.float32))["params"]
  assert params["A_log"].shape == (8,) and np.all((np.exp(params["A_log"]) >= 1) & (np.exp(params["A_log"]) <= 16))
  dt = np.log1p(np.exp(np.asarray(params["dt_bias"], np.float64)))
  assert np.all((dt >= 1e-3 * (1 - 1e-5)) & (dt <= 0.1 * (1 + 1e-5)))
  assert np.all(params["D"] == 1) and np.all(params["norm"] == 1)


def test_decoding_equals_the_forward_pass_with_a_cache_of_constant_size():
  """Step by step with the mask (padding at the start) the outputs at real positions equal the forward pass's; the
  cache (conv window and SSM state) has the same shapes whatever the length it is made for (1 or 1,000)."""
  module = MIXERS["mamba2"](causal=True, headdim=8, d_state=4)
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
  """∂ Σ y·g / ∂ (A_log, D, dt_bias, some of the convolution's biases, x) against central differences of the
  float64 port, at decays from e^-17 to e^-0.007 a step on the 4 heads (2 groups), in chunks of 4 over 6 positions
  (the last chunk partial), padding at both ends; padded inputs get no gradient."""
  module = MIXERS["mamba2"](causal=True, headdim=8, ngroups=2, d_state=4, chunk=4)
  x, mask = _padded_inputs(4, 6, 1, 2)
  params = compiled(module).init(jax.random.key(0), x)["params"]
  params["A_log"] = jnp.log(jnp.asarray([1.0, 1.0, 8.0, 8.0]))  # A = −1, −1, −8, −8
  params["dt_bias"] = jnp.asarray([2.0, -5.0, 2.0, -5.0])  # Δ ≈ 2.1, 0.007: e^{ΔA} ≈ e^-2, 1, e^-17, e^-0.05
  checks = [((name,), (c,)) for name in ("A_log", "D", "dt_bias") for c in range(4)]
  checks += [(("conv1d", "bias"), (c,)) for c in range(0, 48, 5)]
  assert_gradients_match_central_differences(
    module,
    params,
    x,
    mask,
    lambda p, x: [_reference(x[b][mask[b]], p, 8, 2, 4, 4) for b in range(B)],
    checks,
    ((0, 1, 0), (0, 5, 3), (1, 0, 7), (1, 3, 12)),
    g_seed=5,
    atol=1e-6,
  )


def test_gradients_finite_and_bfloat16_close():
  module = MIXERS["mamba2"](causal=True, headdim=8, d_state=4, chunk=4)
  x, _ = _padded_inputs(2, 11, 0, 0)
  assert_finite_grads_and_bfloat16_close(module, compiled(module).init(jax.random.key(0), x)["params"], x)


def test_options_are_checked():
  spec = MIXERS["mamba2"]
  assert type(spec(causal=False)).__name__ == "ByReversal"  # bidirectional: both ways by reversal
  with pytest.raises(UserError, match="headdim"):
    spec.check({"headdim": 24}, 16, True)
  with pytest.raises(UserError, match="ngroups"):
    spec.check({"headdim": 8, "ngroups": 3}, 16, True)
  with pytest.raises(UserError, match="dt_min"):
    spec.check({"dt_min": 0.5}, 16, True)

"""Mamba (efftx/mixers/mamba.py) against a float64 numpy port of state-spaces/mamba: mamba_ssm/modules/mamba_simple.py
`Mamba.forward` (the path without causal_conv1d and the fused kernel: `self.act(self.conv1d(x)[..., :seqlen])`, then
`selective_scan_fn`) with mamba_ssm/ops/selective_scan_interface.py `selective_scan_ref`'s loop over positions, and
`Mamba.__init__`'s initialisation. The flax parameters are copied into the port in torch's layouts (Linear weight
out × in = the kernel transposed; conv1d weight E × 1 × W, whose last tap weighs the current position). The
reference sees no padding: it runs on each sequence's real positions alone.

Tolerance: the JAX side computes in float32. An output sums out_proj's E terms of y ⊙ SiLU(z); y_t sums N terms
h·C, and h the scan's ≤ 2L rounded terms; the projections before sum d_model, E and dt_rank terms, each rounding
once (the exponentials exp(ΔA) and softplus add a relative eps each). So n_terms = 2d + 3E + R + N + 2L + 8, of the
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

B, D = 2, 8
E, N, W, R = 2 * D, 16, 4, 1  # expand 2, d_state 16, d_conv 4, dt_rank ⌈8/16⌉


# ---------------------------------------------------------------------------------------------------------------
# The reference, ported (float64, one sequence, torch's layouts).


def _softplus(x):
  return np.logaddexp(0.0, x)


def _silu(x):
  return x / (1 + np.exp(-x))


def _selective_scan_ref(u, delta, A, B_, C_, D_, z, delta_bias):
  """selective_scan_ref with delta_softplus=True and real A, B, C of r(B N L) — here one sequence: u, delta, z are
  (dim, L), B_ and C_ (dstate, L)."""
  delta = _softplus(delta + delta_bias[:, None])
  x = np.zeros(A.shape)
  deltaA = np.exp(np.einsum("dl,dn->dln", delta, A))
  deltaB_u = np.einsum("dl,nl,dl->dln", delta, B_, u)
  ys = []
  for i in range(u.shape[1]):
    x = deltaA[:, i] * x + deltaB_u[:, i]
    ys.append(np.einsum("dn,n->d", x, C_[:, i]))
  out = np.stack(ys, axis=1) + u * D_[:, None]
  return out * _silu(z)


def _mamba_forward(hidden, sd):
  """Mamba.forward on one sequence (L × d) without inference_params, use_fast_path off, causal_conv1d absent."""
  L = hidden.shape[0]
  xz = sd["in_proj.weight"] @ hidden.T  # (2E, L)
  x, z = np.split(xz, 2, axis=0)
  A = -np.exp(sd["A_log"])
  w = sd["conv1d.weight"][:, 0]  # (E, W): Conv1d(groups=E, padding=W − 1), then [..., :L]
  padded = np.pad(x, [(0, 0), (W - 1, W - 1)])
  conv = np.stack([(w * padded[:, t : t + W]).sum(1) for t in range(L)], axis=1) + sd["conv1d.bias"][:, None]
  x = _silu(conv)
  x_dbl = x.T @ sd["x_proj.weight"].T  # (L, R + 2N)
  dt, B_, C_ = np.split(x_dbl, [R, R + N], axis=1)
  dt = sd["dt_proj.weight"] @ dt.T  # (E, L)
  y = _selective_scan_ref(x, dt, A, B_.T, C_.T, sd["D"], z, sd["dt_proj.bias"])
  return y.T @ sd["out_proj.weight"].T


def _state_dict(params):
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  sd = {f"{n}.weight": p[n]["kernel"].T for n in ("in_proj", "x_proj", "dt_proj", "out_proj")}
  sd["dt_proj.bias"] = p["dt_proj"]["bias"]
  sd["conv1d.weight"] = p["conv1d"]["taps"][::-1].T[:, None]  # taps[j] weighs x_{t−j}; torch's w[W − 1 − j]
  sd["conv1d.bias"] = p["conv1d"]["bias"]
  sd["A_log"], sd["D"] = p["A_log"], p["D"]
  return sd


def _reference(x, params, mask):
  sd = _state_dict(params)
  return [_mamba_forward(np.asarray(x[b], np.float64)[mask[b]], sd) for b in range(len(x))]


# ---------------------------------------------------------------------------------------------------------------

N_TERMS = lambda L: 2 * D + 3 * E + R + N + 2 * L + 8  # noqa: E731


def _padded_inputs(L=13, left=3, right=4, seed=0):
  """x ~ N(0, 1), noise ×10 at padded positions; the first sequence padded at the start, the second at the end."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[0, :left] = False
  mask[1, L - right :] = False
  return np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32), mask


def _params(module, x, dt_bias=None, seed=1):
  """The module's initial parameters with D, A_log and the biases moved off their starting values and x_proj's B and
  C columns ×10 (as training moves them: at torch's U(±1/√E) the SSM's part h·C is ~0.1 % of the output, here
  ~15 %), so that the comparison sees every parameter; dt_bias, if given, sets Δ's offset."""
  params = jax.tree.map(np.asarray, compiled(module).init(jax.random.key(seed), x)["params"])
  rng = np.random.default_rng(seed)
  params["D"] = params["D"] + rng.normal(size=params["D"].shape).astype(np.float32)
  params["A_log"] = params["A_log"] + 0.3 * rng.normal(size=params["A_log"].shape).astype(np.float32)
  params["conv1d"]["bias"] = params["conv1d"]["bias"] + 0.3 * rng.normal(size=(E,)).astype(np.float32)
  params["x_proj"]["kernel"] = params["x_proj"]["kernel"] * np.where(np.arange(R + 2 * N) < R, 1, 10).astype(np.float32)
  if dt_bias is not None:
    params["dt_proj"]["bias"] = np.asarray(dt_bias, np.float32) + np.zeros((E,), np.float32)
  return params


def _compare(module, params, x, mask):
  y = np.asarray(jax.jit(lambda p, x: module.apply({"params": p}, x, mask=mask))(params, x))
  for b, want in enumerate(_reference(x, params, mask)):
    assert_close_sums(y[b][mask[b]], want, n_terms=N_TERMS(x.shape[1]), err_msg=f"sequence {b}")
  return y


# Δ's offset: the initialisation's (Δ ∈ [1e-3, 0.1]); strong decay (Δ ≈ 8: exp(ΔA) ≤ e^-8, the past gone after a
# step, most of it below float32's smallest number); weak decay (Δ ≈ 6e-6: exp(ΔA) ≥ 1 − 1e-4, no decay over the
# sequence).
@pytest.mark.parametrize("dt_bias", [None, 8.0, -12.0], ids=["init", "strong-decay", "weak-decay"])
def test_matches_the_reference_with_padding_at_both_ends(dt_bias):
  module = MIXERS["mamba"](causal=True)
  x, mask = _padded_inputs()
  y = _compare(module, _params(module, x, dt_bias), x, mask)
  assert np.all(np.isfinite(y))


def test_a_sequence_of_4096_with_padding_at_both_ends():
  """Length 4,096, 100 and 57 padded positions, at the weak decay (Δ ≈ 6e-6): a state that sums every position."""
  module = MIXERS["mamba"](causal=True)
  x, mask = _padded_inputs(L=4096, left=100, right=57, seed=7)
  _compare(module, _params(module, x[:, :13], -12.0), x, mask)


def test_gradients_equal_the_references_derivatives():
  """∂ Σ y·g / ∂ (A_log, D, dt_proj's bias, x) against central differences of the float64 port, at strong and weak
  decays on alternate channels; padded inputs get no gradient."""
  module = MIXERS["mamba"](causal=True)
  x, mask = _padded_inputs(L=6, left=1, right=2, seed=2)
  params = _params(module, x, np.where(np.arange(E) % 2, 0.5, -5.0))
  checks = [(("A_log",), (c, c % N)) for c in range(0, E, 3)] + [(("D",), (c,)) for c in range(0, E, 3)]
  checks += [(("dt_proj", "bias"), (c,)) for c in range(E)]
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


def test_gradients_are_finite_and_bfloat16_follows_float32():
  module = MIXERS["mamba"](causal=True)
  x, _ = _padded_inputs(seed=4)
  assert_finite_grads_and_bfloat16_close(module, _params(module, x), x)


def test_decoding_equals_the_forward_pass_in_a_cache_of_constant_size():
  """The cache (the convolution's last d_conv − 1 inputs, the E × N state) has the same shapes whatever the length;
  decoding a sequence padded at the start, with its mask, gives the forward pass's outputs at the real positions."""
  module = MIXERS["mamba"](causal=True)
  init_decoding = functools.partial(module.init, decode=True)
  shapes = [
    jax.tree.map(jnp.shape, jax.eval_shape(init_decoding, jax.random.key(0), jnp.zeros((B, T, D)))["cache"])
    for T in (3, 64)
  ]
  assert shapes[0] == shapes[1]
  assert shapes[0] == {"conv1d": {"conv_state": (B, W - 1, E)}, "ssm_state": (B, E, N)}
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
  """A_log = log(1 … N) in every channel, D = 1, Δ = softplus(dt_proj's bias) in [dt_min, dt_max] (log-uniform:
  its log's mean near the middle), dt_proj's weight U(±dt_rank^−½), in_proj, x_proj, out_proj U(±1/√fan_in) without
  bias, the convolution U(±1/√d_conv) (torch's defaults). At d_model 64: E = 128 draws of Δ, dt_rank 4."""
  d = 64
  module = MIXERS["mamba"](causal=True, dt_min=0.002, dt_max=0.05)
  p = jax.jit(module.init)(jax.random.key(0), np.zeros((1, 3, d), np.float32))["params"]
  np.testing.assert_allclose(p["A_log"], np.log(np.broadcast_to(np.arange(1, 17), (2 * d, 16))), rtol=1e-6)
  np.testing.assert_array_equal(p["D"], np.ones(2 * d))
  dt = np.logaddexp(0.0, np.asarray(p["dt_proj"]["bias"], np.float64))
  assert np.all(dt >= 0.002 * (1 - 1e-5)) and np.all(dt <= 0.05 * (1 + 1e-5))
  assert abs(np.log(dt).mean() - (math.log(0.002) + math.log(0.05)) / 2) < 0.3
  assert p["dt_proj"]["kernel"].shape == (4, 2 * d) and 0.45 < np.abs(p["dt_proj"]["kernel"]).max() <= 0.5
  for name, fan_in, out in (("in_proj", d, 4 * d), ("x_proj", 2 * d, 4 + 32), ("out_proj", 2 * d, d)):
    assert set(p[name]) == {"kernel"} and p[name]["kernel"].shape == (fan_in, out)
    assert 0.9 / math.sqrt(fan_in) < np.abs(p[name]["kernel"]).max() <= 1 / math.sqrt(fan_in)
  assert p["conv1d"]["taps"].shape == (4, 2 * d) and np.abs(p["conv1d"]["taps"]).max() <= 0.5


def test_options_are_checked():
  assert type(MIXERS["mamba"](causal=False)).__name__ == "ByReversal"  # bidirectional: both ways by reversal
  with pytest.raises(UserError, match="dt_min"):
    MIXERS["mamba"].check({"dt_min": 0.2, "dt_max": 0.1}, d_model=8, causal=True)
  with pytest.raises(UserError, match="d_state"):
    MIXERS["mamba"].check({"d_state": 0}, d_model=8, causal=True)
  p = jax.eval_shape(MIXERS["mamba"](causal=True, dt_rank=3, expand=1, d_state=4).init, jax.random.key(0),
                     jnp.zeros((1, 2, D)))["params"]  # fmt: skip
  assert p["x_proj"]["kernel"].shape == (D, 3 + 8) and p["A_log"].shape == (D, 4)

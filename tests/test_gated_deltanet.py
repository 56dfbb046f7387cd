"""Gated DeltaNet (efftx/mixers/gated_deltanet.py) against a float64 port of fla's layer, written from the reference
(fla-org/flash-linear-attention): fla/layers/gated_deltanet.py `GatedDeltaNet.forward` at its defaults
(use_short_conv, mode chunk ≡ the naive recurrence, use_qk_l2norm_in_kernel, use_gate_in_kernel,
use_beta_sigmoid_in_kernel), with fla/modules/conv/short_conv.py `ShortConvolution` (torch Conv1d, groups = C,
padding W − 1, cut to L, SiLU), fla/modules/l2norm.py (x / sqrt(Σx² + 1e−6)), fla/ops/gated_delta_rule/gate.py
`naive_gdn_gate` (g = −exp(A_log) softplus(a + dt_bias)), fla/modules/fused_norm_gate.py `FusedRMSNormGated`
(x · rstd · weight · g σ(g)) and the recurrence of fla/ops/gated_delta_rule/naive.py (tests/test_delta_rule.py's
port, scale K^−½). gate=False: the same without the decay (fla/ops/delta_rule/naive.py). Our parameters are copied
in under the reference's names and layouts (Linear weight out × in; Conv1d weight C × 1 × W, the last tap on the
current position). fla unpads (cu_seqlens): each sequence's real positions alone go through the port.

Tolerance: float32 against float64, the roundings of the chain's sums added to first order (assert_close_sums):
the projections (D terms), the convolution (W), the recurrence (L + chunk + K + V, tests/test_delta_rule.py), the
norm (V) and the output projection (H·V).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_delta_rule import _reference as naive_recurrence

from conftest import assert_close_sums
from conftest import assert_finite_grads_and_bfloat16_close
from conftest import compiled
from efftx.errors import UserError
from efftx.mixers import MIXERS

B, L, D, H = 2, 13, 8, 2
K, V, W, CHUNK = D // H, 2 * D // H, 4, 5


def _state_dict(params, xp=np):
  """Our parameters under the reference's names and layouts."""
  sd = {f"{n}.weight": params[n]["kernel"].T for n in ("q_proj", "k_proj", "v_proj", "b_proj", "g_proj", "o_proj")}
  for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
    sd[f"{n}.weight"] = params[n]["taps"][::-1].T[:, None, :]  # taps[0] weighs the current position: torch's last
  sd["o_norm.weight"] = params["norm_scale"]
  if "a_proj" in params:
    sd["a_proj.weight"] = params["a_proj"]["kernel"].T
    sd["A_log"], sd["dt_bias"] = params["A_log"], params["dt_bias"]
  return jax.tree.map(lambda a: xp.asarray(a, xp.float64), sd)


def _reference_layer(x, sd, xp=np, eps=1e-5):
  """GatedDeltaNet.forward on one unpadded sequence x (L×D), float64."""
  linear = lambda name, a: a @ sd[f"{name}.weight"].T
  silu = lambda a: a / (1 + xp.exp(-a))

  def short_conv(name, a):  # Conv1d(groups=C, padding=W−1) on (C, L), cut to the first L outputs, SiLU
    w = sd[f"{name}.weight"][:, 0]  # C × W
    padded = xp.concatenate([xp.zeros((w.shape[1] - 1, a.shape[1])), a])
    return silu(sum(w[:, i] * padded[i : i + len(a)] for i in range(w.shape[1])))

  q = short_conv("q_conv1d", linear("q_proj", x)).reshape(len(x), H, K)
  k = short_conv("k_conv1d", linear("k_proj", x)).reshape(len(x), H, K)
  v = short_conv("v_conv1d", linear("v_proj", x)).reshape(len(x), H, V)
  l2norm = lambda a: a / xp.sqrt((a * a).sum(-1, keepdims=True) + 1e-6)
  q, k = l2norm(q), l2norm(k)
  beta = 1 / (1 + xp.exp(-linear("b_proj", x)))
  g = None
  if "A_log" in sd:
    a = linear("a_proj", x) + sd["dt_bias"]
    g = -xp.exp(sd["A_log"]) * xp.logaddexp(0.0, a)  # softplus
  o, _ = naive_recurrence(q, k, v, beta, g, scale=K**-0.5, xp=xp)
  gate = linear("g_proj", x).reshape(len(x), H, V)
  rstd = 1 / xp.sqrt((o * o).mean(-1, keepdims=True) + eps)
  o = o * rstd * sd["o_norm.weight"] * gate / (1 + xp.exp(-gate))
  return linear("o_proj", o.reshape(len(x), H * V))


def _padded_inputs(seed=0, left=3, right=2, length=L):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, length, D)).astype(np.float32)
  mask = np.ones((B, length), bool)
  mask[0, :left] = False
  mask[1, length - right :] = False
  return np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32), mask


def _module(gate=True, **options):
  return MIXERS["gated_deltanet"](causal=True, num_heads=H, gate=gate, chunk=CHUNK, **options)


def _params(module, x, seed=1):
  """The module's initial parameters, with the norm's scale moved off 1 (as training moves it)."""
  params = jax.tree.map(np.asarray, compiled(module).init(jax.random.key(seed), x)["params"])
  params["norm_scale"] = 1 + 0.3 * np.random.default_rng(seed).normal(size=params["norm_scale"].shape)
  return jax.tree.map(lambda a: np.asarray(a, np.float32), params)


N_TERMS = D + W + L + CHUNK + K + V + V + H * V


@pytest.mark.parametrize("gate", [True, False], ids=["gated", "deltanet"])
def test_matches_fla_layer_with_padding_at_both_ends(gate):
  module = _module(gate)
  x, mask = _padded_inputs()
  params = _params(module, x)
  assert ("A_log" in params) == gate and ("a_proj" in params) == gate
  _compare(module, params, x, mask, N_TERMS)


@pytest.mark.parametrize("gate", [True, False], ids=["gated", "deltanet"])
def test_a_sequence_of_4096_with_padding_at_both_ends(gate):
  """Length 4,096 in 64 chunks of 64, 100 and 57 padded positions; DeltaNet (no decay: its state holds every
  position, corrected by the delta rule) and the gated rule at its initial decays."""
  module = MIXERS["gated_deltanet"](causal=True, num_heads=H, gate=gate, chunk=64)
  x, mask = _padded_inputs(seed=7, left=100, right=57, length=4096)
  _compare(module, _params(module, x[:, :L]), x, mask, D + W + 4096 + 64 + K + V + V + H * V)


def _compare(module, params, x, mask, n_terms):
  y = np.asarray(compiled(module).apply({"params": params}, x, mask=mask))
  sd = _state_dict(params)
  for b in range(B):
    want = _reference_layer(np.asarray(x[b][mask[b]], np.float64), sd)
    assert_close_sums(y[b][mask[b]], want, n_terms=n_terms, err_msg=f"sequence {b}")


def test_gradients_equal_the_float64_layers():
  """d Σ y·w / d (every parameter, x) against jax.grad of the reference layer in float64 (jax.numpy under
  enable_x64), padding at both ends; padded inputs get exactly 0."""
  module = _module()
  x, mask = _padded_inputs(seed=2)
  params = _params(module, x, seed=3)
  w = np.random.default_rng(4).normal(size=x.shape) * mask[..., None]
  got_p, got_x = jax.jit(jax.grad(lambda p, x: jnp.sum(module.apply({"params": p}, x, mask=mask) * w), argnums=(0, 1)))(
    params, x
  )
  with jax.enable_x64(True):

    def loss64(p, x):
      sd = _state_dict(p, xp=jnp)
      return sum(jnp.sum(_reference_layer(x[b][mask[b]], sd, xp=jnp) * w[b][mask[b]]) for b in range(B))

    p64, x64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), (params, x))
    want_p, want_x = jax.tree.map(np.asarray, jax.jit(jax.grad(loss64, argnums=(0, 1)))(p64, x64))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got_p), jax.tree.leaves(want_p)):
    assert_close_sums(a, b, n_terms=N_TERMS + B * L, err_msg=jax.tree_util.keystr(path))
  assert_close_sums(got_x, want_x, n_terms=N_TERMS)
  assert np.all(np.asarray(got_x)[~mask] == 0)


def test_initialisation_is_the_references():
  """A = exp(A_log) in (0, 16); dt = softplus(dt_bias) in [0.001, 0.1]; the convolutions without bias at torch's
  U(±1/√W); the norm's scale 1."""
  module = MIXERS["gated_deltanet"](causal=True, num_heads=4)
  params = compiled(module).init(jax.random.key(0), np.zeros((1, 2, 64), np.float32))["params"]
  A = np.exp(params["A_log"])
  assert A.shape == (4,) and np.all((A > 0) & (A < 16))
  dt = np.logaddexp(0.0, np.asarray(params["dt_bias"], np.float64))
  assert np.all((dt >= 0.001 * (1 - 1e-5)) & (dt <= 0.1 * (1 + 1e-5)))
  for n in ("q_conv1d", "k_conv1d", "v_conv1d"):
    assert set(params[n]) == {"taps"} and np.abs(params[n]["taps"]).max() <= 1 / np.sqrt(W)
  assert params["v_conv1d"]["taps"].shape == (W, 2 * 64) and np.all(params["norm_scale"] == 1)


def test_bfloat16_and_finite_gradients():
  module = _module()
  x, _ = _padded_inputs(seed=5)
  assert_finite_grads_and_bfloat16_close(module, _params(module, x), x)


@pytest.mark.parametrize("gate", [True, False], ids=["gated", "deltanet"])
def test_decoding_equals_the_forward_pass_with_a_state_of_constant_size(gate):
  """Token by token with the cache (a sequence padded at the start, with its mask) gives the forward pass's outputs
  at real positions; the cache's shapes do not depend on the positions it is made for."""
  module = _module(gate)
  init_decoding = functools.partial(module.init, decode=True)
  shapes = [
    jax.tree.map(jnp.shape, jax.eval_shape(init_decoding, jax.random.key(0), jnp.zeros((B, T, D)))["cache"])
    for T in (3, 64)
  ]
  assert shapes[0] == shapes[1]
  assert shapes[0]["state"] == (B, H, K, V) and shapes[0]["v_conv1d"]["conv_state"] == (B, W - 1, H * V)
  x, mask = _padded_inputs(seed=6, right=0)
  variables = {"params": _params(module, x)}
  full = np.asarray(compiled(module).apply(variables, x, mask=mask))
  cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
  step = jax.jit(
    lambda c, x_t, m_t: module.apply({**variables, "cache": c}, x_t, mask=m_t, decode=True, mutable=["cache"])
  )
  for t in range(L):
    y_t, mutated = step(cache, x[:, t : t + 1], mask[:, t : t + 1])
    cache = mutated["cache"]
    real = mask[:, t]
    assert_close_sums(np.asarray(y_t)[real, 0], full[real, t], n_terms=N_TERMS, scale=np.abs(full).max())


def test_options_are_checked():
  spec = MIXERS["gated_deltanet"]
  assert spec.defaults() == {
    "num_heads": 4,
    "expand_v": 2.0,
    "gate": True,
    "conv_size": 4,
    "chunk": 64,
    "norm_eps": 1e-5,
  }
  assert type(spec(causal=False)).__name__ == "ByReversal"  # bidirectional: both ways by reversal
  with pytest.raises(UserError, match="expand_v=1.5 × the head dim 3"):
    spec.check({"num_heads": 4, "expand_v": 1.5}, 12, True)
  spec.check({"num_heads": 4, "expand_v": 1.5}, 16, True)
  with pytest.raises(UserError, match="chunk"):
    spec.check({"chunk": 0}, 16, True)

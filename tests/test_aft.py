"""AFT variants against the paper's formula (numpy float64, a stable row maximum), causal and not, with padding.

The causal tests with keys spanning ~1e3 are issue 10: each row must be normalised by the keys it can see.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import compiled
from efftx.mixers import MIXERS

B, L, D, H = 2, 9, 8, 2
VARIANTS = ["aft_full", "aft_simple", "aft_local", "aft_conv"]
# Enough to cover L = 16 positions; the window and kernel reach past a hierarchy block of the causal paths.
OPTIONS = {
  "aft_full": dict(max_len=16, aft_bias_dim=4),
  "aft_simple": {},
  "aft_local": dict(max_len=16, aft_bias_dim=4, window=3),
  "aft_conv": dict(num_heads=H, kernel_size=3),
}


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[1, 6:] = False
  return x, mask


def _position_bias(name, params, length, causal, xp=np, window=None):
  """w[t, t'] as length × length × (1 or heads): the paper's bias of each variant, from its parameters
  (numpy or jax.numpy, so that the same formula serves values and gradients)."""
  t, s = np.arange(length)[:, None], np.arange(length)[None, :]
  if name == "aft_simple":
    return xp.zeros((length, length, 1))
  if name in ("aft_full", "aft_local"):
    bias = params["bias"]
    w = (bias["u"] @ bias["v"].T if "u" in bias else bias["w"])[:length, :length]
    if name == "aft_local":
      w = xp.where(np.abs(t - s) < window, w, 0.0)
    return w[:, :, None]
  raw = params["kernel"]
  S = raw.shape[1]
  kernel = params["gamma"] * (raw - raw.mean(-1, keepdims=True)) / (raw.std(-1, keepdims=True) + 1e-5) + params["beta"]
  j = t - s if causal else s - t + (S - 1) // 2  # kernel[:, j] weighs (t, t')
  return xp.where(((j >= 0) & (j < S))[:, :, None], kernel.T[np.clip(j, 0, S - 1)], 0.0)


def _formula(x, mask, params, causal, w, xp=np):
  """Y_t = σ(Q_t) ⊙ Σ_t' exp(K_t' + w_tt') V_t' / Σ_t' exp(K_t' + w_tt') over the real t' (≤ t when causal), with
  each (row, channel)'s exponents shifted by their own maximum — the exact log-sum-exp form, a B×L×L×D tensor.
  A head-shared key or bias (AFT-conv) is broadcast to its head's channels."""
  dense = lambda a, p: a @ p["kernel"] + p["bias"]
  q, k, v = (dense(x, params[n]) for n in ("query", "key", "value"))
  d = x.shape[-1]
  k = xp.repeat(k, d // k.shape[-1], axis=-1)
  w = xp.repeat(w, d // w.shape[-1], axis=-1)
  n = x.shape[1]
  seen_LxL = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
  allowed = xp.asarray(mask)[:, None, :, None] & seen_LxL[None, :, :, None]
  logits = xp.where(allowed, k[:, None] + w[None], -xp.inf)
  top = logits.max(axis=2, keepdims=True)
  e = xp.where(allowed, xp.exp(logits - xp.where(xp.isfinite(top), top, 0.0)), 0.0)
  num, den = (e * v[:, None]).sum(axis=2), e.sum(axis=2)
  y = 1 / (1 + xp.exp(-q)) * num / xp.where(den > 0, den, 1.0)
  return dense(y, params["out"])


def _float64(tree):
  return jax.tree.map(lambda a: np.asarray(a, np.float64), tree)


def _reference(name, x, mask, params, causal, window=None):
  params = _float64(params)
  w = _position_bias(name, params, x.shape[1], causal, window=window)
  return _formula(np.asarray(x, np.float64), mask, params, causal, w)


def _apply(module, variables, x, mask=None) -> np.ndarray:
  """The module's output, compiled once per module and shapes (conftest.compiled)."""
  return np.asarray(compiled(module).apply(variables, x, mask=mask))


def _run(name, causal, seed=0, **kwargs):
  x, mask = _inputs(seed)
  module = MIXERS[name](causal=causal, **kwargs)
  variables = compiled(module).init(jax.random.key(seed), x)
  params = _float64(variables["params"])
  return x, mask, module, variables, params


def test_bidirectional_aft_full_matches_formula():
  """The factorised bias u vᵀ. The full matrix: test_aft_full_with_a_position_bias_spanning_sixty_to_seventy_six;
  causal, both paths: test_causal_auto_takes_the_global_path_for_ordinary_keys_... (the global path, whose sums
  need no padding) and test_causal_aft_matches_the_formula_on_a_long_sequence (the stable path, padded)."""
  x, mask, module, variables, params = _run("aft_full", False, max_len=16, aft_bias_dim=4)
  want = _reference("aft_full", x, mask, params, False)
  np.testing.assert_allclose(_apply(module, variables, x, mask)[mask], want[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_aft_simple_matches_formula_and_is_aft_full_with_zero_bias(causal):
  x, mask, module, variables, params = _run("aft_simple", causal)
  want = _reference("aft_simple", x, mask, params, causal)
  np.testing.assert_allclose(_apply(module, variables, x, mask)[mask], want[mask], rtol=1e-4, atol=1e-5)

  full = MIXERS["aft_full"](causal=causal, max_len=16, aft_bias_dim=4)
  variables = compiled(full).init(jax.random.key(1), x)
  simple_variables = {"params": {k: v for k, v in variables["params"].items() if k != "bias"}}
  zero_bias = jax.tree.map(jnp.zeros_like, variables["params"]["bias"])
  # The same formula summed otherwise: the projections over D, the weighted sum and the normalizer over the L keys,
  # the output projection over D.
  assert_close_sums(
    _apply(module, simple_variables, x, mask),
    _apply(full, {"params": {**variables["params"], "bias": zero_bias}}, x, mask),
    n_terms=2 * D + 2 * L,
  )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 3, L])
def test_aft_local_matches_formula(causal, window):
  """A window of one position (the diagonal), of 3 (not a power of two: the causal paths round their blocks up,
  and the window reaches into the block before), and one covering the sequence, where AFT-local is AFT-full with
  the same parameters."""
  # Bias scaled up so that the band visibly matters.
  x, mask, module, variables, params = _run("aft_local", causal, max_len=16, window=window, aft_bias_dim=4)
  variables = jax.tree.map(lambda a: a * 30, variables)
  variables = {
    "params": {
      **variables["params"],
      **{n: jax.tree.map(lambda a: a / 30, variables["params"][n]) for n in ("query", "key", "value", "out")},
    }
  }
  want = _reference("aft_local", x, mask, variables["params"], causal, window=window)
  got = _apply(module, variables, x, mask)
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-5)
  if window == L:
    full = MIXERS["aft_full"](causal=causal, max_len=16, aft_bias_dim=4)
    np.testing.assert_allclose(got, _apply(full, variables, x, mask), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel_size", [1, 3, 4])
def test_causal_aft_conv_matches_formula(kernel_size):
  """Causal kernels of one entry, an odd and an even size. The bidirectional 1-D form against the formula, kernel
  sizes 1 … 4: tests/test_aft_conv.py (test_a_grid_of_one_row_or_column_is_the_sequence_form_...)."""
  x, mask, module, variables, params = _run("aft_conv", True, num_heads=H, kernel_size=kernel_size)
  # γ and β start at 0 (the kernel is then 0: AFT-simple); give them values so the kernel matters.
  rng = np.random.default_rng(3)
  variables = {
    "params": {
      **variables["params"],
      "gamma": rng.normal(size=(H, 1)).astype(np.float32),
      "beta": rng.normal(size=(H, 1)).astype(np.float32),
    }
  }
  want = _reference("aft_conv", x, mask, variables["params"], True)
  np.testing.assert_allclose(_apply(module, variables, x, mask)[mask], want[mask], rtol=1e-4, atol=1e-5)


# Issue 10: causal rows normalised by the keys they see, not by the whole sequence's. The tests below share one
# module per variant and one batch of inputs (_wide_keys), so that they share its compiled programs: the forward
# pass and _grads in float32 and bfloat16, and the dense formula's gradient.


def _all_finite(tree) -> bool:
  return all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree.leaves(tree))


_GRAD_FNS = {}  # module → its jitted gradient function


def _grads(module, variables, x, mask=None, weights=None):
  """Gradients of Σ output · weights (default: a fixed random projection of every position, padded ones included)
  w.r.t. the parameters and the input, compiled once per module and shapes."""
  if weights is None:
    weights = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  if module not in _GRAD_FNS:
    loss = lambda p, x, mask, w: (module.apply({"params": p}, x, mask=mask).astype(jnp.float32) * w).sum()
    _GRAD_FNS[module] = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return _GRAD_FNS[module](variables["params"], x, mask, weights)


_FORMULA_GRAD_FNS = {}  # variant → the jitted gradient of the causal formula


def _formula_grads(name, params, x, mask, weights):
  """The same gradients by autodiff through the plain causal formula (jax.numpy, float32, the B×L×L×D tensor)."""
  if name not in _FORMULA_GRAD_FNS:
    window = OPTIONS[name].get("window")

    def loss(p, x, mask, w):
      return (_formula(x, mask, p, True, _position_bias(name, p, x.shape[1], True, jnp, window), jnp) * w).sum()

    _FORMULA_GRAD_FNS[name] = jax.jit(jax.grad(loss, argnums=(0, 1)))
  return _FORMULA_GRAD_FNS[name](params, x, mask, weights)


PATTERNS = ("random", "increasing", "decreasing")


def _wide_keys(name, pattern, length=16, seed=0):
  """A module and inputs whose keys span ~1e3 within each sequence: random, or a ramp up or down (+ small
  noise) in every key channel. x is a multiple of 1/8 and the key kernel integer, so that the keys come out
  of the float32 projection exactly and float32 can be held to the float64 formula. The module and the shapes
  are the same for every pattern, so are the compiled programs."""
  rng = np.random.default_rng(seed)
  options = {**OPTIONS[name], **({"max_len": length} if "max_len" in OPTIONS[name] else {})}
  module = MIXERS[name](causal=True, **options)
  x = (rng.integers(-16, 17, size=(B, length, D)) / 8).astype(np.float32)
  params = compiled(module).init(jax.random.key(seed), x)["params"]
  C = params["key"]["kernel"].shape[1]
  if pattern == "random":
    key_kernel = rng.integers(-100, 101, size=(D, C))
  else:
    x[:, :, 0] = np.arange(length) / 8 * (1 if pattern == "increasing" else -1)
    key_kernel = rng.integers(-3, 4, size=(D, C))
    key_kernel[0] = 512  # 64 per position: ~1e3 over 16 positions
  params["key"] = {"kernel": jnp.asarray(key_kernel, jnp.float32), "bias": jnp.zeros(C)}
  if "bias" in params:  # a position bias of range ~±5, so that it matters
    params["bias"] = jax.tree.map(lambda a: a * 100, params["bias"])
  if name == "aft_conv":
    params["gamma"], params["beta"] = jnp.array([[1.5], [-1.0]]), jnp.array([[0.5], [-0.5]])
  mask = np.ones((B, length), bool)
  mask[1, length - 3 :] = False
  return module, {"params": params}, x, mask


def _ramp_keys_module(name, keys, values):
  """Identity query, value and output projections on 2 channels; channel 0's key is x[:, :, 1] (channel 1's is 0),
  no position bias: x = (values, keys) per position."""
  x = np.stack([values, keys], axis=-1)[None].astype(np.float32)
  module = MIXERS[name](causal=True, **OPTIONS[name])
  params = compiled(module).init(jax.random.key(0), x)["params"]
  for n in ("query", "value", "out"):
    params[n] = {"kernel": jnp.eye(2), "bias": jnp.zeros(2)}
  params["key"] = {"kernel": jnp.array([[0.0, 0.0], [1.0, 0.0]]), "bias": jnp.zeros(2)}
  if "bias" in params:  # AFT-full, AFT-local: no position bias (AFT-conv: γ = β = 0 already, so w = 0)
    params["bias"] = jax.tree.map(jnp.zeros_like, params["bias"])
  return module, {"params": params}, x


CAUSAL_SUMS_VARIANTS = ["aft_full", "aft_local"]


@pytest.mark.parametrize("name", VARIANTS)
def test_causal_aft_sees_a_prefix_whose_keys_lie_far_below_a_later_key(name):
  """The issue's case: identity projections, channel 0's key is x[1]: 0 at t = 0 … 2, 200 at t = 3 … 7. Row 0
  sees only t' = 0, so y_0 = σ(q_0) v_0 = (σ(1), 0); normalising by the whole sequence's maximum gave 0 — as
  causal_sums="global" (AFT-full, AFT-local) still does, its documented failure: rows 0 … 2 see only keys 200
  below the sequence's maximum, e^-200 is 0 in float32, and they read 0. (8 positions: the shapes of
  test_causal_auto_switches_..., whose compiled programs it shares.)"""
  keys, values = np.where(np.arange(8) < 3, 0.0, 200.0), np.where(np.arange(8) == 0, 1.0, 0.0)
  module, variables, x = _ramp_keys_module(name, keys, values)
  got = _apply(module, variables, x)
  sigmoid_1 = 1 / (1 + np.exp(-1.0))
  np.testing.assert_allclose(got[0, 0], [sigmoid_1, 0.0], rtol=1e-6, atol=1e-7)
  want = _reference(
    name, x, np.ones((1, 8), bool), variables["params"], causal=True, window=OPTIONS[name].get("window")
  )
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)  # rows 1, 2: (1/4, 0), (1/6, 0)
  assert _all_finite(_grads(module, variables, x))
  if name in CAUSAL_SUMS_VARIANTS:
    np.testing.assert_array_equal(_apply(module.clone(causal_sums="global"), variables, x)[0, :3], 0.0)


@pytest.mark.parametrize("name", VARIANTS)
def test_causal_aft_matches_the_formula_when_keys_span_a_thousand(name):
  """Random keys, a ramp up and a ramp down: float32 against the formula, every output (padded rows too) and
  gradient finite. bfloat16 (random keys) rounds keys of ~1e3 by up to ±4: compared with float32 loosely, as the
  weights follow the largest keys; finite, with finite gradients."""
  for pattern in PATTERNS:
    module, variables, x, mask = _wide_keys(name, pattern)
    keys = x @ np.asarray(variables["params"]["key"]["kernel"])
    assert (keys.max(axis=1) - keys.min(axis=1)).max() > 500
    got = _apply(module, variables, x, mask)
    want = _reference(name, x, mask, variables["params"], causal=True, window=OPTIONS[name].get("window"))
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-5, err_msg=pattern)
    assert np.isfinite(got).all(), pattern  # padded rows too
    assert _all_finite(_grads(module, variables, x, mask)), pattern

  module, variables, x, mask = _wide_keys(name, "random")
  want = _apply(module, variables, x, mask)
  got = compiled(module).apply(variables, jnp.asarray(x, jnp.bfloat16), mask=mask)
  assert got.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(got)))
  np.testing.assert_allclose(np.asarray(got, np.float32)[mask], want[mask], rtol=0.05, atol=0.05)
  assert _all_finite(_grads(module, variables, jnp.asarray(x, jnp.bfloat16), mask))


@pytest.mark.parametrize("causal", [True, False])
def test_aft_full_with_a_position_bias_spanning_sixty_to_seventy_six(causal):
  """The limit left: the reference ignores w, so a row's denominator can be as small as e^-(range of w). Up to
  ~80 the values hold; the gradient, taken as 1/den rather than 1/den², stays finite. Compiled: XLA once rewrote
  the causal path's ratio into one with den² (nan rows, den ~1e-26) that the eager run did not have; the
  bidirectional gradient was nan at 60 (den² underflowed), and its floor of 1e-30 (e^-69) on den was wrong at 76.
  A full (unfactorised) bias matrix."""
  module, variables, x, mask = _wide_keys("aft_full", "random")
  module = module.clone(aft_factorized=False, causal=causal)
  for bias_range in (60, 76):
    w = np.random.default_rng(1).uniform(-bias_range / 2, bias_range / 2, size=(16, 16)).astype(np.float32)
    variables = {"params": {**variables["params"], "bias": {"w": jnp.asarray(w)}}}
    got = _apply(module, variables, x, mask)
    want = _reference("aft_full", x, mask, variables["params"], causal=causal)
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-5, err_msg=f"range {bias_range}")
    assert _all_finite(_grads(module, variables, x, mask)), bias_range


@pytest.mark.parametrize("name", VARIANTS)
def test_causal_aft_gradients_match_the_dense_formula(name):
  """Gradients w.r.t. every parameter and the input against autodiff through the plain formula — the
  stop_gradient'ed references must not bend them — with random keys spanning a thousand and with the initial
  keys, of order 1, where everything mixes."""
  module, variables, x, mask = _wide_keys(name, "random")
  weights = np.random.default_rng(5).normal(size=x.shape).astype(np.float32) * mask[..., None]
  initial_key = compiled(module).init(jax.random.key(1), x)["params"]["key"]
  for keys, key_params in (("spanning a thousand", variables["params"]["key"]), ("initial", initial_key)):
    params = {**variables["params"], "key": key_params}
    got = _grads(module, {"params": params}, x, mask, weights)
    want = _formula_grads(name, params, x, mask, weights)
    # A constant added to a channel's keys cancels in the ratio: the key bias's true gradient is 0 (both are noise).
    scale = np.abs(want[0]["key"]["kernel"]).max()
    assert np.abs(got[0]["key"].pop("bias")).max() < 1e-4 * scale, keys
    want[0]["key"].pop("bias")
    jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3 * np.abs(b).max(), err_msg=keys), got, want
    )


@pytest.mark.parametrize("name", VARIANTS)
def test_causal_aft_matches_the_formula_on_a_long_sequence(name):
  """300 positions (not a power of two: the causal paths pad), the second sequence padded after 250, keys rising by
  ~1/2 a position (150 in all, far past float32's e^±88) under order-1 noise."""
  length, d = 300, 4
  rng = np.random.default_rng(0)
  options = {
    "aft_full": dict(max_len=512, aft_bias_dim=4),
    "aft_simple": {},
    "aft_local": dict(max_len=512, aft_bias_dim=4, window=16),
    "aft_conv": dict(num_heads=2, kernel_size=5),
  }[name]
  module = MIXERS[name](causal=True, **options)
  x = rng.normal(size=(B, length, d)).astype(np.float32)
  x[:, :, 0] = np.arange(length) / 8
  variables = compiled(module).init(jax.random.key(0), x)
  params = variables["params"]
  params["key"]["kernel"] = params["key"]["kernel"].at[0].set(4.0)
  if "bias" in params:
    params["bias"] = jax.tree.map(lambda a: a * 30, params["bias"])
  if name == "aft_conv":
    params["gamma"], params["beta"] = jnp.array([[1.5], [-1.0]]), jnp.array([[0.5], [-0.5]])
  mask = np.ones((B, length), bool)
  mask[1, 250:] = False  # padding after 250 real positions
  got = _apply(module, variables, x, mask)
  want = _reference(name, x, mask, params, causal=True, window=options.get("window"))
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", VARIANTS)
def test_aft_ignores_padded_positions_whose_keys_are_huge(name, causal):
  """Padding at the end (sequence 1) and at the start (sequence 0: causal rows 0, 1 see nothing real
  and must just stay finite), at positions whose keys are ~±4e3 — they would win every maximum if counted, and
  exp of them overflows: the values and the gradients stay finite (the bidirectional gradient once was nan, exp
  overflowing inside a masked branch)."""
  module, variables, x, mask = _wide_keys(name, "random")
  module = module.clone(causal=causal)
  mask[0, :2] = False
  x = np.where(mask[..., None], x, 8.0 * np.sign(x + 0.01)).astype(np.float32)
  keys = np.abs(x @ np.asarray(variables["params"]["key"]["kernel"]))
  assert keys[~mask].max() > 5 * keys[mask].max()
  got = _apply(module, variables, x, mask)
  want = _reference(name, x, mask, variables["params"], causal, window=OPTIONS[name].get("window"))
  rows = mask & (np.cumsum(mask, axis=1) > 0)  # real rows that see a real position
  np.testing.assert_allclose(got[rows], want[rows], rtol=1e-4, atol=1e-5)
  assert np.isfinite(got).all()
  assert _all_finite(_grads(module, variables, x, mask))


@pytest.mark.parametrize("name", VARIANTS)
def test_decoding_equals_the_causal_forward_pass_with_keys_spanning_a_thousand(name):
  """Token by token from the cache, for random keys and both ramps (the rising one raises every running maximum
  at every step)."""
  for pattern in PATTERNS:
    module, variables, x, _ = _wide_keys(name, pattern)
    full = _apply(module, variables, x, np.ones(x.shape[:2], bool))
    cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
    for t in range(x.shape[1]):
      y_t, mutated = compiled(module).apply(
        {**variables, "cache": cache}, x[:, t : t + 1], decode=True, mutable=["cache"]
      )
      cache = mutated["cache"]
      np.testing.assert_allclose(
        np.asarray(y_t)[:, 0], full[:, t], rtol=1e-4, atol=1e-5, err_msg=f"{pattern}, position {t}"
      )


# causal_sums: "global" (one maximum of K per sequence and channel, plain masked matmuls), "stable" (each row's
# prefix maximum) and "auto" (global when the keys' spread plus the bias range is within Δ(L), else stable). Which
# branch "auto" took shows as bit-for-bit equality with that setting's output; the two settings' outputs differ in
# their last bits wherever rows mix several terms, which each test checks so that the comparison can fail.
# Those programs are compiled with XLA's fusion emitters (its default on a CPU, which the suite turns off to
# compile faster: conftest.py): with the older emitters a branch of auto's jax.lax.cond rounds otherwise than the
# same computation compiled alone, and bit-for-bit equality no longer tells which branch ran.
_FUSION_EMITTERS = {"xla_cpu_use_fusion_emitters": True}


def _with_fusion_emitters(fn, *args):
  """fn(*args), jitted and compiled with XLA's fusion emitters."""
  return jax.jit(fn).lower(*args).compile(_FUSION_EMITTERS)(*args)


_OUTPUTS_AND_GRADS = {}  # (module, causal_sums, input shape) → its compiled program


def _outputs_and_grads(module, variables, x, mask):
  """{setting: (output, gradients)} for the three causal_sums settings (_grads' weighted sum), one program each,
  compiled once per module and shape (the tests call them at two sets of parameters)."""
  weights = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)

  def output_and_grads(module, params, x, mask):
    loss = lambda p, x: (module.apply({"params": p}, x, mask=mask).astype(jnp.float32) * weights).sum()
    return module.apply({"params": params}, x, mask=mask), jax.grad(loss, argnums=(0, 1))(params, x)

  runs = {}
  for s in ("auto", "global", "stable"):
    key = (module, s, x.shape)
    if key not in _OUTPUTS_AND_GRADS:
      fn = jax.jit(functools.partial(output_and_grads, module.clone(causal_sums=s)))
      _OUTPUTS_AND_GRADS[key] = fn.lower(variables["params"], x, mask).compile(_FUSION_EMITTERS)
    runs[s] = jax.device_get(_OUTPUTS_AND_GRADS[key](variables["params"], x, mask))
  return runs


def _bit_equal(a, b) -> bool:
  return all(np.array_equal(p, q) for p, q in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


@pytest.mark.parametrize("name", CAUSAL_SUMS_VARIANTS)
def test_causal_auto_takes_the_global_path_for_ordinary_keys_and_the_stable_one_for_keys_spanning_a_thousand(name):
  """Keys of order 1 (the initial projection), a position bias of range ~±5: auto is the global path bit for bit
  (values, gradients, and in bfloat16), and equals the formula (its gradients: test_causal_aft_gradients_match_...).
  Keys spanning ~1e3: auto is the stable path bit for bit and equals the formula; the global path, which auto
  declined, does not (its early rows underflow)."""
  module, variables, x, mask = _wide_keys(name, "random")
  window = OPTIONS[name].get("window")
  ordinary = {"params": {**variables["params"], "key": compiled(module).init(jax.random.key(1), x)["params"]["key"]}}
  runs = _outputs_and_grads(module, ordinary, x, mask)
  assert _bit_equal(runs["auto"], runs["global"])
  assert not np.array_equal(runs["auto"][0], runs["stable"][0])  # the paths differ in rounding: the check can fail
  want = _reference(name, x, mask, ordinary["params"], causal=True, window=window)
  np.testing.assert_allclose(runs["auto"][0][mask], want[mask], rtol=1e-4, atol=1e-5)
  x16 = jnp.asarray(x, jnp.bfloat16)
  auto16, global16 = (
    _with_fusion_emitters(lambda v, x: module.clone(causal_sums=s).apply(v, x, mask=mask), ordinary, x16)
    for s in ("auto", "global")
  )
  assert auto16.dtype == jnp.bfloat16
  assert np.array_equal(np.asarray(auto16, np.float32), np.asarray(global16, np.float32))
  np.testing.assert_allclose(np.asarray(auto16, np.float32)[mask], want[mask], rtol=0.05, atol=0.05)

  runs = _outputs_and_grads(module, variables, x, mask)
  assert _bit_equal(runs["auto"], runs["stable"])
  assert _all_finite(runs["auto"][1])
  want = _reference(name, x, mask, variables["params"], causal=True, window=window)
  np.testing.assert_allclose(runs["auto"][0][mask], want[mask], rtol=1e-4, atol=1e-5)
  assert np.abs(runs["global"][0][mask] - want[mask]).max() > 0.1


@pytest.mark.parametrize("name", CAUSAL_SUMS_VARIANTS)
def test_causal_auto_switches_to_the_stable_path_at_the_global_paths_range(name):
  """Keys 0, −5, then Δ(L) + margin (+ noise) at the later positions, where Δ(L) = ln(2^-24 / (2 L·tiny)) is the
  global path's range (efftx/mixers/README.md#aft): row 1 weighs its two keys 1 : e^-5, which the global path holds as
  e^-(Δ+margin) : e^-(Δ+margin+5). Below Δ (margin −0.5) auto takes the global path, above it (0.5, 16) the stable
  one; both equal the formula. At Δ + 16 the global path's e^-(Δ+21) < float32's smallest normal is flushed to 0,
  and row 1 is off by ~e^-5 — the loss the switch guards against."""
  L = 8
  delta = float(np.log(2.0**-24 / (2 * L * np.finfo(np.float32).tiny)))
  for margin in (-0.5, 0.5, 16.0):
    rng = np.random.default_rng(0)
    keys = np.concatenate([[0.0, -5.0], delta + margin + rng.uniform(-0.5, 0.0, size=L - 2)])
    values = np.concatenate([[1.0, 0.0], rng.normal(size=L - 2)])
    module, variables, x = _ramp_keys_module(name, keys, values)
    got = {s: _apply(module.clone(causal_sums=s), variables, x) for s in ("auto", "global", "stable")}
    assert not np.array_equal(got["global"], got["stable"]), margin
    assert np.array_equal(got["auto"], got["global" if margin < 0 else "stable"]), margin
    want = _reference(
      name, x, np.ones((1, L), bool), variables["params"], causal=True, window=OPTIONS[name].get("window")
    )
    np.testing.assert_allclose(got["auto"], want, rtol=1e-5, atol=1e-6, err_msg=f"margin {margin}")
    if margin < 0:
      np.testing.assert_allclose(got["global"], want, rtol=1e-5, atol=1e-6)
    elif margin > 10:
      sigmoid_0 = 0.5  # row 1: q = x_1 = (0, −5); the value channel 0 weighs v_0 = 1 by 1 / (1 + e^-5)
      np.testing.assert_allclose(want[0, 1, 0], sigmoid_0 / (1 + np.exp(-5.0)), rtol=1e-6)
      np.testing.assert_allclose(got["global"][0, 1, 0], sigmoid_0, rtol=1e-6)  # the e^-5 term flushed to 0

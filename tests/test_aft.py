"""AFT variants against a direct loop over the paper's formula (numpy), causal and not, with padding."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from efftx.mixers import MIXERS

B, L, D, H = 2, 9, 8, 2


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[1, 6:] = False
  return x, mask


def _dense(x, p):
  return x @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)


def _aft_reference(x, mask, params, causal, bias_fn):
  """Y_t = σ(Q_t) ⊙ Σ_t' exp(K_t' + w_tt') V_t' / Σ_t' exp(K_t' + w_tt'), one (b, t, t') at a time.

  bias_fn(t, t') gives w_tt' per channel (length D); a head-shared K (AFT-conv) is broadcast to its channels.
  """
  x = x.astype(np.float64)
  q, k, v = (_dense(x, params[n]) for n in ("query", "key", "value"))
  if k.shape[-1] != D:
    k = np.repeat(k, D // k.shape[-1], axis=-1)
  y = np.zeros_like(x)
  for b in range(B):
    for t in range(L):
      num, den = np.zeros(D), np.zeros(D)
      for s in range(L):
        if mask[b, s] and (s <= t or not causal):
          e = np.exp(k[b, s] + bias_fn(t, s))
          num += e * v[b, s]
          den += e
      y[b, t] = 1 / (1 + np.exp(-q[b, t])) * num / den
  return _dense(y, params["out"])


def _run(name, causal, seed=0, **kwargs):
  x, mask = _inputs(seed)
  module = MIXERS[name](causal=causal, **kwargs)
  variables = module.init(jax.random.key(seed), x)
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  return x, mask, module, variables, params


def _full_bias(params):
  bias = params["bias"]
  return bias["u"] @ bias["v"].T if "u" in bias else bias["w"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("factorized", [True, False])
def test_aft_full_matches_formula(causal, factorized):
  x, mask, module, variables, params = _run("aft_full", causal, max_len=16, aft_bias_dim=4,
                                            aft_factorized=factorized)
  w = _full_bias(params)
  want = _aft_reference(x, mask, params, causal, lambda t, s: np.full(D, w[t, s]))
  got = module.apply(variables, x, mask=mask)
  np.testing.assert_allclose(np.asarray(got)[mask], want[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_aft_simple_matches_formula(causal):
  x, mask, module, variables, params = _run("aft_simple", causal)
  want = _aft_reference(x, mask, params, causal, lambda t, s: np.zeros(D))
  np.testing.assert_allclose(np.asarray(module.apply(variables, x, mask=mask))[mask], want[mask], rtol=1e-4,
                             atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_aft_local_matches_formula(causal, window):
  # Bias scaled up so that the band visibly matters.
  x, mask, module, variables, params = _run("aft_local", causal, max_len=16, window=window, aft_bias_dim=4)
  variables = jax.tree.map(lambda a: a * 30, variables)
  variables = {"params": {**variables["params"], **{n: jax.tree.map(lambda a: a / 30, variables["params"][n])
                                                    for n in ("query", "key", "value", "out")}}}
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  w = _full_bias(params)
  want = _aft_reference(x, mask, params, causal, lambda t, s: np.full(D, w[t, s] if abs(t - s) < window else 0.0))
  got = np.asarray(module.apply(variables, x, mask=mask))
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel_size", [1, 3, 4])
def test_aft_conv_matches_formula(causal, kernel_size):
  x, mask, module, variables, params = _run("aft_conv", causal, num_heads=H, kernel_size=kernel_size)
  # γ and β start at 0 (the kernel is then 0: AFT-simple); give them values so the kernel matters.
  rng = np.random.default_rng(3)
  variables = {"params": {**variables["params"], "gamma": rng.normal(size=(H, 1)).astype(np.float32),
                          "beta": rng.normal(size=(H, 1)).astype(np.float32)}}
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  raw = params["kernel"]
  w = params["gamma"] * (raw - raw.mean(-1, keepdims=True)) / (raw.std(-1, keepdims=True) + 1e-5) + params["beta"]

  def bias(t, s):
    j = t - s if causal else s - t + (kernel_size - 1) // 2
    per_head = w[:, j] if 0 <= j < kernel_size else np.zeros(H)
    return np.repeat(per_head, D // H)

  want = _aft_reference(x, mask, params, causal, bias)
  got = np.asarray(module.apply(variables, x, mask=mask))
  np.testing.assert_allclose(got[mask], want[mask], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_aft_local_with_window_covering_the_sequence_is_aft_full(causal):
  x, mask = _inputs()
  full = MIXERS["aft_full"](causal=causal, max_len=16, aft_bias_dim=4)
  local = MIXERS["aft_local"](causal=causal, max_len=16, aft_bias_dim=4, window=L)
  variables = jax.tree.map(lambda a: a * 30, full.init(jax.random.key(1), x))
  np.testing.assert_allclose(local.apply(variables, x, mask=mask), full.apply(variables, x, mask=mask),
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_aft_simple_is_aft_full_with_zero_bias(causal):
  x, mask = _inputs()
  full = MIXERS["aft_full"](causal=causal, max_len=16, aft_bias_dim=4)
  variables = full.init(jax.random.key(1), x)
  simple_variables = {"params": {k: v for k, v in variables["params"].items() if k != "bias"}}
  zero_bias = jax.tree.map(jnp.zeros_like, variables["params"]["bias"])
  np.testing.assert_allclose(
      MIXERS["aft_simple"](causal=causal).apply(simple_variables, x, mask=mask),
      full.apply({"params": {**variables["params"], "bias": zero_bias}}, x, mask=mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["aft_full", "aft_simple", "aft_local", "aft_conv"])
def test_aft_is_stable_with_large_keys_in_bfloat16(name):
  x, mask = _inputs()
  module = MIXERS[name](causal=True)
  variables = module.init(jax.random.key(0), x)
  # Keys of size ~1e3 would overflow exp without the max subtraction.
  variables["params"]["key"]["kernel"] = variables["params"]["key"]["kernel"] * 1e3
  for dtype in (jnp.float32, jnp.bfloat16):
    y = module.apply(variables, jnp.asarray(x, dtype), mask=mask)
    assert y.dtype == dtype and bool(jnp.all(jnp.isfinite(y)))

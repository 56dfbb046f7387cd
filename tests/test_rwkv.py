"""RWKV-4 time mixing against a float64 numpy port of Zoology's RWKVTimeMixer (zoology/mixers/rwkv.py, forward and
__init__), written from the reference's code: the naive recurrence of its WKV kernel, step by step, without the
running maximum — float64 holds e^100 where float32 would overflow — over the real positions only."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from conftest import lm_model
from conftest import mixer_config
from efftx.errors import UserError
from efftx.mixers import MIXERS

B, L, D = 2, 16, 8
EPS = float(jnp.finfo(jnp.float32).eps)


def _reference_init(D, layer_idx, n_layer):
  """RWKVTimeMixer.__init__'s "fancy init" of time_decay, time_first and time_mix_k, _v, _r."""
  ratio_0_to_1 = layer_idx / (n_layer - 1)
  ratio_1_to_almost0 = 1.0 - layer_idx / n_layer
  decay_speed = [-5 + 8 * (h / (D - 1)) ** (0.7 + 1.3 * ratio_0_to_1) for h in range(D)]
  zigzag = [((i + 1) % 3 - 1) * 0.5 for i in range(D)]
  x = [i / D for i in range(D)]
  return {
    "time_decay": np.array(decay_speed),
    "time_first": np.array([math.log(0.3) + z for z in zigzag]),
    "time_mix_k": np.array([xi**ratio_1_to_almost0 for xi in x]),
    "time_mix_v": np.array([xi**ratio_1_to_almost0 + 0.3 * ratio_0_to_1 for xi in x]),
    "time_mix_r": np.array([xi ** (0.5 * ratio_1_to_almost0) for xi in x]),
  }


def _reference_forward(x_LxD, params):
  """RWKVTimeMixer.forward on one sequence, float64: (y, k). nn.Linear(bias=False) is x @ weight.T, and torch's
  weight is the flax kernel transposed; the WKV is the CUDA kernel's recurrence with its sums kept unscaled."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  x = np.asarray(x_LxD, np.float64)
  xx = np.concatenate([np.zeros_like(x[:1]), x[:-1]])  # time_shift = nn.ZeroPad2d((0, 0, 1, -1))
  mixed = lambda mix: x * mix + xx * (1 - mix)
  k = mixed(p["time_mix_k"]) @ p["key"]["kernel"]
  v = mixed(p["time_mix_v"]) @ p["value"]["kernel"]
  sr = 1 / (1 + np.exp(-(mixed(p["time_mix_r"]) @ p["receptance"]["kernel"])))
  w, u = -np.exp(p["time_decay"]), p["time_first"]
  num, den = np.zeros(x.shape[1]), np.zeros(x.shape[1])
  wkv = np.zeros_like(x)
  for t in range(len(x)):
    bonus = np.exp(u + k[t])
    wkv[t] = (num + bonus * v[t]) / (den + bonus)
    num = np.exp(w) * num + np.exp(k[t]) * v[t]
    den = np.exp(w) * den + np.exp(k[t])
  return (sr * wkv) @ p["output"]["kernel"], k


def _padded_inputs(seed=0, length=L, left=3, right=4):
  """x ~ N(0, 1), noise ×10 at padded positions; the first sequence padded at the start, the second at the end."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, length, D)).astype(np.float32)
  mask = np.ones((B, length), bool)
  mask[0, :left] = False
  mask[1, length - right :] = False
  return np.where(mask[..., None], x, 10 * rng.normal(size=x.shape)).astype(np.float32), mask


def _compare(module, variables, x, mask):
  """The module's outputs at real positions against the reference run on each sequence's real positions alone,
  within float32's rounding: 4·(D + max|k| + n)·eps of the largest output, for the D-term sums of the projections,
  the weights e^k, whose relative error is k's absolute rounding, ~|k|·eps (measured: up to 7·eps at |k| ≤ 200),
  and the WKV's running sums over the n real positions (n·eps, the bound of an n-term sum; measured ~200·eps at
  n = 3,939)."""
  y = np.asarray(compiled(module).apply(variables, x, mask=mask), np.float64)
  largest_k = 0.0
  for b in range(len(x)):
    real = np.ones(x.shape[1], bool) if mask is None else mask[b]
    want, k = _reference_forward(x[b][real], variables["params"])
    largest_k = max(largest_k, np.abs(k).max())
    scale = np.abs(want).max()
    np.testing.assert_allclose(
      y[b][real], want, rtol=0, atol=4 * (D + np.abs(k).max() + real.sum()) * EPS * scale, err_msg=f"sequence {b}"
    )
  return largest_k


def _with(variables, key_scale=1.0, time_decay=None):
  params = dict(variables["params"])
  params["key"] = {"kernel": params["key"]["kernel"] * key_scale}
  if time_decay is not None:
    params["time_decay"] = jnp.asarray(time_decay, jnp.float32)
  return {"params": params}


# Decays per channel: strong (time_decay 5: w = −148, the past gone after one step), weak (−12: w ≈ −6e-6, no decay
# over the sequence), and the initialisation's spread between.
MIXED_DECAYS = np.array([5.0, -12.0] * (D // 2))


@pytest.mark.parametrize(
  "key_scale,time_decay,largest_key",
  [(1.0, None, None), (1.0, MIXED_DECAYS, None), (30.0, MIXED_DECAYS, 45), (60.0, None, 90)],
  ids=["init", "strong-weak-decays", "keys-50", "keys-100"],
)
def test_matches_zoology_with_padding_at_both_ends(key_scale, time_decay, largest_key):
  module = MIXERS["rwkv"](causal=True)
  x, mask = _padded_inputs()
  variables = _with(compiled(module).init(jax.random.key(0), x), key_scale, time_decay)
  k_max = _compare(module, variables, x, mask)
  if largest_key:  # the keys reach ±50 (e^k times e^(L·|w|) overflows float32), ±100 (e^k alone overflows: > e^88.7)
    assert k_max > largest_key


def test_one_position_and_a_length_not_a_power_of_two_at_layer_1():
  """L = 1 (the bonus term alone) without a mask; L = 13 with padding, and Figure 2's second layer's init."""
  module = MIXERS["rwkv"](causal=True)
  x1 = np.random.default_rng(3).normal(size=(B, 1, D)).astype(np.float32)
  _compare(
    module,
    compiled(module).init(jax.random.key(1), x1),
    x1,
    None,
  )
  module = MIXERS["rwkv"](causal=True, layer_idx=1)
  x, mask = _padded_inputs(seed=4, length=13, left=2, right=5)
  _compare(module, _with(compiled(module).init(jax.random.key(2), x), 30.0), x, mask)


def test_initialisation_is_the_references():
  """time_* by Zoology's formulas for Figure 2's two layers (layer_idx 0, 1 of n_layer 12, its default); the four
  projections without bias, at torch.nn.Linear's default U(±1/√D), as Zoology's model leaves them."""
  x = np.zeros((1, 2, D), np.float32)
  for layer_idx in (0, 1):
    params = compiled(MIXERS["rwkv"](causal=True, layer_idx=layer_idx)).init(jax.random.key(0), x)["params"]
    for name, want in _reference_init(D, layer_idx, 12).items():
      assert params[name].dtype == jnp.float32
      np.testing.assert_allclose(params[name], want, rtol=2 * EPS, atol=2 * EPS, err_msg=f"{layer_idx} {name}")
    for name in ("key", "value", "receptance", "output"):
      assert set(params[name]) == {"kernel"}
      assert 0.5 / D**0.5 < np.abs(params[name]["kernel"]).max() <= 1 / D**0.5


def test_bfloat16_is_within_its_rounding_of_the_reference():
  """bfloat16 inputs (float32 parameters): the output in bfloat16, within a few bfloat16 roundings (2^-8 relative)
  of the reference at the same, rounded, input: k, v, r and the output are rounded once each."""
  module = MIXERS["rwkv"](causal=True)
  x, mask = _padded_inputs(seed=5)
  x16 = jnp.asarray(x, jnp.bfloat16)
  variables = compiled(module).init(jax.random.key(0), x)
  y16 = compiled(module).apply(variables, x16, mask=mask)
  assert y16.dtype == jnp.bfloat16
  for b in range(B):
    want, _ = _reference_forward(np.asarray(x16, np.float32)[b][mask[b]], variables["params"])
    got = np.asarray(y16, np.float32)[b][mask[b]]
    np.testing.assert_allclose(got, want, atol=4 * 2**-8 * np.abs(want).max())


def test_gradients_are_finite_and_equal_the_references_derivatives():
  """d Σ y·g / d (time_decay, time_first, x) against central differences of the float64 reference, at keys of ±50
  and strong and weak decays; finite in bfloat16 too."""
  module = MIXERS["rwkv"](causal=True)
  x, mask = _padded_inputs(seed=6, length=6, left=1, right=2)
  variables = _with(compiled(module).init(jax.random.key(0), x), 30.0, MIXED_DECAYS)
  g = np.random.default_rng(7).normal(size=x.shape) * mask[..., None]  # the loss weighs real positions only

  @jax.jit
  def grads(v, x):
    loss = lambda v, x: jnp.sum(module.apply(v, x, mask=mask).astype(jnp.float32) * g)
    return jax.grad(loss, argnums=(0, 1))(v, x)

  got_v, got_x = grads(variables, x)
  got16 = grads(variables, jnp.asarray(x, jnp.bfloat16))
  assert all(bool(jnp.all(jnp.isfinite(a))) for a in jax.tree.leaves((got_v, got_x, got16)))

  def loss64(params, x):
    return sum((_reference_forward(x[b][mask[b]], params)[0] * g[b][mask[b]]).sum() for b in range(B))

  p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), variables["params"])
  h = 1e-6
  for name in ("time_decay", "time_first"):
    for c in range(D):
      up, down = (jax.tree.map(np.copy, p64) for _ in range(2))
      up[name][c] += h
      down[name][c] -= h
      want = (loss64(up, x) - loss64(down, x)) / (2 * h)
      np.testing.assert_allclose(got_v["params"][name][c], want, rtol=1e-4, atol=1e-6, err_msg=f"{name}[{c}]")
  for b, t, c in ((0, 1, 0), (0, 3, 5), (1, 0, 2), (1, 3, 7)):  # real positions of either sequence
    up, down = np.array(x, np.float64), np.array(x, np.float64)
    up[b, t, c] += h
    down[b, t, c] -= h
    want = (loss64(p64, up) - loss64(p64, down)) / (2 * h)
    np.testing.assert_allclose(got_x[b, t, c], want, rtol=1e-4, atol=1e-6, err_msg=f"x[{b}, {t}, {c}]")
  assert np.all(np.asarray(got_x)[~mask] == 0)  # padded inputs reach nothing


def test_decoding_keeps_a_state_of_constant_size_and_skips_padding():
  """The cache is per channel (B×D: the previous input, numerator, denominator, running maximum) whatever the
  number of positions it is made for; decoding a sequence padded at the start, with its mask, gives the forward
  pass's outputs at the real positions."""
  module = MIXERS["rwkv"](causal=True)
  init_decoding = functools.partial(module.init, decode=True)
  shapes = [
    jax.tree.map(jnp.shape, jax.eval_shape(init_decoding, jax.random.key(0), jnp.zeros((B, T, D)))["cache"])
    for T in (3, 64)
  ]
  assert shapes[0] == shapes[1] and set(jax.tree.leaves(shapes[0], is_leaf=lambda s: isinstance(s, tuple))) == {(B, D)}
  x, mask = _padded_inputs(seed=8, length=7, left=2, right=0)
  variables = compiled(module).init(jax.random.key(0), x)
  full = np.asarray(compiled(module).apply(variables, x, mask=mask))
  cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
  step = jax.jit(
    lambda c, x_t, m_t: module.apply({**variables, "cache": c}, x_t, mask=m_t, decode=True, mutable=["cache"])
  )
  for t in range(x.shape[1]):
    y_t, mutated = step(cache, x[:, t : t + 1], mask[:, t : t + 1])
    cache = mutated["cache"]
    real = mask[:, t]
    np.testing.assert_allclose(np.asarray(y_t)[real, 0], full[real, t], rtol=1e-5, atol=1e-6, err_msg=f"{t}")


def test_options_are_checked_and_the_model_gives_each_layer_its_index():
  spec = MIXERS["rwkv"]
  assert spec.defaults() == {"n_layer": 12}
  with pytest.raises(UserError, match="causal only"):
    spec(causal=False)
  with pytest.raises(UserError, match="has no option 'layer_idx'"):
    spec.check({"layer_idx": 1}, None, True)  # the layer's index is the model's to give, not an option
  x = np.zeros((1, 2, D), np.float32)
  with pytest.raises(UserError, match="exponent"):
    spec(causal=True, layer_idx=-1, n_layer=2).init(jax.random.key(0), x)
  spec(causal=True, layer_idx=-1).init(jax.random.key(0), x)  # the reference's own default
  config = mixer_config("rwkv", d_model=D, num_layers=2, max_len=4, d_ff=0)
  params = lm_model(config).init(jax.random.key(0), np.zeros((1, 4), np.int32))["params"]
  for layer in (0, 1):
    got = params[f"block_{layer}"]["mixing"]["mixer"]["time_decay"]
    np.testing.assert_allclose(got, _reference_init(D, layer, 12)["time_decay"], rtol=2 * EPS, atol=2 * EPS)


def test_the_models_redraw_leaves_the_projections_at_torchs_initialisation():
  """Zoology's _init_weights never reaches RWKVTimeMixer's nn.Linear layers (a torch.jit.ScriptModule's submodules
  are not nn.Linear instances), so under init_std 0.02 they keep torch's U(±1/√D) (std 1/√(3D)), in every layer."""
  from configs import zoology_fig2  # pylint: disable=g-import-not-at-top
  from efftx import model as model_lib  # pylint: disable=g-import-not-at-top

  config = zoology_fig2.get_config("mixer=rwkv,L=64,d_model=64")
  config.model.max_len = 8
  params = model_lib.initialize(lm_model(config), jax.random.key(0))
  for layer in (0, 1):
    mixer = params[f"block_{layer}"]["mixing"]["mixer"]
    for name in ("key", "value", "receptance", "output"):
      kernel = np.asarray(mixer[name]["kernel"])
      assert np.abs(kernel).max() <= 1 / 8 and np.std(kernel) == pytest.approx(1 / np.sqrt(3 * 64), rel=0.05), name
  assert np.std(params["embed"]["embedding"]) == pytest.approx(0.02, rel=0.05)


def test_a_sequence_of_4096_with_strong_and_weak_decays_and_padding_at_both_ends():
  """Length 4,096 (a weakly decaying channel sums almost every position; a strong one forgets each step), keys of
  ±15, padding at both ends: the scan's float32 sums against the float64 reference within the same bound."""
  module = MIXERS["rwkv"](causal=True)
  x, mask = _padded_inputs(seed=5, length=4096, left=100, right=57)
  variables = _with(compiled(module).init(jax.random.key(3), x[:, :8]), 10.0, MIXED_DECAYS)
  _compare(module, variables, x, mask)

"""Hyena (efftx/mixers/hyena.py) against float64 numpy ports of the published modules, given efftx's parameters:
Zoology's `Hyena` (zoology/mixers/hyena.py: `Hyena.forward`, `Filter.filter`, `fftconv_ref`,
`PositionalEmbedding`, `ExponentialModulation`, `Sin`), the filter generation on its own, and safari's
standalone_hyena.py `HyenaOperator` at order 3. The ports keep torch's layouts (Linear weights out × in, Conv1d
weights C × 1 × taps, channels before positions); `_torch_state` is the one place that maps efftx's parameters onto
them.

Tolerances: efftx computes in float32. Each output is a chain of a few sums (in_proj over d, 3 taps, the FFT
convolution over ≤ 2L terms in log2(2L) stages, out_proj over d): about 40 roundings of 2^-24 relative to the
largest terms, ~2.4e-6 of the largest output, and the FFT's error is relative to the whole sequence's norm, not to
each entry: so atol = 1e-5 × max |output| and rtol 1e-5. The filter alone (3 Dense layers of 64, sines and an
exponential) is held to 1e-5 of its largest entry.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from conftest import lm_model
from conftest import mixer_config
from efftx import trainer
from efftx.errors import UserError
from efftx.mixers import MIXERS
from efftx.mixers import hyena

D = 8

# ---------------------------------------------------------------------------------------------------------------
# The references, float64, written from zoology/mixers/hyena.py (and safari's standalone_hyena.py for order > 2).


def _positional_embedding(emb_dim, seq_len):
  """PositionalEmbedding.__init__: z (1 × seq_len × emb_dim) and t (1 × seq_len × 1)."""
  t = np.linspace(0, 1, seq_len)[None, :, None]
  bands = (emb_dim - 1) // 2
  t_rescaled = np.linspace(0, seq_len - 1, seq_len)[None, :, None]
  w = 2 * np.pi * t_rescaled / seq_len
  f = np.linspace(1e-4, bands - 1, bands)[None, None]
  z = np.exp(-1j * f * w)
  return np.concatenate([t, z.real, z.imag], axis=-1), t


def _filter(sd, L, max_len, emb_dim=3, num_inner_mlps=2, linear_mixer=False, modulate=True, normalized=False,
            fast_decay_pct=0.3, slow_decay_pct=1.5, target=1e-2, shift=0.0):  # fmt: skip
  """Filter.filter(L): the implicit MLP of the positional features, modulated; 1 × L × channels."""
  _, t = _positional_embedding(emb_dim, max_len)
  z, t = sd["pos_emb.z"][:, :L], t[:, :L]
  linear = lambda h, i: h @ sd[f"implicit_filter.{i}.weight"].T + sd.get(f"implicit_filter.{i}.bias", 0.0)
  if linear_mixer:
    h = linear(z, 0)
  else:
    h = np.sin(sd["implicit_filter.1.freq"] * linear(z, 0))  # one Sin module, shared by every activation
    for i in range(num_inner_mlps):
      h = np.sin(sd["implicit_filter.1.freq"] * linear(h, 2 * i + 2))
    h = linear(h, 2 * num_inner_mlps + 2)
  if modulate:
    channels = h.shape[-1]
    deltas = np.linspace(np.log(target) / slow_decay_pct, np.log(target) / fast_decay_pct, channels)[None, None]
    h = h * (np.exp(-t * np.abs(deltas)) + shift)
  if normalized:
    h = h / np.abs(h).sum(-1, keepdims=True)
  return h


def _fftconv(u, k, D_):
  """fftconv_ref(u, k, D, dropout_mask=None, gelu=False): u b × d × l, k d × l, D d."""
  seqlen = u.shape[-1]
  fft_size = 2 * seqlen
  k_f = np.fft.rfft(k, n=fft_size) / fft_size
  u_f = np.fft.rfft(u, n=fft_size)
  y = np.fft.irfft(u_f * k_f, n=fft_size, norm="forward")[..., :seqlen]
  return y + u * D_[:, None]


def _short_filter(sd, u):
  """nn.Conv1d(C, C, W, groups=C, padding=W − 1)(u)[..., :l] on u b × C × l (cross-correlation)."""
  weight, bias = sd["short_filter.weight"], sd["short_filter.bias"]
  W, l = weight.shape[-1], u.shape[-1]
  padded = np.pad(u, [(0, 0), (0, 0), (W - 1, W - 1)])
  out = bias[None, :, None] + sum(weight[None, :, 0, j, None] * padded[:, :, j : j + l + W - 1] for j in range(W))
  return out[..., :l]


def _zoology_hyena(sd, u, max_len, **filter_args):
  """Hyena.forward (num_heads = num_blocks = 1, dropout inactive): u b × l × d → b × l × d."""
  l, d = u.shape[1], u.shape[2]
  u = u @ sd["in_proj.weight"].T + sd["in_proj.bias"]
  uc = _short_filter(sd, u.transpose(0, 2, 1))
  x1, x2, v = uc[:, :d], uc[:, d : 2 * d], uc[:, 2 * d :]
  v = v * x1
  k = _filter(sd, l, max_len, **filter_args)[0].T
  v = _fftconv(v, k, sd["filter_fn.bias"])
  v = v * x2
  return v.transpose(0, 2, 1) @ sd["out_proj.weight"].T + sd["out_proj.bias"]


def _safari_hyena(sd, u, max_len, order):
  """safari standalone_hyena.py HyenaOperator.forward (dropout inactive): u b × l × d → b × l × d."""
  l, d = u.shape[1], u.shape[2]
  u = u @ sd["in_proj.weight"].T + sd["in_proj.bias"]
  uc = _short_filter(sd, u.transpose(0, 2, 1))
  *x, v = np.split(uc, order + 1, axis=1)
  k = _filter(sd, l, max_len)[0]  # l × (o d)
  k = k.T.reshape(order - 1, d, l)  # 'l (o d) -> o d l'
  bias = sd["filter_fn.bias"].reshape(order - 1, d)
  for o, x_i in enumerate(reversed(x[1:])):
    v = _fftconv(v * x_i, k[o], bias[o])
  return (v * x[0]).transpose(0, 2, 1) @ sd["out_proj.weight"].T + sd["out_proj.bias"]


# ---------------------------------------------------------------------------------------------------------------


def _filter_state(f):
  """efftx's filter_fn parameters under the reference's names (Filter's) and layouts, float64."""
  f = jax.tree.map(lambda a: np.asarray(a, np.float64), f)
  sd = {"filter_fn.bias": f["bias"], "pos_emb.z": f["z"][None]}
  if "freq" in f:
    sd["implicit_filter.1.freq"] = f["freq"]
  for name, layer in f.items():
    if name.startswith("implicit_filter_"):
      i = name.rsplit("_", 1)[1]
      sd[f"implicit_filter.{i}.weight"] = layer["kernel"].T
      if "bias" in layer:
        sd[f"implicit_filter.{i}.bias"] = layer["bias"]
  return sd


def _torch_state(params):
  """efftx's parameters under the reference's state-dict names and layouts, float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  return {
    "in_proj.weight": p["in_proj"]["kernel"].T,
    "in_proj.bias": p["in_proj"]["bias"],
    "out_proj.weight": p["out_proj"]["kernel"].T,
    "out_proj.bias": p["out_proj"]["bias"],
    # efftx's taps[j] weighs x_{t−j}; torch's weight[..., j] weighs x_{t−(W−1−j)}
    "short_filter.weight": p["short_filter"]["taps"][::-1].T[:, None, :],
    "short_filter.bias": p["short_filter"]["bias"],
    **_filter_state(params["filter_fn"]),
  }


def _inputs(B, L, seed=0):
  return np.random.default_rng(seed).normal(size=(B, L, D)).astype(np.float32)


def _assert_close(got, want):
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


FILTER_CASES = [
  {},
  dict(emb_dim=5, num_inner_mlps=1, normalized=True, shift=0.1, fast_decay_pct=0.2, slow_decay_pct=2.0, target=0.1),
  dict(linear_mixer=True, modulate=False),
]


@pytest.mark.parametrize("options", FILTER_CASES, ids=["defaults", "bands-normalized-shift", "linear-unmodulated"])
def test_filter_generation_equals_zoologys_filter(options):
  """z's initial value is PositionalEmbedding's; the filter (positional features → MLP with sines → modulation)
  equals Filter.filter at the full length (and, at the defaults, a shorter one: the first rows of z); freq starts
  at w, D ~ N(0, 1) has its own draw per channel."""
  max_len, channels = 13, 2 * D
  module = hyena.ImplicitFilter(channels, max_len, w=1.5, **options)
  variables = jax.jit(module.init, static_argnums=1)(jax.random.key(0), max_len)
  params = variables["params"]
  z, _ = _positional_embedding(options.get("emb_dim", 3), max_len)
  np.testing.assert_allclose(params["z"], z[0], rtol=0, atol=1e-7)
  sd = _filter_state(params)
  if not options.get("linear_mixer"):
    np.testing.assert_array_equal(params["freq"], np.full((1, 64), 1.5, np.float32))
  for L in (max_len, 5) if not options else (max_len,):
    h, d = jax.jit(module.apply, static_argnums=1)(variables, L)
    want = _filter(sd, L, max_len, **options)[0]
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  assert d.shape == (channels,) and len(set(np.asarray(d).tolist())) == channels


@pytest.mark.parametrize("L,max_len", [(13, 16), (1, 1)])
def test_forward_equals_zoologys_hyena(L, max_len):
  """Hyena(l_max=max_len) at its defaults on L < max_len positions (not a power of two; one); L = max_len in the
  padding test below."""
  x = _inputs(2, L)
  module = MIXERS["hyena"](causal=True, max_len=max_len)
  variables = compiled(module).init(jax.random.key(1), x)
  got = compiled(module).apply(variables, x)
  _assert_close(got, _zoology_hyena(_torch_state(variables["params"]), x.astype(np.float64), max_len))


def test_padding_at_both_ends_equals_the_reference_on_the_real_positions():
  """Padded positions enter every convolution as zeros, which is what the reference's causal convolutions see
  before a sequence starts: the real positions' outputs equal the reference on the real positions alone."""
  L, max_len = 11, 11
  x = _inputs(2, L, seed=2)
  mask = np.ones((2, L), bool)
  mask[1, :3] = mask[1, 9:] = False  # 3 padded positions before, 2 after
  module = MIXERS["hyena"](causal=True, max_len=max_len)
  variables = compiled(module).init(jax.random.key(2), x)
  noisy = np.where(mask[..., None], x, 100.0)  # what padding holds must not matter
  got = np.asarray(compiled(module).apply(variables, noisy, mask=mask))
  sd = _torch_state(variables["params"])
  _assert_close(got[0], _zoology_hyena(sd, x[:1].astype(np.float64), max_len)[0])
  _assert_close(got[1, 3:9], _zoology_hyena(sd, x[1:, 3:9].astype(np.float64), max_len)[0])


def test_order_3_equals_safaris_operator_and_decodes_step_by_step():
  """Order N follows safari's HyenaOperator, whose gates take the in_proj chunks last first (x_{N−1} before the
  first convolution, x_0 after the last) where Zoology's order 2 takes them first first: with the gate chunks
  of in_proj and the short filter reversed, the two are the same function. Decoding keeps a buffer of inputs per
  long convolution (the registry test decodes order 2)."""
  L, max_len, order = 9, 12, 3
  x = _inputs(2, L, seed=3)
  module = MIXERS["hyena"](causal=True, max_len=max_len, order=order)
  variables = compiled(module).init(jax.random.key(3), x, decode=True)
  cache, variables = variables.pop("cache"), {"params": variables["params"]}
  full = np.asarray(compiled(module).apply(variables, x))
  sd = _torch_state(variables["params"])
  chunks = list(range(order))[::-1] + [order]  # safari's chunk i is efftx's chunk order − 1 − i; v stays last
  rows = np.concatenate([np.arange(c * D, (c + 1) * D) for c in chunks])
  for name in ("in_proj.weight", "in_proj.bias", "short_filter.weight", "short_filter.bias"):
    sd[name] = sd[name][rows]
  _assert_close(full, _safari_hyena(sd, x.astype(np.float64), max_len, order))
  assert set(cache) == {"short_filter", "long_conv_0", "long_conv_1"}
  step = jax.jit(lambda v, x_t: module.apply(v, x_t, decode=True, mutable=["cache"]))
  for t in range(L):
    y_t, mutated = step({**variables, "cache": cache}, x[:, t : t + 1])
    cache = mutated["cache"]
    _assert_close(np.asarray(y_t)[:, 0], full[:, t])


def test_gradients_are_finite_and_bfloat16_keeps_its_dtype_and_values():
  """Gradients of every parameter (z, freq and D included) and of the input are finite and not all zero;
  bfloat16 inputs give a bfloat16 output within bfloat16's resolution of the float32 one at the same inputs."""
  L = 6
  x = _inputs(2, L, seed=5)
  mask = np.ones((2, L), bool)
  mask[1, :2] = False
  module = MIXERS["hyena"](causal=True, max_len=L, gate_dropout=0.1)
  x16 = jnp.asarray(x, jnp.bfloat16)

  @jax.jit
  def run(key, x32, x16):  # one program: init, the training pass's gradients, float32 and bfloat16 outputs
    v = module.init(key, x32)
    loss = lambda v, x: module.apply(v, x, mask=mask, deterministic=False, rngs={"dropout": jax.random.key(0)}).sum()
    return jax.grad(loss, argnums=(0, 1))(v, x32), module.apply(v, x32, mask=mask), module.apply(v, x16, mask=mask)

  grads, y32, y16 = run(jax.random.key(5), np.asarray(x16, np.float32), x16)
  for path, g in jax.tree_util.tree_leaves_with_path(grads):
    assert np.all(np.isfinite(g)) and np.any(g != 0), jax.tree_util.keystr(path)
  assert y16.dtype == jnp.bfloat16 and y16.shape == x.shape
  want = np.asarray(y32)
  np.testing.assert_allclose(np.asarray(y16, np.float32), want, rtol=0, atol=0.03 * np.abs(want).max())


def test_initialisation_and_what_the_model_redraws_and_decays():
  """With init_std (Zoology's _init_weights: every nn.Linear N(0, 0.02²) with zero biases, the filter MLP's
  included, its last one without a bias too) every Dense kernel is redrawn; the rest is as the reference makes it:
  short_filter's taps and bias U(±1/√3) (torch's Conv1d, fan-in 3), D ~ N(0, 1), freq = w = 1, z its formula.
  AdamW decays the Dense kernels and the taps, nothing else."""
  model = lm_model(mixer_config("hyena", d_model=16, d_ff=16, num_layers=1, max_len=32, causal=True, init_std=0.02))
  params = jax.jit(trainer.init_params, static_argnums=0)(model, jax.random.key(0))
  layer = jax.tree.map(np.asarray, params["block_0"]["mixing"]["mixer"])
  dense = {"in_proj", "out_proj", "implicit_filter_0", "implicit_filter_2", "implicit_filter_4", "implicit_filter_6"}
  kernels = {keys[-2]: leaf for keys, leaf in _leaves(layer) if keys[-1] == "kernel"}
  assert set(kernels) == dense
  for name, kernel in kernels.items():
    assert abs(np.std(kernel) - 0.02) < 0.2 * 0.02, name
  for keys, leaf in _leaves(layer):
    if keys[-1] == "bias" and keys[-2] != "filter_fn" and keys[-2] != "short_filter":
      np.testing.assert_array_equal(leaf, 0.0, err_msg=str(keys))
  bound = 1 / np.sqrt(3)
  for leaf in layer["short_filter"].values():
    assert 0.8 * bound < np.abs(leaf).max() < bound
  assert layer["short_filter"]["taps"].shape == (3, 3 * 16)
  assert 0.5 < np.std(layer["filter_fn"]["bias"]) < 1.5
  np.testing.assert_array_equal(layer["filter_fn"]["freq"], np.ones((1, 64)))
  np.testing.assert_allclose(layer["filter_fn"]["z"], _positional_embedding(3, 32)[0][0], rtol=0, atol=1e-7)
  decayed = {"/".join(keys) for keys, on in _leaves(trainer.decay_mask(layer)) if on}
  assert decayed == {f"{m}/kernel" if "proj" in m else f"filter_fn/{m}/kernel" for m in dense} | {"short_filter/taps"}


def _leaves(tree):
  return [([k.key for k in path], leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]


def test_options_are_checked():
  with pytest.raises(UserError, match="odd emb_dim"):
    MIXERS["hyena"](causal=True, emb_dim=4)
  with pytest.raises(UserError, match="filter_dropout"):
    MIXERS["hyena"](causal=True, filter_dropout=0.1)
  with pytest.raises(UserError, match="causal only"):
    MIXERS["hyena"](causal=False)
  with pytest.raises(UserError, match="exceeds max_len"):
    MIXERS["hyena"](causal=True, max_len=4).init(jax.random.key(0), jnp.zeros((1, 5, D)))

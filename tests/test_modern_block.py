"""The modern block's options (config.model.norm="rms", activation="swiglu", position_embedding="rotary", d_ff=0)
and bidirectional use of causal-only mixers by reversal (MixerSpec.bidirectional_by_reversal), each against a
numpy formula; the defaults' parameters are unchanged."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import assert_decodes_like_forward
from conftest import compiled
from conftest import lm_model
from conftest import mixer_config
from efftx import config as config_lib
from efftx import hf
from efftx import model as model_lib
from efftx.errors import UserError
from efftx.mixers import MIXERS
from efftx.mixers import rotary
from efftx.mixers import rwkv as rwkv_lib
from efftx.mixers.__main__ import _causal
from efftx.mixers.spec import ByReversal
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import mixer_module

rng = np.random.default_rng(0)


def test_rms_norm_is_llamas_formula_in_float32():
  x_BxLxD = rng.normal(size=(2, 3, 8)).astype(np.float32) * 3 + 1
  scale_D = rng.normal(size=8).astype(np.float32)
  eps = 1e-5
  want = x_BxLxD / np.sqrt((x_BxLxD.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps) * scale_D
  norm = model_lib.make_norm("rms", eps, jnp.float32, "norm")
  assert jax.tree.map(np.shape, jax.eval_shape(norm.init, jax.random.key(0), x_BxLxD)) == {"params": {"scale": (8,)}}
  got = compiled(norm).apply({"params": {"scale": scale_D}}, x_BxLxD)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  # bfloat16 in and out, statistics in float32: within bfloat16's rounding of the output (2⁻⁸ relative).
  x16 = jnp.asarray(x_BxLxD, jnp.bfloat16)
  got16 = compiled(model_lib.make_norm("rms", eps, jnp.bfloat16, "norm")).apply({"params": {"scale": scale_D}}, x16)
  want16 = np.asarray(x16, np.float64) / np.sqrt((np.asarray(x16, np.float64) ** 2).mean(-1, keepdims=True) + eps)
  assert got16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got16, np.float32), want16 * scale_D, rtol=2**-7, atol=1e-6)


def _silu(x):
  return x / (1 + np.exp(-x))


def test_swiglu_feed_forward_is_llamas_mlp_also_in_chunks():
  D, F, L = 8, 12, 8
  x_BxLxD = rng.normal(size=(2, L, D)).astype(np.float32)
  ff = model_lib.FeedForward(F, 0.0, "swiglu")
  params = compiled(ff).init(jax.random.key(0), x_BxLxD, True)["params"]
  assert jax.tree.map(np.shape, params) == {
    "up": {"kernel": (D, F)},
    "gate": {"kernel": (D, F)},
    "down": {"kernel": (F, D)},
  }
  w = jax.tree.map(np.asarray, params)
  want = (_silu(x_BxLxD @ w["gate"]["kernel"]) * (x_BxLxD @ w["up"]["kernel"])) @ w["down"]["kernel"]
  np.testing.assert_allclose(compiled(ff).apply({"params": params}, x_BxLxD, True), want, rtol=1e-5, atol=1e-5)
  # The sublayer, whole and over chunks of 4 positions (a scan over the same parameters), pre-normed by RMSNorm.
  whole = model_lib.FeedForwardSublayer(F, 0.0, 0, activation="swiglu", norm="rms")
  chunked = model_lib.FeedForwardSublayer(F, 0.0, 4, activation="swiglu", norm="rms")
  sub = jax.tree.map(np.asarray, compiled(whole).init(jax.random.key(1), x_BxLxD, True)["params"])
  chunked_shapes = jax.eval_shape(lambda: chunked.init(jax.random.key(1), x_BxLxD, True))["params"]
  assert jax.tree.map(np.shape, chunked_shapes) == {
    "norm": {"scale": (D,)},
    "chunks": {"ff": jax.tree.map(np.shape, sub["ff"])},
  }
  h = x_BxLxD / np.sqrt((x_BxLxD**2).mean(-1, keepdims=True) + 1e-6) * np.asarray(sub["norm"]["scale"])
  want = (_silu(h @ sub["ff"]["gate"]["kernel"]) * (h @ sub["ff"]["up"]["kernel"])) @ sub["ff"]["down"]["kernel"]
  np.testing.assert_allclose(compiled(whole).apply({"params": sub}, x_BxLxD, True), want, rtol=1e-5, atol=1e-5)
  in_chunks = compiled(chunked).apply({"params": {"norm": sub["norm"], "chunks": {"ff": sub["ff"]}}}, x_BxLxD, True)
  np.testing.assert_allclose(in_chunks, want, rtol=1e-5, atol=1e-5)


def _rotate_np(x_BxLxHxK, pos_L, base=10000.0):
  """transformers' apply_rotary_pos_emb in float64: x·cos + rotate_half(x)·sin, inv_freq = base^(−2i/K)."""
  K = x_BxLxHxK.shape[-1]
  inv_freq = 1.0 / base ** (np.arange(0, K, 2, dtype=np.float64) / K)
  freqs = np.outer(pos_L.astype(np.float64), inv_freq)
  emb = np.concatenate([freqs, freqs], -1)[:, None, :]
  rotate_half = np.concatenate([-x_BxLxHxK[..., K // 2 :], x_BxLxHxK[..., : K // 2]], -1)
  return x_BxLxHxK * np.cos(emb) + rotate_half * np.sin(emb)


def test_rotary_is_rotate_half_and_scores_depend_on_relative_position_only():
  q, k = rng.normal(size=(2, 2, 6, 3, 8)).astype(np.float32)
  pos = np.arange(6)
  rotate = jax.jit(rotary.rotate)
  np.testing.assert_allclose(rotate(q, pos), _rotate_np(q, pos), rtol=1e-5, atol=1e-5)
  scores = lambda shift: np.einsum("bqhk,bthk->bhqt", rotate(q, pos + shift), rotate(k, pos + shift))
  for shift in (1, 37, 1000):
    np.testing.assert_allclose(scores(shift), scores(0), rtol=1e-4, atol=1e-4)
  assert not np.allclose(scores(0), np.einsum("bqhk,bthk->bhqt", q, k), atol=1e-2)  # it does rotate


def _attention_np(params, x_BxLxD, mask_BxL, causal):
  """Attention with rotary queries and keys in float64 from the module's parameters."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  qkv = np.einsum("bld,dthk->bltkh", x_BxLxD, p["qkv"]["kernel"]) + p["qkv"]["bias"].transpose(0, 2, 1)
  q, k, v = (qkv[:, :, i].swapaxes(-1, -2) for i in range(3))  # B×L×H×K
  L, K = x_BxLxD.shape[1], q.shape[-1]
  q, k = _rotate_np(q, np.arange(L)), _rotate_np(k, np.arange(L))
  s = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(K)
  allowed = mask_BxL[:, None, None, :] & (np.tril(np.ones((L, L), bool)) if causal else True)
  s = np.where(allowed, s, -np.inf)
  probs = np.exp(s - s.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  out = np.einsum("bhqt,bthk->bqhk", probs, v)
  return np.einsum("bqhk,hkd->bqd", out, p["out"]["kernel"]) + p["out"]["bias"]


def test_rotary_attention_matches_numpy_in_every_path():
  B, L, D = 2, 8, 16
  x_BxLxD = rng.normal(size=(B, L, D)).astype(np.float32)
  mask_BxL = np.ones((B, L), bool)
  mask_BxL[1, 5:] = False
  make = lambda causal, impl: MIXERS["attention"](
    causal=causal, rotary=True, num_heads=2, attention_impl=impl, attention_chunk=4
  )
  variables = jax.jit(make(False, "plain").init)(jax.random.key(0), x_BxLxD)
  for causal in (False, True):
    want = _attention_np(variables["params"], x_BxLxD.astype(np.float64), mask_BxL, causal)
    for impl in ("plain", "chunked", "flash"):
      got = np.asarray(compiled(make(causal, impl)).apply(variables, x_BxLxD, mask=mask_BxL))
      np.testing.assert_allclose(got[mask_BxL], want[mask_BxL], rtol=1e-4, atol=1e-4, err_msg=f"{impl} {causal}")


def test_rotary_lm_decodes_like_its_forward_pass_without_learned_positions():
  config = mixer_config(
    "attention", num_heads=2, causal=True, d_model=16, num_layers=1, d_ff=32, max_len=6, dropout=0.0
  )
  config.model.update(position_embedding="rotary", norm="rms", activation="swiglu")
  model = lm_model(config)
  assert model.make_mixer.keywords["rotary"] is True
  tokens = rng.integers(0, 16, size=(2, 6)).astype(np.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens))["params"]
  assert "pos_embed" not in params and set(params["final_norm"]) == {"scale"}
  assert_decodes_like_forward(model, tokens)


def test_rotary_goes_to_the_layers_that_take_it_and_is_refused_where_none_does():
  config = mixer_config("attention+linear", num_layers=2, d_model=16, num_heads=2, causal=True)
  config.model.position_embedding = "rotary"
  model = lm_model(config)
  assert model.make_mixer[0].keywords["rotary"] is True and "rotary" not in model.make_mixer[1].keywords
  config = mixer_config("linear", d_model=16, num_heads=2, causal=True)
  config.model.position_embedding = "rotary"
  with pytest.raises(UserError, match="rotary"):
    lm_model(config)
  with pytest.raises(UserError, match="position_embedding='rotary' rotates attention's"):
    config_lib.validate(config, 1)
  config = mixer_config("attention", d_model=12, num_heads=4, position_embedding="rotary")
  with pytest.raises(UserError, match="even head width, not d_model / num_heads = 12/4"):
    config_lib.validate(config, 1)


@pytest.mark.parametrize("field,value", [("norm", "rms"), ("activation", "swiglu"), ("position_embedding", "rotary")])
def test_hugging_face_export_refuses_the_modern_options(field, value, tmp_path):
  config = mixer_config("attention", block_layout="post_ln")
  config.model[field] = value
  with pytest.raises(UserError, match=f"cannot export to Hugging Face: {field}"):
    hf.export(config, {}, str(tmp_path))


def test_mixer_only_rms_pattern_trains():
  """d_ff=0: blocks of norm + mixer only (a Mamba stack's shape); attention with rotary and linear attention."""
  config = mixer_config(
    "attention*1+linear", num_layers=2, d_model=16, d_ff=0, num_heads=2, max_len=8, causal=True, dropout=0.0
  )
  config.model.update(norm="rms", position_embedding="rotary")
  model = lm_model(config)
  tokens = np.tile(np.arange(8, dtype=np.int32), (4, 1))  # 0 1 2 ... 7: the next token is learnable
  params = jax.jit(model_lib.initialize, static_argnums=0)(model, jax.random.key(0))
  assert set(params["block_0"]) == {"mixing"} and set(params["block_0"]["mixing"]["norm"]) == {"scale"}
  optimizer = optax.adam(3e-2)

  @jax.jit
  def step(params, opt_state):
    def loss_fn(p):
      logits = model.apply({"params": p}, tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = optimizer.init(params)
  losses = []
  for _ in range(12):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses


class _CumSum(nn.Module):
  """A test-local causal-only mixer: y_t = Σ_{s ≤ t} (W x_s + b), ignoring the mask (so any padding before a real
  position would reach it)."""

  causal: bool = True
  scale: float = 1.0

  @nn.compact
  def __call__(self, x_BxLxD, mask=None, deterministic=True, decode=False):
    del mask, deterministic, decode
    return self.scale * jnp.cumsum(nn.Dense(x_BxLxD.shape[-1], name="proj")(x_BxLxD), axis=1)


CUMSUM = MixerSpec(
  _CumSum,
  "test: cumulative sum of a projection",
  {},
  bidirectional_by_reversal=True,
  flops=lambda options, L, d, causal: 10.0 * L if causal else 1.0,
)


def _by_reversal_np(params, x_BxLxD, mask_BxL):
  """Σ over the real positions before (forward) and after (backward) each real position, in float64."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  h = {d: x_BxLxD @ p[d]["proj"]["kernel"] + p[d]["proj"]["bias"] for d in p}
  y = np.zeros_like(x_BxLxD)
  for b in range(len(x_BxLxD)):
    real = np.flatnonzero(mask_BxL[b])
    for j, t in enumerate(real):
      y[b, t] = h["forward"][b, real[: j + 1]].sum(0) + h["backward"][b, real[j:]].sum(0)
  return y


def test_bidirectional_by_reversal_is_forward_plus_reversed_and_ignores_padding_anywhere():
  B, L, D = 3, 9, 4
  x_BxLxD = rng.normal(size=(B, L, D)).astype(np.float32)
  mask_BxL = np.ones((B, L), bool)
  mask_BxL[0, :3] = False  # left padding
  mask_BxL[1, 6:] = False  # right padding
  mask_BxL[2, [0, 4, 8]] = False  # both ends and inside
  module = CUMSUM(causal=False)
  assert isinstance(module, ByReversal) and mixer_module(CUMSUM.maker({})) is _CumSum
  variables = compiled(module).init(jax.random.key(0), x_BxLxD)
  params = variables["params"]
  assert set(params) == {"forward", "backward"}  # separate parameters per direction
  assert not np.allclose(params["forward"]["proj"]["kernel"], params["backward"]["proj"]["kernel"])
  got = np.asarray(compiled(module).apply(variables, x_BxLxD, mask=mask_BxL))
  np.testing.assert_allclose(got[mask_BxL], _by_reversal_np(params, x_BxLxD, mask_BxL)[mask_BxL], atol=1e-5)
  other = np.where(mask_BxL[..., None], x_BxLxD, 100 * rng.normal(size=x_BxLxD.shape)).astype(np.float32)
  np.testing.assert_allclose(
    np.asarray(compiled(module).apply(variables, other, mask=mask_BxL))[mask_BxL], got[mask_BxL], atol=1e-5
  )
  everything = np.ones((B, L), bool)  # no mask: the whole sequence both ways
  np.testing.assert_allclose(
    compiled(module).apply(variables, x_BxLxD), _by_reversal_np(params, x_BxLxD, everything), atol=1e-5
  )
  assert CUMSUM(causal=True).causal and isinstance(CUMSUM(causal=True), _CumSum)  # causal: the module itself
  with pytest.raises(UserError, match="decode"):
    module.apply(variables, x_BxLxD[:, :1], decode=True)
  assert CUMSUM.forward_flops({}, L, D, causal=False) == 2 * CUMSUM.forward_flops({}, L, D, causal=True)
  assert _causal(CUMSUM) == "yes; both ways by reversal" and CUMSUM.causal_settings == (False, True)
  with pytest.raises(TypeError, match="bidirectional_by_reversal"):
    dataclasses.replace(CUMSUM, can_be_bidirectional=False)


def test_a_registered_reversal_mixer_in_a_model_and_rwkv_by_reversal(monkeypatch):
  """Through the registry and the model (a layer pattern, its options section); and RWKV (layer_idx, keep_init)
  with the flag set here only: the sum of its causal module over x and over x reversed."""
  monkeypatch.setitem(MIXERS, "test_cumsum", CUMSUM)
  config = mixer_config("attention+test_cumsum", num_layers=2, d_model=8, d_ff=0, num_heads=2, max_len=6)
  assert not config.model.causal  # a reversal mixer leaves the model bidirectional by default
  model = model_lib.build_model(config, lambda x, mask: x.mean(1), 4)
  params = jax.eval_shape(lambda: model_lib.initialize(model, jax.random.key(0)))
  assert set(params["block_1"]["mixing"]["mixer"]) == {"forward", "backward"}

  rwkv = dataclasses.replace(MIXERS["rwkv"], can_be_bidirectional=True, bidirectional_by_reversal=True)
  x_BxLxD = rng.normal(size=(2, 5, 8)).astype(np.float32)
  both = rwkv(causal=False, layer_idx=1, n_layer=2)
  variables = compiled(both).init(jax.random.key(0), x_BxLxD)
  one = MIXERS["rwkv"](causal=True, layer_idx=1, n_layer=2)
  run = lambda d, x: compiled(one).apply({"params": variables["params"][d]}, x)
  want = np.asarray(run("forward", x_BxLxD)) + np.asarray(run("backward", x_BxLxD[:, ::-1]))[:, ::-1]
  np.testing.assert_allclose(compiled(both).apply(variables, x_BxLxD), want, rtol=1e-5, atol=1e-5)
  # layer_idx reached the module: its time_decay is layer 1's of 2
  np.testing.assert_allclose(variables["params"]["backward"]["time_decay"], rwkv_lib.initial_time_decay(8, 1, 2))


DEFAULT_PARAMS = {  # config.model at its defaults (attention, pre_ln, 2 layers) with an LM head: as before the options
  "block_{i}": {
    "feed_forward": {
      "ff": {"down": {"bias": (128,), "kernel": (512, 128)}, "up": {"bias": (512,), "kernel": (128, 512)}},
      "norm": {"bias": (128,), "scale": (128,)},
    },
    "mixing": {
      "mixer": {
        "out": {"bias": (128,), "kernel": (4, 32, 128)},
        "qkv": {"bias": (3, 4, 32), "kernel": (128, 3, 4, 32)},
      },
      "norm": {"bias": (128,), "scale": (128,)},
    },
  },
  "embed": {"embedding": (16, 128)},
  "final_norm": {"bias": (128,), "scale": (128,)},
  "lm_head": {"bias": (16,), "kernel": (128, 16)},
  "pos_embed": (128, 128),
}


def test_defaults_are_unchanged():
  config = mixer_config("attention")
  assert (config.model.norm, config.model.activation, config.model.position_embedding) == (
    "layer",
    "gelu_tanh",
    "learned",
  )
  model = lm_model(config)
  assert "rotary" not in model.make_mixer.keywords
  shapes = jax.tree.map(np.shape, jax.eval_shape(lambda: model_lib.initialize(model, jax.random.key(0))))
  block = DEFAULT_PARAMS["block_{i}"]
  assert shapes == {**{k: v for k, v in DEFAULT_PARAMS.items() if k != "block_{i}"}, "block_0": block, "block_1": block}

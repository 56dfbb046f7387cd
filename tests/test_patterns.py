"""Layer patterns: FNet's hybrid layouts against the published rules, periods, per-layer options and their checks,
the parameters each layer gets, decoding, reversible stacks, bfloat16, FLOP counts and a sharded training run."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from conftest import lm_model
from efftx import config as config_lib
from efftx import patterns
from efftx import reversible
from efftx import saved_configs
from efftx.errors import UserError
from efftx.mixers import MIXERS
from efftx.perf import bench

L = 8


# The published layouts (google-research f_net models.py, `_is_attention_layer`), written out by hand for the
# models they are used with: which of N layers are attention when k of them are.
@pytest.mark.parametrize(
  "layout,n,k,attention_layers",
  [
    ("top", 12, 2, {10, 11}),  # FNet-Hybrid
    ("bottom", 12, 2, {0, 1}),
    ("middle", 12, 2, {5, 6}),  # 10 ≤ 2i < 14
    ("middle", 6, 4, {1, 2, 3, 4}),  # 2 ≤ 2i < 10
    ("middle", 12, 3, {5, 6, 7}),  # 9 ≤ 2i < 15
    ("mixed", 12, 2, {0, 6}),  # i mod 6 = 0
    ("mixed", 12, 4, {0, 3, 6, 9}),
    ("top", 3, 3, {0, 1, 2}),  # every layer
    ("bottom", 1, 1, {0}),  # one layer
  ],
)
def test_fnet_hybrid_layouts_place_attention_where_the_published_code_does(layout, n, k, attention_layers):
  layers = patterns.layer_mixers(f"fnet+attention*{k}@{layout}", n)
  assert len(layers) == n
  assert {i for i, name in enumerate(layers) if name == "attention"} == attention_layers
  assert all(name == "fnet" for i, name in enumerate(layers) if i not in attention_layers)


def test_periods_repeat_to_fill_the_model_and_named_patterns_expand():
  assert patterns.layer_mixers("local*3+attention", 8) == ("local",) * 3 + ("attention",) + ("local",) * 3 + (
    "attention",
  )
  assert patterns.layer_mixers("fnet", 3) == ("fnet",) * 3
  assert patterns.layer_mixers("fnet_hybrid", 4) == ("fnet", "fnet", "attention", "attention")
  assert patterns.mixer_names("local*3+attention+local") == ("local", "attention")


@pytest.mark.parametrize(
  "pattern,num_layers,message",
  [
    ("local*3+attention", 6, "its period of 4 layers does not divide config.model.num_layers=6"),
    ("fnet+attention*5@mixed", 12, "FNet's mixed layout places 6 attention layers, not 5"),
    ("fnet+attention*8@mixed", 12, "FNet's mixed layout places 12 attention layers, not 8"),
    ("fnet+attention*3@top", 2, "3 attention layers in a model of 2"),
    ("fnet+attention*2@side", 4, "a hybrid is BASE+OTHER*k@LAYOUT"),
    ("fnet+atention", 2, "'atention' is not a mixer (did you mean 'attention'?); choose from: attention, fnet"),
    ("fnet+attention*0", 2, "repeats a mixer 0 times"),
    ("fnet,attention", 2, "is not a mixer name or NAME*COUNT"),
  ],
)
def test_a_pattern_that_does_not_fit_is_refused_in_one_line(pattern, num_layers, message):
  with pytest.raises(UserError, match=None) as error:
    patterns.layer_mixers(pattern, num_layers)
  assert message in str(error.value) and "\n" not in str(error.value)


def _hybrid_config(**fields):
  config = config_lib.default_config("fnet+attention*2@top")
  config.model.update(d_model=16, d_ff=32, num_layers=4, max_len=L, dropout=0.0, **fields)
  config.mixer.attention.num_heads = 2
  return config


def test_a_hybrid_has_attention_parameters_in_exactly_its_attention_layers():
  config = _hybrid_config()
  assert set(config.mixer.keys()) == {"fnet", "attention"}  # one section per mixer, each its declared options
  assert set(config.mixer.attention.keys()) == set(MIXERS["attention"].options)
  model = lm_model(config)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, L), jnp.int32))["params"]  # names only
  attention = MIXERS["attention"].module(num_heads=2)
  attention_params = jax.eval_shape(attention.init, jax.random.key(0), jnp.zeros((1, L, 16)))["params"]
  for i in range(4):
    mixer_params = params[f"block_{i}"]["mixing"].get("mixer", {})
    if i >= 2:  # attention: its projections
      assert set(mixer_params) == set(attention_params)
      assert mixer_params
    else:  # FNet: no parameters at all
      assert not mixer_params


def test_each_layers_options_are_checked_and_foreign_options_refused():
  config = _hybrid_config()
  config.mixer.attention.num_heads = 3  # 16 is not divisible by 3
  with pytest.raises(UserError, match=r"config.mixer.attention.num_heads=3.*in pattern 'fnet\+attention\*2@top'"):
    config_lib.validate(config, 8)
  config = _hybrid_config()
  config.mixer.attention.unlock()
  config.mixer.attention.window = 4  # local attention's option, not attention's
  with pytest.raises(UserError, match="config.mixer.attention.window: mixer 'attention' has no option 'window'"):
    config_lib.validate(config, 8)
  config = _hybrid_config()
  config.model.causal = True  # FNet cannot be causal, in any layer
  with pytest.raises(UserError, match="mixer 'fnet' cannot be causal"):
    config_lib.validate(config, 8)


def test_a_config_built_for_one_pattern_is_refused_for_another():
  config = _hybrid_config()
  config.model.mixer = "local*3+attention"
  with pytest.raises(
    UserError, match=r"config.mixer holds the options of mixers attention, fnet, not of 'local\*3\+atten"
  ):
    config_lib.validate(config, 8)


def test_set_where_declared_reaches_every_section_that_declares_the_option():
  config = config_lib.default_config("local*3+attention")
  config_lib.set_where_declared(config.mixer, num_heads=8, window=5)
  assert config.mixer.local.num_heads == config.mixer.attention.num_heads == 8
  assert config.mixer.local.window == 5 and "window" not in config.mixer.attention


def test_reversible_segments_give_the_gradients_of_plain_autodiff():
  """Two segments of different F (and per-segment stacked parameters) under the custom_vjp: the same outputs and
  gradients as autodiff of the same couplings, which stores every layer's activations."""
  rng = np.random.default_rng(0)
  B, D = 2, 4
  f_tanh = lambda p, x, mask, key: jnp.tanh(x @ p["w"]) * mask[..., None]
  f_roll = lambda p, x, mask, key: jnp.roll(x, 1, axis=1) @ p["w"] + jax.random.normal(key, x.shape) * 0.1
  g = lambda p, y, key: jnp.sin(y @ p["w"])
  stack = lambda n: {
    "F": {"w": jnp.asarray(rng.normal(size=(n, D, D)), jnp.float32) * 0.5},
    "G": {"w": jnp.asarray(rng.normal(size=(n, D, D)), jnp.float32) * 0.5},
  }
  layers = (stack(2), stack(3))
  x = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  mask = jnp.asarray(np.arange(L)[None] < np.array([[L], [5]]))
  weights = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)

  def loss(forward):
    def f(layers, x1, x2):
      y1, y2 = forward((f_tanh, f_roll), g, layers, x1, x2, mask, jax.random.key(3))
      return jnp.sum((y1 + 2 * y2) * weights)

    return f

  got = jax.jit(jax.grad(loss(reversible.reversible_forward), argnums=(0, 1, 2)))(layers, x, x)
  want = jax.jit(jax.grad(loss(reversible.coupling_forward), argnums=(0, 1, 2)))(layers, x, x)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):  # equal up to the inputs' float32 reconstruction
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * float(np.abs(b).max()))


def test_a_reversible_pattern_model_stacks_each_segment_and_trains():
  """fnet+attention*2@top, reversible: one stack of stacked parameters per segment of one mixer; its loss and
  gradients (dropout on) are finite and reach the attention segment's parameters, in float32 and in bfloat16 (one
  program for both)."""
  config = config_lib.default_config("fnet+attention*2@top")
  config.model.update(d_model=16, d_ff=32, num_layers=4, max_len=L, dropout=0.1, reversible=True)
  config.mixer.attention.num_heads = 2
  model = lm_model(config)
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 16, (2, L)), jnp.int32)
  params = compiled(model).init(jax.random.key(0), tokens)["params"]  # float32 in either dtype
  stacks = params["reversible"]
  assert set(stacks) == {"segment_0", "segment_1"}
  assert {leaf.shape[0] for leaf in jax.tree.leaves(stacks["segment_0"])} == {2}
  assert not stacks["segment_0"]["F"].get("mixer") and stacks["segment_1"]["F"]["mixer"]  # FNet has none

  def loss(model):
    def fn(params):
      logits = model.apply({"params": params}, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)})
      return jnp.mean(jax.nn.log_softmax(logits.astype(jnp.float32))[..., 0])

    return fn

  model16 = model.clone(dtype="bfloat16")
  for value, grads in jax.jit(lambda p: [jax.value_and_grad(loss(m))(p) for m in (model, model16)])(params):
    assert np.isfinite(float(value))
    assert all(np.isfinite(np.asarray(g, np.float32)).all() for g in jax.tree.leaves(grads))
    assert float(jnp.abs(grads["reversible"]["segment_1"]["F"]["mixer"]["qkv"]["kernel"]).sum()) > 0


def test_flops_of_a_pattern_are_the_sum_of_its_layers_mixers():
  config = _hybrid_config()
  model = lm_model(config)
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, L), jnp.int32))["params"]  # sizes only
  dense = 6 * sum(
    leaf.size
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    if getattr(path[-1], "key", None) == "kernel"
  )
  fnet = MIXERS["fnet"].train_flops(dict(config.mixer.fnet), L, 16, False)
  attention = MIXERS["attention"].train_flops(dict(config.mixer.attention), L, 16, False)
  assert fnet > 0 and attention > 0 and fnet != attention
  assert bench.flops_per_token(config, params) == pytest.approx(dense + 2 * fnet + 2 * attention)


def test_a_pattern_trains_on_8_devices_from_a_config_argument(smoke_config, tmp_path, caplog):
  """The pattern goes where a mixer name goes (the config argument), the log says which layer has which mixer, its
  config.mixer sections are saved with the run, and a 3-layer FNet/Linear hybrid with fsdp-sharded parameters
  trains to finite metrics."""
  import logging  # pylint: disable=g-import-not-at-top

  from efftx import train  # pylint: disable=g-import-not-at-top

  config = smoke_config("smoke,mixer=fnet+linear_mixing*1@top")
  config.model.num_layers = 3
  config.mesh.fsdp = 2
  caplog.set_level(logging.INFO, logger="absl")
  metrics = train.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(metrics["eval_loss"])
  assert any(
    "fnet+linear_mixing*1@top mixer (layers from the input up: fnet, fnet, linear_mixing)" in r.getMessage()
    for r in caplog.records
  )
  saved = saved_configs.from_saved(json.loads((tmp_path / "config.json").read_text()))
  assert saved.model.mixer == "fnet+linear_mixing*1@top"
  assert saved.mixer.to_dict() == {"fnet": dict(config.mixer.fnet), "linear_mixing": dict(config.mixer.linear_mixing)}

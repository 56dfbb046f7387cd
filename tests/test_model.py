"""The model around the mixers: padding never reaches the classifier; a causal LM never sees the future."""

import copy
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_decodes_like_forward
from conftest import compiled
from conftest import lm_model
from conftest import mixer_config
from efftx import config as config_lib
from efftx import model as model_lib
from efftx import trainer
from efftx.errors import UserError
from efftx.mixers import MIXERS

B, L = 3, 12


def _tokens_and_mask(vocab=16):
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, vocab, size=(B, L)).astype(np.int32)
  mask = np.ones((B, L), bool)
  mask[1, 7:] = False
  mask[2, 3:] = False
  return tokens, mask


# The model's part of padding and of bfloat16 — the embeddings, the mask handed to each layer, the per-position
# feed-forward, the pooling and head, the casts around each mixer — is the same code for every mixer; each mixer's own
# handling of padding and of bfloat16 is tests/test_mixers.py's, mixer by mixer (test_outputs_at_real_positions_...
# and test_every_mixer_jits_...). Here one classifier of one layer each of: attention (padding masked in a softmax),
# fnet (padding zeroed before a transform) and linear_mixing (a max_len × max_len matrix sized by the model).
REPRESENTATIVES = ("attention", "fnet", "linear_mixing")


@pytest.fixture(scope="module")
def classifier():
  """(config, model, variables, float32 logits at _tokens_and_mask()) of the classifier of REPRESENTATIVES."""
  config = mixer_config(
    "+".join(REPRESENTATIVES),
    num_layers=len(REPRESENTATIVES),
    d_model=16,
    d_ff=32,
    num_heads=2,
    max_len=L,
    attention_chunk=4,
  )
  model = trainer.parts(config).model
  tokens, mask = _tokens_and_mask()
  variables = compiled(model).init(jax.random.key(0), tokens)
  return config, model, variables, np.asarray(compiled(model).apply(variables, tokens, mask=mask))


def test_classifier_ignores_padded_tokens(classifier):
  _, model, variables, logits = classifier
  tokens, mask = _tokens_and_mask()
  other = np.where(mask, tokens, np.random.default_rng(1).integers(0, 16, size=tokens.shape)).astype(np.int32)
  assert logits.shape == (B, 10)
  np.testing.assert_allclose(logits, compiled(model).apply(variables, other, mask=mask), rtol=1e-5, atol=1e-5)


def test_causal_lm_logits_do_not_depend_on_later_tokens():
  config = mixer_config(
    "attention", num_heads=2, causal=True, d_model=16, num_layers=2, d_ff=32, max_len=L, dropout=0.0
  )
  model = lm_model(config)
  tokens, _ = _tokens_and_mask()
  variables = compiled(model).init(jax.random.key(0), tokens)
  logits = np.asarray(compiled(model).apply(variables, tokens))
  assert logits.shape == (B, L, 16)
  for t in range(L - 1):
    changed = tokens.copy()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % 16
    new = np.asarray(compiled(model).apply(variables, changed))
    np.testing.assert_array_equal(new[:, : t + 1], logits[:, : t + 1])
    assert not np.allclose(new[:, t + 1 :], logits[:, t + 1 :])


def test_build_model_passes_mixer_options_to_the_mixer():
  config = mixer_config("attention", num_heads=8, d_model=16, d_ff=32, max_len=L)
  model = trainer.parts(config).model
  variables = compiled(model).init(jax.random.key(0), jnp.ones((1, L), jnp.int32))
  assert variables["params"]["block_0"]["mixing"]["mixer"]["qkv"]["kernel"].shape == (16, 3, 8, 2)
  assert len([k for k in variables["params"] if k.startswith("block_")]) == config.model.num_layers


def test_build_model_builds_each_mixer_with_its_spec_s_maker():
  """build_model's layers are MixerSpec.maker's modules (the one way to build a mixer, also under spec(...)): the
  positions the mixer sees as max_len, the patch grid for grid-aware mixers, which refuse it with causal=True."""
  config = mixer_config("aft_conv", d_model=16, d_ff=32, num_heads=2, patch_size=2)
  model = model_lib.build_model(config, head=lambda x_BxLxD, mask_BxL: x_BxLxD, vocab_size=16, image_shape=(4, 6, 1))
  made = MIXERS["aft_conv"].maker(dict(config.mixer), max_len=6, grid=(2, 3))
  assert (model.make_mixer.func, model.make_mixer.keywords) == (made.func, made.keywords)
  assert made.keywords == {"causal": False, "grid": (2, 3), **config.mixer}  # aft_conv has no max_len field
  assert model.make_mixer() == MIXERS["aft_conv"](max_len=6, grid=(2, 3), **config.mixer)
  config.model.causal = True
  message = "mixer 'aft_conv' mixes an image's patch grid in both directions: set config.model.causal=False for patches"
  with pytest.raises(UserError, match=f"^{message}$"):
    model_lib.build_model(config, head=lambda x_BxLxD, mask_BxL: x_BxLxD, vocab_size=16, image_shape=(4, 6, 1))
  with pytest.raises(UserError, match=f"^{message}$"):
    MIXERS["aft_conv"](causal=True, grid=(2, 3))
  assert lm_model(mixer_config("aft_full", max_len=L)).make_mixer.keywords["max_len"] == L


def test_sequence_longer_than_max_len_is_refused():
  config = mixer_config("attention", d_model=16, d_ff=32, max_len=8)
  model = trainer.parts(config).model
  with pytest.raises(ValueError, match="exceeds max_len"):
    compiled(model).init(jax.random.key(0), jnp.ones((1, 9), jnp.int32))


def test_bfloat16_model_runs_close_to_float32(classifier):
  config, _, variables, want = classifier
  tokens, mask = _tokens_and_mask()
  config = copy.deepcopy(config)
  config.model.dtype = "bfloat16"
  got = compiled(trainer.parts(config).model).apply(variables, tokens, mask=mask)
  assert got.dtype == jnp.float32  # logits in float32; parameters were float32 all along
  np.testing.assert_allclose(np.asarray(got), want, atol=0.05 + 0.05 * np.abs(want).max())


def test_model_decoding_token_by_token_equals_the_causal_forward_pass():
  """A causal LM of two layers of AFT-local and one of attention (a layer pattern: two kinds of cache, a position
  bias and a key/value buffer): decoding with the model's cache (its position, each layer's own) gives the forward
  pass's logits. Each decodable mixer's own decoding is tests/test_mixers.py's."""
  pattern = "aft_local*2+attention"
  config = mixer_config(
    pattern,
    num_layers=3,
    causal=True,
    d_model=16,
    d_ff=32,
    num_heads=2,
    max_len=L,
    window=4,
    dropout=0.0,
  )
  config_lib.validate(config, 8)
  model = lm_model(config)
  assert [m.func for m in model.make_mixer] == [MIXERS["aft_local"].module] * 2 + [MIXERS["attention"].module]
  tokens, _ = _tokens_and_mask()
  assert_decodes_like_forward(model, tokens)


@pytest.mark.slow
def test_the_model_does_not_import_the_data_package():
  """Arrows point one way: the model gets its head from the objective and knows nothing of data (or TFDS)."""
  code = (
    "import sys, efftx.model, efftx.objectives; "
    "assert not [m for m in sys.modules if m.startswith(('efftx.data', 'tensorflow_datasets'))], "
    "sorted(m for m in sys.modules if m.startswith(('efftx.data', 'tensorflow_datasets')))"
  )
  subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_cls_pooling_classifies_from_a_learned_first_position():
  """One layer each of attention, FNet and AFT-full (whose position biases the model sizes for the L + 1 positions
  it gives the mixers): LRA's head on the final state of a learned first position, and padding never reaches it."""
  config = mixer_config(
    "attention+fnet+aft_full", num_layers=3, d_model=16, d_ff=32, num_heads=2, max_len=L, pooling="cls", dropout=0.0
  )
  model = trainer.parts(config).model
  tokens, mask = _tokens_and_mask()
  params = compiled(model).init(jax.random.key(0), tokens)["params"]
  assert params["pos_embed"].shape == (L + 1, 16) and not np.any(params["cls"])  # LRA initialises it to 0
  params["cls"] = params["cls"] + 0.5  # as after training
  logits = np.asarray(compiled(model).apply({"params": params}, tokens, mask=mask))
  # Reference: the encoder's final states (L + 1 positions), then LRA's head on position 0, in numpy.
  states = np.asarray(
    compiled(model.clone(head=lambda x, m: x)).apply({"params": params}, tokens, mask=mask), np.float64
  )
  assert states.shape == (B, L + 1, 16)
  dense = lambda x, p: x @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)
  want = dense(np.maximum(dense(states[:, 0], params["pool_dense"]), 0), params["classifier"])
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
  # Padding never reaches the [CLS] state.
  other = np.where(mask, tokens, (tokens + 3) % 16).astype(np.int32)
  np.testing.assert_allclose(compiled(model).apply({"params": params}, other, mask=mask), logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_token_types_add_their_embedding_at_their_positions(pooling):
  """A type embedding is a per-position vector: with type rows (0, v), types t give the model whose position
  embedding has v added where t is 1 — after the learned [CLS] position when there is one (it is type 0)."""
  config = mixer_config(
    "attention", d_model=16, d_ff=32, num_heads=2, max_len=L, pooling=pooling, dropout=0.0, type_vocab_size=2
  )
  model = trainer.parts(config).model
  tokens, mask = _tokens_and_mask()
  params = compiled(model).init(jax.random.key(0), tokens)["params"]
  v = np.asarray(jax.random.normal(jax.random.key(1), (16,)))
  params["type_embed"]["embedding"] = np.stack([np.zeros(16), v]).astype(np.float32)
  types_L = (np.arange(L) >= L // 2).astype(np.int32)
  types = np.broadcast_to(types_L, tokens.shape)
  got = compiled(model).apply({"params": params}, tokens, mask=mask, token_types=types)
  shift = 1 if pooling == "cls" else 0
  moved = jax.tree.map(lambda x: x, params)
  moved["pos_embed"] = np.asarray(params["pos_embed"]).copy()
  moved["pos_embed"][shift : shift + L] += types_L[:, None] * v
  want = compiled(model).apply({"params": moved}, tokens, mask=mask)  # no types given: all type 0 (row 0 = 0)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert np.abs(np.asarray(got) - np.asarray(compiled(model).apply({"params": params}, tokens, mask=mask))).max() > 1e-3


@pytest.mark.parametrize("activation", ["gelu_tanh", "gelu"])
def test_post_ln_layout_is_bert_s(activation):
  """block_layout="post_ln" against a numpy BERT-style encoder written from the paper's equations: embeddings →
  LayerNorm → (optional projection) → per block LN(x + Attn(x)), LN(x + FF(x)); no final norm."""
  config = mixer_config(
    "attention",
    d_model=16,
    d_ff=32,
    num_heads=2,
    max_len=L,
    num_layers=2,
    dropout=0.0,
    block_layout="post_ln",
    embed_projection=True,
    norm_eps=1e-12,
    activation=activation,
  )
  model = trainer.parts(config).model.clone(head=lambda x, m: x)
  tokens, mask = _tokens_and_mask()
  params = jax.tree.map(lambda a: np.asarray(a, np.float64), compiled(model).init(jax.random.key(1), tokens)["params"])
  got = np.asarray(compiled(model).apply({"params": params}, tokens, mask=mask))
  ln = lambda x, p: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12) * p["scale"] + p["bias"]
  dense = lambda x, p: x @ p["kernel"] + p["bias"]
  erf = np.vectorize(__import__("math").erf)
  gelu = (
    (lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))))
    if activation == "gelu_tanh"
    else (lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2))))
  )
  x = params["embed"]["embedding"][tokens] + params["pos_embed"][:L]
  x = dense(ln(x, params["embed_norm"]), params["embed_projection"])
  for i in range(2):
    p = params[f"block_{i}"]
    att = p["mixing"]["mixer"]
    qkv = np.einsum("bld,dchk->blchk", x, att["qkv"]["kernel"]) + att["qkv"]["bias"]
    scores = np.einsum("bqhk,bthk->bhqt", qkv[:, :, 0], qkv[:, :, 1]) / np.sqrt(8)
    scores = np.where(mask[:, None, None, :], scores, -1e30)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    heads = np.einsum("bhqt,bthk->bqhk", probs, qkv[:, :, 2])
    x = ln(x + np.einsum("bqhk,hkd->bqd", heads, att["out"]["kernel"]) + att["out"]["bias"], p["mixing_norm"])
    ff = p["feed_forward"]["ff"]
    x = ln(x + dense(gelu(dense(x, ff["up"])), ff["down"]), p["feed_forward_norm"])
  np.testing.assert_allclose(got[mask], x[mask], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("layout", ["pre_ln", "post_ln"])
def test_a_model_without_feed_forward_is_a_stack_of_mixers(layout):
  """d_ff=0 (Zoology's MQAR models): each block is x + Mix(LN x) (pre_ln) or LN(x + Mix(x)) (post_ln) and nothing
  else, against the same blocks applied by hand; no feed-forward parameters exist."""
  config = mixer_config(
    "attention", d_model=16, d_ff=0, num_heads=2, max_len=L, num_layers=2, dropout=0.0, block_layout=layout
  )
  model = trainer.parts(config).model.clone(head=lambda x, m: x)
  tokens, mask = _tokens_and_mask()
  params = compiled(model).init(jax.random.key(1), tokens)["params"]
  assert all(
    set(params[f"block_{i}"]) == ({"mixing"} if layout == "pre_ln" else {"mixing", "mixing_norm"}) for i in range(2)
  )
  got = compiled(model).apply({"params": params}, tokens, mask=mask)
  mixing = model_lib.MixingSublayer(model.make_mixer, 0.0, layout == "pre_ln", model.norm_eps)
  norm = nn.LayerNorm(model.norm_eps)

  @jax.jit
  def by_hand(params):
    x = params["embed"]["embedding"][tokens] + params["pos_embed"][:L]
    if layout == "post_ln":
      x = norm.apply({"params": params["embed_norm"]}, x)
    for i in range(2):
      x = x + mixing.apply({"params": params[f"block_{i}"]["mixing"]}, x, mask, True)
      if layout == "post_ln":
        x = norm.apply({"params": params[f"block_{i}"]["mixing_norm"]}, x)
    if layout == "pre_ln":
      x = norm.apply({"params": params["final_norm"]}, x)
    return x

  np.testing.assert_allclose(np.asarray(got)[mask], np.asarray(by_hand(params))[mask], rtol=1e-5, atol=1e-5)


def test_exact_gelu_and_its_gradient_against_the_erf_formula():
  """model.gelu_erf (a hand-written backward pass) against x·Φ(x) and Φ(x) + x·φ(x) from math.erf in float64, over
  the whole range: the tails (|x| up to 30, where Φ saturates and φ underflows) and zero; bfloat16 in, bfloat16
  out."""
  import math  # pylint: disable=g-import-not-at-top

  x = np.concatenate([np.linspace(-30, 30, 601), [0.0, 1e-3, -1e-3, 5.5, -5.5]])
  cdf = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
  pdf = np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
  x32 = jnp.asarray(x, jnp.float32)
  np.testing.assert_allclose(model_lib.gelu_erf(x32), x * cdf, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(jax.vmap(jax.grad(model_lib.gelu_erf))(x32), cdf + x * pdf, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    jax.vmap(jax.grad(lambda v: nn.gelu(v, approximate=False)))(x32),
    jax.vmap(jax.grad(model_lib.gelu_erf))(x32),
    rtol=1e-5,
    atol=1e-6,
  )
  y16 = model_lib.gelu_erf(x32.astype(jnp.bfloat16))
  assert y16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y16, np.float32), x * cdf, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mixer,reversible", [("aft_conv", False), ("attention", True)])
def test_init_std_redraws_every_dense_kernel_and_nothing_else(mixer, reversible):
  """config.model.init_std = 0.02 (GPT-2 / BERT / Zoology): every nn.Dense / DenseGeneral kernel (the mixer's, the
  feed-forward's, the head's; stacked under the reversible layers too) is N(0, 0.02²) and independent of the
  others; biases, norms, embeddings and AFT-conv's renormalised kernel are as flax makes them; 0 is flax's init."""
  model = lambda init_std: lm_model(
    mixer_config(
      mixer,
      d_model=64,
      d_ff=256,
      num_layers=2,
      max_len=32,
      causal=True,
      reversible=reversible,
      init_std=init_std,
      num_heads=4,
    ),
    128,
  )
  # One compiled program, as training creates its state under jit: the three inits share their draws.
  flax_default, flax_init, redrawn = jax.jit(
    lambda key: (
      trainer.init_params(model(0.0), key),
      model(0.0).init(key, jnp.zeros((1, 32), jnp.int32))["params"],
      trainer.init_params(model(0.02), key),
    )
  )(jax.random.key(0))
  assert jax.tree.all(jax.tree.map(np.array_equal, flax_default, flax_init))
  kernels = []
  for (path, old), new in zip(jax.tree_util.tree_leaves_with_path(flax_default), jax.tree.leaves(redrawn)):
    name = jax.tree_util.keystr(path)
    if name.endswith("['kernel']") and "['mixer']['kernel']" not in name:  # a dense kernel (AFT-conv's is not)
      kernels.append(np.asarray(new).ravel())
      assert abs(np.std(new) - 0.02) < 0.1 * 0.02 and abs(np.mean(new)) < 5 * 0.02 / np.sqrt(new.size), name
      assert np.std(old) > 2 * 0.02, name  # LeCun normal at fan-in ≤ 256: std ≥ 1/16
    else:
      np.testing.assert_array_equal(new, old, err_msg=name)
  assert len(kernels) >= (5 if reversible else 13)  # qkv, out, up, down (AFT: query, key, value, out, up, down) + head
  firsts = np.stack([k[:64] for k in kernels])
  assert np.abs(np.corrcoef(firsts)[np.triu_indices(len(kernels), 1)]).max() < 0.6  # independent draws

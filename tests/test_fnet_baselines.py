"""FNet's baselines — Linear, Random and FF-only (efftx/mixers/linear_mixing.py, random_mixing.py, ff_only.py) —
against plain numpy loops of the published formula y[b,n,k] = Σ_{i,j} W_seq[n,i] x[b,i,j] W_hidden[j,k]
(google-research f_net layers.py), with the matrices read from the modules; Random's matrices are not trained."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import compiled
from conftest import mixer_config
from conftest import padded_inputs
from efftx import trainer
from efftx.errors import UserError
from efftx.mixers import MIXERS

B, L, D, MAX_LEN = 2, 7, 8, 16


def _numpy_mixing(x, w_seq, w_hidden, mask, causal, padding):
  """Loop over examples, output positions n and input positions i (i ≤ n if causal): y[b, n] += W_seq[n, i] ·
  (x[b, i] @ W_hidden), in float64; padded inputs zeroed first when padding == "zero"."""
  x = np.asarray(x, np.float64)
  if padding == "zero":
    x = np.where(mask[..., None], x, 0.0)
  y = np.zeros(x.shape)
  for b in range(x.shape[0]):
    for n in range(x.shape[1]):
      for i in range(x.shape[1]):
        if causal and i > n:
          continue
        y[b, n] += w_seq[n, i] * (x[b, i] @ np.asarray(w_hidden, np.float64))
  return y


def _random_matrices(module, d_model):
  return jax.tree.map(np.asarray, module.apply({}, d_model, method="matrices"))


def _case(shape):
  b, length, d = shape
  return padded_inputs(b, length, d, length // 2)  # the second sequence: half of it padding (all of it at L = 1)


SHAPES = [(B, L, D), (2, 1, 1), (2, MAX_LEN, 3)]  # the usual case; one position, width one; L = max_len


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", ["zero", "mix"])
def test_linear_mixing_equals_the_published_product(shape, causal, padding):
  x, mask = _case(shape)
  module = MIXERS["linear_mixing"](causal=causal, max_len=MAX_LEN, padding=padding)
  variables = compiled(module).init(jax.random.key(0), x)
  params = jax.tree.map(np.asarray, variables["params"])
  assert params["w_seq"].shape == (MAX_LEN, MAX_LEN) and params["w_hidden"].shape == (shape[2],) * 2
  y = compiled(module).apply(variables, x, mask=mask)
  assert y.shape == x.shape and y.dtype == x.dtype
  assert_close_sums(
    y, _numpy_mixing(x, params["w_seq"], params["w_hidden"], mask, causal, padding), n_terms=shape[1] + shape[2]
  )


def test_linear_mixing_initialises_both_matrices_from_n_0_0_02():
  module = MIXERS["linear_mixing"](max_len=64)
  params = compiled(module).init(jax.random.key(3), np.zeros((1, 4, 64), np.float32))["params"]
  for name in ("w_seq", "w_hidden"):  # 4,096 draws each: the sample std is within ~1% of the true one
    w = np.asarray(params[name])
    assert abs(w.std() - 0.02) < 0.001 and abs(w.mean()) < 0.001, name
  assert not np.array_equal(params["w_seq"], params["w_hidden"])


@pytest.mark.parametrize("causal", [False, True])
def test_linear_mixing_gradients_equal_the_products_transposed(causal):
  """d<g, y>/dW_seq[n, i] = Σ_b g[b, n] · (x[b, i] W_hidden) for i ≤ n < L (0 beyond L, and above the diagonal if
  causal); d<g, y>/dW_hidden = Σ_b (W_seq x_b)ᵀ g_b; d<g, y>/dx = W_seqᵀ g W_hiddenᵀ, 0 at padded positions."""
  x, mask = _case((B, L, D))
  g = np.random.default_rng(7).normal(size=x.shape)
  module = MIXERS["linear_mixing"](causal=causal, max_len=MAX_LEN)
  variables = compiled(module).init(jax.random.key(0), x)
  grads = jax.jit(jax.grad(lambda v, x: jnp.sum(module.apply(v, x, mask=mask) * g), argnums=(0, 1)))(variables, x)
  w_seq, w_hidden = (np.asarray(variables["params"][k], np.float64) for k in ("w_seq", "w_hidden"))
  x0 = np.where(mask[..., None], x, 0.0)
  want_seq = np.zeros((MAX_LEN, MAX_LEN))
  want_hidden = np.zeros((D, D))
  want_x = np.zeros(x.shape)
  for b in range(B):
    for n in range(L):
      for i in range(n + 1 if causal else L):
        want_seq[n, i] += g[b, n] @ (x0[b, i] @ w_hidden)
        want_hidden += w_seq[n, i] * np.outer(x0[b, i], g[b, n])
        want_x[b, i] += w_seq[n, i] * (w_hidden @ g[b, n]) * mask[b, i]
  assert_close_sums(grads[0]["params"]["w_seq"], want_seq, n_terms=B * D + D)
  assert_close_sums(grads[0]["params"]["w_hidden"], want_hidden, n_terms=B * L * L)
  assert_close_sums(grads[1], want_x, n_terms=L + D)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padding", ["zero", "mix"])
def test_random_equals_the_published_product(shape, causal, padding):
  x, mask = _case(shape)
  module = MIXERS["random"](causal=causal, max_len=MAX_LEN, padding=padding)
  assert compiled(module).init(jax.random.key(0), x) == {}  # nothing to train, nothing stored
  w_seq, w_hidden = _random_matrices(module, shape[2])
  assert w_seq.shape == (MAX_LEN, MAX_LEN) and w_hidden.shape == (shape[2],) * 2
  y = compiled(module).apply({}, x, mask=mask)
  assert y.shape == x.shape and y.dtype == x.dtype
  assert_close_sums(y, _numpy_mixing(x, w_seq, w_hidden, mask, causal, padding), n_terms=shape[1] + shape[2])


def test_random_matrices_are_lecun_normal():
  """Variance 1/fan_in, truncated at two standard deviations of the untruncated normal (whose std is then
  1/(0.8796·√fan_in)): flax's lecun_normal, the published initializer."""
  module = MIXERS["random"](max_len=64)
  for w in _random_matrices(module, 128):
    n = w.shape[0]
    assert abs(w.std() * np.sqrt(n) - 1) < 0.05 and abs(w.mean()) * np.sqrt(n) < 0.05
    assert np.abs(w).max() <= 2 / 0.87962566103423978 / np.sqrt(n) * (1 + 1e-6)
    assert np.abs(w).max() > 1.8 / np.sqrt(n)  # and truncated at 2σ, not at 1σ


def test_random_matrices_come_from_the_seed_alone():
  """The same random_seed gives the same matrices whatever the init key; another seed other matrices; each layer
  (module path) its own."""
  x, _ = _case((B, L, D))
  make = lambda seed: MIXERS["random"](max_len=MAX_LEN, random_seed=seed)
  first, again, other = _random_matrices(make(0), D), _random_matrices(make(0), D), _random_matrices(make(1), D)
  np.testing.assert_array_equal(first[0], again[0])
  np.testing.assert_array_equal(first[1], again[1])
  assert not np.allclose(first[0], other[0]) and not np.allclose(first[1], other[1])
  y = [compiled(make(0)).apply(compiled(make(0)).init(jax.random.key(k), x), x) for k in (0, 1)]
  np.testing.assert_array_equal(y[0], y[1])
  assert not np.allclose(y[0], compiled(make(1)).apply({}, x))


def _captured_matrices(model, variables, tokens, mask):
  """{module path: (W_seq, W_hidden)} of every `random` mixer, as the model's forward pass computes them."""
  seen = {}

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == "matrices":
      seen["/".join(context.module.scope.path)] = out
    return out

  @jax.jit
  def forward(variables):
    with nn.intercept_methods(interceptor):
      model.apply(variables, tokens, mask=mask)
    return {path: tuple(matrices) for path, matrices in seen.items()}

  return jax.tree.map(np.asarray, forward(variables))


def test_random_matrices_are_not_trained():
  """A 2-layer classifier with the `random` mixer: no parameter and no gradient leaf belongs to a mixer; two steps
  of efftx's AdamW (weight decay on) change the other parameters and leave every layer's matrices as they were."""
  config = mixer_config("random", d_model=16, d_ff=32, num_layers=2, max_len=L)
  config.optim.update(weight_decay=0.1, warmup_steps=0)
  model = trainer.parts(config).model
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 16, size=(B, L)).astype(np.int32)
  mask = np.ones((B, L), bool)
  mask[1, 4:] = False
  params = jax.jit(lambda key: trainer.init_params(model, key))(jax.random.key(0))
  mixer_leaves = lambda tree: [
    path for path, _ in jax.tree_util.tree_leaves_with_path(tree) if "['mixer']" in jax.tree_util.keystr(path)
  ]
  assert not mixer_leaves(params)
  before = _captured_matrices(model, {"params": params}, tokens, mask)
  assert sorted(before) == ["block_0/mixing/mixer", "block_1/mixing/mixer"]
  assert not np.allclose(before["block_0/mixing/mixer"][0], before["block_1/mixing/mixer"][0])

  tx, _ = trainer.make_optimizer(config)
  state = jax.jit(tx.init)(params)
  loss = lambda p: jnp.sum(model.apply({"params": p}, tokens, mask=mask, deterministic=True) ** 2)

  @jax.jit
  def step(params, state):
    grads = jax.grad(loss)(params)
    updates, state = tx.update(grads, state, params)
    return grads, jax.tree.map(lambda p, u: p + u, params, updates), state

  new_params = params
  for _ in range(2):
    grads, new_params, state = step(new_params, state)
    assert not mixer_leaves(grads)
  changed = [not np.allclose(a, b) for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(params))]
  assert sum(changed) > len(changed) // 2  # the steps did train the model
  after = _captured_matrices(model, {"params": new_params}, tokens, mask)
  for path, (w_seq, w_hidden) in before.items():
    np.testing.assert_array_equal(after[path][0], w_seq)
    np.testing.assert_array_equal(after[path][1], w_hidden)


@pytest.mark.parametrize("name", ["linear_mixing", "random"])
@pytest.mark.parametrize("causal", [False, True])
def test_zero_padding_makes_real_outputs_independent_of_the_padding(name, causal):
  """padding="zero": outputs at real positions depend neither on the padded contents nor on how many padded
  positions follow (W_seq[:L, :L] is a prefix of W_seq); padding="mix" (the published code) depends on both."""
  x, mask = _case((B, L, D))
  longer = np.concatenate([x, np.random.default_rng(4).normal(size=(B, 3, D)).astype(np.float32)], axis=1)
  longer_mask = np.concatenate([mask, np.zeros((B, 3), bool)], axis=1)
  longer[1, 3:] *= 10
  for padding in ("zero", "mix"):
    module = MIXERS[name](causal=causal, max_len=MAX_LEN, padding=padding)
    variables = compiled(module).init(jax.random.key(0), x)
    y = np.asarray(compiled(module).apply(variables, x, mask=mask))[mask]
    y_longer = np.asarray(compiled(module).apply(variables, longer, mask=longer_mask))[longer_mask]
    if padding == "zero":
      np.testing.assert_allclose(y_longer, y, rtol=1e-5, atol=1e-6)
    elif not causal:  # causal: the padding lies in every real position's future
      assert not np.allclose(y_longer, y, atol=1e-4)


@pytest.mark.parametrize("name", ["linear_mixing", "random"])
def test_bfloat16_stays_within_its_resolution_of_float32(name):
  x, mask = _case((B, L, D))
  module = MIXERS[name](max_len=MAX_LEN)
  variables = compiled(module).init(jax.random.key(0), x)
  want = np.asarray(compiled(module).apply(variables, x, mask=mask))
  got = compiled(module).apply(variables, jnp.asarray(x, jnp.bfloat16), mask=mask)
  assert got.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=0.02 * np.abs(want).max())


@pytest.mark.parametrize("name", ["linear_mixing", "random"])
def test_longer_than_max_len_and_decoding_are_refused(name):
  x, _ = _case((B, MAX_LEN + 1, D))
  with pytest.raises(UserError, match="exceeds max_len"):
    compiled(MIXERS[name](max_len=MAX_LEN)).init(jax.random.key(0), x)
  with pytest.raises(UserError, match="cannot decode"):
    compiled(MIXERS[name](causal=True, max_len=MAX_LEN)).init(jax.random.key(0), x[:, :L], decode=True)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_ff_only_is_the_identity(dtype, causal):
  x, mask = _case((B, L, D))
  x = jnp.asarray(x, dtype)
  module = MIXERS["ff_only"](causal=causal)
  assert compiled(module).init(jax.random.key(0), x) == {}
  y = compiled(module).apply({}, x, mask=mask)
  assert y.dtype == dtype
  np.testing.assert_array_equal(np.asarray(y, np.float32), np.asarray(x, np.float32))
  grad = jax.grad(lambda x: jnp.sum(module.apply({}, x).astype(jnp.float32) * 3.0))(x)
  np.testing.assert_array_equal(np.asarray(grad, np.float32), 3.0)


def test_ff_only_decodes_the_identity_step_by_step():
  x, _ = _case((B, L, D))
  module = MIXERS["ff_only"](causal=True)
  cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
  assert [leaf.shape for leaf in jax.tree.leaves(cache)] == [()]  # the position counter only
  step = jax.jit(lambda cache, x_t: module.apply({"cache": cache}, x_t, decode=True, mutable=["cache"]))
  for t in range(L):
    y_t, mutated = step(cache, x[:, t : t + 1])
    cache = mutated["cache"]
    np.testing.assert_array_equal(y_t, x[:, t : t + 1])
  assert int(cache["index"]) == L
  with pytest.raises(UserError, match="decoding needs causal=True"):
    compiled(MIXERS["ff_only"](causal=False)).init(jax.random.key(0), x, decode=True)


def test_flop_counts_and_train_factors():
  """2·L·d + 2·d² per token for both products (the sequence and the hidden matmul), 0 for the identity;
  tests/test_flops.py checks the counts against the traced programs. Training: 3× for learned matrices, 2× for
  constants (only the input's gradient)."""
  for name in ("linear_mixing", "random"):
    assert MIXERS[name].forward_flops({}, 512, 64, False) == 2 * 512 * 64 + 2 * 64 * 64
    assert MIXERS[name].forward_flops({}, 512, 64, True) == 2 * 512 * 64 + 2 * 64 * 64
  assert MIXERS["linear_mixing"].train_factor == 3 and MIXERS["random"].train_factor == 2
  assert MIXERS["ff_only"].forward_flops({}, 512, 64, False) == 0

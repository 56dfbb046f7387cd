"""Attention-probability dropout: "chunked" against the textbook formula with the same keep mask, no dropout when
deterministic, unbiased in expectation on every path, O(L·chunk) memory in training, and "fused" refusing it."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import compiled
from conftest import padded_inputs
from efftx import platform
from efftx.mixers.attention import Attention
from efftx.mixers.attention import dropout_keep_block
from efftx.mixers.local import LocalAttention
from efftx.mixers.lsh import LSHAttention

B, L, D, H = 2, 8, 8, 2
RATE = 0.2


def _inputs(seed=0):
  return padded_inputs(B, L, D, 5, seed)  # the second sequence has 3 padded positions at the end


def _module_dropout_key(module, variables, rng):
  """The key Attention draws with make_rng("dropout"): its one draw from the stream, in the root scope."""
  return compiled(module).apply(variables, rngs={"dropout": rng}, method=lambda m: m.make_rng("dropout"))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _full_keep_mask(key, chunk, rate):
  """B×H×L×L keep mask of "chunked": its per-block masks side by side, cut to L."""
  C = min(chunk, L)
  N = -(-L // C)
  rows = [
    jnp.concatenate([dropout_keep_block(key, i, j, (B, H, C, C), rate) for j in range(N)], axis=-1) for i in range(N)
  ]
  return jnp.concatenate(rows, axis=-2)[..., :L, :L]


def _naive_attention(params, x_BxLxD, mask_BxL, causal, keep_BxHxLxL, rate):
  """softmax(q·k/√K over allowed keys) · keep / (1 − rate), weighted sum of v, output projection: all L×L at once."""
  K = D // H
  qkv_BxLx3xHxK = jnp.einsum("bld,dchk->blchk", x_BxLxD, params["qkv"]["kernel"]) + params["qkv"]["bias"]
  q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (qkv_BxLx3xHxK[:, :, i] for i in range(3))
  scores_BxHxLxL = jnp.einsum("bqhk,bthk->bhqt", q_BxLxHxK, k_BxLxHxK) / np.sqrt(K)
  allowed_Bx1xLxL = mask_BxL[:, None, None, :] & (np.tril(np.ones((L, L), bool)) if causal else True)
  probs_BxHxLxL = jax.nn.softmax(jnp.where(allowed_Bx1xLxL, scores_BxHxLxL, -1e30), axis=-1)
  heads_BxLxHxK = jnp.einsum("bhqt,bthk->bqhk", probs_BxHxLxL * keep_BxHxLxL / (1 - rate), v_BxLxHxK)
  return jnp.einsum("blhk,hkd->bld", heads_BxLxHxK, params["out"]["kernel"]) + params["out"]["bias"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("chunk", [3, 4, 8])  # 3 does not divide L; 8 is one block
def test_chunked_dropout_equals_naive_attention_with_the_same_keep_mask(causal, chunk):
  x, mask = _inputs()
  module = Attention(
    num_heads=H, causal=causal, attention_impl="chunked", attention_chunk=chunk, attention_dropout=RATE
  )
  variables = compiled(module).init(jax.random.key(0), x)
  rng = jax.random.key(7)
  keep_BxHxLxL = np.asarray(_full_keep_mask(_module_dropout_key(module, variables, rng), chunk, RATE))
  assert 0.5 < keep_BxHxLxL.mean() < 0.95 and not keep_BxHxLxL.all()  # the mask does drop something

  weights = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  y, (got_params, got_x) = _weighted_values_and_grads(
    lambda v, x: module.apply(v, x, mask=mask, deterministic=False, rngs={"dropout": rng}), variables, x, weights
  )
  want_y, (want_params, want_x) = _naive_values_and_grads(variables["params"], x, mask, causal, keep_BxHxLxL, weights)
  # Equal up to the order of the sums: the projections over D, the scores over K, the softmax's normalizer and
  # weighted sum over the L keys (blocked: a partial sum per block); the backward pass the same again, then the
  # weight gradients' sum over the B·L rows. A wrongly redrawn mask changes entries by O(1).
  forward = 2 * D + D // H + 3 * L
  assert_close_sums(y, want_y, n_terms=forward)
  # The backward pass recomputes each query block: it must redraw the forward pass's masks.
  assert_close_sums(got_x, want_x, n_terms=2 * forward)
  jax.tree.map(lambda a, b: assert_close_sums(a, b, n_terms=2 * forward + B * L), got_params["params"], want_params)


def _weighted_values_and_grads(apply, variables, x, weights):
  """apply(variables, x) and the gradients of its sum weighted by weights, in one compiled program."""

  @jax.jit
  def values_and_grads(variables, x):
    y, vjp = jax.vjp(apply, variables, x)
    return y, vjp(jnp.asarray(weights, y.dtype))

  return values_and_grads(variables, x)


@functools.partial(jax.jit, static_argnums=3)
def _naive_values_and_grads(params, x, mask, causal, keep_BxHxLxL, weights):
  """_naive_attention and its weighted sum's gradients: compiled once per causal, whatever the keep mask."""
  y, vjp = jax.vjp(lambda p, x: _naive_attention(p, x, mask, causal, keep_BxHxLxL, RATE), params, x)
  return y, vjp(weights)


PATHS = {  # every path with attention probabilities, small enough that each splits the sequence
  "plain": lambda rate: Attention(num_heads=H, attention_impl="plain", attention_dropout=rate),
  "chunked": lambda rate: Attention(num_heads=H, attention_impl="chunked", attention_chunk=3, attention_dropout=rate),
  "local": lambda rate: LocalAttention(num_heads=H, window=3, attention_dropout=rate),
  "lsh": lambda rate: LSHAttention(num_heads=H, lsh_buckets=2, lsh_chunk=4, attention_dropout=rate),
}


@pytest.mark.parametrize("path", sorted(PATHS) + ["fused", "flash", "auto"])
def test_no_dropout_when_deterministic_or_rate_zero(path):
  x, mask = _inputs()
  make = PATHS.get(path, lambda rate: Attention(num_heads=H, attention_impl=path, attention_dropout=rate))
  variables = compiled(make(0.0)).init(jax.random.key(0), x)
  want = np.asarray(compiled(make(0.0)).apply(variables, x, mask=mask, deterministic=True))
  rngs = {"dropout": jax.random.key(1)}
  np.testing.assert_array_equal(compiled(make(RATE)).apply(variables, x, mask=mask, deterministic=True), want)
  np.testing.assert_array_equal(
    compiled(make(0.0)).apply(variables, x, mask=mask, deterministic=False, rngs=rngs), want
  )


@pytest.mark.parametrize("path", sorted(PATHS))
def test_dropout_is_unbiased_and_random(path):
  """Inverse-scaled dropout keeps E[keep / (1 − rate)] = 1, and the output projection is linear: the mean output
  over many dropout keys tends to the deterministic output, within a few standard errors."""
  x, mask = _inputs()
  module = PATHS[path](0.3)
  variables = compiled(module).init(jax.random.key(0), x)
  want = np.asarray(compiled(module).apply(variables, x, mask=mask, deterministic=True))
  n = 200
  ys = np.asarray(
    jax.jit(jax.vmap(lambda rng: module.apply(variables, x, mask=mask, deterministic=False, rngs={"dropout": rng})))(
      jax.random.split(jax.random.key(3), n)
    )
  )
  stderr = ys.std(axis=0) / np.sqrt(n)
  assert np.all(np.abs(ys.mean(axis=0) - want) <= 5 * stderr + 1e-5), np.abs(ys.mean(axis=0) - want).max()
  assert not np.allclose(ys[0], want, atol=1e-3)  # a single draw does drop something
  assert not np.allclose(ys[0], ys[1], atol=1e-3)  # and each key drops something else


def test_auto_attention_trains_with_dropout_in_memory_linear_in_length():
  """Compiled temp memory of forward+backward with dropout on (deterministic, not a timing). At 2,048 positions
  auto is chunked on every platform (on a CPU plain only up to 1,024)."""
  L, chunk = 2048, 128

  def temp_bytes(impl):
    module = Attention(num_heads=1, causal=True, attention_impl=impl, attention_chunk=chunk, attention_dropout=0.1)
    x = jnp.zeros((1, L, 16))
    variables = compiled(module).init(jax.random.key(0), x[:, :8])
    loss = lambda v, x, rng: module.apply(v, x, deterministic=False, rngs={"dropout": rng}).sum()
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return grad.lower(variables, x, jax.random.key(1)).compile().memory_analysis().temp_size_in_bytes

  plain, auto = temp_bytes("plain"), temp_bytes("auto")
  assert plain > L * L * 4  # the L×L float32 probabilities are there
  assert auto < plain / 8, (auto, plain)


@pytest.mark.parametrize("impl", ["fused", "flash"])
def test_fused_and_flash_attention_refuse_dropout_in_training(impl):
  x, mask = _inputs()
  module = Attention(num_heads=H, attention_impl=impl, attention_dropout=RATE)
  variables = compiled(module).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match=f"attention_impl='{impl}' has no dropout.*'chunked' or 'auto'"):
    compiled(module).apply(variables, x, mask=mask, deterministic=False, rngs={"dropout": jax.random.key(1)})


@pytest.mark.parametrize("dtype,want", [(jnp.bfloat16, "fused"), (jnp.float32, "flash")])
def test_auto_on_gpu_is_fused_in_16_bit_flash_in_float32_and_chunked_with_dropout(dtype, want):
  """Traced for a GPU (efftx.platform.lowering_for) and run here: "fused" runs XLA's kernel here (no cuDNN)."""
  x, mask = _inputs()
  x = x.astype(dtype)
  make = lambda impl: Attention(num_heads=H, attention_impl=impl, attention_chunk=3, attention_dropout=RATE)
  variables = compiled(make("auto")).init(jax.random.key(0), x)
  apply = lambda impl, deterministic: np.asarray(
    compiled(make(impl)).apply(
      variables, x, mask=mask, deterministic=deterministic, rngs={"dropout": jax.random.key(1)}
    ),
    np.float32,
  )
  expected, want_chunked = apply(want, True), apply("chunked", False)
  with platform.lowering_for("gpu"):
    np.testing.assert_array_equal(apply("auto", True), expected)
    np.testing.assert_array_equal(apply("auto", False), want_chunked)
  assert not np.array_equal(apply("auto", True), expected) or want == "flash"  # on the CPU: flash, not fused


def test_auto_on_cpu_is_flash_without_dropout_and_plain_or_chunked_with_it():
  """With dropout, plain up to 1,024 positions (the same keep mask as plain's), chunked beyond (chunked's mask)."""
  make = lambda impl, chunk: Attention(num_heads=1, attention_impl=impl, attention_chunk=chunk, attention_dropout=RATE)
  for L, chunk in ((7, 3), (1025, 512)):  # both span more than one chunk
    x = jax.random.normal(jax.random.key(L), (1, L, 4))
    variables = compiled(make("auto", chunk)).init(jax.random.key(0), x)
    apply = lambda impl, deterministic, x=x, chunk=chunk, variables=variables: np.asarray(
      compiled(make(impl, chunk)).apply(variables, x, deterministic=deterministic, rngs={"dropout": jax.random.key(1)})
    )
    np.testing.assert_array_equal(apply("auto", True), apply("flash", True))
    np.testing.assert_array_equal(apply("auto", False), apply("plain" if L <= 1024 else "chunked", False))
    assert not np.array_equal(apply("plain", False), apply("chunked", False))  # the two draw different masks

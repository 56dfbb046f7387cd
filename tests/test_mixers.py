"""Mixers against independent references: naive numpy attention, numpy's FFT; causality and padding properties."""

import functools
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
from conftest import assert_close_sums
from conftest import causal_settings_to_check
from conftest import compiled
from conftest import padded_inputs
from efftx.errors import UserError
from efftx.mixers import MIXERS

B, L, D = 2, 7, 8


def _inputs(seed=0):
  return padded_inputs(B, L, D, 4, seed)  # the second sequence has 3 padded positions at the end


def _numpy_attention(x, mask, params, num_heads, causal, window=None, feature_map=None, same_block=None):
  """Loop-by-loop attention from the textbook formula: softmax weights, or with feature_map φ the linear
  attention weights φ(q)·φ(k) / Σ φ(q)·φ(k'); window limits the keys to |i − j| < window; same_block(i, j) to the
  keys in the query's block."""
  qkv_w, qkv_b = params["qkv"]["kernel"], params["qkv"]["bias"]  # Dx3xHxK, 3xHxK
  out_w, out_b = params["out"]["kernel"], params["out"]["bias"]  # HxKxD
  K = D // num_heads
  y = np.zeros_like(x)
  for b in range(B):
    qkv = np.einsum("ld,dchk->lchk", x[b], qkv_w) + qkv_b
    heads = np.zeros((L, num_heads, K))
    for h in range(num_heads):
      for i in range(L):
        keys = [
          j
          for j in range(L)
          if mask[b, j]
          and (j <= i or not causal)
          and (window is None or abs(i - j) < window)
          and (same_block is None or same_block(i, j))
        ]
        if not keys:  # a padded query with no real key in its window: compared nowhere
          continue
        if feature_map is None:
          scores = np.array([qkv[i, 0, h] @ qkv[j, 1, h] / np.sqrt(K) for j in keys])
          p = np.exp(scores - scores.max())
        else:
          p = np.array([feature_map(qkv[i, 0, h]) @ feature_map(qkv[j, 1, h]) for j in keys])
        p /= p.sum()
        heads[i, h] = sum(pj * qkv[j, 2, h] for pj, j in zip(p, keys))
    y[b] = np.einsum("lhk,hkd->ld", heads, out_w) + out_b
  return y


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("impl", ["auto", "plain", "chunked"])  # plain and chunked share one mask; auto: flash here
def test_attention_matches_numpy(causal, impl):
  x, mask = _inputs()
  module = MIXERS["attention"](num_heads=2, causal=causal, attention_impl=impl, attention_chunk=2)
  variables = compiled(module).init(jax.random.key(0), x)
  y = compiled(module).apply(variables, x, mask=mask)
  params = jax.tree.map(np.asarray, variables["params"])
  np.testing.assert_allclose(y, _numpy_attention(x, mask, params, 2, causal), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window", [1, 2, 3, 8])
def test_local_attention_matches_numpy(causal, window):
  x, mask = _inputs()
  module = MIXERS["local"](num_heads=2, causal=causal, window=window)
  variables = compiled(module).init(jax.random.key(0), x)
  params = jax.tree.map(np.asarray, variables["params"])
  want = _numpy_attention(x, mask, params, 2, causal, window=window)
  np.testing.assert_allclose(
    np.asarray(compiled(module).apply(variables, x, mask=mask))[mask], want[mask], rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize("causal,chunk", [(False, 256), (True, 2), (True, 3), (True, 256)])
def test_linear_attention_matches_numpy(causal, chunk):
  x, mask = _inputs()
  module = MIXERS["linear"](num_heads=2, causal=causal, chunk=chunk)
  variables = compiled(module).init(jax.random.key(0), x)
  params = jax.tree.map(np.asarray, variables["params"])
  elu_plus_one = lambda z: np.where(z > 0, z + 1, np.exp(z))
  want = _numpy_attention(x, mask, params, 2, causal, feature_map=elu_plus_one)
  np.testing.assert_allclose(
    np.asarray(compiled(module).apply(variables, x, mask=mask))[mask], want[mask], rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize("impl", ["fft", "rfft", "matmul", "auto"])
@pytest.mark.parametrize("shape", [(B, L, D), (3, 8, 5), (1, 6, 9)])
def test_fnet_equals_numpy_fft2(impl, shape):
  x = np.random.default_rng(2).normal(size=shape).astype(np.float32)  # odd and even lengths and widths
  mask = np.ones(shape[:2], bool)
  mask[0, shape[1] // 2 :] = False
  module = MIXERS["fnet"](causal=False, fourier_impl=impl)
  y = compiled(module).apply(compiled(module).init(jax.random.key(0), x), x)
  np.testing.assert_allclose(y, np.real(np.fft.fft2(x, axes=(-2, -1))), rtol=1e-4, atol=1e-4)
  # With a mask, padded positions are zero before the transform.
  y = compiled(module).apply({}, x, mask=mask)
  np.testing.assert_allclose(
    y, np.real(np.fft.fft2(np.where(mask[..., None], x, 0), axes=(-2, -1))), rtol=1e-4, atol=1e-4
  )
  # padding="mix", the published code's convention: the mask is ignored, padded positions are mixed in.
  mixing = MIXERS["fnet"](causal=False, fourier_impl=impl, padding="mix")
  np.testing.assert_allclose(
    compiled(mixing).apply({}, x, mask=mask), np.real(np.fft.fft2(x, axes=(-2, -1))), rtol=1e-4, atol=1e-4
  )


@pytest.mark.parametrize("impl", ["fft", "rfft", "matmul"])
@pytest.mark.parametrize("L,D", [(33, 9), (1024, 16)])
def test_fnet_gradient_equals_the_dft_matrices_transposed(impl, L, D):
  """d<Re(F_L x F_D), g>/dx = C_Lᵀ g C_Dᵀ − S_Lᵀ g S_Dᵀ, the DFT's cos and sin matrices written out in numpy
  from the definition (F[j, k] = exp(−2πi·jk/N)); zero at padded positions. Lengths 33 × width 9 (both odd) and
  1024 × 16. Under jax.vmap over a further leading axis the mixer equals numpy's FFT too."""
  rng = np.random.default_rng(5)
  x_BxLxD, g_BxLxD = (rng.normal(size=(2, L, D)).astype(np.float32) for _ in range(2))
  mask_BxL = np.ones((2, L), bool)
  mask_BxL[1, L * 2 // 3 :] = False
  module = MIXERS["fnet"](causal=False, fourier_impl=impl)
  grad_BxLxD = jax.grad(lambda x: jnp.sum(compiled(module).apply({}, x, mask=mask_BxL) * g_BxLxD))(x_BxLxD)

  def cos_sin(n):
    angle = 2 * np.pi * np.outer(np.arange(n), np.arange(n)) / n
    return np.cos(angle), np.sin(angle)

  (c_l, s_l), (c_d, s_d) = cos_sin(L), cos_sin(D)
  want_BxLxD = np.einsum("kl,bke,de->bld", c_l, g_BxLxD, c_d) - np.einsum("kl,bke,de->bld", s_l, g_BxLxD, s_d)
  np.testing.assert_allclose(
    grad_BxLxD, np.where(mask_BxL[..., None], want_BxLxD, 0), rtol=1e-4, atol=1e-4 * np.sqrt(L * D)
  )
  x_NxBxLxD = np.stack([x_BxLxD, g_BxLxD])
  np.testing.assert_allclose(
    jax.vmap(lambda x: compiled(module).apply({}, x))(x_NxBxLxD),
    np.real(np.fft.fft2(x_NxBxLxD, axes=(-2, -1))),
    rtol=1e-4,
    atol=1e-4 * np.sqrt(L * D),
  )


@pytest.mark.parametrize("impl", ["fft", "rfft"])
def test_fnet_transforms_only_each_devices_share_of_the_batch(impl):
  """Data parallel over 8 devices: every FFT of the compiled step (forward and backward) has the device's 2 rows
  of the batch of 16, no all-gather brings the batch together, and the values equal one device's."""
  from efftx import sharding  # pylint: disable=import-outside-toplevel

  mesh = sharding.make_mesh()
  x_BxLxD = np.random.default_rng(6).normal(size=(2 * len(mesh.devices.flat), 16, 8)).astype(np.float32)
  module = MIXERS["fnet"](causal=False, fourier_impl=impl)
  loss = lambda x: jnp.sum(compiled(module).apply({}, x) ** 3)
  step = jax.jit(jax.value_and_grad(loss))
  hlo = step.lower(jax.device_put(x_BxLxD, sharding.batch(mesh))).compile().as_text()
  ffts = [line for line in hlo.splitlines() if " fft(" in line]
  assert len(ffts) == 2 and all("[2,16," in line for line in ffts), ffts
  assert " all-gather(" not in hlo
  value, grad_BxLxD = step(jax.device_put(x_BxLxD, sharding.batch(mesh)))
  want_value, want_BxLxD = jax.jit(jax.value_and_grad(loss))(x_BxLxD)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  np.testing.assert_allclose(grad_BxLxD, want_BxLxD, rtol=1e-4, atol=1e-3)


def test_fnet_cannot_be_causal_and_checks_its_impl():
  with pytest.raises(ValueError, match="cannot be causal"):
    MIXERS["fnet"](causal=True)
  with pytest.raises(ValueError, match="rfft"):
    MIXERS["fnet"](fourier_impl="fast")


CAUSAL_MIXERS = sorted(n for n, spec in MIXERS.items() if spec.can_be_causal)
DECODING_MIXERS = sorted(n for n, spec in MIXERS.items() if spec.can_decode)
# How many positions reach an output (its own included) where a mixer at its defaults reaches fewer than L: ff_only
# mixes nothing, base_conv's convolution has kernel_size taps.
REACH = {"ff_only": 1, "base_conv": MIXERS["base_conv"].defaults()["kernel_size"]}


@pytest.mark.parametrize("name", CAUSAL_MIXERS)
def test_causal_mixers_gradients_never_reach_the_past(name):
  x, _ = _inputs()
  module = MIXERS[name](causal=True)
  variables = compiled(module).init(jax.random.key(0), x)
  # jac[b, t, d, b', t', d'] = d y[b, t, d] / d x[b', t', d']
  jac = jax.jit(jax.jacrev(lambda x: module.apply(variables, x)))(x)
  per_position_LxL = np.abs(np.asarray(jac)).sum(axis=(0, 2, 3, 5))
  future = np.triu(np.ones((L, L), bool), k=1)  # t' > t
  if "fft" in str(jax.make_jaxpr(lambda x: module.apply(variables, x))(x)):
    # A convolution through an FFT (efftx.mixers.conv.causal_long_conv): exactly causal, but the transforms' rounding
    # spreads over every position, the future's share within L·eps of the largest dependence.
    assert per_position_LxL[future].max() <= L * np.finfo(np.float32).eps * per_position_LxL.max()
  else:
    assert np.all(per_position_LxL[future] == 0.0)
  lag_LxL = np.arange(L)[:, None] - np.arange(L)[None]  # t − t'
  reach = REACH.get(name, L)
  assert np.all(per_position_LxL[(lag_LxL > 0) & (lag_LxL < reach)] > 0.0)  # the past does reach it
  assert np.all(per_position_LxL[lag_LxL >= reach] == 0.0)  # but not beyond the mixer's reach
  if name != "lsh":  # LSH excludes a position's own key when another exists: y_1 is v_0 whatever x_1 is
    assert np.all(np.diag(per_position_LxL) > 0.0)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_declared_capabilities_hold(name):
  """What a spec says it cannot do is refused (the tests above and below check what it says it can do)."""
  spec = MIXERS[name]
  if not spec.can_be_causal:
    with pytest.raises(UserError, match="cannot be causal"):
      spec(causal=True)
  if not spec.can_be_bidirectional:
    with pytest.raises(UserError, match="causal only"):
      spec(causal=False)
  if spec.can_be_causal and not spec.can_decode:
    x, _ = _inputs()
    with pytest.raises(ValueError, match="decod"):
      compiled(spec(causal=True)).init(jax.random.key(0), x, decode=True)
  assert spec.has_heads == ("num_heads" in spec.options)


@pytest.mark.parametrize("name,causal", [(n, c) for n in sorted(MIXERS) for c in causal_settings_to_check(n)])
def test_outputs_at_real_positions_ignore_padded_contents(name, causal):
  x, mask = _inputs()
  module = MIXERS[name](causal=causal)
  variables = compiled(module).init(jax.random.key(0), x)
  noise = np.random.default_rng(1).normal(size=x.shape).astype(np.float32) * 10
  x_other = np.where(mask[..., None], x, noise)
  # One program: the outputs with the mask, and without it.
  outputs = jax.jit(lambda v, x: (module.apply(v, x, mask=mask), module.apply(v, x)))
  (y, y_unmasked), (y_other, y_other_unmasked) = (jax.tree.map(np.asarray, outputs(variables, a)) for a in (x, x_other))
  np.testing.assert_allclose(y[mask], y_other[mask], rtol=1e-5, atol=1e-5)
  # Without the mask the padded contents do change the real outputs: the property above is the mask's doing.
  # (Not so for causal mixers: the padding is at the end, in every real position's future; nor for ff_only, which
  # mixes nothing.)
  assert causal or name == "ff_only" or not np.allclose(y_unmasked[mask], y_other_unmasked[mask], atol=1e-3)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_every_mixer_jits_keeps_shape_and_dtype_and_has_finite_grads(name):
  """In float32 and in bfloat16 (float32 parameters, as the model keeps them): under jit the output has the input's
  shape and dtype, and every gradient is finite; in one program for both. The bfloat16 output lies within
  bfloat16's resolution of the float32 output at the same (rounded) input."""
  x, mask = _inputs()
  module = MIXERS[name](causal=causal_settings_to_check(name)[0])
  variables = compiled(module).init(jax.random.key(0), x)
  x16 = jnp.asarray(x, jnp.bfloat16)

  @jax.jit
  def outputs_and_grads(v, x32, x16):
    def one(x):
      y, vjp = jax.vjp(lambda v, x: module.apply(v, x, mask=mask), v, x)
      return y, vjp(jnp.ones_like(y))  # the gradients of y.sum()

    return one(x32), one(x16)

  (y32, grads32), (y16, grads16) = outputs_and_grads(variables, np.asarray(x16, np.float32), x16)
  for y, want_dtype in ((y32, jnp.float32), (y16, jnp.bfloat16)):
    assert y.shape == x.shape and y.dtype == want_dtype
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves((grads32, grads16)))
  want = np.asarray(y32)
  np.testing.assert_allclose(np.asarray(y16, np.float32), want, atol=0.05 * np.abs(want).max())


def test_every_mixer_is_a_linen_module_with_declared_defaults():
  for name, spec in MIXERS.items():
    assert issubclass(spec.module, nn.Module), name
    spec(causal=spec.causal_settings[0])  # every option has a default
    assert all(option.help for option in spec.options.values()), name  # and a meaning


@functools.cache
def _weighted_values_and_grads(module):
  """module's outputs at _inputs() and the gradients (parameters, input) of their sum weighted by fixed normal
  weights, at the parameters of plain attention's init, in one compiled program; each module once."""
  x, mask = _inputs()
  variables = compiled(MIXERS["attention"](num_heads=2, attention_impl="plain")).init(jax.random.key(0), x)
  weights = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)

  @jax.jit
  def values_and_grads(v, x):
    y, vjp = jax.vjp(lambda v, x: module.apply(v, x, mask=mask), v, x)
    return y, vjp(jnp.asarray(weights, y.dtype))

  return jax.tree.map(np.asarray, values_and_grads(variables, x))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
  "impl,chunk",
  [("chunked", 3), ("chunked", 4), ("chunked", 64), ("flash", 3), ("flash", 4), ("flash", 64), ("fused", 256)],
)
def test_attention_impls_equal_plain_in_values_and_gradients(causal, impl, chunk):
  plain = MIXERS["attention"](num_heads=2, causal=causal, attention_impl="plain")
  other = MIXERS["attention"](num_heads=2, causal=causal, attention_impl=impl, attention_chunk=chunk)
  (got_y, got_grads), (want_y, want_grads) = _weighted_values_and_grads(other), _weighted_values_and_grads(plain)
  # Equal up to the order of the sums: the projections over D, the scores over the head's K, the softmax's
  # normalizer and weighted sum over the L keys (blocked: a partial sum, and for "flash" a rescaling, per block);
  # the backward pass the same again, then the weight gradients' sum over the B·L rows.
  forward = 2 * D + D // 2 + 3 * L
  assert_close_sums(got_y, want_y, n_terms=forward)
  jax.tree.map(lambda a, b: assert_close_sums(a, b, n_terms=2 * forward + B * L), got_grads, want_grads)


def test_blocked_attention_memory_does_not_grow_with_the_square_of_length():
  """Compiled temp memory of forward+backward (deterministic, not a timing), of "chunked" and of "flash"."""
  L, chunk = 2048, 128

  def temp_bytes(impl):
    module = MIXERS["attention"](num_heads=1, causal=True, attention_impl=impl, attention_chunk=chunk)
    x = jnp.zeros((1, L, 16))
    variables = compiled(module).init(jax.random.key(0), x[:, :8])
    grad = jax.jit(jax.grad(lambda v, x: module.apply(v, x).sum(), argnums=(0, 1)))
    return grad.lower(variables, x).compile().memory_analysis().temp_size_in_bytes

  plain = temp_bytes("plain")
  assert plain > L * L * 4  # the L×L float32 scores are there
  for impl in ("chunked", "flash"):
    blocked = temp_bytes(impl)
    assert blocked < plain / 8, (impl, blocked, plain)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_at_extreme_logits_and_in_bfloat16(causal):
  """Scores in the thousands (near one-hot rows), a sequence padded down to 2 real keys, 33 positions in blocks of
  8 (a partial last block): "flash" against the float64 textbook formula, and its gradients against "plain"'s. In
  bfloat16, within bfloat16's resolution of the float32 result."""
  Lx, Dx, H = 33, 8, 2
  rng = np.random.default_rng(3)
  x = (rng.normal(size=(2, Lx, Dx)) * 30).astype(np.float32)
  mask = np.ones((2, Lx), bool)
  mask[1, 2:] = False
  flash = MIXERS["attention"](num_heads=H, causal=causal, attention_impl="flash", attention_chunk=8)
  plain = MIXERS["attention"](num_heads=H, causal=causal, attention_impl="plain")
  variables = compiled(flash).init(jax.random.key(0), x)
  params = jax.tree.map(np.asarray, variables["params"])
  qkv = np.einsum("bld,dchk->blchk", x.astype(np.float64), params["qkv"]["kernel"]) + params["qkv"]["bias"]
  logits = np.einsum("bqhk,bthk->bhqt", qkv[:, :, 0], qkv[:, :, 1]) / np.sqrt(Dx // H)
  allowed = mask[:, None, None, :] & (np.tril(np.ones((Lx, Lx), bool)) if causal else True)
  assert np.abs(logits).max() > 1000
  logits = np.where(allowed, logits, -np.inf)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  heads = np.einsum("bhqt,bthk->bqhk", probs, qkv[:, :, 2])
  want = np.einsum("bqhk,hkd->bqd", heads, params["out"]["kernel"]) + params["out"]["bias"]
  got = compiled(flash).apply(variables, x, mask=mask)
  rows = mask[:, :, None]  # a padded query's output is not compared (the model ignores it)
  np.testing.assert_allclose(np.where(rows, got, 0), np.where(rows, want, 0), rtol=1e-4, atol=1e-3)
  weights = rng.normal(size=x.shape).astype(np.float32) * rows
  loss = lambda module: lambda v, x: (module.apply(v, x, mask=mask) * weights).sum()
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3 * np.abs(b).max()),
    *(jax.jit(jax.grad(loss(m), argnums=(0, 1)))(variables, x) for m in (flash, plain)),
  )
  x16 = jnp.asarray(x / 30, jnp.bfloat16)
  flash16 = MIXERS["attention"](num_heads=H, causal=causal, attention_impl="flash", attention_chunk=8)
  got16 = compiled(flash16).apply(jax.tree.map(lambda p: p.astype(jnp.bfloat16), variables), x16, mask=mask)
  assert got16.dtype == jnp.bfloat16
  want32 = compiled(plain).apply(variables, np.asarray(x16, np.float32), mask=mask)
  np.testing.assert_allclose(
    np.where(rows, np.asarray(got16, np.float32), 0), np.where(rows, want32, 0), atol=0.05 * np.abs(want32).max()
  )
  # bfloat16 gradients (the hand-written backward pass in bfloat16, 5 blocks: dK and dV carried transposed on a CPU)
  # against plain's float32 autodiff at the same rounded inputs, within bfloat16's resolution.
  variables16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), variables)
  grads16 = jax.jit(jax.grad(loss(flash16), argnums=(0, 1)))(variables16, x16)
  grads32 = jax.jit(jax.grad(loss(plain), argnums=(0, 1)))(
    jax.tree.map(lambda p: p.astype(jnp.float32), variables16), np.asarray(x16, np.float32)
  )
  assert jax.tree.leaves(grads16)[0].dtype == jnp.bfloat16
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(np.asarray(a, np.float32), b, atol=0.05 * np.abs(b).max()), grads16, grads32
  )


@pytest.mark.parametrize("name", DECODING_MIXERS)
def test_step_by_step_decoding_equals_the_causal_forward_pass(name):
  x, _ = _inputs()
  module = MIXERS[name](causal=True, **({"window": 3} if name in ("local", "aft_local") else {}))
  variables = compiled(module).init(jax.random.key(0), x)
  if name == "aft_conv":  # γ, β start at 0 (kernel off); switch the kernel on
    variables["params"]["gamma"] = variables["params"]["gamma"] + 1.0
  full = np.asarray(compiled(module).apply(variables, x))
  cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
  step = jax.jit(lambda v, x_t: module.apply(v, x_t, decode=True, mutable=["cache"]))
  for t in range(L):
    y_t, mutated = step({**variables, "cache": cache}, x[:, t : t + 1])
    cache = mutated["cache"]
    np.testing.assert_allclose(np.asarray(y_t)[:, 0], full[:, t], rtol=1e-5, atol=1e-5, err_msg=f"position {t}")


def test_aft_simple_decodes_in_constant_memory():
  x, _ = _inputs()
  module = MIXERS["aft_simple"](causal=True)
  cache = compiled(module).init(jax.random.key(0), x, decode=True)["cache"]
  assert all(leaf.shape[1] == 1 for leaf in jax.tree.leaves(cache))  # running sums, not per-position buffers


def test_the_mixers_readme_shows_the_registry_table():
  """efftx/mixers/README.md's registry table is `python -m efftx.mixers --markdown`, so it cannot drift from the
  declared specs; the plain-text listing (the command without the flag) names every mixer and option with its
  default, no markup; README.md names every mixer."""
  from efftx.mixers.__main__ import table  # pylint: disable=g-import-not-at-top
  from efftx.mixers.__main__ import text  # pylint: disable=g-import-not-at-top

  with open(os.path.join(REPO, "efftx", "mixers", "README.md")) as f:
    assert table() in f.read(), "efftx/mixers/README.md: paste the output of `python -m efftx.mixers --markdown`"
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  assert [name for name in MIXERS if f"`{name}`" not in readme] == []
  listing = " ".join(text().split())  # lines joined where they wrap
  assert "<br>" not in listing and "|" not in listing.replace("|t − t'|", "")
  for name, spec in MIXERS.items():
    assert f"{name}: {' '.join(spec.summary.split())}" in listing
    for option, value in spec.defaults().items():
      assert f"--config.mixer.{option} (default {value!r}):" in listing, (name, option)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_on_a_long_padded_sequence_equals_plain(causal):
  """1,000 positions in blocks of 128 (a partial last block), the second sequence padded after 613 real ones, keys
  up to 999 positions apart: values and gradients of "flash" (its hand-written backward) against "plain"
  (autodiff of the textbook formula)."""
  Lx, Dx = 1000, 16
  rng = np.random.default_rng(11)
  x = rng.normal(size=(2, Lx, Dx)).astype(np.float32) * 3
  mask = np.ones((2, Lx), bool)
  mask[1, 613:] = False
  flash = MIXERS["attention"](num_heads=2, causal=causal, attention_impl="flash", attention_chunk=128)
  plain = MIXERS["attention"](num_heads=2, causal=causal, attention_impl="plain")
  variables = compiled(plain).init(jax.random.key(0), x)
  rows = mask[:, :, None]
  weights = rng.normal(size=x.shape).astype(np.float32) * rows
  # Equal up to the order of the sums (see test_attention_impls_equal_plain_in_values_and_gradients): the L keys'
  # normalizer and weighted sum dominate, a rescaling per block of 128 keys on top.
  forward = 2 * Dx + Dx // 2 + 2 * Lx + Lx // 128 + 1
  assert_close_sums(
    np.where(rows, compiled(flash).apply(variables, x, mask=mask), 0),
    np.where(rows, compiled(plain).apply(variables, x, mask=mask), 0),
    n_terms=forward,
  )
  loss = lambda module: lambda v, x: (module.apply(v, x, mask=mask) * weights).sum()
  jax.tree.map(
    lambda a, b: assert_close_sums(a, b, n_terms=2 * forward + 2 * Lx),
    *(jax.jit(jax.grad(loss(m), argnums=(0, 1)))(variables, x) for m in (flash, plain)),
  )

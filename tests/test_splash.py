"""attention_impl="splash": the Pallas TPU splash-attention kernel, run here in Pallas's interpret mode, against a
float64 numpy softmax attention from the textbook formula and against "plain" (values and gradients), with padding,
causal masks, lengths that are not a multiple of the kernel's 128-position blocks, float32 and bfloat16, one head,
and under an 8-device mesh; and "auto" taking it exactly where the model is traced for a TPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_sums
from efftx import platform
from efftx.errors import UserError
from efftx.mixers import MIXERS
from efftx.mixers import attention as attention_lib

B, L, D = 2, 200, 32  # 200 positions: padded to 256 inside the kernel


def _inputs(lengths=(150, 200), seed=0, start=30):
  """x B×L×D and its mask: sequence b has real positions start … lengths[b] − 1 (padding before and after, so
  that a causal query could see padded keys too), the last one all real positions."""
  x = np.random.default_rng(seed).normal(size=(B, L, D)).astype(np.float32)
  mask = np.arange(L)[None, :] < np.array(lengths)[:, None]
  mask[0, :start] = False
  return jnp.asarray(x), jnp.asarray(mask)


def _numpy_attention(x, mask, params, num_heads, causal):
  """softmax(q kᵀ / √K) v over the real keys (and, causal, those at or before the query), in float64; NaN at a
  query with no key to see."""
  x, mask = np.asarray(x, np.float64), np.asarray(mask)
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  qkv = np.einsum("bld,dthk->blthk", x, p["qkv"]["kernel"]) + p["qkv"]["bias"]
  q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
  logits = np.einsum("bqhk,bthk->bhqt", q, k) / np.sqrt(q.shape[-1])
  length = x.shape[1]
  allowed = mask[:, None, None, :] & (np.tril(np.ones((length, length), bool)) if causal else True)
  logits = np.where(allowed, logits, -np.inf)
  with np.errstate(invalid="ignore"):
    weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  out = np.einsum("bhqt,bthk->bqhk", weights, v)
  return np.einsum("bqhk,hkd->bqd", out, p["out"]["kernel"]) + p["out"]["bias"]


def _modules(causal, num_heads=2, **options):
  make = lambda impl: MIXERS["attention"](num_heads=num_heads, causal=causal, attention_impl=impl, **options)
  return make("splash"), make("plain")


@pytest.mark.parametrize("causal", [False, True])
def test_splash_equals_the_formula_and_plain_in_values_and_gradients(causal):
  x, mask = _inputs()
  splash, plain = _modules(causal)
  variables = plain.init(jax.random.key(0), x)
  got = jax.jit(lambda v, x: splash.apply(v, x, mask=mask))(variables, x)
  want = _numpy_attention(x, mask, variables["params"], 2, causal)
  # Every query with a key to see, padded ones included (causal: not those before sequence 0's first real key).
  seen = ~np.isnan(want).any(-1)
  assert seen[1].all() and seen[0, 30:].all() and seen[0, :30].all() != causal
  assert_close_sums(np.asarray(got)[seen], want[seen], n_terms=2 * D + L)
  # A loss on those positions: gradients for the parameters and the inputs.
  weights = np.random.default_rng(1).normal(size=x.shape).astype(np.float32) * seen[..., None]
  loss = lambda module: lambda v, x: (module.apply(v, x, mask=mask) * weights).sum()
  got = jax.jit(jax.grad(loss(splash), argnums=(0, 1)))(variables, x)
  want = jax.jit(jax.grad(loss(plain), argnums=(0, 1)))(variables, x)
  jax.tree.map(lambda a, b: assert_close_sums(a, b, n_terms=2 * (2 * D + L) + B * L), got, want)


@pytest.mark.parametrize("causal", [False, True])
def test_splash_in_bfloat16_is_as_accurate_as_plain_in_bfloat16(causal):
  """bfloat16 rounds every sum by ~2^-8: both paths are held to the float64 formula (values) and to float32
  "plain" (gradients), and splash may be off by at most twice what plain is, plus a tenth of a bfloat16 step."""
  x, mask = _inputs(lengths=(77, 200))
  splash, plain = _modules(causal)
  variables = plain.init(jax.random.key(2), x)
  x16 = x.astype(jnp.bfloat16)
  reference = _numpy_attention(x16.astype(jnp.float32), mask, variables["params"], 2, causal)
  real = ~np.isnan(reference).any(-1)  # the queries with a key to see
  reference = reference[real]
  error = lambda module: np.abs(
    np.asarray(jax.jit(lambda v, x: module.apply(v, x, mask=mask))(variables, x16), np.float64)[real] - reference
  ).max()
  bf16_step = 2.0**-8 * np.abs(reference).max()
  assert error(splash) <= 2 * error(plain) + 0.1 * bf16_step, (error(splash), error(plain))
  weights = jnp.asarray(np.random.default_rng(3).normal(size=x.shape) * real[..., None], jnp.float32)
  loss = lambda module: lambda v, x: (module.apply(v, x, mask=mask).astype(jnp.float32) * weights).sum()
  want = jax.jit(jax.grad(loss(plain)))(variables, x16.astype(jnp.float32))
  got16, plain16 = (jax.jit(jax.grad(loss(module)))(variables, x16) for module in (splash, plain))
  for path in (("qkv", "kernel"), ("out", "kernel")):
    leaf = lambda g: np.asarray(g["params"][path[0]][path[1]], np.float64)
    scale = np.abs(leaf(want)).max()
    assert (
      np.abs(leaf(got16) - leaf(want)).max() <= 2 * np.abs(leaf(plain16) - leaf(want)).max() + 0.1 * 2.0**-8 * scale
    ), path


def test_splash_with_one_head_a_full_block_and_a_one_token_sequence():
  """L = 128 (the kernel's block, no alignment padding), one head of width D; a sequence with one real token."""
  x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 128, 16)), jnp.float32)
  mask = jnp.asarray(np.arange(128)[None, :] < np.array([[1], [128]]))
  for causal in (False, True):
    splash, plain = _modules(causal, num_heads=1)
    variables = plain.init(jax.random.key(3), x)
    got = np.asarray(jax.jit(lambda v, x: splash.apply(v, x, mask=mask))(variables, x))
    want = _numpy_attention(x, mask, variables["params"], 1, causal)
    assert np.isfinite(got).all()
    assert_close_sums(got, want, n_terms=2 * 16 + 128)  # every query sees the one real key


def test_splash_under_a_mesh_runs_per_device_and_equals_plain():
  """Under jax.set_mesh (as efftx.train lowers its steps), the batch of 8 is split over the 8 devices by
  shard_map: each device's kernel sees one example, and the result is the unsplit one's."""
  from efftx import sharding  # pylint: disable=import-outside-toplevel

  mesh = sharding.make_mesh(fsdp=2)
  x = jnp.asarray(np.random.default_rng(5).normal(size=(8, 136, 16)), jnp.float32)
  mask = jnp.asarray(np.arange(136)[None, :] < np.arange(1, 9)[:, None] * 17)
  splash, plain = _modules(True)
  variables = plain.init(jax.random.key(4), x)
  step = jax.jit(lambda v, x: splash.apply(v, x, mask=mask), in_shardings=(None, sharding.batch(mesh)))
  with jax.set_mesh(mesh):
    lowered = step.lower(variables, x)
    got = step(variables, x)
  assert "shard_map" in lowered.as_text() or "sdy.manual_computation" in lowered.as_text()
  want = jax.jit(lambda v, x: plain.apply(v, x, mask=mask))(variables, x)
  assert_close_sums(got, want, n_terms=2 * 16 + 136)  # right padding, causal: every query sees a key


def test_splash_refuses_attention_dropout():
  with pytest.raises(UserError, match="attention_impl='splash' has no dropout.*'chunked' or 'auto'"):
    MIXERS["attention"](num_heads=2, attention_impl="splash", attention_dropout=0.1)


def _lowered_text(module, target, dtype=jnp.float32, deterministic=True):
  """The gradient's program traced for `target` (efftx.platform.lowering_for) and lowered for it."""
  x, mask = _inputs()
  variables = module.init(jax.random.key(0), x)
  with platform.lowering_for(target):
    fn = jax.jit(
      jax.grad(
        lambda v, x: (
          module.apply(v, x, mask=mask, deterministic=deterministic, rngs={"dropout": jax.random.key(1)})
          .astype(jnp.float32)
          .sum()
        ),
        argnums=(0, 1),
      )
    )
    return fn.trace(variables, x.astype(dtype)).lower(lowering_platforms=(target,)).as_text()


@pytest.mark.parametrize("causal", [False, True])
def test_auto_takes_splash_where_traced_for_a_tpu_and_not_elsewhere(causal):
  auto = MIXERS["attention"](num_heads=2, causal=causal)
  assert platform.kernels(_lowered_text(auto, "tpu")) == {"Pallas TPU kernel": 3}  # forward, dq, dkv
  for dtype in (jnp.float32, jnp.bfloat16):
    assert "Pallas TPU kernel" not in platform.kernels(_lowered_text(auto, "cuda", dtype))
    assert "Pallas TPU kernel" not in platform.kernels(_lowered_text(auto, "cpu", dtype))
  # With attention dropout active, a TPU takes the chunked path (the kernel has no dropout).
  dropping = MIXERS["attention"](num_heads=2, causal=causal, attention_dropout=0.1, attention_chunk=64)
  assert not platform.kernels(_lowered_text(dropping, "tpu", deterministic=False))


def test_auto_paths_per_platform_and_dtype():
  resolve = attention_lib._resolve  # pylint: disable=protected-access
  assert resolve("auto", 1024, 256, False, "tpu") == "splash"
  assert resolve("auto", 1024, 256, False, "gpu", jnp.bfloat16) == "fused"
  assert resolve("auto", 1024, 256, False, "gpu", jnp.float16) == "fused"
  assert resolve("auto", 1024, 256, False, "gpu", jnp.float32) == "flash"
  assert resolve("auto", 1024, 256, False, "cpu", jnp.bfloat16) == "flash"
  for target in ("gpu", "tpu"):
    assert resolve("auto", 1024, 256, True, target) == "chunked"
    assert resolve("auto", 200, 256, True, target) == "plain"
  # On a CPU plain keeps the dropout up to 1,024 positions and 2^26 probabilities (faster there), chunked beyond.
  assert [resolve("auto", L, 256, True, "cpu") for L in (200, 784, 1024, 1025)] == ["plain"] * 3 + ["chunked"]
  assert resolve("auto", 1024, 256, True, "cpu", batch_heads=64) == "plain"  # 2^26
  assert resolve("auto", 1024, 256, True, "cpu", batch_heads=65) == "chunked"
  assert resolve("auto", 1024, 256, True, "cpu", batch_heads=256) == "chunked"  # LRA's CIFAR-10 batch
  assert resolve("splash", 10, 256, False, "cpu") == "splash"


def test_splash_exports_for_tpu_with_its_kernel():
  """jax.export exports the gradient of a causal, padded splash attention for TPU, the Mosaic kernel inside (its
  serialized form needs the flatbuffers package, not a dependency: the module is checked)."""
  x, mask = _inputs()
  splash, _ = _modules(True)
  variables = splash.init(jax.random.key(0), x[:, :8])
  grad = jax.jit(jax.grad(lambda v, x: splash.apply(v, x, mask=mask).sum(), argnums=(0, 1)))
  with platform.lowering_for("tpu"):
    exported = jax.export.export(grad, platforms=["tpu"])(variables, x)
  assert exported.platforms == ("tpu",)
  assert platform.kernels(exported.mlir_module()) == {"Pallas TPU kernel": 3}


@pytest.mark.parametrize("causal", [False, True])
def test_splash_with_keys_far_apart_equals_the_formula(causal):
  """Inputs ×30: logits spanning thousands, softmaxes near one-hot. Float32 logits that large carry rounding errors
  of ~1e-4 that exp amplifies, for any path: splash is held to the float64 formula as closely as plain is (within
  twice plain's error), and finite."""
  x = jnp.asarray(30 * np.random.default_rng(7).normal(size=(2, 128, 16)), jnp.float32)
  mask = jnp.asarray(np.arange(128)[None, :] < np.array([[100], [128]]))
  splash, plain = _modules(causal, num_heads=1)
  variables = plain.init(jax.random.key(5), x)
  want = _numpy_attention(x, mask, variables["params"], 1, causal)
  error = lambda module: np.abs(
    np.asarray(jax.jit(lambda v, x: module.apply(v, x, mask=mask))(variables, x), np.float64) - want
  ).max()
  assert np.isfinite(error(splash))
  assert error(splash) <= 2 * error(plain) + 1e-6 * np.abs(want).max(), (error(splash), error(plain))

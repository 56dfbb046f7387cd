"""Reversible layers: exact gradients from the recomputing backward pass, and memory that does not grow with depth."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import assert_close_gradients
from conftest import assert_close_sums
from conftest import mixer_config
from efftx import model as model_lib
from efftx import reversible
from efftx import trainer

B, L, D = 2, 16, 16


def _stack(mixer, causal, dropout, ff_chunk_size=0, num_layers=3):
  config = mixer_config(mixer, num_heads=2, causal=causal, max_len=L, window=4, d_model=D)
  make_mixer = trainer.parts(config).model.make_mixer
  return reversible.ReversibleStack(
    make_f=lambda: model_lib.MixingSublayer(make_mixer, dropout, parent=None),
    make_g=lambda: model_lib.FeedForwardSublayer(32, dropout, ff_chunk_size, parent=None),
    num_layers=num_layers,
  )


def _inputs():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  mask = np.ones((B, L), bool)
  mask[1, 11:] = False
  return jnp.asarray(x), jnp.asarray(mask)


@pytest.mark.parametrize(
  "mixer,causal", [("attention", True), ("fnet", False), ("aft_local", False), ("linear", False)]
)
def test_recomputing_backward_equals_plain_autodiff(mixer, causal):
  x, mask = _inputs()
  stack = _stack(mixer, causal, dropout=0.2)
  f, g = stack._apply_fns(deterministic=False)  # dropout on: the backward pass must replay it
  key = jax.random.key(7)
  weights = jnp.asarray(np.random.default_rng(1).normal(size=(B, L, D)).astype(np.float32))

  def loss(forward):
    def fn(layers, x1, x2):
      y1, y2 = forward(f, g, layers, x1, x2, mask, key)
      return ((y1 + 2 * y2) * weights).sum()

    return fn

  @jax.jit  # one program: the layers' init, and the gradients both ways
  def got_and_want():
    rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
    layers = stack.init(rngs, x, mask, False)["params"]["layers"]
    return tuple(
      jax.grad(loss(forward), argnums=(0, 1, 2))(layers, x, x)
      for forward in (reversible.reversible_forward, reversible.coupling_forward)
    )

  got, want = got_and_want()
  flat_got, flat_want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(flat_got) == len(flat_want) > 3
  # Equal up to rounding: each of the 3 layers reconstructs its inputs (two subtractions) and sums its weight
  # gradients over the B·L rows in another program than plain autodiff's, so the roundings of 3 · B·L terms, at
  # the size of each parameter's largest gradient entry (AFT's key bias, zero in exact arithmetic since a softmax
  # over positions does not see it, at the overall scale).
  assert_close_gradients(flat_got, flat_want, n_terms=3 * B * L)


def _train_step_temp_bytes(num_layers, reversible_, ff_chunk_size=0, length=256, mixer="attention", recompute=True):
  config = mixer_config(
    mixer,
    d_model=32,
    num_heads=4,
    d_ff=64,
    max_len=length,
    num_layers=num_layers,
    reversible=reversible_,
    reversible_recompute=recompute,
    ff_chunk_size=ff_chunk_size,
    attention_impl="plain",
  )
  parts = trainer.parts(config)
  tx, schedule = trainer.make_optimizer(config)
  step = trainer.make_train_step(parts.model, parts.objective, tx, schedule, jax.random.key(0))
  tokens = jnp.zeros((8, length), jnp.int32)
  state = jax.eval_shape(lambda: trainer.create_state(parts.model, tx, jax.random.key(0)))
  batch = {"tokens": tokens, "mask": jnp.ones((8, length), bool), "label": jnp.zeros((8,), jnp.int32)}
  compiled = jax.jit(step, donate_argnums=0).lower(state, batch).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_reversible_memory_does_not_grow_with_depth_and_stored_couplings_do():
  """The compiled train step's temp memory: reversible, 12 layers within 25% of 2 (its layers are a scan, so 12
  compile as fast as 2); model.reversible_recompute=False (the time claim's baseline: the same couplings
  differentiated by plain autodiff, their gradients equal by test_recomputing_backward_equals_plain_autodiff) stores
  every layer's activations, growing roughly linearly in depth (4 layers more than three quarters of twice 2's),
  which shows that the measure sees growth."""
  rev = {n: _train_step_temp_bytes(n, True) for n in (2, 12)}
  stored = {n: _train_step_temp_bytes(n, True, recompute=False) for n in (2, 4)}
  print("compiled temp bytes, reversible:", rev, "stored:", stored)
  assert rev[12] <= 1.25 * rev[2], rev
  assert stored[4] > 1.5 * stored[2], stored


def test_recomputing_costs_one_forward_pass_in_xla_flops(mixer="attention", causal=True):
  """XLA's cost analysis of the compiled gradient: recomputing (reversible_forward) against storing (the same
  couplings by plain autodiff) adds one forward pass of a layer, not none and not two. XLA counts a scanned loop's
  body once whatever its trip count, so with two layers (a loop) the counts are one layer's forward and backward
  work (with one, the scan is no loop, and the first layer's rebuilt input, which nothing needs, is dropped). One
  mixer: what recomputing adds does not depend on which (aft_local: 1.03 forward passes)."""
  x, mask = _inputs()
  stack = _stack(mixer, causal, dropout=0.0, num_layers=2)
  f, g = stack._apply_fns(deterministic=True)
  layers = stack.init(jax.random.key(0), x, mask, True)["params"]["layers"]
  key = jax.random.key(0)

  def flops(fn):
    return jax.jit(fn).lower(layers, x).compile().cost_analysis()["flops"]

  def outputs(forward):
    return lambda p, x: sum(y.sum() for y in forward(f, g, p, x, x, mask, key))

  forward = flops(outputs(reversible.coupling_forward))
  stored, recomputed = (
    flops(jax.grad(outputs(fn), argnums=(0, 1))) for fn in (reversible.coupling_forward, reversible.reversible_forward)
  )
  print(f"{mixer}: forward {forward:.0f}, gradient stored {stored:.0f}, recomputed {recomputed:.0f} FLOPs")
  assert stored > 2 * forward  # the gradient is the forward and about twice its work backwards
  assert 0.8 * forward < recomputed - stored < 1.2 * forward  # (0.90 here; 0.99–1.0 at the study's shapes)


def test_chunked_feed_forward_same_outputs_and_gradients():
  x, mask = _inputs()
  whole = model_lib.FeedForwardSublayer(64, 0.0, 0)
  chunked = model_lib.FeedForwardSublayer(64, 0.0, 4)
  params = jax.jit(lambda: chunked.init(jax.random.key(0), x, True)["params"])()
  # The chunked module keeps one FeedForward's parameters (shared by the chunks): map them onto the plain one.
  whole_params = {"norm": params["norm"], "ff": params["chunks"]["ff"]}
  # Equal up to the order of the sums: XLA may tile a chunk's matmuls (B·C rows) otherwise than the whole's (B·L),
  # and the weight gradients add 4 chunks' partial sums instead of one sum over the B·L rows. Forward: the
  # LayerNorm's statistics over D, the matmuls over D and d_ff; backward: the same sums again, then the rows.
  forward = 2 * D + 64

  @jax.jit  # one program: both modules' outputs and gradients
  def outputs_and_grads(params, whole_params):
    def one(module, p):
      y, vjp = jax.vjp(lambda p, x: module.apply({"params": p}, x, True), p, x)
      return y, vjp(2 * y)  # the gradients of (y ** 2).sum()

    return one(chunked, params), one(whole, whole_params)

  (y_c, (gp_c, gx_c)), (y_w, (gp_w, gx_w)) = outputs_and_grads(params, whole_params)
  assert_close_sums(y_c, y_w, n_terms=forward)
  assert_close_sums(gx_c, gx_w, n_terms=2 * forward)
  jax.tree.map(
    lambda a, b: assert_close_sums(a, b, n_terms=2 * forward + B * L),
    {"norm": gp_c["norm"], "ff": gp_c["chunks"]["ff"]},
    gp_w,
  )


def test_chunked_feed_forward_lowers_compiled_memory_at_long_length():
  whole = _train_step_temp_bytes(2, False, 0, length=2048, mixer="aft_simple")
  chunked = _train_step_temp_bytes(2, False, 256, length=2048, mixer="aft_simple")
  assert chunked < 0.8 * whole, (chunked, whole)


def test_reconstruction_error_is_small_in_float32():
  x, mask = _inputs()
  stack = _stack("attention", False, dropout=0.0, num_layers=6)
  layers = jax.jit(lambda: stack.init(jax.random.key(0), x, mask, True)["params"]["layers"])()
  f, g = stack._apply_fns(deterministic=True)
  errors = np.asarray(
    jax.jit(lambda layers, x: reversible.reconstruction_errors(f, g, layers, x, mask, jax.random.key(0)))(layers, x)
  )
  assert errors.shape == (6,) and errors.max() < 1e-4, errors

"""Reversible residual layers (RevNet coupling, as in Reformer): memory that does not grow with depth.

The activations are two streams (x1, x2), both starting as the embedding. Each layer computes

    y1 = x1 + F(x2)        F = the mixing sublayer (norm, mixer, dropout)
    y2 = x2 + G(y1)        G = the feed-forward sublayer (norm, feed-forward, dropout)

and the stack returns (y1 + y2) / 2. The backward pass (a jax.custom_vjp) keeps only the last layer's outputs and
walks the layers in reverse, rebuilding each layer's inputs from its outputs, x2 = y2 − G(y1), x1 = y1 − F(x2),
and differentiating F and G on the way. The layers' parameters are stacked along a leading axis and the layers
run under jax.lax.scan, so compile time and memory do not grow with depth. Dropout in F and G draws from keys
folded per layer, so the recomputation replays it exactly.

Precision: the rebuilt inputs differ from the true ones by rounding, and the difference accumulates with depth:
max |x_rebuilt − x| (inputs ~N(0, 1)) is about 5e-7 after one layer and 2e-5 after 48 in float32 — safe — but
3e-2 and 0.6 in bfloat16, so use float32 for reversible stacks deeper than a few layers (`efftx.bench
--mode=reversible` prints it; experiments/reversible/README.md).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

# (params, x_BxLxD, mask_BxL, dropout_key) → F(x); (params, x_BxLxD, dropout_key) → G(x)
FApply = Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]
GApply = Callable[[Any, jax.Array, jax.Array], jax.Array]


def _layer_keys(key: jax.Array, layer: jax.Array) -> tuple[jax.Array, jax.Array]:
  layer_key = jax.random.fold_in(key, layer)
  return jax.random.fold_in(layer_key, 0), jax.random.fold_in(layer_key, 1)


def coupling_forward(f: FApply, g: GApply, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key):
  """The stack of couplings, differentiable by plain autodiff (which stores every layer's activations)."""

  def layer(carry, inputs):
    x1, x2 = carry
    params, index = inputs
    key_f, key_g = _layer_keys(key, index)
    y1 = x1 + f(params["F"], x2, mask_BxL, key_f)
    y2 = x2 + g(params["G"], y1, key_g)
    return (y1, y2), None

  num_layers = jax.tree.leaves(layers)[0].shape[0]
  (y1, y2), _ = jax.lax.scan(layer, (x1_BxLxD, x2_BxLxD), (layers, jnp.arange(num_layers)))
  return y1, y2


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def reversible_forward(f: FApply, g: GApply, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key):
  """The same function as coupling_forward, with a backward pass that recomputes instead of storing."""
  return coupling_forward(f, g, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key)


def _reversible_fwd(f, g, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key):
  y1, y2 = coupling_forward(f, g, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key)
  return (y1, y2), (layers, y1, y2, mask_BxL, key)  # only the outputs are kept, whatever the depth


def _reversible_bwd(f, g, residuals, cotangents):
  layers, y1, y2, mask_BxL, key = residuals
  dy1, dy2 = cotangents

  def layer_back(carry, inputs):
    y1, y2, dy1, dy2 = carry
    params, index = inputs
    key_f, key_g = _layer_keys(key, index)
    # y2 = x2 + G(y1): rebuild x2, pass dy2 back through G.
    g_y1, g_vjp = jax.vjp(lambda p, y: g(p, y, key_g), params["G"], y1)
    x2 = y2 - g_y1
    d_params_g, dy1_through_g = g_vjp(dy2)
    dy1 = dy1 + dy1_through_g
    # y1 = x1 + F(x2): rebuild x1, pass dy1 back through F.
    f_x2, f_vjp = jax.vjp(lambda p, x: f(p, x, mask_BxL, key_f), params["F"], x2)
    x1 = y1 - f_x2
    d_params_f, dx2_through_f = f_vjp(dy1)
    return (x1, x2, dy1, dy2 + dx2_through_f), {"F": d_params_f, "G": d_params_g}

  num_layers = jax.tree.leaves(layers)[0].shape[0]
  (_, _, dx1, dx2), d_layers = jax.lax.scan(layer_back, (y1, y2, dy1, dy2), (layers, jnp.arange(num_layers)),
                                            reverse=True)
  return d_layers, dx1, dx2, None, None


reversible_forward.defvjp(_reversible_fwd, _reversible_bwd)


def reconstruction_errors(f: FApply, g: GApply, layers, x_BxLxD, mask_BxL, key) -> jax.Array:
  """max |x_rebuilt − x| of the stack's input, rebuilt from the outputs of the first n layers, for n = 1 … depth."""

  def rebuild(n):
    sub = jax.tree.map(lambda p: p[:n], layers)
    y1, y2 = coupling_forward(f, g, sub, x_BxLxD, x_BxLxD, mask_BxL, key)

    def layer_back(carry, inputs):
      y1, y2 = carry
      params, index = inputs
      key_f, key_g = _layer_keys(key, index)
      x2 = y2 - g(params["G"], y1, key_g)
      return (y1 - f(params["F"], x2, mask_BxL, key_f), x2), None

    (x1, x2), _ = jax.lax.scan(layer_back, (y1, y2), (sub, jnp.arange(n)), reverse=True)
    return jnp.maximum(jnp.abs(x1 - x_BxLxD).max(), jnp.abs(x2 - x_BxLxD).max())

  depth = jax.tree.leaves(layers)[0].shape[0]
  return jnp.stack([rebuild(n) for n in range(1, depth + 1)])


class ReversibleStack(nn.Module):
  """num_layers reversible couplings of F = mixing sublayer and G = feed-forward sublayer."""

  make_f: Callable[[], nn.Module]   # builds the (unbound) mixing sublayer
  make_g: Callable[[], nn.Module]   # builds the (unbound) feed-forward sublayer
  num_layers: int

  def _apply_fns(self, deterministic: bool) -> tuple[FApply, GApply]:
    f_module, g_module = self.make_f(), self.make_g()

    def f(params, x, mask, key):
      return f_module.apply({"params": params}, x, mask, deterministic, rngs={"dropout": key})

    def g(params, x, key):
      return g_module.apply({"params": params}, x, deterministic, rngs={"dropout": key})

    return f, g

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, deterministic: bool) -> jax.Array:
    def init_layers(rng, shape, dtype):
      x, mask = jnp.zeros(shape, dtype), jnp.ones(shape[:2], bool)

      def one_layer(layer_rng):
        rng_f, rng_g = jax.random.split(layer_rng)
        return {"F": self.make_f().init(rng_f, x, mask, True)["params"],
                "G": self.make_g().init(rng_g, x, True)["params"]}

      return jax.vmap(one_layer)(jax.random.split(rng, self.num_layers))

    layers = self.param("layers", init_layers, x_BxLxD.shape, x_BxLxD.dtype)  # every leaf: num_layers × …
    key = jax.random.key(0) if deterministic else self.make_rng("dropout")
    f, g = self._apply_fns(deterministic)
    y1, y2 = reversible_forward(f, g, layers, x_BxLxD, x_BxLxD, mask_BxL, key)
    return (y1 + y2) / 2

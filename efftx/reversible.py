"""Reversible residual layers (RevNet coupling, as in Reformer): memory that does not grow with depth.

The activations are two streams (x1, x2), both starting as the embedding. Each layer computes

    y1 = x1 + F(x2)        F = the mixing sublayer (norm, mixer, dropout)
    y2 = x2 + G(y1)        G = the feed-forward sublayer (norm, feed-forward, dropout)

and the stack returns (y1 + y2) / 2. The backward pass (a jax.custom_vjp) keeps only the last layer's outputs and
walks the layers in reverse, rebuilding each layer's inputs from its outputs, x2 = y2 − G(y1), x1 = y1 − F(x2),
and differentiating F and G on the way. The layers' parameters are stacked along a leading axis and the layers
run under jax.lax.scan, so compile time and memory do not grow with depth. Dropout in F and G draws from keys
folded per layer, so the recomputation replays it exactly. With a layer pattern (layers with different mixers),
each run of consecutive layers with the same mixer is a segment with its own F and its own stacked parameters;
the segments run one after another inside the same custom_vjp, so the memory kept is still one layer's outputs.

Precision: the rebuilt inputs differ from the true ones by rounding, and the difference accumulates with depth:
max |x_rebuilt − x| (inputs ~N(0, 1)) is about 5e-7 after one layer and 2e-5 after 48 in float32 — safe — but
3e-2 and 0.6 in bfloat16, so use float32 for reversible stacks deeper than a few layers (`efftx.bench
--mode=reversible` prints it; experiments/reversible/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# (params, x_BxLxD, mask_BxL, dropout_key) → F(x); (params, x_BxLxD, dropout_key) → G(x)
FApply = Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]
GApply = Callable[[Any, jax.Array, jax.Array], jax.Array]


def _layer_keys(key: jax.Array, layer: jax.Array) -> tuple[jax.Array, jax.Array]:
  layer_key = jax.random.fold_in(key, layer)
  return jax.random.fold_in(layer_key, 0), jax.random.fold_in(layer_key, 1)


def _segments(f, layers):
  """(F, stacked parameters, index of the segment's first layer) per segment: f and layers are one F and one stack,
  or tuples of them, one per segment."""
  fs, stacks = (f, layers) if isinstance(f, tuple) else ((f,), (layers,))
  sizes = [jax.tree.leaves(stack)[0].shape[0] for stack in stacks]
  starts = [sum(sizes[:i]) for i in range(len(sizes))]
  return list(zip(fs, stacks, starts, sizes))


def coupling_forward(f: FApply | tuple[FApply, ...], g: GApply, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key):
  """The stack of couplings, differentiable by plain autodiff (which stores every layer's activations). f and
  layers: one F and its stacked parameters, or a tuple of each, one per segment."""
  y1, y2 = x1_BxLxD, x2_BxLxD
  for f_segment, stack, start, size in _segments(f, layers):

    def layer(carry, inputs, f_segment=f_segment):
      x1, x2 = carry
      params, index = inputs
      key_f, key_g = _layer_keys(key, index)
      y1 = x1 + f_segment(params["F"], x2, mask_BxL, key_f)
      y2 = x2 + g(params["G"], y1, key_g)
      return (y1, y2), None

    (y1, y2), _ = jax.lax.scan(layer, (y1, y2), (stack, start + jnp.arange(size)))
  return y1, y2


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def reversible_forward(f: FApply | tuple[FApply, ...], g: GApply, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key):
  """The same function as coupling_forward, with a backward pass that recomputes instead of storing."""
  return coupling_forward(f, g, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key)


def _reversible_fwd(f, g, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key):
  y1, y2 = coupling_forward(f, g, layers, x1_BxLxD, x2_BxLxD, mask_BxL, key)
  return (y1, y2), (layers, y1, y2, mask_BxL, key)  # only the outputs are kept, whatever the depth


def _reversible_bwd(f, g, residuals, cotangents):
  layers, y1, y2, mask_BxL, key = residuals
  dy1, dy2 = cotangents
  d_stacks = []
  for f_segment, stack, start, size in reversed(_segments(f, layers)):

    def layer_back(carry, inputs, f_segment=f_segment):
      y1, y2, dy1, dy2 = carry
      params, index = inputs
      key_f, key_g = _layer_keys(key, index)
      # y2 = x2 + G(y1): rebuild x2, pass dy2 back through G.
      g_y1, g_vjp = jax.vjp(lambda p, y: g(p, y, key_g), params["G"], y1)
      x2 = y2 - g_y1
      d_params_g, dy1_through_g = g_vjp(dy2)
      dy1 = dy1 + dy1_through_g
      # y1 = x1 + F(x2): rebuild x1, pass dy1 back through F.
      f_x2, f_vjp = jax.vjp(lambda p, x: f_segment(p, x, mask_BxL, key_f), params["F"], x2)
      x1 = y1 - f_x2
      d_params_f, dx2_through_f = f_vjp(dy1)
      return (x1, x2, dy1, dy2 + dx2_through_f), {"F": d_params_f, "G": d_params_g}

    (y1, y2, dy1, dy2), d_stack = jax.lax.scan(
      layer_back, (y1, y2, dy1, dy2), (stack, start + jnp.arange(size)), reverse=True
    )
    d_stacks.insert(0, d_stack)
  d_layers = tuple(d_stacks) if isinstance(f, tuple) else d_stacks[0]
  return d_layers, dy1, dy2, None, None


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
  """num_layers reversible couplings of F = mixing sublayer and G = feed-forward sublayer. With segment_sizes,
  make_f is a tuple with one maker per segment (consecutive layers sharing a mixer) and each segment's parameters
  are stacked on their own ("segment_<s>"); without, one stack of every layer ("layers")."""

  make_f: Callable[[], nn.Module] | tuple[Callable[[], nn.Module], ...]  # builds the (unbound) mixing sublayer
  make_g: Callable[[], nn.Module]  # builds the (unbound) feed-forward sublayer
  num_layers: int
  segment_sizes: tuple[int, ...] = ()  # layers per segment, summing to num_layers; () = one segment
  # False: the same couplings differentiated by plain autodiff, which stores every layer's activations — the
  # baseline that isolates what recomputing costs (same scanned program, same function, another backward pass).
  recompute: bool = True

  def _apply_fns(self, deterministic: bool) -> tuple[FApply | tuple[FApply, ...], GApply]:
    """F (a tuple of one per segment with segment_sizes) and G as functions of (params, inputs, key)."""
    g_module = self.make_g()

    def f_of(f_module):
      def f(params, x, mask, key):
        return f_module.apply({"params": params}, x, mask, deterministic, rngs={"dropout": key})

      return f

    def g(params, x, key):
      return g_module.apply({"params": params}, x, deterministic, rngs={"dropout": key})

    if isinstance(self.make_f, tuple):
      return tuple(f_of(make()) for make in self.make_f), g
    return f_of(self.make_f()), g

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, deterministic: bool) -> jax.Array:
    makers = self.make_f if isinstance(self.make_f, tuple) else (self.make_f,)
    sizes = self.segment_sizes or (self.num_layers,)
    if len(makers) != len(sizes) or sum(sizes) != self.num_layers:
      raise ValueError(f"{len(makers)} mixing sublayers for segments {sizes} of {self.num_layers} layers")

    def init_layers(rng, shape, dtype, make_f, size):
      x, mask = jnp.zeros(shape, dtype), jnp.ones(shape[:2], bool)

      def one_layer(layer_rng):
        rng_f, rng_g = jax.random.split(layer_rng)
        return {"F": make_f().init(rng_f, x, mask, True)["params"], "G": self.make_g().init(rng_g, x, True)["params"]}

      return jax.vmap(one_layer)(jax.random.split(rng, size))

    if not isinstance(self.make_f, tuple):  # every leaf: num_layers × …
      layers = self.param("layers", init_layers, x_BxLxD.shape, x_BxLxD.dtype, makers[0], sizes[0])
    else:  # every leaf of segment s: sizes[s] × …
      layers = tuple(
        self.param(f"segment_{s}", init_layers, x_BxLxD.shape, x_BxLxD.dtype, make_f, size)
        for s, (make_f, size) in enumerate(zip(makers, sizes))
      )
    key = jax.random.key(0) if deterministic else self.make_rng("dropout")
    f, g = self._apply_fns(deterministic)
    forward = reversible_forward if self.recompute else coupling_forward
    y1, y2 = forward(f, g, layers, x_BxLxD, x_BxLxD, mask_BxL, key)
    return (y1 + y2) / 2

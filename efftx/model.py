"""The Transformer around a token mixer: embeddings → pre-LN blocks (mixer, feed-forward) → final norm → head.

`build_model(config)` picks the mixer by name from `efftx.mixers.MIXERS` and the head from the task:
  - "classify": logits_BxC from the mean of the final states over real tokens;
  - "lm": logits_BxLxV at every position (next-token prediction; needs a causal mixer).
Applied as `model.apply(variables, tokens_BxL, mask=mask_BxL, deterministic=True)`.
"""
from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from efftx import config as config_lib
from efftx.data import TASKS
from efftx.mixers import MIXERS


class FeedForward(nn.Module):
  d_ff: int
  dropout: float

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, deterministic: bool) -> jax.Array:
    h_BxLxF = nn.gelu(nn.Dense(self.d_ff, dtype=x_BxLxD.dtype, name="up")(x_BxLxD))
    h_BxLxF = nn.Dropout(self.dropout)(h_BxLxF, deterministic=deterministic)
    return nn.Dense(x_BxLxD.shape[-1], dtype=x_BxLxD.dtype, name="down")(h_BxLxF)


class Block(nn.Module):
  """x + mixer(LN(x)), then x + FF(LN(x)); dropout on both residual branches."""

  make_mixer: Callable[..., nn.Module]
  d_ff: int
  dropout: float

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, deterministic: bool, decode: bool = False) -> jax.Array:
    norm = lambda name: nn.LayerNorm(dtype=x_BxLxD.dtype, name=name)  # statistics in float32 regardless
    mixer_args = {"decode": True} if decode else {}
    h_BxLxD = self.make_mixer(name="mixer")(norm("mixer_norm")(x_BxLxD), mask=mask_BxL, deterministic=deterministic,
                                            **mixer_args)
    x_BxLxD = x_BxLxD + nn.Dropout(self.dropout)(h_BxLxD, deterministic=deterministic)
    h_BxLxD = FeedForward(self.d_ff, self.dropout, name="ff")(norm("ff_norm")(x_BxLxD), deterministic)
    return x_BxLxD + nn.Dropout(self.dropout)(h_BxLxD, deterministic=deterministic)


class Transformer(nn.Module):
  make_mixer: Callable[..., nn.Module]
  vocab_size: int
  num_classes: int
  objective: str        # "classify" or "lm"
  d_model: int
  num_layers: int
  d_ff: int
  max_len: int
  dropout: float
  dtype: str = "float32"  # compute dtype; parameters stay float32, logits are float32

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False) -> jax.Array:
    """Logits. With decode=True (causal LMs), after `init(key, tokens_BxT, decode=True)` made the cache for T
    positions: one token per call, `apply({**variables, "cache": cache}, tokens_Bx1, decode=True,
    mutable=["cache"])`, each mixed with the ones before it."""
    _, L = tokens_BxL.shape
    if L > self.max_len:
      raise ValueError(f"sequence length {L} exceeds max_len={self.max_len}")
    mask_BxL = jnp.ones(tokens_BxL.shape, bool) if mask is None else mask.astype(bool)

    dtype = jnp.dtype(self.dtype)
    x_BxLxD = nn.Embed(self.vocab_size, self.d_model, embedding_init=nn.initializers.normal(0.02), dtype=dtype,
                       name="embed")(tokens_BxL)
    pos_MxD = self.param("pos_embed", nn.initializers.normal(0.02), (self.max_len, self.d_model))
    pos_LxD = pos_MxD[:L]
    if decode:
      decoding = self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      if decoding:
        pos_LxD = jax.lax.dynamic_slice_in_dim(pos_MxD, position.value, L)
        position.value += L
    x_BxLxD = nn.Dropout(self.dropout)(x_BxLxD + pos_LxD.astype(dtype), deterministic=deterministic)
    for i in range(self.num_layers):
      x_BxLxD = Block(self.make_mixer, self.d_ff, self.dropout, name=f"block_{i}")(x_BxLxD, mask_BxL, deterministic,
                                                                                  decode)
    x_BxLxD = nn.LayerNorm(dtype=jnp.float32, name="final_norm")(x_BxLxD)  # the heads run in float32

    if self.objective == "lm":
      return nn.Dense(self.vocab_size, name="lm_head")(x_BxLxD)
    # Mean over real tokens only, so padding never reaches the classifier.
    weights_BxL = mask_BxL.astype(x_BxLxD.dtype)
    pooled_BxD = jnp.einsum("bld,bl->bd", x_BxLxD, weights_BxL) / jnp.maximum(weights_BxL.sum(-1, keepdims=True), 1)
    h_BxD = nn.relu(nn.Dense(self.d_model, name="pool_dense")(pooled_BxD))
    return nn.Dense(self.num_classes, name="classifier")(h_BxD)


def build_model(config: ml_collections.ConfigDict) -> Transformer:
  """The model for a full run config: mixer from config.model.mixer, vocabulary and head from config.data.task."""
  task = TASKS[config.data.task]
  mixer_cls = MIXERS[config.model.mixer]
  m = config.model
  return Transformer(
      make_mixer=functools.partial(mixer_cls, **config_lib.mixer_kwargs(mixer_cls, m)),
      vocab_size=task.vocab_size, num_classes=task.num_classes, objective=task.objective,
      d_model=m.d_model, num_layers=m.num_layers, d_ff=m.d_ff, max_len=m.max_len, dropout=m.dropout, dtype=m.dtype)

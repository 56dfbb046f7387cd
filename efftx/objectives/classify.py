"""Sequence classification: one label per sequence, from the mean of the final states over real tokens, the
learned [CLS] position's state (config.model.pooling="cls"), or the input's own first token through a pooler
(pooling="first": a pretrained checkpoint's [CLS] and its pooler)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.objectives import base


def _head(x_BxLxD: jax.Array, mask_BxL: jax.Array, *, num_classes: int, pooling: str) -> jax.Array:
  """logits_BxC: the mean over real tokens only (padding never reaches the classifier), or the [CLS] position's
  state (LRA's way), then a ReLU layer and a linear one (LRA's classifier head). pooling="first": the first
  position's state through "pooler" (dense + tanh, BERT's and FNet's pooler, converted with a checkpoint), then a
  linear classifier, as f_net's SequenceClassificationModel does (no dropout between them)."""
  if pooling == "first":
    pooled_BxD = jnp.tanh(nn.Dense(x_BxLxD.shape[-1], name="pooler")(x_BxLxD[:, 0]))
    return nn.Dense(num_classes, name="classifier")(pooled_BxD)
  if pooling == "cls":
    pooled_BxD = x_BxLxD[:, 0]
  else:
    weights_BxL = mask_BxL.astype(x_BxLxD.dtype)
    pooled_BxD = jnp.einsum("bld,bl->bd", x_BxLxD, weights_BxL) / jnp.maximum(weights_BxL.sum(-1, keepdims=True), 1)
  h_BxD = nn.relu(nn.Dense(x_BxLxD.shape[-1], name="pool_dense")(pooled_BxD))
  return nn.Dense(num_classes, name="classifier")(h_BxD)


class Classify(base.Objective):
  batch_keys = ("label",)
  fresh_params = ("pool_dense", "classifier")
  optional_params = ("pooler",)

  def check(self, config, task) -> None:
    if task.objective != "classify":
      raise UserError(f"task '{config.data.task}' has no labels to classify (its objective is '{task.objective}')")

  def head(self, vocab_size: int, num_classes: int, pooling: str = "mean") -> base.Head:
    del vocab_size
    return functools.partial(_head, num_classes=num_classes, pooling=pooling)

  def loss_sums(self, logits_BxC, batch, row_weights_B):
    return base.cross_entropy_sums(logits_BxC, batch["label"], row_weights_B)

"""The interface every objective implements, and the weighted-sum loss the per-position objectives share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

# (final states x_BxLxD in float32, mask_BxL) → logits; called inside the model, so its parameters are the
# model's (named by the objective, e.g. "classifier").
Head = Callable[[jax.Array, jax.Array], jax.Array]


class Objective:
  """What an objective declares and does. Subclasses set the class attributes and override the methods."""

  batch_keys: tuple[str, ...] = ()  # what the loss reads from a batch besides "tokens" and "mask"
  fresh_params: tuple[str, ...] = ()  # the head's top-level parameter names: new when fine-tuning (init_from)
  # the head's parameters a pretrained model may bring (a checkpoint's pooler): loaded by init_from when the source
  # has them, new otherwise
  optional_params: tuple[str, ...] = ()
  next_token: bool = False  # predicts the next token: a causal LM that can generate text

  def check(self, config, task) -> None:
    """Raises UserError if this objective cannot train on `task` with `config` (e.g. an LM that is not causal)."""

  def head(self, vocab_size: int, num_classes: int, pooling: str = "mean") -> Head:
    """The head for a vocabulary, a class count, and config.model.pooling ("cls": the model put a [CLS] vector
    at position 0; "first": the input's own first token)."""
    raise NotImplementedError

  def loss_sums(self, logits: jax.Array, batch: dict[str, jax.Array], row_weights_B: jax.Array) -> dict[str, jax.Array]:
    """Weighted sums (not means) of "loss", "correct" and "count", so that batches, devices and padded eval rows
    (row weight 0) combine exactly."""
    raise NotImplementedError

  def summarize(
    self, sums: dict[str, jax.Array], token_unit: str | None = None, prefix: str = ""
  ) -> dict[str, jax.Array]:
    """Metrics from (summed) loss sums: loss in nats and accuracy."""
    count = jnp.maximum(sums["count"], 1.0)
    return {f"{prefix}loss": sums["loss"] / count, f"{prefix}accuracy": sums["correct"] / count}

  def corrupt(self, ds: Any, task, seed: int) -> Any:
    """The encoded grain MapDataset this objective trains on (masked-LM corrupts it; others leave it)."""
    del task, seed
    return ds


def cross_entropy_sums(logits_NxC: jax.Array, labels_N: jax.Array, weights_N: jax.Array) -> dict[str, jax.Array]:
  """Weighted sums of softmax cross-entropy, correct argmax predictions, and weights."""
  loss_N = optax.softmax_cross_entropy_with_integer_labels(logits_NxC.astype(jnp.float32), labels_N)
  correct_N = (jnp.argmax(logits_NxC, -1) == labels_N).astype(jnp.float32)
  weights_N = weights_N.astype(jnp.float32)
  return {"loss": (loss_N * weights_N).sum(), "correct": (correct_N * weights_N).sum(), "count": weights_N.sum()}


def per_position_sums(
  logits_BxLxV: jax.Array, batch: dict[str, jax.Array], row_weights_B: jax.Array
) -> dict[str, jax.Array]:
  """Cross-entropy sums over the positions with weight > 0: batch["targets"] and batch["weights"], both B×L."""
  weights_BxL = batch["weights"] * row_weights_B[:, None]
  return cross_entropy_sums(
    logits_BxLxV.reshape(-1, logits_BxLxV.shape[-1]), batch["targets"].reshape(-1), weights_BxL.reshape(-1)
  )

"""Per-position prediction with a causal mixer: the next token, or a task's own per-position targets (MQAR's
query answers). Scored over the positions of weight > 0; bits per token unit (byte, dim) where the task has one."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.objectives import base


def lm_head(x_BxLxD: jax.Array, mask_BxL: jax.Array, *, vocab_size: int) -> jax.Array:
  """logits_BxLxV at every position."""
  del mask_BxL
  return nn.Dense(vocab_size, name="lm_head")(x_BxLxD)


class PerPosition(base.Objective):
  """What next-token and masked-LM share: an LM head at every position, cross-entropy where weights > 0."""

  batch_keys = ("targets", "weights")  # and "positions" where a task scores a few positions (their targets)
  fresh_params = ("lm_head",)

  def check(self, config, task) -> None:
    del task
    if config.model.pooling != "mean":
      raise UserError(
        f"config.model.pooling='{config.model.pooling}' is for classification: a [CLS] position "
        "would shift every per-position prediction"
      )

  def head(self, vocab_size: int, num_classes: int, pooling: str = "mean") -> base.Head:
    del num_classes, pooling  # config.model.pooling="cls" is refused (check)
    return functools.partial(lm_head, vocab_size=vocab_size)

  def loss_sums(self, logits_BxLxV, batch, row_weights_B):
    return base.per_position_sums(logits_BxLxV, batch, row_weights_B)


class NextToken(PerPosition):
  next_token = True

  def check(self, config, task) -> None:
    if task.objective != "lm":
      raise UserError(f"task '{config.data.task}' has objective '{task.objective}'; only 'mlm' can replace it")
    if not config.model.causal:
      raise UserError(f"task '{config.data.task}' is language modelling: set config.model.causal=True")
    super().check(config, task)

  def summarize(self, sums, token_unit=None, prefix=""):
    out = super().summarize(sums, token_unit, prefix)
    if token_unit:
      out[f"{prefix}bits_per_{token_unit}"] = out[f"{prefix}loss"] / jnp.log(2.0)
    return out

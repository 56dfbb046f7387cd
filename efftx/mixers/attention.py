"""Multi-head softmax attention: the baseline every other mixer is measured against."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


class Attention(nn.Module):
  """Softmax attention over the sequence, bidirectional or causal, with a padding mask.

  Queries attend to keys where `mask` is True (and, if causal, to keys at or before their own position).
  A query at a padded position still gets an output (it attends to the real keys); the model ignores it.
  """

  num_heads: int = 4
  causal: bool = False
  attention_dropout: float = 0.0  # dropout on the attention probabilities

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    _, L, D = x_BxLxD.shape
    if D % self.num_heads:
      raise ValueError(f"attention: d_model={D} is not divisible by num_heads={self.num_heads}")
    H, K = self.num_heads, D // self.num_heads

    qkv_BxLx3xHxK = nn.DenseGeneral((3, H, K), dtype=x_BxLxD.dtype, name="qkv")(x_BxLxD)
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = (qkv_BxLx3xHxK[:, :, i] for i in range(3))
    logits_BxHxLxL = jnp.einsum("bqhk,bthk->bhqt", q_BxLxHxK, k_BxLxHxK) / jnp.sqrt(K).astype(x_BxLxD.dtype)

    allowed_1x1xLxL = jnp.ones((1, 1, L, L), bool)
    if self.causal:
      allowed_1x1xLxL = jnp.tril(allowed_1x1xLxL)
    allowed_Bx1xLxL = allowed_1x1xLxL if mask is None else allowed_1x1xLxL & mask[:, None, None, :]
    # The most negative finite value, not -inf: a row with no allowed key (a padded query) stays finite.
    logits_BxHxLxL = jnp.where(allowed_Bx1xLxL, logits_BxHxLxL.astype(jnp.float32), jnp.finfo(jnp.float32).min)
    probs_BxHxLxL = jax.nn.softmax(logits_BxHxLxL, axis=-1).astype(x_BxLxD.dtype)
    probs_BxHxLxL = nn.Dropout(self.attention_dropout)(probs_BxHxLxL, deterministic=deterministic)

    out_BxLxHxK = jnp.einsum("bhqt,bthk->bqhk", probs_BxHxLxL, v_BxLxHxK)
    return nn.DenseGeneral(D, axis=(-2, -1), dtype=x_BxLxD.dtype, name="out")(out_BxLxHxK)

"""Sliding-window softmax attention: each query sees keys with |t − t'| < window (causal: t − window < t' ≤ t),
computed on blocks in O(T·window·d) time and memory. Attention dropout acts on the blocks' probabilities, within
that memory. LRA's "Local Attention" baseline is block-local instead: see `block_local`."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.fields import Field
from efftx.mixers import banded
from efftx.mixers.attention import ATTENTION_DROPOUT
from efftx.mixers.attention import HEADS
from efftx.mixers.attention import decode_step
from efftx.mixers.attention import merge_heads
from efftx.mixers.attention import qkv_heads
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import padded

_NEG = jnp.finfo(jnp.float32).min


class LocalAttention(nn.Module):
  num_heads: int = 4
  causal: bool = False
  window: int = 32  # keys with |t − t'| < window are seen
  attention_dropout: float = 0.0  # dropout rate on the attention probabilities

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    B, L, _ = x_BxLxD.shape
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = qkv_heads(x_BxLxD, self.num_heads)
    if decode and (cached := decode_step(self, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, self.window)) is not None:
      return merge_heads(cached)
    key_mask_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    b, _, _, in_band_NxBxC = banded.band(L, self.window, self.causal)

    q_BxNxBxHxK = banded.blocks(q_BxLxHxK * q_BxLxHxK.shape[-1] ** -0.5, b)
    k_BxNxCxHxK, v_BxNxCxHxK = banded.context(k_BxLxHxK, b), banded.context(v_BxLxHxK, b)
    allowed_BxNx1xBxC = in_band_NxBxC[None, :, None] & banded.context(key_mask_BxL, b)[:, :, None, None, :]
    logits_BxNxHxBxC = jnp.einsum("znqhk,znchk->znhqc", q_BxNxBxHxK, k_BxNxCxHxK).astype(jnp.float32)
    probs_BxNxHxBxC = jax.nn.softmax(jnp.where(allowed_BxNx1xBxC, logits_BxNxHxBxC, _NEG), axis=-1)
    probs_BxNxHxBxC = nn.Dropout(self.attention_dropout)(probs_BxNxHxBxC, deterministic=deterministic)
    out_BxNxBxHxK = jnp.einsum("znhqc,znchk->znqhk", probs_BxNxHxBxC.astype(v_BxLxHxK.dtype), v_BxNxCxHxK)
    return merge_heads(banded.unblocks(out_BxNxBxHxK, L))


def _flops(options, L: int, d: int, causal: bool) -> float:
  """Each block of b = min(window, L) queries against its 3b context keys, QKᵀ and the weighted sum of V (causal
  or not: the band is masked, not cut)."""
  del causal
  b = min(options["window"], L)
  return 12 * b * d * padded(L, b) / L


SPEC = MixerSpec(
  LocalAttention,
  "sliding-window softmax attention; O(L·window·d)",
  can_decode=True,
  flops=_flops,
  options={
    "num_heads": HEADS,
    "window": Field("keys with |t − t'| < window are seen (tokens)", at_least=1),
    "attention_dropout": ATTENTION_DROPOUT,
  },
)

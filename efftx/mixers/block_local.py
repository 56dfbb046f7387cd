"""Block-local softmax attention: LRA's "Local Attention" baseline. The sequence is cut into blocks of
`block_size` positions and each query attends only to the keys of its own block (causal: those not after it), so
time and memory are O(L·block_size·d) and no information crosses a block boundary within a layer.

`grouping` chooses which positions share a block:
  - "contiguous" (default; the paper's description): positions n·b … n·b + b − 1;
  - "strided": what LRA's published code computes (lra_benchmarks/models/local/local_attention.py reshapes
    [batch, length, ...] to [batch, block_size, num_blocks, ...] and attends over the block_size axis), so a block
    holds the positions congruent modulo the number of blocks N = ⌈L / b⌉ (t, t + N, t + 2N, …): dilated, not local.
    That code also cuts its padding mask into contiguous blocks, inconsistently with its strided grouping; here both
    groupings mask padded keys by their real positions.
Compare with `local` (a sliding window of |t − t'| < window around every query).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.attention import ATTENTION_DROPOUT
from efftx.mixers.attention import HEADS
from efftx.mixers.attention import merge_heads
from efftx.mixers.attention import qkv_heads
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import padded

_NEG = jnp.finfo(jnp.float32).min
GROUPINGS = ("contiguous", "strided")


def groups(L: int, block_size: int, grouping: str) -> jax.Array:
  """N×b: the positions of each block (positions ≥ L are padding), N = ⌈L / b⌉."""
  b = min(block_size, L)
  N = -(-L // b)
  if grouping == "contiguous":
    return jnp.arange(N * b).reshape(N, b)
  return jnp.arange(N * b).reshape(b, N).T  # block n holds n, n + N, n + 2N, ...


class BlockLocalAttention(nn.Module):
  num_heads: int = 4
  causal: bool = False
  block_size: int = 50  # LRA's default
  grouping: str = "contiguous"
  attention_dropout: float = 0.0

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    if decode:
      raise UserError(
        "block_local: incremental decoding is not supported; sample from a model with another causal mixer"
      )
    B, L, _ = x_BxLxD.shape
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = qkv_heads(x_BxLxD, self.num_heads)
    key_mask_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    pos_NxC = groups(L, self.block_size, self.grouping)
    N, C = pos_NxC.shape
    pad = lambda x: jnp.pad(x, [(0, 0), (0, N * C - L)] + [(0, 0)] * (x.ndim - 2))
    gather = lambda x: pad(x)[:, pos_NxC]  # B×N×C×…
    q_BxNxCxHxK = gather(q_BxLxHxK * q_BxLxHxK.shape[-1] ** -0.5)
    k_BxNxCxHxK, v_BxNxCxHxK = gather(k_BxLxHxK), gather(v_BxLxHxK)
    allowed_BxNx1xCxC = jnp.broadcast_to(gather(key_mask_BxL)[:, :, None, None, :], (B, N, 1, C, C))
    if self.causal:
      allowed_BxNx1xCxC &= (pos_NxC[:, None, :] <= pos_NxC[:, :, None])[None, :, None]
    logits_BxNxHxCxC = jnp.einsum("bnqhk,bnchk->bnhqc", q_BxNxCxHxK, k_BxNxCxHxK).astype(jnp.float32)
    probs_BxNxHxCxC = jax.nn.softmax(jnp.where(allowed_BxNx1xCxC, logits_BxNxHxCxC, _NEG), axis=-1)
    probs_BxNxHxCxC = nn.Dropout(self.attention_dropout)(probs_BxNxHxCxC, deterministic=deterministic)
    out_BxNxCxHxK = jnp.einsum("bnhqc,bnchk->bnqhk", probs_BxNxHxCxC.astype(v_BxLxHxK.dtype), v_BxNxCxHxK)
    # Back to sequence order: position pos_NxC[n, c] holds out[:, n, c] (pos_NxC is a permutation of 0 … N·C − 1).
    flat_BxPxHxK = out_BxNxCxHxK.reshape((B, N * C) + out_BxNxCxHxK.shape[3:])
    return merge_heads(flat_BxPxHxK[:, jnp.argsort(pos_NxC.reshape(-1))][:, :L])


def _flops(options, L: int, d: int, causal: bool) -> float:
  """QKᵀ and the weighted sum of V within blocks of b = min(block_size, L), over L padded to whole blocks."""
  del causal
  b = min(options["block_size"], L)
  return 4 * b * d * padded(L, b) / L


SPEC = MixerSpec(
  BlockLocalAttention,
  "softmax attention within fixed blocks (LRA's local baseline); O(L·block·d)",
  can_decode=False,
  flops=_flops,
  options={
    "num_heads": HEADS,
    "block_size": Field("positions per block; a query sees its own block only", at_least=1),
    "grouping": Field(
      "contiguous (the paper's blocks) or strided (what LRA's published code "
      "computes: positions congruent modulo the number of blocks)",
      choices=GROUPINGS,
    ),
    "attention_dropout": ATTENTION_DROPOUT,
  },
)

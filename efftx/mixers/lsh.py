"""Reformer's LSH self-attention (Kitaev, Kaiser, Levskaya, 2020).

Queries and keys share one projection (keys are the L2-normalised queries). Each of `lsh_hashes` rounds hashes
the keys by a random rotation R into `lsh_buckets` buckets, h(k) = argmax([kR; −kR]), sorts positions by
(bucket, position), cuts the sorted sequence into chunks of `lsh_chunk`, and lets each chunk attend to itself and
the chunk before it (cyclically). A position does not attend to itself unless nothing else is allowed (its score
is lowered by 1e5 rather than removed); causal masking and the padding mask apply by original position. Rounds are
combined by their softmax normalisers: o = Σ_r softmax_r(logsumexp_r) o_r. Attention dropout acts on each round's
normalised probabilities (as trax's Reformer does); the rounds are still combined by the undropped normalisers.

The rotations are drawn from `lsh_seed` and the module's path, so a forward pass is reproducible and each layer
hashes differently (except in a reversible stack, whose layers share one path: there every layer hashes alike);
they are fixed, not resampled every step.
"""
from __future__ import annotations

import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.mixers.attention import ATTENTION_DROPOUT, HEADS, merge_heads
from efftx.mixers.spec import MixerSpec, Option

_NEG = jnp.finfo(jnp.float32).min
_SELF = -1e5  # score penalty for attending to oneself


class LSHAttention(nn.Module):
  num_heads: int = 4
  causal: bool = False
  lsh_buckets: int = 8    # buckets per round (1, or even)
  lsh_hashes: int = 2     # hash rounds; more rounds approach full attention
  lsh_chunk: int = 64     # positions per chunk of the sorted sequence
  lsh_seed: int = 0       # seed of the random rotations
  attention_dropout: float = 0.0  # dropout rate on the attention probabilities

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False) -> jax.Array:
    if decode:
      # One new position re-hashes into a bucket, but which chunk it would share depends on the whole sorted
      # sequence: a step-by-step decode cannot equal the chunked forward pass. Not supported.
      raise UserError("lsh: incremental decoding is not supported; sample from a model with another causal mixer")
    B, L, D = x_BxLxD.shape
    H, R = self.num_heads, self.lsh_hashes
    K = D // H
    qk_BxLx2xHxK = nn.DenseGeneral((2, H, K), dtype=x_BxLxD.dtype, name="qkv")(x_BxLxD)  # shared QK, V
    q_BxHxLxK = qk_BxLx2xHxK[:, :, 0].transpose(0, 2, 1, 3).astype(jnp.float32)
    v_BxHxLxK = qk_BxLx2xHxK[:, :, 1].transpose(0, 2, 1, 3).astype(jnp.float32)
    k_BxHxLxK = q_BxHxLxK / jnp.maximum(jnp.linalg.norm(q_BxHxLxK, axis=-1, keepdims=True), 1e-6)
    key_mask_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)

    # Pad to whole chunks; padded positions are masked keys and sort last.
    C = min(self.lsh_chunk, L)
    N = -(-L // C)
    P = N * C
    pad = lambda x, axis: jnp.pad(x, [(0, P - L) if a == axis else (0, 0) for a in range(x.ndim)])
    q_BxHxPxK, k_BxHxPxK, v_BxHxPxK = pad(q_BxHxLxK, 2), pad(k_BxHxLxK, 2), pad(v_BxHxLxK, 2)
    real_BxP = pad(key_mask_BxL, 1)
    pos_P = jnp.arange(P)

    # ------------------------------------------------------------------ hash: R rounds of random rotations
    if self.lsh_buckets == 1:
      buckets_BxHxRxP = jnp.zeros((B, H, R, P), jnp.int32)
    else:
      path_hash = zlib.crc32("/".join(self.scope.path).encode())
      key = jax.random.fold_in(jax.random.key(self.lsh_seed), path_hash)
      rotations_HxRxKxN = jax.random.normal(key, (H, R, K, self.lsh_buckets // 2))
      rotated_BxHxRxPxN = jnp.einsum("bhpk,hrkn->bhrpn", k_BxHxPxK, rotations_HxRxKxN)
      buckets_BxHxRxP = jnp.argmax(jnp.concatenate([rotated_BxHxRxPxN, -rotated_BxHxRxPxN], -1), -1)
    # Padding sorts after every real position.
    buckets_BxHxRxP = jnp.where(real_BxP[:, None, None, :], buckets_BxHxRxP, self.lsh_buckets)
    order_BxHxRxP = jnp.argsort(buckets_BxHxRxP * P + pos_P, axis=-1)

    # ------------------------------------------------------- sort, chunk, attend to own + previous chunk
    def sort(x_BxHxPx_):  # per round, positions in hash order: B×H×R×P×…
      x_BxHxRxPx_ = jnp.broadcast_to(x_BxHxPx_[:, :, None], (B, H, R) + x_BxHxPx_.shape[2:])
      index = order_BxHxRxP.reshape(order_BxHxRxP.shape + (1,) * (x_BxHxPx_.ndim - 3))
      return jnp.take_along_axis(x_BxHxRxPx_, index, axis=3)

    chunks = lambda x: x.reshape((B, H, R, N, C) + x.shape[4:])
    sq, sk, sv = chunks(sort(q_BxHxPxK)), chunks(sort(k_BxHxPxK)), chunks(sort(v_BxHxPxK))  # B×H×R×N×C×K
    spos = chunks(sort(jnp.broadcast_to(pos_P, (B, H, P))))
    sreal = chunks(sort(jnp.broadcast_to(real_BxP[:, None], (B, H, P))))

    def with_previous(x):  # own chunk then the one before it (cyclically); one chunk: just itself
      return x if N == 1 else jnp.concatenate([x, jnp.roll(x, 1, axis=3)], axis=4)

    ck, cv, cpos, creal = with_previous(sk), with_previous(sv), with_previous(spos), with_previous(sreal)
    scores = jnp.einsum("bhrnqk,bhrnck->bhrnqc", sq, ck) * K ** -0.5       # B×H×R×N×C×(2C)
    allowed = creal[..., None, :]
    if self.causal:
      allowed &= cpos[..., None, :] <= spos[..., :, None]
    scores = jnp.where(cpos[..., None, :] == spos[..., :, None], scores + _SELF, scores)
    scores = jnp.where(allowed, scores, _NEG)
    lse = jax.nn.logsumexp(scores, axis=-1)                                # B×H×R×N×C
    probs = nn.Dropout(self.attention_dropout)(jnp.exp(scores - lse[..., None]), deterministic=deterministic)
    out = jnp.einsum("bhrnqc,bhrnck->bhrnqk", probs, cv)

    # --------------------------------------------------- unsort, combine rounds by their normalisers
    undo_BxHxRxP = jnp.argsort(order_BxHxRxP, axis=-1)
    out_BxHxRxPxK = jnp.take_along_axis(out.reshape(B, H, R, P, K), undo_BxHxRxP[..., None], axis=3)
    lse_BxHxRxP = jnp.take_along_axis(lse.reshape(B, H, R, P), undo_BxHxRxP, axis=3)
    weights_BxHxRxP = jax.nn.softmax(lse_BxHxRxP, axis=2)
    out_BxHxPxK = jnp.einsum("bhrpk,bhrp->bhpk", out_BxHxRxPxK, weights_BxHxRxP)
    out_BxLxHxK = out_BxHxPxK[:, :, :L].transpose(0, 2, 1, 3).astype(x_BxLxD.dtype)
    return merge_heads(out_BxLxHxK)


def _lsh_relations(options, d_model, causal) -> None:
  del d_model, causal
  if options["lsh_buckets"] > 1 and options["lsh_buckets"] % 2:
    raise UserError(f"config.mixer.lsh_buckets={options['lsh_buckets']}: mixer 'lsh' needs 1 or an even number "
                    "(a hash is the argmax over [xR; −xR])")


SPEC = MixerSpec(
    LSHAttention, "Reformer LSH attention (shared QK, hashed chunks); O(L·chunk·rounds·d)", can_decode=False,
    relations=_lsh_relations,
    options={"num_heads": HEADS,
             "lsh_buckets": Option("hash buckets per round (1 or even)", at_least=1),
             "lsh_hashes": Option("hash rounds; more approach full attention", at_least=1),
             "lsh_chunk": Option("positions per chunk of the sorted sequence", at_least=1),
             "lsh_seed": Option("seed of the random rotations (fixed, reproducible)"),
             "attention_dropout": ATTENTION_DROPOUT})

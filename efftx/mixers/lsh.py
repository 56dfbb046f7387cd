"""Reformer's LSH self-attention (Kitaev, Kaiser, Levskaya, 2020): x_BxLxD → y_BxLxD.

Queries and keys share one projection (keys are the normalised queries). Each of `lsh_hashes` rounds hashes the
keys by a random rotation R into `lsh_buckets` buckets, h(k) = argmax([kR; −kR]), sorts positions by bucket, cuts
them into chunks of `lsh_chunk`, and lets each chunk attend to itself and the chunk before it; a position attends
to itself only if nothing else is allowed. Rounds are combined by their softmax normalisers. O(L·chunk·rounds·d).
lsh_rotations, lsh_scale and lsh_lookback choose between efftx's conventions (the defaults) and those of trax and
HF, which tests/test_lsh.py checks against a numpy reference and HF's layer. Conventions, and where the references
differ: efftx/mixers/README.md#lsh
"""

from __future__ import annotations

import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.attention import ATTENTION_DROPOUT
from efftx.mixers.attention import HEADS
from efftx.mixers.attention import merge_heads
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import padded

_NEG = jnp.finfo(jnp.float32).min
_SELF = -1e5  # the score of a position for itself (HF's value; trax subtracts 1e5)


class LSHAttention(nn.Module):
  num_heads: int = 4
  causal: bool = False
  lsh_buckets: int = 8  # buckets per round (1, or even)
  lsh_hashes: int = 2  # hash rounds; more rounds approach full attention
  lsh_chunk: int = 64  # positions per chunk of the sorted sequence
  lsh_seed: int = 0  # seed of the fixed random rotations
  lsh_rotations: str = "fixed"  # "fixed" (from lsh_seed) or "per_step" (new each training pass; trax/HF)
  lsh_scale: str = "sqrt_d"  # logits q·k̂/√d, or "unit": q·k̂ (trax/HF)
  lsh_lookback: str = "per_round"  # chunks look back within their round, or "across_rounds" (trax/HF)
  attention_dropout: float = 0.0  # dropout rate on the attention probabilities

  @nn.compact
  def __call__(
    self,
    x_BxLxD: jax.Array,
    mask: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
    *,
    rotations_HxRxKxN: jax.Array | None = None,
  ) -> jax.Array:
    """`rotations_HxRxKxN` (heads × rounds × head width × buckets/2), for tests: hash with these instead."""
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
    if self.lsh_scale == "unit":  # trax `length_normalized(k) / sqrt(d)`, HF `_len_and_dim_norm`
      k_BxHxLxK = q_BxHxLxK * jax.lax.rsqrt(jnp.mean(q_BxHxLxK**2, -1, keepdims=True) + 1e-6) * K**-0.5
      scale = 1.0
    else:
      k_BxHxLxK = q_BxHxLxK / jnp.maximum(jnp.linalg.norm(q_BxHxLxK, axis=-1, keepdims=True), 1e-6)
      scale = K**-0.5
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
    dropout_key = None  # None: attention dropout draws its own key from the "dropout" stream
    if self.lsh_buckets == 1:
      buckets_BxHxRxP = jnp.zeros((B, H, R, P), jnp.int32)
    else:
      if rotations_HxRxKxN is None:
        if self.lsh_rotations == "per_step" and not deterministic:
          # Split, so that the rotations and the attention dropout never share a key.
          rotation_key, dropout_key = jax.random.split(self.make_rng("dropout"))
        else:
          path_hash = zlib.crc32("/".join(self.scope.path).encode())
          rotation_key = jax.random.fold_in(jax.random.key(self.lsh_seed), path_hash)
        rotations_HxRxKxN = jax.random.normal(rotation_key, (H, R, K, self.lsh_buckets // 2))
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

    # G sequences of M chunks: each round on its own, or the R rounds' sorted sequences one after another (the
    # same memory order, so only the reshape differs).
    G, M = (R, N) if self.lsh_lookback == "per_round" else (1, R * N)
    chunks = lambda x: x.reshape((B, H, G, M, C) + x.shape[4:])
    sq, sk, sv = chunks(sort(q_BxHxPxK)), chunks(sort(k_BxHxPxK)), chunks(sort(v_BxHxPxK))  # B×H×G×M×C×K
    spos = chunks(sort(jnp.broadcast_to(pos_P, (B, H, P))))
    sreal = chunks(sort(jnp.broadcast_to(real_BxP[:, None], (B, H, P))))

    def with_previous(x):  # own chunk then the one before it (cyclically); one chunk: just itself
      return x if M == 1 else jnp.concatenate([x, jnp.roll(x, 1, axis=3)], axis=4)

    ck, cv, cpos, creal = with_previous(sk), with_previous(sv), with_previous(spos), with_previous(sreal)
    scores = jnp.einsum("bhgmqk,bhgmck->bhgmqc", sq, ck) * scale  # B×H×G×M×C×(2C)
    allowed = creal[..., None, :]
    if self.causal:
      allowed &= cpos[..., None, :] <= spos[..., :, None]
    scores = jnp.where(cpos[..., None, :] == spos[..., :, None], _SELF, scores)
    scores = jnp.where(allowed, scores, _NEG)
    lse = jax.nn.logsumexp(scores, axis=-1)  # B×H×G×M×C
    # Normalised by the sum, not as exp(scores − lse): a row that sees only copies of itself has lse ≈ −1e5, where
    # float32 resolves 0.008, and exp(scores − lse) would not sum to 1 (HF's float32 output is off by up to 0.3%
    # there).
    probs = nn.Dropout(self.attention_dropout)(
      jax.nn.softmax(scores, axis=-1), deterministic=deterministic, rng=dropout_key
    )
    out = jnp.einsum("bhgmqc,bhgmck->bhgmqk", probs, cv)

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
    raise UserError(
      f"config.mixer.lsh_buckets={options['lsh_buckets']}: mixer 'lsh' needs 1 or an even number "
      "(a hash is the argmax over [xR; −xR])"
    )


def _flops(options, L: int, d: int, causal: bool) -> float:
  """Per round, over L padded to whole chunks of C: the hash (K × buckets/2 rotations per head), then each chunk's
  queries against its own and the previous chunk's keys (2C; C alone when the sorted sequence is one chunk), QKᵀ
  and the weighted sum of V; then the rounds' outputs combined."""
  del causal
  R, buckets = options["lsh_hashes"], options["lsh_buckets"]
  C = min(options["lsh_chunk"], L)
  P = padded(L, C)
  chunks_in_sequence = P // C * (R if options["lsh_lookback"] == "across_rounds" else 1)
  keys = C if chunks_in_sequence == 1 else 2 * C
  hash_flops = d * buckets if buckets > 1 else 0  # 2 · K · buckets/2 per head
  return R * (4 * keys * d + hash_flops + 2 * d) * P / L


SPEC = MixerSpec(
  LSHAttention,
  "Reformer LSH attention (shared QK, hashed chunks); O(L·chunk·rounds·d)",
  can_decode=False,
  relations=_lsh_relations,
  flops=_flops,
  options={
    "num_heads": HEADS,
    "lsh_buckets": Field("hash buckets per round (1 or even)", at_least=1),
    "lsh_hashes": Field("hash rounds; more approach full attention", at_least=1),
    "lsh_chunk": Field("positions per chunk of the sorted sequence", at_least=1),
    "lsh_seed": Field("seed of the fixed random rotations (per_step uses them at evaluation)"),
    "lsh_rotations": Field(
      "fixed (from lsh_seed) or per_step (new each training step, from the dropout key; as trax/HF)",
      choices=("fixed", "per_step"),
    ),
    "lsh_scale": Field("logits q·k̂/√d (sqrt_d) or q·k̂, k̂ = q/‖q‖ (unit; as trax/HF)", choices=("sqrt_d", "unit")),
    "lsh_lookback": Field(
      "chunks look back within their round (per_round) or along all rounds' sorted "
      "sequences joined (across_rounds; as trax/HF)",
      choices=("per_round", "across_rounds"),
    ),
    "attention_dropout": ATTENTION_DROPOUT,
  },
)

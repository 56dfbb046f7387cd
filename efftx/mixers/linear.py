"""Linear attention (Katharopoulos et al., 2020): softmax(q·k) replaced by φ(q)·φ(k) with φ = elu + 1, so

    y_t = φ(q_t)ᵀ Σ_s φ(k_s) v_sᵀ / φ(q_t)ᵀ Σ_s φ(k_s)

costs O(T·K²) per head instead of O(T²·K). Causal: the sums run over s ≤ t, computed in chunks (quadratic inside
a chunk, a carried K×K state across chunks) so memory stays O(T·chunk + K²).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.attention import merge_heads
from efftx.mixers.attention import qkv_heads
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import padded


def _phi(x: jax.Array) -> jax.Array:
  return jax.nn.elu(x.astype(jnp.float32)) + 1.0


class LinearAttention(nn.Module):
  num_heads: int = 4
  causal: bool = False
  chunk: int = 256  # causal: positions per chunk (quadratic inside a chunk, a carried state across)

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    B, L, _ = x_BxLxD.shape
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = qkv_heads(x_BxLxD, self.num_heads)
    fq_BxLxHxK = _phi(q_BxLxHxK)
    fk_BxLxHxK = _phi(k_BxLxHxK)
    if decode:
      if not self.causal:
        raise UserError("linear: decoding needs causal=True")
      # The whole past in a K×K state and a K normaliser per head: constant memory per step.
      initialized = self.has_variable("cache", "kv")
      H, K = q_BxLxHxK.shape[-2:]
      kv = self.variable("cache", "kv", jnp.zeros, (B, H, K, K), jnp.float32)
      z = self.variable("cache", "z", jnp.zeros, (B, H, K), jnp.float32)
      if initialized:
        kv.value += jnp.einsum("bthk,bthv->bhkv", fk_BxLxHxK, v_BxLxHxK.astype(jnp.float32))
        z.value += fk_BxLxHxK.sum(1)
        num_Bx1xHxK = jnp.einsum("bqhk,bhkv->bqhv", fq_BxLxHxK, kv.value)
        den_Bx1xH = jnp.einsum("bqhk,bhk->bqh", fq_BxLxHxK, z.value)
        return merge_heads((num_Bx1xHxK / jnp.maximum(den_Bx1xH, 1e-30)[..., None]).astype(x_BxLxD.dtype))
    if mask is not None:
      fk_BxLxHxK = jnp.where(mask[:, :, None, None], fk_BxLxHxK, 0.0)  # padded keys contribute nothing
    v_BxLxHxK = v_BxLxHxK.astype(jnp.float32)
    if self.causal:
      num_BxLxHxK, den_BxLxH = _causal_sums(fq_BxLxHxK, fk_BxLxHxK, v_BxLxHxK, min(self.chunk, L))
    else:
      kv_BxHxKxK = jnp.einsum("bthk,bthv->bhkv", fk_BxLxHxK, v_BxLxHxK)
      num_BxLxHxK = jnp.einsum("bqhk,bhkv->bqhv", fq_BxLxHxK, kv_BxHxKxK)
      den_BxLxH = jnp.einsum("bqhk,bhk->bqh", fq_BxLxHxK, fk_BxLxHxK.sum(1))
    out_BxLxHxK = num_BxLxHxK / jnp.maximum(den_BxLxH, 1e-30)[..., None]
    return merge_heads(out_BxLxHxK.astype(x_BxLxD.dtype))


def _causal_sums(fq_BxLxHxK, fk_BxLxHxK, v_BxLxHxK, C):
  B, L, H, K = fq_BxLxHxK.shape
  N = -(-L // C)
  to_chunks = lambda x: jnp.pad(x, [(0, 0), (0, N * C - L), (0, 0), (0, 0)]).reshape(B, N, C, H, -1).swapaxes(0, 1)
  causal_CxC = jnp.tril(jnp.ones((C, C), bool))

  def chunk(state, inputs):
    kv_BxHxKxK, z_BxHxK = state
    fq, fk, v = inputs
    scores_BxHxCxC = jnp.where(causal_CxC, jnp.einsum("bqhk,bthk->bhqt", fq, fk), 0.0)
    num = jnp.einsum("bhqt,bthv->bqhv", scores_BxHxCxC, v) + jnp.einsum("bqhk,bhkv->bqhv", fq, kv_BxHxKxK)
    den = scores_BxHxCxC.sum(-1).transpose(0, 2, 1) + jnp.einsum("bqhk,bhk->bqh", fq, z_BxHxK)
    state = (kv_BxHxKxK + jnp.einsum("bthk,bthv->bhkv", fk, v), z_BxHxK + fk.sum(1))
    return state, (num, den)

  init = (jnp.zeros((B, H, K, v_BxLxHxK.shape[-1])), jnp.zeros((B, H, K)))
  _, (num_NxBxCxHxK, den_NxBxCxH) = jax.lax.scan(
    chunk, init, (to_chunks(fq_BxLxHxK), to_chunks(fk_BxLxHxK), to_chunks(v_BxLxHxK))
  )
  unchunk = lambda x: x.swapaxes(0, 1).reshape((B, N * C) + x.shape[3:])[:, :L]
  return unchunk(num_NxBxCxHxK), unchunk(den_NxBxCxH)


def _flops(options, L: int, d: int, causal: bool) -> float:
  """Per token and head (width K = d / heads): φ(k)vᵀ and φ(q)ᵀ(KV), 2·K² each, and the normaliser, 2·K.
  Causal adds the quadratic part inside chunks of C (scores and their sum over V, 2·C·K each), over L padded to
  whole chunks."""
  K = d // options["num_heads"]
  if not causal:
    return 4 * d * K + 2 * d
  C = min(options["chunk"], L)
  return (4 * C * d + 4 * d * K + 2 * d) * padded(L, C) / L


SPEC = MixerSpec(
  LinearAttention,
  "linear attention, φ = elu + 1; O(L·d²/heads)",
  can_decode=True,
  flops=_flops,
  options={
    "num_heads": Field("heads; must divide d_model", at_least=1),
    "chunk": Field("causal: positions per chunk (quadratic inside, a carried K×K state across)", at_least=1),
  },
)

"""Gated linear attention (Yang et al., 2024) as flash-linear-attention's fla/layers/gla.py `GatedLinearAttention`
at its defaults (expand_k 0.5, expand_v 1, num_heads 4, no kv-head sharing, feature map none, no short
convolution, output gate with swish, fused RMSNorm-gate per head, eps 1e-5, gate_logit_normalizer 16,
gate_low_rank_dim 16, no clamp). Per head, with a per-key-channel log-decay gk:

    gk_t = logsigmoid(W₂ W₁ x_t + b₂) / 16,   S_t = diag(exp(gk_t)) S_{t−1} + k_t v_tᵀ,   o_t = S_tᵀ (q_t / √d_k)
    out = o_proj(RMSNorm(o_t) · weight ⊙ swish(g_proj x_t))

the recurrence being efftx.mixers.recurrence's per-key chunked form (float32; sub-chunks of 16 as chunk_gla).
Padded positions are zeroed before the projections and skipped by the recurrence. Decoding: the num_heads × d_k
× d_v state, constant in the position. Projections at torch's nn.Linear default U(±1/√fan_in); the norm's
weight and the gate's bias are not weight-decayed. Notes: efftx/mixers/README.md#gla.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import recurrence
from efftx.mixers.spec import MixerSpec


def _torch_linear_init(key, shape, dtype=jnp.float32):
  """torch.nn.Linear's default weight (and bias, over the same fan-in), U(±1/√fan_in)."""
  bound = 1.0 / math.sqrt(shape[0])
  return jax.random.uniform(key, shape, dtype, -bound, bound)


def widths(d_model: int, expand_k: float, expand_v: float) -> tuple[int, int]:
  """(key_dim, value_dim) as the reference: int(d_model·expand)."""
  return int(d_model * expand_k), int(d_model * expand_v)


class GatedLinearAttention(nn.Module):
  num_heads: int = 4
  expand_k: float = 0.5
  expand_v: float = 1.0
  gate_low_rank_dim: int = 16
  gate_logit_normalizer: float = 16.0
  chunk: int = 64
  causal: bool = True

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    if not self.causal:
      raise UserError("gla: the module is causal (MIXERS['gla'](causal=False) runs it both ways)")
    B, L, D = x_BxLxD.shape
    _relations({n: getattr(self, n) for n in ("num_heads", "expand_k", "expand_v")}, D, True)
    H = self.num_heads
    KD, VD = widths(D, self.expand_k, self.expand_v)
    K, V = KD // H, VD // H
    dtype = x_BxLxD.dtype
    real_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    u = jnp.where(real_BxL[..., None], x_BxLxD, 0)
    dense = lambda n, name, bias=False: nn.Dense(
      n, use_bias=bias, kernel_init=_torch_linear_init, bias_init=_bias_init(self.gate_low_rank_dim), dtype=dtype,
      name=name,
    )  # fmt: skip
    q = dense(KD, "q_proj")(u).reshape(B, L, H, K).astype(jnp.float32) * K**-0.5  # chunk_gla's default scale
    k = dense(KD, "k_proj")(u).reshape(B, L, H, K)
    v = dense(VD, "v_proj")(u).reshape(B, L, H, V)
    gate = dense(VD, "g_proj")(u).reshape(B, L, H, V).astype(jnp.float32)
    low = dense(self.gate_low_rank_dim, "gk_proj_0")(u)
    gk = jax.nn.log_sigmoid(dense(KD, "gk_proj_1", bias=True)(low).astype(jnp.float32)) / self.gate_logit_normalizer
    gk = gk.reshape(B, L, H, K)
    weight = self.param("g_norm_weight", nn.initializers.ones, (V,))
    state = None
    if decode:
      initialized = self.has_variable("cache", "state")
      cached = self.variable("cache", "state", jnp.zeros, (B, H, K, V), jnp.float32)
      if initialized:
        if L != 1:
          raise ValueError(f"gla: decoding takes one position at a time, got {L}")
        state = cached.value
    if state is not None:
      o, cached.value = recurrence.gated_recurrence_step(state, q[:, 0], k[:, 0], v[:, 0], gk[:, 0], real_BxL[:, 0])
      o = o[:, None]
    else:
      o, _ = recurrence.chunked_gated_recurrence(q, k, v, gk, chunk=self.chunk, real_BxL=real_BxL)
    o = o * jax.lax.rsqrt(jnp.mean(o**2, axis=-1, keepdims=True) + 1e-5) * weight * jax.nn.silu(gate)
    return dense(D, "o_proj")(o.reshape(B, L, VD).astype(dtype))


def _bias_init(fan_in: int):
  bound = 1.0 / math.sqrt(fan_in)
  return lambda key, shape, dtype=jnp.float32: jax.random.uniform(key, shape, dtype, -bound, bound)


def _relations(options: dict[str, Any], d_model: int | None, causal: bool) -> None:
  del causal
  if d_model is None:
    return
  H = options["num_heads"]
  for name, width in zip(("expand_k", "expand_v"), widths(d_model, options["expand_k"], options["expand_v"])):
    if width < H or width % H:
      raise UserError(
        f"mixer 'gla': int(d_model·{name}) = int({d_model}·{options[name]}) = {width} must be a positive multiple "
        f"of config.mixer.num_heads={H}"
      )


SPEC = MixerSpec(
  GatedLinearAttention,
  "Gated linear attention (fla's GLA): per-key-channel decaying K×V state per head, swish output gate; "
  "O(L·d²/H); decode state d_k·d_v/H",
  bidirectional_by_reversal=True,
  can_decode=True,
  relations=_relations,
  options={
    "num_heads": Field("heads (each int(d_model·expand_k)/num_heads keys wide)", at_least=1),
    "expand_k": Field("key width = int(d_model·expand_k)", above=0),
    "expand_v": Field("value width = int(d_model·expand_v)", above=0),
    "gate_low_rank_dim": Field("rank of the forget gate's projection", at_least=1),
    "gate_logit_normalizer": Field("logsigmoid(gate) is divided by it", above=0),
    "chunk": Field("positions per chunk of the chunked recurrence (chunk_gla's 64)", at_least=1),
  },
)

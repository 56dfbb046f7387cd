"""Multi-head softmax attention: the baseline every other mixer is compared with. x_BxLxD → y_BxLxD.

Six implementations of the same function (config `attention_impl`): "plain" (B×H×L×L scores, O(L²) memory),
"chunked" (online softmax, O(L·chunk) memory), "flash" (exact softmax per query block, a recomputing backward pass,
O(L·chunk) memory, no dropout), "fused" (jax.nn.dot_product_attention: cuDNN on GPU), "splash" (the Pallas TPU
kernel) and "auto" (per platform, efftx.platform.target_platform()). Every path gives the same outputs at every
query that has a key to see; a query with none gets a finite value that nothing reads. Which kernels a compiled
step calls is in its program text (efftx.platform.kernels; efftx.train logs it). Attention dropout acts on the
normalised probabilities ("plain", "chunked"). Each path and the "auto" choice: efftx/mixers/README.md#attention
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
from jax.experimental.pallas.ops.tpu import splash_attention as splash
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import cache
from efftx.mixers import rotary as rotary_lib
from efftx.mixers.spec import MixerSpec
from efftx.mixers.spec import padded
from efftx.platform import target_platform

ATTENTION_IMPLS = ("plain", "chunked", "flash", "fused", "splash", "auto")
_NEG = jnp.finfo(jnp.float32).min  # not -inf: a row with no allowed key stays finite


def qkv_heads(x_BxLxD: jax.Array, num_heads: int, name: str = "qkv"):
  """Q, K, V as B×L×H×K (one Dense in the calling module's scope), in the input's dtype."""
  D = x_BxLxD.shape[-1]
  if D % num_heads:
    raise ValueError(f"d_model={D} is not divisible by num_heads={num_heads}")
  qkv_BxLx3xHxK = nn.DenseGeneral((3, num_heads, D // num_heads), dtype=x_BxLxD.dtype, name=name)(x_BxLxD)
  return tuple(qkv_BxLx3xHxK[:, :, i] for i in range(3))


def merge_heads(out_BxLxHxK: jax.Array, name: str = "out") -> jax.Array:
  """B×L×H×K → B×L×D through the output projection."""
  H, K = out_BxLxHxK.shape[-2:]
  return nn.DenseGeneral(H * K, axis=(-2, -1), dtype=out_BxLxHxK.dtype, name=name)(out_BxLxHxK)


def _allowed(q_pos, k_pos, key_mask_Bx1xS, causal: bool) -> jax.Array:
  """B×1×T×S: key allowed for query (real key; not in the query's future when causal)."""
  allowed = key_mask_Bx1xS[:, :, None, :]
  if causal:
    allowed = allowed & (k_pos[None, None, None, :] <= q_pos[None, None, :, None])
  return allowed


def _plain(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal, dropout=lambda probs: probs):
  pos = jnp.arange(q_BxLxHxK.shape[1])
  scale = q_BxLxHxK.shape[-1] ** -0.5
  logits_BxHxLxL = jnp.einsum("bqhk,bthk->bhqt", q_BxLxHxK * scale, k_BxLxHxK).astype(jnp.float32)
  logits_BxHxLxL = jnp.where(_allowed(pos, pos, key_mask_BxL[:, None], causal), logits_BxHxLxL, _NEG)
  probs_BxHxLxL = dropout(jax.nn.softmax(logits_BxHxLxL, axis=-1).astype(v_BxLxHxK.dtype))
  return jnp.einsum("bhqt,bthk->bqhk", probs_BxHxLxL, v_BxLxHxK)


def dropout_keep_block(key: jax.Array, q_block, k_block, shape: tuple[int, ...], rate: float) -> jax.Array:
  """Keep mask (True with probability 1 − rate) of one (query block, key block) pair of "chunked" attention.

  A function of the key and the block indices only, so the backward pass, which recomputes each query block,
  redraws the mask of the forward pass; the full L×L mask is these blocks side by side.
  """
  return jax.random.bernoulli(jax.random.fold_in(jax.random.fold_in(key, q_block), k_block), 1.0 - rate, shape)


def _chunked(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal, chunk, dropout_key=None, dropout_rate=0.0):
  B, L, H, K = q_BxLxHxK.shape
  C = min(chunk, L)
  N = -(-L // C)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, N * C - L)] + [(0, 0)] * (x.ndim - 2))
  # Blocks first, for scan/map: N×B×C×H×K; padded keys are masked out.
  to_blocks = lambda x: pad(x).reshape((B, N, C) + x.shape[2:]).swapaxes(0, 1)
  q_NxBxCxHxK = to_blocks(q_BxLxHxK * K**-0.5)
  k_NxBxCxHxK, v_NxBxCxHxK = to_blocks(k_BxLxHxK), to_blocks(v_BxLxHxK)
  kmask_NxBxC = to_blocks(key_mask_BxL)
  pos_NxC = jnp.arange(N * C).reshape(N, C)
  block_N = jnp.arange(N)
  keep_scale = 0.0 if dropout_rate >= 1 else 1.0 / (1.0 - dropout_rate)

  @jax.checkpoint  # the backward pass recomputes a query block instead of storing its C×L scores
  def query_block(q_BxCxHxK, q_pos_C, q_block):
    def step(carry, kv):
      m_BxHxC, l_BxHxC, acc_BxCxHxK = carry
      k_BxCxHxK, v_BxCxHxK, kmask_BxC, k_pos_C, k_block = kv
      s_BxHxCxC = jnp.einsum("bqhk,bthk->bhqt", q_BxCxHxK, k_BxCxHxK).astype(jnp.float32)
      allowed_Bx1xCxC = _allowed(q_pos_C, k_pos_C, kmask_BxC[:, None], causal)
      s_BxHxCxC = jnp.where(allowed_Bx1xCxC, s_BxHxCxC, _NEG)
      m_new_BxHxC = jnp.maximum(m_BxHxC, s_BxHxCxC.max(-1))
      p_BxHxCxC = jnp.where(allowed_Bx1xCxC, jnp.exp(s_BxHxCxC - m_new_BxHxC[..., None]), 0.0)
      correction_BxHxC = jnp.exp(m_BxHxC - m_new_BxHxC)
      l_BxHxC = l_BxHxC * correction_BxHxC + p_BxHxCxC.sum(-1)
      # dropout(p / l) = keep·p / ((1 − rate)·l): l (above) sums the undropped p; only the weights on v are dropped.
      if dropout_key is not None:
        keep_BxHxCxC = dropout_keep_block(dropout_key, q_block, k_block, p_BxHxCxC.shape, dropout_rate)
        p_BxHxCxC = jnp.where(keep_BxHxCxC, p_BxHxCxC * keep_scale, 0.0)
      acc_BxCxHxK = acc_BxCxHxK * correction_BxHxC.transpose(0, 2, 1)[..., None] + jnp.einsum(
        "bhqt,bthk->bqhk", p_BxHxCxC, v_BxCxHxK.astype(jnp.float32)
      )
      return (m_new_BxHxC, l_BxHxC, acc_BxCxHxK), None

    init = (jnp.full((B, H, C), _NEG), jnp.zeros((B, H, C)), jnp.zeros((B, C, H, K)))
    kv = (k_NxBxCxHxK, v_NxBxCxHxK, kmask_NxBxC, pos_NxC, block_N)
    (_, l_BxHxC, acc_BxCxHxK), _ = jax.lax.scan(step, init, kv)
    return acc_BxCxHxK / jnp.maximum(l_BxHxC, 1e-30).transpose(0, 2, 1)[..., None]

  out_NxBxCxHxK = jax.lax.map(lambda args: query_block(*args), (q_NxBxCxHxK, pos_NxC, block_N))
  return out_NxBxCxHxK.swapaxes(0, 1).reshape(B, N * C, H, K)[:, :L].astype(v_BxLxHxK.dtype)


def _query_blocks(x_BxHxPxK: jax.Array, C: int) -> jax.Array:
  """B×H×P×K → N×B×H×C×K: the blocks of C query positions, first, for lax.map / scan."""
  B, H, P = x_BxHxPxK.shape[:3]
  return jnp.moveaxis(x_BxHxPxK.reshape((B, H, P // C, C) + x_BxHxPxK.shape[3:]), 2, 0)


def _block_scores(q_BxHxCxK, k_BxHxLxK, key_mask_BxL, q_pos_C, causal):
  """A query block's float32 scores against every key, and which keys it may see (B×1×C×L, or B×1×1×L)."""
  s_BxHxCxL = jnp.einsum("bhqk,bhtk->bhqt", q_BxHxCxK, k_BxHxLxK, preferred_element_type=jnp.float32)
  allowed = key_mask_BxL[:, None, None, :]
  if causal:
    allowed = allowed & (jnp.arange(k_BxHxLxK.shape[2])[None, :] <= q_pos_C[:, None])
  return s_BxHxCxL, allowed


def _flash_forward(q_BxHxPxK, k_BxHxLxK, v_BxHxLxK, key_mask_BxL, causal, C):
  """Per block of C queries (lax.map): scores against all L keys, exact softmax, weighted sum. Returns the output
  B×H×P×K and each row's log-sum-exp B×H×P (what the backward pass recomputes the probabilities from)."""
  B, H, P, K = q_BxHxPxK.shape

  def block(args):
    q_BxHxCxK, q_pos_C = args
    s_BxHxCxL, allowed = _block_scores(q_BxHxCxK, k_BxHxLxK, key_mask_BxL, q_pos_C, causal)
    m_BxHxC = jnp.max(jnp.where(allowed, s_BxHxCxL, _NEG), axis=-1)
    p_BxHxCxL = jnp.where(allowed, jnp.exp(s_BxHxCxL - m_BxHxC[..., None]), 0.0)
    l_BxHxC = jnp.maximum(p_BxHxCxL.sum(-1), 1e-30)  # 0 only in a row without any allowed key
    o_BxHxCxK = (
      jnp.einsum("bhqt,bhtk->bhqk", p_BxHxCxL.astype(v_BxHxLxK.dtype), v_BxHxLxK, preferred_element_type=jnp.float32)
      / l_BxHxC[..., None]
    )
    return o_BxHxCxK.astype(v_BxHxLxK.dtype), m_BxHxC + jnp.log(l_BxHxC)

  pos_NxC = jnp.arange(P).reshape(-1, C)
  o_NxBxHxCxK, lse_NxBxHxC = jax.lax.map(block, (_query_blocks(q_BxHxPxK, C), pos_NxC))
  return (jnp.moveaxis(o_NxBxHxCxK, 0, 2).reshape(B, H, P, K), jnp.moveaxis(lse_NxBxHxC, 0, 2).reshape(B, H, P))


def _transposed_key_grads(P: int, C: int) -> bool:
  """Whether flash's backward pass accumulates dK and dV transposed (K×L), as Qᵀ dS and dOᵀ P with Qᵀ and dOᵀ made
  contiguous first (an optimization barrier keeps XLA from folding the transposes back into the dots): on a CPU
  with more than one query block. Written as dSᵀ Q and Pᵀ dO (a contraction over the left operand's rows), XLA:CPU
  hands these dots to Eigen; transposed, to YNNPACK, which is faster there except for a single query block,
  whose B·H matmuls are small (experiments/performance/DECISIONS.md: flash-transposed-key-gradients). Either way
  the result is the same up to float32 rounding."""
  return jax.default_backend() == "cpu" and P > C


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash_core(q_BxHxPxK, k_BxHxLxK, v_BxHxLxK, key_mask_BxL, causal, C):
  return _flash_forward(q_BxHxPxK, k_BxHxLxK, v_BxHxLxK, key_mask_BxL, causal, C)[0]


def _flash_core_fwd(q_BxHxPxK, k_BxHxLxK, v_BxHxLxK, key_mask_BxL, causal, C):
  o_BxHxPxK, lse_BxHxP = _flash_forward(q_BxHxPxK, k_BxHxLxK, v_BxHxLxK, key_mask_BxL, causal, C)
  return o_BxHxPxK, (q_BxHxPxK, k_BxHxLxK, v_BxHxLxK, key_mask_BxL, o_BxHxPxK, lse_BxHxP)


def _flash_core_bwd(causal, C, residuals, do_BxHxPxK):
  """Per block of C queries (a scan carrying dK, dV): P = exp(S − lse) recomputed, dS = P ⊙ (dO Vᵀ − rowsum(dO ⊙
  O)), dQ = dS K, dK += dSᵀ Q, dV += Pᵀ dO (on a CPU with more than one block carried transposed, dKᵀ += Qᵀ dS,
  dVᵀ += dOᵀ P: _transposed_key_grads). Only one block's C×L scores exist at a time."""
  q_BxHxPxK, k_BxHxLxK, v_BxHxLxK, key_mask_BxL, o_BxHxPxK, lse_BxHxP = residuals
  f32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)
  delta_BxHxP = jnp.sum(do_BxHxPxK.astype(jnp.float32) * o_BxHxPxK.astype(jnp.float32), axis=-1)

  B, H, P, K = q_BxHxPxK.shape
  transposed = _transposed_key_grads(P, C)  # dk_acc, dv_acc: B×H×K×L if so, else B×H×L×K

  def block(carry, xs):
    dk_acc, dv_acc = carry
    q_BxHxCxK, do_BxHxCxK, lse_BxHxC, delta_BxHxC, q_pos_C = xs
    s_BxHxCxL, allowed = _block_scores(q_BxHxCxK, k_BxHxLxK, key_mask_BxL, q_pos_C, causal)
    p_BxHxCxL = jnp.where(allowed, jnp.exp(s_BxHxCxL - lse_BxHxC[..., None]), 0.0)
    dp_BxHxCxL = f32("bhqk,bhtk->bhqt", do_BxHxCxK, v_BxHxLxK)
    ds_BxHxCxL = (p_BxHxCxL * (dp_BxHxCxL - delta_BxHxC[..., None])).astype(q_BxHxCxK.dtype)
    dq_BxHxCxK = f32("bhqt,bhtk->bhqk", ds_BxHxCxL, k_BxHxLxK)
    p_BxHxCxL = p_BxHxCxL.astype(do_BxHxCxK.dtype)
    if transposed:
      q_BxHxKxC, do_BxHxKxC = jax.lax.optimization_barrier((q_BxHxCxK.swapaxes(2, 3), do_BxHxCxK.swapaxes(2, 3)))
      dk_acc += f32("bhkq,bhqt->bhkt", q_BxHxKxC, ds_BxHxCxL)
      dv_acc += f32("bhkq,bhqt->bhkt", do_BxHxKxC, p_BxHxCxL)
    else:
      dk_acc += f32("bhqt,bhqk->bhtk", ds_BxHxCxL, q_BxHxCxK)
      dv_acc += f32("bhqt,bhqk->bhtk", p_BxHxCxL, do_BxHxCxK)
    return (dk_acc, dv_acc), dq_BxHxCxK

  L = k_BxHxLxK.shape[2]
  zeros = jnp.zeros((B, H, K, L) if transposed else (B, H, L, K), jnp.float32)
  xs = (
    _query_blocks(q_BxHxPxK, C),
    _query_blocks(do_BxHxPxK, C),
    _query_blocks(lse_BxHxP, C),
    _query_blocks(delta_BxHxP, C),
    jnp.arange(P).reshape(-1, C),
  )
  (dk_acc, dv_acc), dq_NxBxHxCxK = jax.lax.scan(block, (zeros, zeros), xs)
  if transposed:
    dk_acc, dv_acc = dk_acc.swapaxes(2, 3), dv_acc.swapaxes(2, 3)
  dq_BxHxPxK = jnp.moveaxis(dq_NxBxHxCxK, 0, 2).reshape(B, H, P, K)
  return (dq_BxHxPxK.astype(q_BxHxPxK.dtype), dk_acc.astype(k_BxHxLxK.dtype), dv_acc.astype(v_BxHxLxK.dtype), None)


_flash_core.defvjp(_flash_core_fwd, _flash_core_bwd)


def _flash(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal, chunk):
  """Exact attention in blocks of `chunk` queries, each against all keys, with a hand-written backward pass that
  recomputes a block's probabilities from its saved log-sum-exp (FlashAttention's recipe, Dao et al. 2022, with
  whole key rows per block): O(L·chunk) scores alive at a time, no L×L tensor, no stored probabilities."""
  B, L, H, K = q_BxLxHxK.shape
  C = min(chunk, L)
  P = -(-L // C) * C
  heads_first = lambda x: x.transpose(0, 2, 1, 3)  # B×H×L×K: each head's rows contiguous for the matmuls
  q_BxHxPxK = jnp.pad(heads_first(q_BxLxHxK * K**-0.5), [(0, 0), (0, 0), (0, P - L), (0, 0)])
  out_BxHxPxK = _flash_core(q_BxHxPxK, heads_first(k_BxLxHxK), heads_first(v_BxLxHxK), key_mask_BxL, causal, C)
  return out_BxHxPxK[:, :, :L].transpose(0, 2, 1, 3)


def _fused(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal):
  attend = functools.partial(
    jax.nn.dot_product_attention, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask=key_mask_BxL[:, None, None, :], is_causal=causal
  )
  # implementation=None means XLA in current JAX; ask for cuDNN's fused kernel where it can run (16-bit), and fall
  # back to XLA when it refuses the configuration or finds no cuDNN (it raises while tracing: a step traced on a
  # CPU for a GPU, by jax.export, gets XLA's attention). Only called where the step is lowered for a GPU.
  if q_BxLxHxK.dtype in (jnp.bfloat16, jnp.float16):
    try:
      return attend(implementation="cudnn")
    except (ValueError, NotImplementedError, RuntimeError):
      pass
  return attend(implementation="xla")


SPLASH_ALIGN = 128  # the kernel's sequence blocks are multiples of 128 positions (TPU lanes)


def _splash_kernel(P: int, num_heads: int, causal: bool, interpret: bool):
  """A splash-attention kernel for one example (H×P×K queries, keys and values): the static causal or full mask,
  blocks of the largest of 512, 256, 128 positions that divides P (MaxText's default is 512)."""
  block = next(b for b in (512, 256, SPLASH_ALIGN) if P % b == 0)
  mask = splash.MultiHeadMask([splash.CausalMask((P, P)) if causal else splash.FullMask((P, P))] * num_heads)
  sizes = splash.BlockSizes(
    block_q=block,
    block_kv=block,
    block_kv_compute=block,
    block_q_dkv=block,
    block_kv_dkv=block,
    block_kv_dkv_compute=block,
    block_q_dq=block,
    block_kv_dq=block,
  )
  return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _splash(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal, interpret: bool):
  """Pallas splash attention. The sequence is padded to a multiple of SPLASH_ALIGN. Segment ids: every query 1, a
  key 1 if it is real, 0 if it is padding (the caller's or the alignment's), so each query sees exactly the real
  keys (and, causal, those at or before it), as in the other paths. A query that sees no key gets the mean of the
  values of the key blocks the kernel visits: finite, and read by nothing. The kernel does not scale the logits:
  the queries are scaled by K^-½ first, as in the other paths."""
  B, L, H, K = q_BxLxHxK.shape
  P = padded(L, SPLASH_ALIGN)
  heads_first = lambda x: jnp.pad(x.transpose(0, 2, 1, 3), [(0, 0), (0, 0), (0, P - L), (0, 0)])
  key_segment_BxP = jnp.pad(key_mask_BxL.astype(jnp.int32), [(0, 0), (0, P - L)])
  kernel = _splash_kernel(P, H, causal, interpret)

  def attend(q_BxHxPxK, k_BxHxPxK, v_BxHxPxK, key_segment_BxP):
    query_segment_P = jnp.ones(key_segment_BxP.shape[1:], jnp.int32)
    one = lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=query_segment_P, kv=s))
    return jax.vmap(one)(q_BxHxPxK, k_BxHxPxK, v_BxHxPxK, key_segment_BxP)

  # A Pallas kernel is one custom call that XLA's partitioner cannot split: under a mesh (jax.set_mesh, as
  # efftx.train sets it) each device runs it on its own examples, the batch split over every mesh axis as
  # efftx.sharding.batch splits it.
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty and B % mesh.size == 0:
    rows = PartitionSpec(tuple(mesh.axis_names))
    attend = jax.shard_map(attend, mesh=mesh, in_specs=rows, out_specs=rows, check_vma=False)
  q_BxHxPxK = heads_first(q_BxLxHxK * jnp.asarray(K**-0.5, q_BxLxHxK.dtype))
  out_BxHxPxK = attend(q_BxHxPxK, heads_first(k_BxLxHxK), heads_first(v_BxLxHxK), key_segment_BxP)
  return out_BxHxPxK[:, :, :L].transpose(0, 2, 1, 3).astype(v_BxLxHxK.dtype)


# With attention dropout on a CPU, "plain" (one mask over the B×H×L×L probabilities, kept for the backward pass) is
# faster than "chunked" (a mask per block, redrawn when the backward pass rematerialises it) up to this length
# (experiments/performance/DECISIONS.md: plain-attention-dropout-on-cpu), while B·H·L² stays within the second
# bound: 2**26 float32 probabilities are 256 MiB, and plain holds a few such tensors per layer.
_CPU_PLAIN_WITH_DROPOUT_UP_TO = 1024
_CPU_PLAIN_WITH_DROPOUT_SCORES = 2**26


def _resolve(
  impl: str,
  L: int,
  chunk: int,
  dropout_active: bool,
  platform: str | None = None,
  dtype=jnp.float32,
  batch_heads: int = 1,
) -> str:
  """The path "auto" takes on `platform` ("cpu", "gpu" or "tpu"; default: efftx.platform.target_platform()) for `dtype`
  and B·H = `batch_heads` sequences of attention (efftx/mixers/README.md#attention); other names unchanged."""
  if impl != "auto":
    return impl
  platform = platform or target_platform()
  if dropout_active:
    if L <= chunk or (
      platform == "cpu" and L <= _CPU_PLAIN_WITH_DROPOUT_UP_TO and batch_heads * L * L <= _CPU_PLAIN_WITH_DROPOUT_SCORES
    ):
      return "plain"
    return "chunked"
  if platform == "tpu":
    return "splash"
  if platform == "gpu":
    return "fused" if jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else "flash"
  return "flash"


class Attention(nn.Module):
  """Softmax attention over the sequence, bidirectional or causal, with a padding mask.

  Queries attend to keys where `mask` is True (and, if causal, to keys at or before their own position).
  A query at a padded position still gets an output (it attends to the real keys); the model ignores it. A query
  with no key it may see at all (a sequence of padding only) gets 0 from "chunked" and "flash", the mean of V
  from "plain", and from "splash" a mean of V over the blocks it visits; nothing reads it.
  With `attention_dropout` > 0 and deterministic=False the normalised probabilities are dropped and rescaled by
  1 / (1 − rate), drawing from the "dropout" rng stream; "flash", "fused" and "splash" cannot, and raise.
  With `rotary` (set by the model for config.model.position_embedding="rotary"), queries and keys are rotated by
  their absolute positions (efftx/mixers/rotary.py) before any path; decoding caches the rotated key at its position.
  """

  num_heads: int = 4
  causal: bool = False
  attention_dropout: float = 0.0  # dropout rate on the attention probabilities (not "flash", "fused", "splash")
  attention_impl: str = "auto"  # see ATTENTION_IMPLS
  attention_chunk: int = 256  # block size of "chunked" and "flash" (positions)
  rotary: bool = False  # RoPE on queries and keys (a model field: config.model.position_embedding="rotary")

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    B, L, _ = x_BxLxD.shape
    q_BxLxHxK, k_BxLxHxK, v_BxLxHxK = qkv_heads(x_BxLxD, self.num_heads)
    if self.rotary:  # decoding: the positions from the cache's index (0 in the init pass)
      start = self.get_variable("cache", "index") if decode and self.has_variable("cache", "index") else 0
      positions_L = start + jnp.arange(L)
      q_BxLxHxK, k_BxLxHxK = rotary_lib.rotate(q_BxLxHxK, positions_L), rotary_lib.rotate(k_BxLxHxK, positions_L)
    if decode and (cached := decode_step(self, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK)) is not None:
      return merge_heads(cached)
    key_mask_BxL = jnp.ones((B, L), bool) if mask is None else mask.astype(bool)
    dropout_active = self.attention_dropout > 0 and not deterministic
    impl = _resolve(
      self.attention_impl,
      L,
      self.attention_chunk,
      dropout_active,
      dtype=q_BxLxHxK.dtype,
      batch_heads=B * self.num_heads,
    )
    if dropout_active:
      _check_dropout(impl, self.attention_dropout)
    if dropout_active and impl == "plain":
      dropout = functools.partial(nn.Dropout(self.attention_dropout), deterministic=deterministic)
      out_BxLxHxK = _plain(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, self.causal, dropout)
    elif dropout_active:  # chunked
      out_BxLxHxK = _chunked(
        q_BxLxHxK,
        k_BxLxHxK,
        v_BxLxHxK,
        key_mask_BxL,
        self.causal,
        self.attention_chunk,
        self.make_rng("dropout"),
        self.attention_dropout,
      )
    else:
      out_BxLxHxK = _deterministic(
        impl, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, self.causal, self.attention_chunk
      )
    return merge_heads(out_BxLxHxK)


def _deterministic(impl: str, q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal: bool, chunk: int):
  """Attention without dropout by path `impl` (not "auto")."""
  if impl == "plain":
    return _plain(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal)
  if impl == "flash":
    return _flash(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal, chunk)
  if impl == "chunked":
    return _chunked(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal, chunk)
  if impl == "splash":  # the Mosaic kernel where traced for a TPU, interpret mode anywhere else
    return _splash(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal, interpret=target_platform() != "tpu")
  return _fused(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal)


def decode_step(module: nn.Module, q_Bx1xHxK, k_Bx1xHxK, v_Bx1xHxK, window: int | None = None):
  """One position against the KV cache (keys within `window` of it, if given); None in the init pass."""
  cached = cache.append(module, cached_key=k_Bx1xHxK, cached_value=v_Bx1xHxK)
  if cached is None:
    return None
  buffers, i = cached
  keys_BxTxHxK, values_BxTxHxK = buffers["cached_key"], buffers["cached_value"]
  pos_T = jnp.arange(keys_BxTxHxK.shape[1])
  allowed_T = (pos_T <= i) if window is None else (pos_T <= i) & (pos_T > i - window)
  logits_BxHx1xT = jnp.einsum("bqhk,bthk->bhqt", q_Bx1xHxK * q_Bx1xHxK.shape[-1] ** -0.5, keys_BxTxHxK).astype(
    jnp.float32
  )
  probs_BxHx1xT = jax.nn.softmax(jnp.where(allowed_T, logits_BxHx1xT, _NEG), axis=-1)
  return jnp.einsum("bhqt,bthk->bqhk", probs_BxHx1xT.astype(values_BxTxHxK.dtype), values_BxTxHxK)


def _check_dropout(impl: str, rate: float) -> None:
  """Raises UserError for a path without dropout (flash, fused, splash) asked for attention dropout."""
  if impl in ("fused", "flash", "splash") and rate:
    raise UserError(
      f"mixer 'attention': attention_impl='{impl}' has no dropout, but attention_dropout={rate}; "
      "use attention_impl='chunked' or 'auto'"
    )


def _attention_relations(options, d_model, causal) -> None:
  del d_model, causal
  _check_dropout(options["attention_impl"], options["attention_dropout"])


def _flops(options, L: int, d: int, causal: bool) -> float:
  """QKᵀ and the weighted sum of V: 2·L·d each per token, causal or not (plain, chunked and flash compute the whole
  square and mask it; cuDNN's causal kernel may skip the upper half, still counted). "chunked" computes L padded
  to whole chunks, queries and keys; "flash" pads the queries only; "splash" pads both to SPLASH_ALIGN (its causal
  kernel skips the blocks above the diagonal, still counted). "auto" counts the path it takes on this backend in
  float32 without dropout (training with dropout, or bfloat16 on a GPU, may take another)."""
  del causal
  chunk = options["attention_chunk"]
  impl = _resolve(options["attention_impl"], L, chunk, dropout_active=False)
  queries = (
    padded(L, min(chunk, L)) if impl in ("chunked", "flash") else padded(L, SPLASH_ALIGN) if impl == "splash" else L
  )
  keys = L if impl in ("flash", "plain", "fused") else queries
  return 4 * d * queries * keys / L


def _kernel(options, L: int, dtype, platform: str, dropout_active: bool) -> str | None:
  impl = _resolve(options["attention_impl"], L, options["attention_chunk"], dropout_active, platform, dtype)
  if impl == "splash" and platform == "tpu":
    return "Pallas TPU kernel"
  if impl == "fused" and platform == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16):
    return "cuDNN fused attention"
  return None


HEADS = Field("attention heads; must divide d_model", at_least=1)
ATTENTION_DROPOUT = Field("dropout rate on the attention probabilities (training only)", at_least=0, below=1)

SPEC = MixerSpec(
  Attention,
  "multi-head softmax attention; O(L²d) time, O(L²) memory plain, O(L·chunk) chunked and flash",
  can_decode=True,
  relations=_attention_relations,
  flops=_flops,
  kernel=_kernel,
  options={
    "num_heads": HEADS,
    "attention_dropout": ATTENTION_DROPOUT,
    "attention_impl": Field(
      "plain (L×L scores), chunked (online softmax, O(L·chunk) memory), flash "
      "(query blocks, recomputing backward pass, O(L·chunk) memory, no dropout), "
      "fused (jax.nn.dot_product_attention: cuDNN on GPU), splash (Pallas TPU "
      "kernel; interpreted off TPU), auto (per platform: TPU splash, GPU cuDNN "
      "for 16-bit, else flash)",
      choices=ATTENTION_IMPLS,
    ),
    "attention_chunk": Field("block size of the chunked and flash paths (positions)", at_least=1),
  },
)

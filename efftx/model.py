"""The Transformer around a token mixer: embeddings → pre-LN blocks (mixer, feed-forward) → final norm → head.

`build_model(config, head)` picks the mixer by name from `efftx.mixers.MIXERS` with the options in
`config.mixer`; the head comes from the objective (`efftx.objectives`: e.g. `OBJECTIVES["lm"].head(vocab, 0)`).
The model knows nothing of data or objectives beyond that function. Applied as
`model.apply(variables, tokens_BxL, mask=mask_BxL, deterministic=True)`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from efftx.mixers import MIXERS
from efftx.reversible import ReversibleStack


@jax.custom_vjp
def gelu_erf(x: jax.Array) -> jax.Array:
  """Exact GELU, x·Φ(x) = x·(1 + erf(x/√2))/2, computed in float32, with the derivative Φ(x) + x·φ(x) written out:
  the same function as nn.gelu(approximate=False), whose autodiff backward pass is slower on a 2-core CPU: one
  feed-forward layer (8192 tokens, 256 → 1024 → 256, forward and backward) 220 → 190 ms, a whole training step
  of the peer benchmark's shape 1.01–1.05× faster (experiments/performance/gelu_ab.py, the two steps alternated in one
  process), 1.10× with the backward pass's barrier below (2 CPU devices, a 2-core Xeon)."""
  x32 = x.astype(jnp.float32)
  return (x32 * (0.5 + 0.5 * jax.lax.erf(x32 * np.float32(np.sqrt(0.5))))).astype(x.dtype)


def _gelu_erf_fwd(x):
  return gelu_erf(x), x


def _gelu_erf_bwd(x, g):
  # The barrier keeps XLA from sharing erf(x/√2) with the forward pass, which wrote it out as one more B×L×F array
  # and read it twice (for GELU's output and here) instead of recomputing it: the training step 1.02-1.07x faster
  # without that (2 CPU devices, a 2-core Xeon; python experiments/performance/gelu_ab.py 1024 identity shared).
  x32 = jax.lax.optimization_barrier(x).astype(jnp.float32)
  cdf = 0.5 + 0.5 * jax.lax.erf(x32 * np.float32(np.sqrt(0.5)))
  pdf = np.float32(1 / np.sqrt(2 * np.pi)) * jnp.exp(-0.5 * x32 * x32)
  return ((g.astype(jnp.float32) * (cdf + x32 * pdf)).astype(x.dtype),)


gelu_erf.defvjp(_gelu_erf_fwd, _gelu_erf_bwd)

# The feed-forward nonlinearity: GELU's tanh approximation (Flax's default; HF FNet's "gelu_new") or exact (erf,
# BERT's "gelu").
ACTIVATIONS = {"gelu_tanh": lambda x: nn.gelu(x, approximate=True), "gelu": gelu_erf}
BLOCK_LAYOUTS = ("pre_ln", "post_ln")


class FeedForward(nn.Module):
  d_ff: int
  dropout: float
  activation: str = "gelu_tanh"

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, deterministic: bool) -> jax.Array:
    h_BxLxF = ACTIVATIONS[self.activation](nn.Dense(self.d_ff, dtype=x_BxLxD.dtype, name="up")(x_BxLxD))
    h_BxLxF = nn.Dropout(self.dropout)(h_BxLxF, deterministic=deterministic)
    return nn.Dense(x_BxLxD.shape[-1], dtype=x_BxLxD.dtype, name="down")(h_BxLxF)


class _FeedForwardChunk(nn.Module):
  """FeedForward as a scan body: (carry, chunk) → (carry, output chunk)."""

  d_ff: int
  dropout: float
  deterministic: bool
  activation: str = "gelu_tanh"

  @nn.compact
  def __call__(self, carry, x_BxCxD):
    return carry, FeedForward(self.d_ff, self.dropout, self.activation, name="ff")(x_BxCxD, self.deterministic)


class MixingSublayer(nn.Module):
  """F(x) = dropout(mixer(LN(x))): the residual branch around the token mixer (without the LN when post-LN)."""

  make_mixer: Callable[..., nn.Module]
  dropout: float
  pre_norm: bool = True
  norm_eps: float = 1e-6

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, deterministic: bool, decode: bool = False):
    h_BxLxD = x_BxLxD
    if self.pre_norm:  # statistics in float32 regardless
      h_BxLxD = nn.LayerNorm(self.norm_eps, dtype=x_BxLxD.dtype, name="norm")(x_BxLxD)
    h_BxLxD = self.make_mixer(name="mixer")(h_BxLxD, mask=mask_BxL, deterministic=deterministic,
                                            **({"decode": True} if decode else {}))
    return nn.Dropout(self.dropout)(h_BxLxD, deterministic=deterministic)


class FeedForwardSublayer(nn.Module):
  """G(x) = dropout(FF(LN(x))) (without the LN when post-LN), over sequence chunks of ff_chunk_size if set (same
  result, lower peak memory)."""

  d_ff: int
  dropout: float
  ff_chunk_size: int = 0
  pre_norm: bool = True
  norm_eps: float = 1e-6
  activation: str = "gelu_tanh"

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, deterministic: bool) -> jax.Array:
    h_BxLxD = x_BxLxD
    if self.pre_norm:
      h_BxLxD = nn.LayerNorm(self.norm_eps, dtype=x_BxLxD.dtype, name="norm")(x_BxLxD)
    B, L, D = h_BxLxD.shape
    C = self.ff_chunk_size
    if C and L > C and L % C == 0:
      # One chunk at a time (scan), each recomputed in the backward pass (remat): the B×C×d_ff hidden layer is
      # the only one alive, instead of B×L×d_ff.
      chunked = nn.scan(nn.remat(_FeedForwardChunk), variable_broadcast="params",
                        split_rngs={"params": False, "dropout": True}, in_axes=1, out_axes=1)
      _, h_BxNxCxD = chunked(self.d_ff, self.dropout, deterministic, self.activation, name="chunks")(
          None, h_BxLxD.reshape(B, L // C, C, D))
      h_BxLxD = h_BxNxCxD.reshape(B, L, D)
    else:
      h_BxLxD = FeedForward(self.d_ff, self.dropout, self.activation, name="ff")(h_BxLxD, deterministic)
    return nn.Dropout(self.dropout)(h_BxLxD, deterministic=deterministic)


class Block(nn.Module):
  """A residual block. "pre_ln": x + F(x), then x + G(x), each branch normalising its input. "post_ln" (BERT's and
  the published FNet's layout): LN(x + F(x)), then LN(x + G(x)), the branches without a norm of their own."""

  make_mixer: Callable[..., nn.Module]
  d_ff: int
  dropout: float
  ff_chunk_size: int = 0
  layout: str = "pre_ln"
  norm_eps: float = 1e-6
  activation: str = "gelu_tanh"

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, deterministic: bool, decode: bool = False) -> jax.Array:
    pre = self.layout == "pre_ln"
    post_norm = lambda name: (lambda x: x) if pre else nn.LayerNorm(self.norm_eps, dtype=x_BxLxD.dtype, name=name)
    x_BxLxD = post_norm("mixing_norm")(x_BxLxD + MixingSublayer(
        self.make_mixer, self.dropout, pre, self.norm_eps, name="mixing")(x_BxLxD, mask_BxL, deterministic, decode))
    return post_norm("feed_forward_norm")(x_BxLxD + FeedForwardSublayer(
        self.d_ff, self.dropout, self.ff_chunk_size, pre, self.norm_eps, self.activation, name="feed_forward")(
            x_BxLxD, deterministic))


class Transformer(nn.Module):
  make_mixer: Callable[..., nn.Module]  # (name=...) → the mixer module
  # (final states x_BxLxD in float32, mask_BxL) → logits; its parameters are created in this module's scope
  head: Callable[[jax.Array, jax.Array], jax.Array]
  vocab_size: int
  d_model: int
  num_layers: int
  d_ff: int
  max_len: int
  dropout: float
  dtype: str = "float32"  # compute dtype; parameters stay float32, logits are float32
  reversible: bool = False  # RevNet couplings with a recomputing backward pass (efftx.reversible)
  ff_chunk_size: int = 0    # feed-forward over sequence chunks of this many positions (0: whole sequence)
  # "pre_ln" (a final LayerNorm after the blocks) or "post_ln" (BERT / published FNet: the embeddings are
  # normalised, each block ends with a LayerNorm, no final one)
  block_layout: str = "pre_ln"
  embed_projection: bool = False  # FNet: a dense D→D layer after the embedding LayerNorm
  norm_eps: float = 1e-6          # LayerNorm epsilon (HF BERT / FNet: 1e-12)
  activation: str = "gelu_tanh"   # feed-forward nonlinearity, a key of ACTIVATIONS
  cls_token: bool = False         # a learned [CLS] vector before the tokens (position 0; LRA: initialised to 0)
  # 0: flax's default initialisation of dense kernels (LeCun normal, std 1/√fan-in); > 0: every dense kernel
  # drawn from N(0, init_std²) instead (GPT-2, BERT, Zoology: 0.02), by `initialize`
  init_std: float = 0.0

  @nn.compact
  def __call__(self, tokens_BxL: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False, positions: jax.Array | None = None) -> jax.Array:
    """Logits; with positions (B×K indices), only at those positions (the head sees x_BxKxD: a per-position loss
    that looks at a few positions, MQAR's queries, skips the rest of the B×L×V logits). With decode=True (causal
    LMs), after `init(key, tokens_BxT, decode=True)` made the cache for T positions: one token per call,
    `apply({**variables, "cache": cache}, tokens_Bx1, decode=True, mutable=["cache"])`, each mixed with the ones
    before it."""
    _, L = tokens_BxL.shape
    if L > self.max_len:
      raise ValueError(f"sequence length {L} exceeds max_len={self.max_len}")
    mask_BxL = jnp.ones(tokens_BxL.shape, bool) if mask is None else mask.astype(bool)

    dtype = jnp.dtype(self.dtype)
    x_BxLxD = nn.Embed(self.vocab_size, self.d_model, embedding_init=nn.initializers.normal(0.02), dtype=dtype,
                       name="embed")(tokens_BxL)
    if self.cls_token:  # then every later step sees L + 1 positions, the first one the [CLS] vector
      if decode:
        raise ValueError("decoding is not supported with a [CLS] position (pooling='cls' is for classification)")
      cls_1x1xD = self.param("cls", nn.initializers.zeros, (1, 1, self.d_model)).astype(dtype)
      x_BxLxD = jnp.concatenate([jnp.broadcast_to(cls_1x1xD, (len(x_BxLxD), 1, self.d_model)), x_BxLxD], axis=1)
      mask_BxL = jnp.concatenate([jnp.ones_like(mask_BxL[:, :1]), mask_BxL], axis=1)
      L += 1
    pos_MxD = self.param("pos_embed", nn.initializers.normal(0.02), (self.max_len + self.cls_token, self.d_model))
    pos_LxD = pos_MxD[:L]
    if decode:
      decoding = self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      if decoding:
        pos_LxD = jax.lax.dynamic_slice_in_dim(pos_MxD, position.value, L)
        position.value += L
    x_BxLxD = x_BxLxD + pos_LxD.astype(dtype)
    post_ln = self.block_layout == "post_ln"
    if post_ln:
      x_BxLxD = nn.LayerNorm(self.norm_eps, dtype=dtype, name="embed_norm")(x_BxLxD)
    if self.embed_projection:
      x_BxLxD = nn.Dense(self.d_model, dtype=dtype, name="embed_projection")(x_BxLxD)
    x_BxLxD = nn.Dropout(self.dropout)(x_BxLxD, deterministic=deterministic)
    if self.reversible:
      if decode:
        raise ValueError("decoding is not supported with reversible=True (train reversibly, decode without)")
      x_BxLxD = ReversibleStack(
          make_f=lambda: MixingSublayer(self.make_mixer, self.dropout, parent=None),
          make_g=lambda: FeedForwardSublayer(self.d_ff, self.dropout, self.ff_chunk_size, activation=self.activation,
                                         parent=None),
          num_layers=self.num_layers, name="reversible")(x_BxLxD, mask_BxL, deterministic)
    else:
      for i in range(self.num_layers):
        x_BxLxD = Block(self.make_mixer, self.d_ff, self.dropout, self.ff_chunk_size, self.block_layout,
                        self.norm_eps, self.activation, name=f"block_{i}")(x_BxLxD, mask_BxL, deterministic, decode)
    if post_ln:  # each block ended with a LayerNorm already
      x_BxLxD = x_BxLxD.astype(jnp.float32)
    else:
      x_BxLxD = nn.LayerNorm(self.norm_eps, dtype=jnp.float32, name="final_norm")(x_BxLxD)
    if positions is not None:
      if self.cls_token:
        raise ValueError("positions select per-position logits; a [CLS] position is for classification")
      x_BxLxD = jnp.take_along_axis(x_BxLxD, positions[..., None], axis=1)  # now x_BxKxD
      mask_BxL = jnp.take_along_axis(mask_BxL, positions, axis=1)
    return self.head(x_BxLxD, mask_BxL)  # the heads run in float32


def build_model(config: ml_collections.ConfigDict, head: Callable[[jax.Array, jax.Array], jax.Array],
                vocab_size: int) -> Transformer:
  """The model of a run config (config.model, and config.mixer: the options of config.model.mixer) with the
  objective's head over a vocabulary of vocab_size tokens. Checks the mixer options (raises UserError)."""
  m = config.model
  spec = MIXERS[m.mixer]
  options = dict(config.mixer)
  spec.check(options, m.d_model, m.causal)
  extra = {"max_len": m.max_len + (m.pooling == "cls")} if spec.takes_max_len else {}
  return Transformer(
      make_mixer=functools.partial(spec.module, causal=m.causal, **extra, **options), head=head,
      vocab_size=vocab_size, d_model=m.d_model, num_layers=m.num_layers, d_ff=m.d_ff, max_len=m.max_len,
      dropout=m.dropout, dtype=m.dtype, reversible=m.reversible, ff_chunk_size=m.ff_chunk_size,
      block_layout=m.block_layout, embed_projection=m.embed_projection, norm_eps=m.norm_eps, activation=m.activation,
      cls_token=m.pooling == "cls", init_std=m.init_std)


def initialize(model: Transformer, key: jax.Array) -> Any:
  """Fresh parameters of `model` (shapes from one sequence of model.max_len tokens). With model.init_std > 0,
  every dense layer's kernel (a "kernel" beside a "bias": nn.Dense, nn.DenseGeneral, also when stacked by the
  reversible layers) is redrawn from N(0, init_std²); biases stay 0, embeddings N(0, 0.02²), and other parameters
  as their module makes them (AFT-conv's "kernel", which is renormalised in use, among them)."""
  params = model.init(key, jnp.zeros((1, model.max_len), jnp.int32))["params"]
  if not model.init_std:
    return params

  def redraw(path, leaf):
    keys = [getattr(p, "key", None) for p in path]
    parent = functools.reduce(lambda node, k: node[k], keys[:-1], params)
    if keys[-1] != "kernel" or not isinstance(parent.get("bias"), jax.Array):
      return leaf
    leaf_key = jax.random.fold_in(key, zlib.crc32("/".join(map(str, keys)).encode()))
    return model.init_std * jax.random.normal(leaf_key, leaf.shape, leaf.dtype)

  return jax.tree_util.tree_map_with_path(redraw, params)

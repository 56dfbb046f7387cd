"""The Transformer around a token mixer: embeddings → pre-LN blocks (mixer, feed-forward) → final norm → head.

`build_model(config, head)` picks each layer's mixer by name from `efftx.mixers.MIXERS` — config.model.mixer is a
mixer name or a layer pattern (efftx/patterns.py: local*3+attention, fnet+attention*2@top) — with the options in
`config.mixer` and copies the fields of `config.model`, each declared once here (CONFIG_FIELDS: default, meaning,
allowed values; `python -m efftx.config` lists them); the head comes from the objective (`efftx.objectives`: e.g.
`OBJECTIVES["lm"].head(vocab, 0)`). The model knows nothing of data or objectives beyond that function. Applied as
`model.apply(variables, tokens_BxL, mask=mask_BxL, deterministic=True)`.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import itertools
from typing import Any
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from efftx import patterns
from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers import MIXERS
from efftx.mixers.spec import mixer_module
from efftx.reversible import ReversibleStack


@jax.custom_vjp
def gelu_erf(x: jax.Array) -> jax.Array:
  """Exact GELU, x·Φ(x) = x·(1 + erf(x/√2))/2, computed in float32 and returned in x's dtype: the same function as
  nn.gelu(approximate=False), with its derivative Φ(x) + x·φ(x) written out as the backward pass, which is faster
  than autodiff's on XLA:CPU (experiments/performance/DECISIONS.md: gelu-erf-written-out-backward)."""
  x32 = x.astype(jnp.float32)
  return (x32 * (0.5 + 0.5 * jax.lax.erf(x32 * np.float32(np.sqrt(0.5))))).astype(x.dtype)


def _gelu_erf_fwd(x):
  return gelu_erf(x), x


def _gelu_erf_bwd(x, g):
  # The barrier makes XLA recompute erf(x/√2) here instead of keeping the forward pass's B×L×F copy of it, which
  # is faster on XLA:CPU (experiments/performance/DECISIONS.md: gelu-erf-recomputed-in-backward).
  x32 = jax.lax.optimization_barrier(x).astype(jnp.float32)
  cdf = 0.5 + 0.5 * jax.lax.erf(x32 * np.float32(np.sqrt(0.5)))
  pdf = np.float32(1 / np.sqrt(2 * np.pi)) * jnp.exp(-0.5 * x32 * x32)
  return ((g.astype(jnp.float32) * (cdf + x32 * pdf)).astype(x.dtype),)


gelu_erf.defvjp(_gelu_erf_fwd, _gelu_erf_bwd)

# The feed-forward nonlinearity: GELU's tanh approximation (Flax's default; HF FNet's "gelu_new") or exact (erf,
# BERT's "gelu"); or a gated unit (GATED): SwiGLU, SiLU(gate x) ⊙ up x (Shazeer 2020; Llama's MLP).
ACTIVATIONS = {"gelu_tanh": lambda x: nn.gelu(x, approximate=True), "gelu": gelu_erf, "swiglu": nn.silu}
GATED = ("swiglu",)  # activations of a gated feed-forward: gate and up projections, no biases
BLOCK_LAYOUTS = ("pre_ln", "post_ln")
POSITION_EMBEDDINGS = ("learned", "none", "rotary")
# The norms: LayerNorm (mean and variance; scale and bias) or RMSNorm, x / √(mean(x²) + ε) · scale (Zhang & Sennrich
# 2019; Llama's and Mamba's), both with statistics in float32 whatever the compute dtype.
NORMS = {"layer": nn.LayerNorm, "rms": nn.RMSNorm}


def make_norm(kind: str, eps: float, dtype: Any, name: str) -> nn.Module:
  """A norm of kind "layer" or "rms" (NORMS) over the last axis, its output in dtype."""
  return NORMS[kind](epsilon=eps, dtype=dtype, name=name)


class FeedForward(nn.Module):
  """down(act(up x)), biases in both; gated (GATED: "swiglu"), down(act(gate x) ⊙ up x) without biases (Llama's
  MLP). d_ff is the hidden width either way."""

  d_ff: int
  dropout: float
  activation: str = "gelu_tanh"

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, deterministic: bool) -> jax.Array:
    gated = self.activation in GATED
    dense = functools.partial(nn.Dense, dtype=x_BxLxD.dtype, use_bias=not gated)
    h_BxLxF = dense(self.d_ff, name="up")(x_BxLxD)
    if gated:
      h_BxLxF = ACTIVATIONS[self.activation](dense(self.d_ff, name="gate")(x_BxLxD)) * h_BxLxF
    else:
      h_BxLxF = ACTIVATIONS[self.activation](h_BxLxF)
    h_BxLxF = nn.Dropout(self.dropout)(h_BxLxF, deterministic=deterministic)
    return dense(x_BxLxD.shape[-1], name="down")(h_BxLxF)


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
  norm: str = "layer"  # a key of NORMS

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, deterministic: bool, decode: bool = False):
    h_BxLxD = x_BxLxD
    if self.pre_norm:  # statistics in float32 regardless
      h_BxLxD = make_norm(self.norm, self.norm_eps, x_BxLxD.dtype, "norm")(x_BxLxD)
    h_BxLxD = self.make_mixer(name="mixer")(
      h_BxLxD, mask=mask_BxL, deterministic=deterministic, **({"decode": True} if decode else {})
    )
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
  norm: str = "layer"  # a key of NORMS

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, deterministic: bool) -> jax.Array:
    h_BxLxD = x_BxLxD
    if self.pre_norm:
      h_BxLxD = make_norm(self.norm, self.norm_eps, x_BxLxD.dtype, "norm")(x_BxLxD)
    B, L, D = h_BxLxD.shape
    C = self.ff_chunk_size
    if C and L > C and L % C == 0:
      # One chunk at a time (scan), each recomputed in the backward pass (remat): the B×C×d_ff hidden layer is
      # the only one alive, instead of B×L×d_ff.
      chunked = nn.scan(
        nn.remat(_FeedForwardChunk),
        variable_broadcast="params",
        split_rngs={"params": False, "dropout": True},
        in_axes=1,
        out_axes=1,
      )
      _, h_BxNxCxD = chunked(self.d_ff, self.dropout, deterministic, self.activation, name="chunks")(
        None, h_BxLxD.reshape(B, L // C, C, D)
      )
      h_BxLxD = h_BxNxCxD.reshape(B, L, D)
    else:
      h_BxLxD = FeedForward(self.d_ff, self.dropout, self.activation, name="ff")(h_BxLxD, deterministic)
    return nn.Dropout(self.dropout)(h_BxLxD, deterministic=deterministic)


class Block(nn.Module):
  """A residual block. "pre_ln": x + F(x), then x + G(x), each branch normalising its input. "post_ln" (BERT's and
  the published FNet's layout): LN(x + F(x)), then LN(x + G(x)), the branches without a norm of their own. With
  d_ff = 0 there is no G. With state_mixer "identity" (pre_ln only), G(x) = dropout(LN(x)): Zoology's blocks with
  torch.nn.Identity as their state mixer (zoology/model.py TransformerBlock), whose normalised output the next
  residual addition adds to the stream. Every "LN" is the norm of kind `norm` (NORMS: LayerNorm or RMSNorm)."""

  make_mixer: Callable[..., nn.Module]
  d_ff: int
  dropout: float
  ff_chunk_size: int = 0
  layout: str = "pre_ln"
  norm_eps: float = 1e-6
  activation: str = "gelu_tanh"
  state_mixer: str = "mlp"
  norm: str = "layer"  # a key of NORMS

  @nn.compact
  def __call__(self, x_BxLxD: jax.Array, mask_BxL: jax.Array, deterministic: bool, decode: bool = False) -> jax.Array:
    pre = self.layout == "pre_ln"
    post_norm = lambda name: (lambda x: x) if pre else make_norm(self.norm, self.norm_eps, x_BxLxD.dtype, name)
    x_BxLxD = post_norm("mixing_norm")(
      x_BxLxD
      + MixingSublayer(self.make_mixer, self.dropout, pre, self.norm_eps, self.norm, name="mixing")(
        x_BxLxD, mask_BxL, deterministic, decode
      )
    )
    if self.state_mixer == "identity":
      normed_BxLxD = make_norm(self.norm, self.norm_eps, x_BxLxD.dtype, "identity_norm")(x_BxLxD)
      return x_BxLxD + nn.Dropout(self.dropout)(normed_BxLxD, deterministic=deterministic)
    if not self.d_ff:
      return x_BxLxD
    return post_norm("feed_forward_norm")(
      x_BxLxD
      + FeedForwardSublayer(
        self.d_ff, self.dropout, self.ff_chunk_size, pre, self.norm_eps, self.activation, self.norm, name="feed_forward"
      )(x_BxLxD, deterministic)
    )


def declared(default: Any, help: str, **allowed: Any) -> Any:  # pylint: disable=redefined-builtin
  """A Transformer field that is also a config.model field: its default, one-line help and allowed values
  (efftx.fields.Field's choices, at_least, above, below). CONFIG_FIELDS (below Transformer) lists them all, and
  efftx.config builds config.model and its per-field checks from it."""
  return dataclasses.field(default=default, metadata={"config": Field(help, default, **allowed)})


class Transformer(nn.Module):
  """The whole model. Its fields from d_model on are config.model's (build_model copies them), each declared once
  here with its default, meaning and allowed values."""

  # (name=...) → the mixer module: one for every layer, or a tuple with one per layer (a layer pattern)
  make_mixer: Callable[..., nn.Module] | tuple[Callable[..., nn.Module], ...]
  # (final states x_BxLxD in float32, mask_BxL) → logits; its parameters are created in this module's scope
  head: Callable[[jax.Array, jax.Array], jax.Array]
  vocab_size: int
  cls_token: bool = False  # a learned [CLS] vector before the tokens (position 0, initialised to 0; config: pooling)
  # (height, width, channels) of the image whose pixels the tokens are (raster order, values 0–255), from the
  # task; with patch_size > 0 the model embeds its patches instead of its tokens
  image_shape: tuple[int, int, int] | None = None
  d_model: int = declared(128, "width of the residual stream (features per position)", at_least=1)
  num_layers: int = declared(2, "blocks (mixer sublayer + feed-forward sublayer)", at_least=1)
  d_ff: int = declared(
    512, "hidden width of the feed-forward sublayer (features; 0: no feed-forward sublayer)", at_least=0
  )
  max_len: int = declared(128, "sequence length every example is padded to (tokens)", at_least=1)
  dropout: float = declared(
    0.1,
    "dropout rate on the embeddings, the residual branches and the feed-forward hidden layer (a probability)",
    at_least=0,
    below=1,
  )
  embed_dropout: float = declared(
    -1.0,
    "dropout rate on the embeddings alone (a probability); -1: config.model.dropout (Zoology: 0.1 on the "
    "embeddings, 0 elsewhere)",
    at_least=-1,
    below=1,
  )
  dtype: str = declared("float32", "compute dtype; parameters and logits stay float32", choices=("float32", "bfloat16"))
  reversible: bool = declared(
    False,
    "reversible (RevNet) couplings whose backward pass recomputes the activations "
    "(efftx.reversible): activation memory independent of num_layers",
  )
  reversible_recompute: bool = declared(
    True,
    "with reversible: false differentiates the same couplings by plain autodiff, storing every layer's "
    "activations (the baseline for what recomputing costs)",
  )
  ff_chunk_size: int = declared(
    0,
    "feed-forward over chunks of this many positions, the same result with a lower peak memory (0: all at once)",
    at_least=0,
  )
  block_layout: str = declared(
    "pre_ln",
    '"pre_ln": x + F(LN x), a final LN; "post_ln": LN(x + F(x)), LN on the '
    "embeddings, no final LN (BERT's and the published FNet's layout)",
    choices=BLOCK_LAYOUTS,
  )
  embed_projection: bool = declared(False, "a dense D→D layer on the (normalised) embeddings (published FNet)")
  norm_eps: float = declared(
    1e-6, "epsilon of the norms, LayerNorm or RMSNorm (HF BERT and FNet checkpoints: 1e-12)", above=0, below=1
  )
  init_std: float = declared(
    0.0,
    "0: flax's LeCun-normal dense kernels (std 1/√fan-in); > 0: every dense kernel "
    "drawn from N(0, init_std²) by `initialize` (GPT-2, BERT, Zoology: 0.02; MQAR "
    "needs it, configs/mqar.py)",
    at_least=0,
  )
  patch_size: int = declared(
    0,
    "images (tasks with an image_shape): the tokens are the image's pixels, cut into "
    "patch_size × patch_size patches, each embedded by a dense layer (ViT/DeiT) with a "
    "learned position per patch of the grid; 0: every token is embedded",
    at_least=0,
  )
  activation: str = declared(
    "gelu_tanh",
    'feed-forward nonlinearity: GELU "gelu_tanh" (the tanh approximation; HF FNet) or "gelu" (erf; BERT); "swiglu": '
    "down(SiLU(gate x) ⊙ up x), no biases, d_ff the hidden width (Llama)",
    choices=tuple(ACTIVATIONS),
  )
  position_embedding: str = declared(
    "learned",
    '"learned": a learned vector per position added to the embeddings; "none": no position information but what '
    "the mixers make (Zoology's non-attention models); \"rotary\": RoPE (rotate-half, base 10000) on the queries "
    "and keys of the layers whose mixer takes it (attention), nothing elsewhere, no learned positions",
    choices=POSITION_EMBEDDINGS,
  )
  state_mixer: str = declared(
    "mlp",
    '"mlp": the feed-forward sublayer of width d_ff (none with d_ff=0); "identity": Zoology\'s blocks with '
    "torch.nn.Identity as state mixer, whose sublayer adds LN(x) to the residual stream (pre_ln only)",
    choices=("mlp", "identity"),
  )
  tie_embeddings: bool = declared(
    False,
    "per-position heads (LM, MQAR): the logits are the final states times the token embeddings' transpose, no "
    "bias (Zoology, GPT-2); False: the objective's own dense head",
  )
  init_rescale_out: bool = declared(
    False,
    "with init_std > 0: the mixers' output projections (dense layers named out or out_proj) drawn with "
    "init_std/√(2·num_layers) (Zoology, GPT-2)",
  )
  type_vocab_size: int = declared(
    0,
    "token types (segments: a sentence pair's A 0 and B 1, from a checkpoint's "
    "tokenizer) embedded and added to the input, as BERT and FNet do; 0: none (a "
    "batch's token_types are not read)",
    at_least=0,
  )
  norm: str = declared(
    "layer",
    'every norm of the model (blocks, final, post_ln\'s): "layer": LayerNorm; "rms": RMSNorm, '
    "x / √(mean(x²) + norm_eps) · scale, no bias (Llama, Mamba); statistics in float32 either way",
    choices=tuple(NORMS),
  )

  @nn.compact
  def __call__(
    self,
    tokens_BxL: jax.Array,
    mask: jax.Array | None = None,
    deterministic: bool = True,
    decode: bool = False,
    positions: jax.Array | None = None,
    token_types: jax.Array | None = None,
  ) -> jax.Array:
    """Logits; with positions (B×K indices), only at those positions (the head sees x_BxKxD: a per-position loss
    that looks at a few positions, MQAR's queries, skips the rest of the B×L×V logits). token_types (B×L ids in
    [0, type_vocab_size); all 0 when not given) add their embedding where type_vocab_size > 0. With decode=True (causal
    LMs), after `init(key, tokens_BxT, decode=True)` made the cache for T positions: one token per call,
    `apply({**variables, "cache": cache}, tokens_Bx1, decode=True, mutable=["cache"])`, each mixed with the ones
    before it."""
    _, L = tokens_BxL.shape
    if L > self.max_len:
      raise ValueError(f"sequence length {L} exceeds max_len={self.max_len}")
    mask_BxL = jnp.ones(tokens_BxL.shape, bool) if mask is None else mask.astype(bool)

    dtype = jnp.dtype(self.dtype)
    if self.patch_size:  # from here on the positions are the image's patches (raster order over the grid)
      if decode or positions is not None:
        raise ValueError("patch embeddings are for classification: no decoding, no per-position logits")
      x_BxLxD, mask_BxL = self._embed_patches(tokens_BxL, mask_BxL, dtype)
      L = x_BxLxD.shape[1]
    else:
      embed = nn.Embed(
        self.vocab_size, self.d_model, embedding_init=nn.initializers.normal(0.02), dtype=dtype, name="embed"
      )
      x_BxLxD = embed(tokens_BxL)
    if self.cls_token:  # then every later step sees L + 1 positions, the first one the [CLS] vector
      if decode:
        raise ValueError("decoding is not supported with a [CLS] position (pooling='cls' is for classification)")
      cls_1x1xD = self.param("cls", nn.initializers.zeros, (1, 1, self.d_model)).astype(dtype)
      x_BxLxD = jnp.concatenate([jnp.broadcast_to(cls_1x1xD, (len(x_BxLxD), 1, self.d_model)), x_BxLxD], axis=1)
      mask_BxL = jnp.concatenate([jnp.ones_like(mask_BxL[:, :1]), mask_BxL], axis=1)
      L += 1
    if self.position_embedding == "learned":
      positions_kept = self.num_patches if self.patch_size else self.max_len
      pos_MxD = self.param("pos_embed", nn.initializers.normal(0.02), (positions_kept + self.cls_token, self.d_model))
      pos_LxD = pos_MxD[:L]
      if decode:
        decoding = self.has_variable("cache", "position")
        position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
        if decoding:
          pos_LxD = jax.lax.dynamic_slice_in_dim(pos_MxD, position.value, L)
          position.value += L
      x_BxLxD = x_BxLxD + pos_LxD.astype(dtype)
    if self.type_vocab_size:
      types_BxL = jnp.zeros(x_BxLxD.shape[:2], jnp.int32)
      if token_types is not None:  # (the [CLS] position, if any, is type 0)
        types_BxL = types_BxL.at[:, L - token_types.shape[1] :].set(token_types.astype(jnp.int32))
      x_BxLxD = x_BxLxD + nn.Embed(
        self.type_vocab_size, self.d_model, embedding_init=nn.initializers.normal(0.02), dtype=dtype, name="type_embed"
      )(types_BxL)
    post_ln = self.block_layout == "post_ln"
    if post_ln:
      x_BxLxD = make_norm(self.norm, self.norm_eps, dtype, "embed_norm")(x_BxLxD)
    if self.embed_projection:
      x_BxLxD = nn.Dense(self.d_model, dtype=dtype, name="embed_projection")(x_BxLxD)
    embed_dropout = self.dropout if self.embed_dropout < 0 else self.embed_dropout
    x_BxLxD = nn.Dropout(embed_dropout)(x_BxLxD, deterministic=deterministic)
    if self.reversible:
      if decode:
        raise ValueError("decoding is not supported with reversible=True (train reversibly, decode without)")
      # Consecutive layers with the same mixer form a segment, its parameters stacked (one segment: all layers).
      segments = [
        (maker, len(list(run))) for maker, run in itertools.groupby(map(self.mixer_of, range(self.num_layers)))
      ]
      make_fs = tuple(
        functools.partial(
          lambda maker: MixingSublayer(maker, self.dropout, norm_eps=self.norm_eps, norm=self.norm, parent=None), maker
        )
        for maker, _ in segments
      )
      x_BxLxD = ReversibleStack(
        make_f=make_fs[0] if len(make_fs) == 1 else make_fs,
        make_g=lambda: FeedForwardSublayer(
          self.d_ff,
          self.dropout,
          self.ff_chunk_size,
          norm_eps=self.norm_eps,
          activation=self.activation,
          norm=self.norm,
          parent=None,
        ),
        num_layers=self.num_layers,
        segment_sizes=tuple(n for _, n in segments) if len(segments) > 1 else (),
        recompute=self.reversible_recompute,
        name="reversible",
      )(x_BxLxD, mask_BxL, deterministic)
    else:
      for i in range(self.num_layers):
        x_BxLxD = Block(
          self.mixer_of(i),
          self.d_ff,
          self.dropout,
          self.ff_chunk_size,
          self.block_layout,
          self.norm_eps,
          self.activation,
          self.state_mixer,
          self.norm,
          name=f"block_{i}",
        )(x_BxLxD, mask_BxL, deterministic, decode)
    if post_ln:  # each block ended with a LayerNorm already
      x_BxLxD = x_BxLxD.astype(jnp.float32)
    else:
      x_BxLxD = make_norm(self.norm, self.norm_eps, jnp.float32, "final_norm")(x_BxLxD)
    if positions is not None:
      if self.cls_token:
        raise ValueError("positions select per-position logits; a [CLS] position is for classification")
      x_BxLxD = jnp.take_along_axis(x_BxLxD, positions[..., None], axis=1)  # now x_BxKxD
      mask_BxL = jnp.take_along_axis(mask_BxL, positions, axis=1)
    if self.tie_embeddings:
      if self.patch_size:
        raise ValueError("tie_embeddings: patch embeddings have no token embeddings to tie")
      # In float32, as the heads: the embedding itself, not its compute-dtype copy that Embed.attend would use.
      return x_BxLxD.astype(jnp.float32) @ embed.embedding.astype(jnp.float32).T
    return self.head(x_BxLxD, mask_BxL)  # the heads run in float32

  def mixer_of(self, layer: int) -> Callable[..., nn.Module]:
    """The mixer maker of a layer (0-based), with the layer's index where the mixer takes one (layer_idx)."""
    maker = self.make_mixer[layer] if isinstance(self.make_mixer, tuple) else self.make_mixer
    module = getattr(maker, "func", None)
    if dataclasses.is_dataclass(module) and any(f.name == "layer_idx" for f in dataclasses.fields(module)):
      return functools.partial(maker, layer_idx=layer)
    return maker

  @property
  def grid(self) -> tuple[int, int] | None:
    """(rows, columns) of the patch grid, None without patches."""
    if not self.patch_size:
      return None
    H, W, _ = self.image_shape
    return H // self.patch_size, W // self.patch_size

  @property
  def num_patches(self) -> int:
    rows, cols = self.grid
    return rows * cols

  def _embed_patches(self, tokens_BxL: jax.Array, mask_BxL: jax.Array, dtype) -> tuple[jax.Array, jax.Array]:
    """ViT/DeiT patch embedding: the pixel tokens (raster order, 0–255) as an image scaled to [−1, 1], cut into
    non-overlapping p×p patches, each flattened (p·p·C values) and mapped to d_model by one dense layer (the same
    as a p×p convolution with stride p). Returns x_BxNxD over the N patches in raster order of the grid, and
    their mask (a patch is real if any of its pixels is)."""
    if self.image_shape is None:
      raise ValueError("patch_size > 0 needs an image task (one whose tokens are pixels: Task.image_shape)")
    B, L = tokens_BxL.shape
    H, W, C = self.image_shape
    p = self.patch_size
    if L != H * W * C:
      raise ValueError(f"an image of {H}×{W}×{C} is {H * W * C} pixel tokens, not {L}")
    rows, cols = self.grid
    image_BxRxpxCxpxC = (tokens_BxL.astype(jnp.float32) / 127.5 - 1.0).reshape(B, rows, p, cols, p, C)
    patches_BxNxP = image_BxRxpxCxpxC.transpose(0, 1, 3, 2, 4, 5).reshape(B, rows * cols, p * p * C)
    x_BxNxD = nn.Dense(self.d_model, dtype=dtype, name="patch_embed")(patches_BxNxP.astype(dtype))
    mask_BxN = mask_BxL.reshape(B, rows, p, cols, p, C).any(axis=(2, 4, 5)).reshape(B, rows * cols)
    return x_BxNxD, mask_BxN


# The Transformer fields that are config.model fields (build_model copies them).
_DECLARED = {f.name: f.metadata["config"] for f in dataclasses.fields(Transformer) if "config" in f.metadata}

# Every field of config.model, in its order: the Transformer's declared fields, and three that build_model maps
# instead of copying (mixer and causal → make_mixer, pooling → cls_token).
CONFIG_FIELDS: dict[str, Field] = {
  "mixer": Field(
    "token mixer, a key of efftx.mixers.MIXERS, or a layer pattern: a mixer per layer "
    "(efftx/patterns.py: local*3+attention, fnet+attention*2@top, fnet_hybrid); its options are "
    "config.mixer (python -m efftx.mixers)",
    "attention",
  ),
  "causal": Field(
    "causal mixing: position t sees positions ≤ t only (required by LM objectives; FNet cannot be causal)", False
  ),
  **_DECLARED,
  "pooling": Field(
    'classification: "mean" of the real tokens\' final states; "cls": a learned [CLS] vector is put '
    "before the tokens (position 0, LRA's way) and its final state is pooled; \"first\": the "
    "input's own first token (the [CLS] of a checkpoint's tokenizer) through BERT's and FNet's "
    "pooler (dense + tanh)",
    "mean",
    choices=("mean", "cls", "first"),
  ),
}


def build_model(
  config: ml_collections.ConfigDict,
  head: Callable[[jax.Array, jax.Array], jax.Array],
  vocab_size: int,
  image_shape: tuple[int, int, int] | None = None,
) -> Transformer:
  """The model of a run config (config.model, and config.mixer: the options of config.model.mixer's mixers) with
  the objective's head over a vocabulary of vocab_size tokens; image_shape (the task's) where the tokens are an
  image's pixels. Checks the mixer options and the patch size (raises UserError)."""
  m = config.model
  grid = None
  if m.patch_size:
    if image_shape is None:
      raise UserError(
        f"config.model.patch_size={m.patch_size}: task '{config.data.task}' is not an image task "
        "(its tokens are not an image's pixels)"
      )
    H, W, _ = image_shape
    if H % m.patch_size or W % m.patch_size:
      raise UserError(f"config.model.patch_size={m.patch_size} must divide the image's height {H} and width {W}")
    grid = (H // m.patch_size, W // m.patch_size)
  positions = (grid[0] * grid[1] if grid else m.max_len) + (m.pooling == "cls")  # what the mixers see
  check_rotary(m.mixer, m.position_embedding)
  makers = {}
  rotary = m.position_embedding == "rotary"
  for name, options in patterns.sections(m.mixer, config.mixer).items():
    makers[name] = MIXERS[name].maker(
      options, causal=m.causal, d_model=m.d_model, max_len=positions, grid=grid, rotary=rotary
    )
  layers = tuple(makers[name] for name in patterns.layer_mixers(m.mixer, m.num_layers))
  make_mixer = layers[0] if len(makers) == 1 else layers
  return Transformer(
    make_mixer=make_mixer,
    head=head,
    vocab_size=vocab_size,
    cls_token=m.pooling == "cls",
    image_shape=tuple(image_shape) if m.patch_size else None,
    **{name: m[name] for name in _DECLARED},
  )


def check_rotary(mixer: str, position_embedding: str) -> None:
  """position_embedding="rotary" applies in the layers whose mixer takes it (MixerSpec.takes_rotary) and is nothing
  in the others; a pattern where no layer does would have no positions at all: UserError."""
  names = patterns.mixer_names(mixer)
  if position_embedding == "rotary" and not any(MIXERS[n].takes_rotary for n in names):
    raise UserError(
      f"config.model.position_embedding='rotary' rotates attention's queries and keys, but mixer '{mixer}' has none "
      f"(mixers that take it: {', '.join(n for n, s in MIXERS.items() if s.takes_rotary)}); use 'learned' or 'none'"
    )


OUTPUT_PROJECTIONS = ("out", "out_proj")  # a mixer's output projection: init_rescale_out's names


def initialize(model: Transformer, key: jax.Array) -> Any:
  """Fresh parameters of `model` (shapes from one sequence of model.max_len tokens). With model.init_std > 0,
  every dense layer's kernel (a "kernel" beside a "bias", or alone in its module: nn.Dense, nn.DenseGeneral, with or
  without a bias, also when stacked by the reversible layers) is redrawn from N(0, init_std²) (a mixer's output
  projection from N(0, init_std²/(2·num_layers)) with init_rescale_out), but for the dense layers a mixer keeps
  (MixerSpec.keep_init); biases stay 0, embeddings N(0, 0.02²), and other parameters as their module makes them
  (AFT-conv's "kernel", which sits beside its γ and β and is renormalised in use, among them)."""
  params = model.init(key, jnp.zeros((1, model.max_len), jnp.int32))["params"]
  if not model.init_std:
    return params

  kept = {  # (block, dense layer) pairs whose mixer keeps their initialisation (MixerSpec.keep_init)
    (f"block_{i}", name)
    for i in range(model.num_layers)
    for spec in MIXERS.values()
    if spec.module is mixer_module(model.mixer_of(i))
    for name in spec.keep_init
  }

  def redraw(path, leaf):
    keys = [getattr(p, "key", None) for p in path]
    parent = functools.reduce(lambda node, k: node[k], keys[:-1], params)
    if keys[-1] != "kernel" or not (isinstance(parent.get("bias"), jax.Array) or set(parent) == {"kernel"}):
      return leaf
    if keys[1:3] == ["mixing", "mixer"] and (keys[0], keys[-2]) in kept:
      return leaf
    leaf_key = jax.random.fold_in(key, zlib.crc32("/".join(map(str, keys)).encode()))
    std = model.init_std
    if model.init_rescale_out and "mixer" in keys and keys[-2] in OUTPUT_PROJECTIONS:
      std /= (2 * model.num_layers) ** 0.5
    return std * jax.random.normal(leaf_key, leaf.shape, leaf.dtype)

  return jax.tree_util.tree_map_with_path(redraw, params)

"""How a mixer declares itself: its options, what it can do, and the checks its options must pass.

Each mixer file ends with a `SPEC = MixerSpec(...)`; `efftx.mixers.MIXERS` maps a name to it. From the spec:
  - `config_lib.default_config(mixer)` fills `config.mixer` with exactly the declared options at their defaults
    (the module fields' defaults: one source), so an option the mixer lacks cannot be set or overridden;
  - `config_lib.validate` runs `spec.check(options, d_model=..., causal=...)` before anything is written;
  - the model builds each layer's module with `spec.maker(options, causal=..., max_len=..., grid=...)`, direct
    callers with `spec(causal=..., **options)` (the same, applied);
  - tests, bench and README read `can_be_causal`, `can_be_bidirectional`, `can_decode` and `has_heads` instead of
    keeping lists;
  - `efftx.bench` counts the model's FLOPs (and so its MFU) with `spec.train_flops(...)` ("n/a" where a mixer
    declares no count);
  - `efftx.trainer` decays the parameters named in `spec.decayed` besides every dense kernel and embedding.

Besides its options, a mixer module may have the fields `causal` (every mixer has it), `max_len` (mixers with
per-position parameters), `grid` (mixers that know a 2-D layout of the positions: (rows, columns) of an image's
patches, None for sequences), `layer_idx` (mixers whose initialisation depends on the layer: its index from 0 at
the input, as Zoology passes it) and `rotary` (mixers that can rotate queries and keys by their positions, RoPE:
set where config.model.position_embedding is "rotary"); the model fills those from `config.model`, the task and the
layer.

A causal-only mixer (a recurrence) can declare `bidirectional_by_reversal=True`: with causal=False it is built as
`ByReversal`, the mixer run causally over the sequence and over the reversed sequence, the two outputs summed.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field

MODEL_FIELDS = ("causal", "max_len", "grid", "layer_idx", "rotary")  # module fields filled from the model, not options


@dataclasses.dataclass(frozen=True)
class MixerSpec:
  """A mixer: its linen module class, declared options and capabilities."""

  module: type[nn.Module]
  summary: str  # one line: what it computes, and its cost in time / memory
  options: dict[str, Field]  # each names a module field, whose default is the option's
  can_be_causal: bool = True  # causal=True is allowed (FNet: no)
  can_be_bidirectional: bool = True  # causal=False is allowed (recurrences and causal convolutions: no)
  # A causal-only module that causal=False runs in both directions: causally over the sequence and over the reversed
  # sequence, separate parameters, outputs summed (ByReversal). Such a spec keeps can_be_bidirectional=True: causal=
  # False is allowed; the module itself is always built causal.
  bidirectional_by_reversal: bool = False
  can_decode: bool = False  # causal and decodes one token at a time with a cache (`decode=True`)
  # Relations between options and the model that a single option cannot state: (every option, d_model or None,
  # causal) → raises UserError. Runs after the per-option checks.
  relations: Callable[[dict[str, Any], int | None, bool], None] | None = None
  # The mixing's forward FLOPs per token of one layer, beyond its projections (Dense layers, counted with the model's
  # other matmuls), or None where not counted (then the model's FLOPs and MFU are "n/a"): (every option, length L,
  # d_model, causal) → 2 × the multiply-adds of its matmuls and convolutions as implemented (padding to blocks
  # included), FFTs as 5 N log2 N (complex, Cooley-Tukey: the convention of FNet's counts and of the PyTorch
  # comparison in experiments/performance). Elementwise work (softmax, exp, masks) is not counted, nor per-sequence
  # work shared by the batch (position-bias tables). tests/test_flops.py checks each against the matmuls in the
  # mixer's traced program.
  flops: Callable[[dict[str, Any], int, int, bool], float] | None = None
  # Training FLOPs of the mixing ÷ its forward FLOPs: 3 where both operands of its matmuls need gradients
  # (activations × activations, or learned weights); 2 where one operand is a constant (FNet's DFT: the backward
  # pass is one more transform of the same size, as the PyTorch comparison counts it).
  train_factor: float = 3.0
  # Grid-aware mixers: the forward FLOPs per token on an image's patch grid, (every option, length L, d_model,
  # cells of the grid) → as `flops` (L − cells leading positions, a [CLS], take no part in the grid's terms).
  flops_grid: Callable[[dict[str, Any], int, int, int], float] | None = None
  # The kernel a layer of this mixer should compile to, where it is not XLA's own code: (every option, length L,
  # compute dtype, platform: "cpu", "gpu" or "tpu", dropout active) → a key of efftx.platform.KERNELS, or None.
  # efftx.train compares it with what the compiled step calls, and says so.
  kernel: Callable[[dict[str, Any], int, Any, str, bool], str | None] | None = None
  # Names of this mixer's parameters (leaf names) that AdamW's weight decay applies to, besides "kernel" and
  # "embedding", which every module's dense layers and embeddings have and which are always decayed: learned
  # weight matrices of its own (linear_mixing's w_seq, w_hidden). Biases, scales and position biases are not
  # decayed. efftx.trainer decays every leaf whose name one of the registry's mixers declares here.
  decayed: tuple[str, ...] = ()
  # Dense layers of this mixer (module names) whose kernels keep the mixer's own initialisation when
  # config.model.init_std redraws every other dense kernel: RWKV's projections, which Zoology's re-initialisation
  # does not reach (its module is a torch.jit.ScriptModule).
  keep_init: tuple[str, ...] = ()

  def __post_init__(self):
    fields = {f.name: f for f in dataclasses.fields(self.module)}
    for name in self.options:
      if name not in fields or name in MODEL_FIELDS:
        raise TypeError(f"{self.module.__name__}: option '{name}' is not a module field (or is a model field)")
    if not (self.can_be_causal or self.can_be_bidirectional):
      raise TypeError(f"{self.module.__name__}: a mixer is causal, bidirectional or both")
    if "causal" not in fields:
      raise TypeError(f"{self.module.__name__}: a mixer module needs a `causal` field")
    if self.bidirectional_by_reversal and not (self.can_be_causal and self.can_be_bidirectional):
      raise TypeError(
        f"{self.module.__name__}: bidirectional_by_reversal runs a causal module both ways: it needs can_be_causal "
        "and allows causal=False (leave can_be_bidirectional at True)"
      )

  @property
  def name(self) -> str:
    return next((n for n, s in REGISTRY.items() if s is self), self.module.__name__)

  @property
  def causal_settings(self) -> tuple[bool, ...]:
    """The values config.model.causal may take with this mixer (False first where allowed)."""
    return tuple(c for c, ok in ((False, self.can_be_bidirectional), (True, self.can_be_causal)) if ok)

  @property
  def has_heads(self) -> bool:
    return "num_heads" in self.options

  @property
  def takes_max_len(self) -> bool:
    return any(f.name == "max_len" for f in dataclasses.fields(self.module))

  @property
  def takes_layer_idx(self) -> bool:
    return any(f.name == "layer_idx" for f in dataclasses.fields(self.module))

  @property
  def takes_grid(self) -> bool:
    return any(f.name == "grid" for f in dataclasses.fields(self.module))

  @property
  def takes_rotary(self) -> bool:
    """The module can rotate its queries and keys by position (RoPE; config.model.position_embedding="rotary")."""
    return any(f.name == "rotary" for f in dataclasses.fields(self.module))

  def defaults(self) -> dict[str, Any]:
    """Every option at its default (the module field's default)."""
    fields = {f.name: f.default for f in dataclasses.fields(self.module)}
    return {name: fields[name] for name in self.options}

  def forward_flops(self, options: dict[str, Any], length: int, d_model: int, causal: bool) -> float | None:
    """`flops` with the options not given at their defaults; None if the mixer declares no count."""
    if self.flops is None:
      return None
    if self.bidirectional_by_reversal and not causal:  # the causal mixing twice, once per direction
      return 2.0 * float(self.flops({**self.defaults(), **options}, length, d_model, True))
    return float(self.flops({**self.defaults(), **options}, length, d_model, causal))

  def train_flops(
    self, options: dict[str, Any], length: int, d_model: int, causal: bool, grid: tuple[int, int] | None = None
  ) -> float | None:
    """Forward and backward FLOPs of the mixing per token of one layer: forward_flops × train_factor (on an image's
    patch grid, flops_grid's count where the mixer knows the grid); None if the mixer declares no count."""
    if grid is not None and self.flops_grid is not None:
      return self.train_factor * float(
        self.flops_grid({**self.defaults(), **options}, length, d_model, grid[0] * grid[1])
      )
    forward = self.forward_flops(options, length, d_model, causal)
    return None if forward is None else self.train_factor * forward

  def describe(self) -> str:
    """'name (meaning, default D)' for every option: the line an error about options ends with."""
    if not self.options:
      return "(none)"
    defaults = self.defaults()
    return "; ".join(f"{n} ({o.help}; default {defaults[n]!r})" for n, o in self.options.items())

  def check(self, options: dict[str, Any], d_model: int | None, causal: bool) -> None:
    """Raises UserError for an unknown option, a value out of range, or options that cannot work together
    (d_model None: the width is not known yet, and not checked)."""
    unknown = sorted(set(options) - set(self.options))
    if unknown:
      raise UserError(
        f"config.mixer.{unknown[0]}: mixer '{self.name}' has no option '{unknown[0]}'; its options: {self.describe()}"
      )
    if causal and not self.can_be_causal:
      raise UserError(
        f"mixer '{self.name}' cannot be causal; causal mixers: "
        f"{', '.join(n for n, s in REGISTRY.items() if s.can_be_causal)} "
        "(or set config.model.causal=False)"
      )
    if not causal and not self.can_be_bidirectional:
      raise UserError(
        f"mixer '{self.name}' is causal only: set config.model.causal=True; mixers that mix in both directions: "
        f"{', '.join(n for n, s in REGISTRY.items() if s.can_be_bidirectional)}"
      )
    for name, value in options.items():
      self.options[name].check(f"config.mixer.{name}", value, mixer=self.name)
    resolved = {**self.defaults(), **options}
    if self.has_heads and d_model is not None and d_model % resolved["num_heads"]:
      raise UserError(
        f"config.model.d_model={d_model} must be divisible by config.mixer.num_heads="
        f"{resolved['num_heads']} (mixer '{self.name}' splits the width into heads)"
      )
    if self.relations:
      self.relations(resolved, d_model, causal)

  def maker(
    self,
    options: dict[str, Any],
    *,
    causal: bool = False,
    d_model: int | None = None,
    max_len: int | None = None,
    grid: tuple[int, int] | None = None,
    layer_idx: int | None = None,
    rotary: bool = False,
  ) -> functools.partial:
    """`maker(name=...)` → the module with these options (the rest at their defaults), after `check` (d_model, if
    given, is checked against num_heads). `max_len` (the positions the mixer sees) goes to mixers with
    per-position parameters, `grid` to grid-aware ones, which refuse it with causal=True, `rotary` to those that
    take it (others ignore it). With causal=False, a mixer bidirectional by reversal is a ByReversal around its
    causal module. The model builds every layer's mixer with this (efftx.model.build_model)."""
    self.check(options, d_model, causal)
    extra = {"max_len": max_len} if max_len is not None and self.takes_max_len else {}
    if layer_idx is not None and self.takes_layer_idx:
      extra["layer_idx"] = layer_idx
    if rotary and self.takes_rotary:
      resolved = {**self.defaults(), **options}
      if self.has_heads and d_model is not None and (d_model // resolved["num_heads"]) % 2:
        raise UserError(
          f"position_embedding='rotary' rotates pairs of features: mixer '{self.name}' needs an even head width, "
          f"not d_model / num_heads = {d_model}/{resolved['num_heads']}"
        )
      extra["rotary"] = True
    if grid is not None and self.takes_grid:
      if causal:
        raise UserError(
          f"mixer '{self.name}' mixes an image's patch grid in both directions: set "
          "config.model.causal=False for patches"
        )
      extra["grid"] = grid
    if self.bidirectional_by_reversal and not causal:
      return functools.partial(ByReversal, make=functools.partial(self.module, causal=True, **extra, **options))
    return functools.partial(self.module, causal=causal, **extra, **options)

  def __call__(
    self,
    *,
    causal: bool = False,
    max_len: int | None = None,
    d_model: int | None = None,
    grid: tuple[int, int] | None = None,
    layer_idx: int | None = None,
    rotary: bool = False,
    **options,
  ) -> nn.Module:
    """The module with these options: `maker(options, ...)()`."""
    return self.maker(
      options, causal=causal, d_model=d_model, max_len=max_len, grid=grid, layer_idx=layer_idx, rotary=rotary
    )()


class ByReversal(nn.Module):
  """A causal-only mixer used bidirectionally: y = M_fwd(x) + rev(M_bwd(rev(x))), each direction causal.

  The two directions have separate parameters ("forward", "backward" submodules), as Vision Mamba gives its forward
  and backward SSMs their own (Zhu et al. 2024); Caduceus ties them (BiMamba with weight tying, for reverse-
  complement equivariance of DNA and half the parameters), which a comparison of mixers at equal width would count
  as a smaller model. Padding is irrelevant anywhere (left, right, inside): per example, the real positions are
  gathered to the front in order for the forward direction and in reverse order for the backward one, padding
  after them, so each real position sees exactly the real positions before (resp. after) it; the outputs are
  scattered back, and padded positions get whatever the mixer gives padding (read by nothing). No decoding: decode
  with the causal mixer (causal=True).
  """

  make: Callable[..., nn.Module]  # (name=...) → the causal mixer module (its options, causal=True)
  layer_idx: int | None = None  # passed on to a mixer that takes one
  causal: bool = False

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    if decode:
      raise UserError("a mixer bidirectional by reversal cannot decode: decoding needs causal=True")
    make = self.make
    inner = getattr(make, "func", None)
    if self.layer_idx is not None and dataclasses.is_dataclass(inner):
      if any(f.name == "layer_idx" for f in dataclasses.fields(inner)):
        make = functools.partial(make, layer_idx=self.layer_idx)
    forward, backward = make(name="forward"), make(name="backward")
    if mask is None:  # the whole sequence is real: the plain reversal
      y_BxLxD = forward(x_BxLxD, deterministic=deterministic)
      return y_BxLxD + jnp.flip(backward(jnp.flip(x_BxLxD, 1), deterministic=deterministic), 1)
    L = x_BxLxD.shape[1]
    pos_L, mask_BxL = jnp.arange(L), mask.astype(bool)
    take = lambda a, idx_BxL: jnp.take_along_axis(a, idx_BxL.reshape(idx_BxL.shape + (1,) * (a.ndim - 2)), axis=1)
    y_BxLxD = 0
    # Sort keys: the real positions first (in order, resp. reversed), then the padding in order (a stable argsort).
    for mixer, key_L in ((forward, pos_L), (backward, L - 1 - pos_L)):
      order_BxL = jnp.argsort(jnp.where(mask_BxL, key_L, L + pos_L), axis=1)  # place j ← position order_BxL[:, j]
      y_sorted_BxLxD = mixer(take(x_BxLxD, order_BxL), mask=take(mask_BxL, order_BxL), deterministic=deterministic)
      y_BxLxD = y_BxLxD + take(y_sorted_BxLxD, jnp.argsort(order_BxL, axis=1))  # each output back at its position
    return y_BxLxD.astype(x_BxLxD.dtype)


def mixer_module(maker: Callable[..., nn.Module]) -> type[nn.Module] | None:
  """The mixer module class a maker builds (the causal module inside a ByReversal); None if not a partial."""
  module = getattr(maker, "func", None)
  if module is ByReversal:
    return getattr(maker.keywords["make"], "func", None)
  return module


def padded(length: int, block: int) -> int:
  """length rounded up to whole blocks: the positions a blocked mixer computes."""
  return -(-length // block) * block


# Every mixer by name: filled by efftx/mixers/__init__.py (which exports it as MIXERS), read here for a spec's name
# and the lists in its errors, so this module imports no mixer.
REGISTRY: dict[str, MixerSpec] = {}

"""How a mixer declares itself: its options, what it can do, and the checks its options must pass.

Each mixer file ends with a `SPEC = MixerSpec(...)`; `efftx.mixers.MIXERS` maps a name to it. From the spec:
  - `config_lib.default_config(mixer)` fills `config.mixer` with exactly the declared options at their defaults
    (the module fields' defaults: one source), so an option the mixer lacks cannot be set or overridden;
  - `config_lib.validate` runs `spec.check(options, d_model=..., causal=...)` before anything is written;
  - the model builds the module with `spec(causal=..., max_len=..., **options)`;
  - tests, bench and README read `can_be_causal`, `can_decode` and `has_heads` instead of keeping lists;
  - `efftx.bench` counts the model's FLOPs (and so its MFU) with `spec.train_flops(...)`.

Besides its options, a mixer module may have the fields `causal` (every mixer has it), `max_len` (mixers with
per-position parameters) and `grid` (mixers that know a 2-D layout of the positions: (rows, columns) of an image's
patches, None for sequences); the model fills those from `config.model` and the task.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax

from efftx.errors import UserError

MODEL_FIELDS = ("causal", "max_len", "grid")  # module fields filled from the model, not options


@dataclasses.dataclass(frozen=True)
class Option:
  """One hyperparameter of a mixer: a module field with its default, meaning and allowed values."""

  help: str                               # one line: meaning and unit
  choices: tuple[Any, ...] | None = None  # allowed values, if a fixed set
  at_least: float | None = None           # smallest allowed value
  below: float | None = None              # values must be strictly smaller (e.g. a probability < 1)

  def check(self, mixer: str, name: str, value: Any) -> None:
    if self.choices is not None and value not in self.choices:
      raise UserError(f"config.mixer.{name}={value!r}: mixer '{mixer}' takes one of "
                      f"{', '.join(map(str, self.choices))}")
    if self.at_least is not None and value < self.at_least:
      raise UserError(f"config.mixer.{name}={value!r}: mixer '{mixer}' needs {name} ≥ {self.at_least:g}")
    if self.below is not None and value >= self.below:
      raise UserError(f"config.mixer.{name}={value!r}: mixer '{mixer}' needs {name} < {self.below:g}")


@dataclasses.dataclass(frozen=True)
class MixerSpec:
  """A mixer: its linen module class, declared options and capabilities."""

  module: type[nn.Module]
  summary: str                 # one line: what it computes, and its cost in time / memory
  options: dict[str, Option]
  can_be_causal: bool = True   # causal=True is allowed (FNet: no)
  can_decode: bool = False     # causal and decodes one token at a time with a cache (`decode=True`)
  # Relations between options and the model that a single option cannot state: (every option, d_model or None,
  # causal) → raises UserError. Runs after the per-option checks.
  relations: Callable[[dict[str, Any], int | None, bool], None] | None = None
  # The mixing's forward FLOPs per token of one layer, beyond its projections (Dense layers, counted with the model's
  # other matmuls): (every option, length L, d_model, causal) → 2 × the multiply-adds of its matmuls and convolutions
  # as implemented (padding to blocks included), FFTs as 5 N log2 N (complex, Cooley-Tukey: the convention of FNet's
  # counts and of the PyTorch comparison in experiments/performance). Elementwise work (softmax, exp, masks) is not
  # counted, nor per-sequence work shared by the batch (position-bias tables). tests/test_flops.py checks each against
  # the matmuls in the mixer's traced program.
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

  def __post_init__(self):
    fields = {f.name: f for f in dataclasses.fields(self.module)}
    for name in self.options:
      if name not in fields or name in MODEL_FIELDS:
        raise TypeError(f"{self.module.__name__}: option '{name}' is not a module field (or is a model field)")
    if "causal" not in fields:
      raise TypeError(f"{self.module.__name__}: a mixer module needs a `causal` field")
    if self.flops is None:
      raise TypeError(f"{self.module.__name__}: a mixer spec needs its `flops` count")

  @property
  def name(self) -> str:
    from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top
    return next((n for n, s in MIXERS.items() if s is self), self.module.__name__)

  @property
  def has_heads(self) -> bool:
    return "num_heads" in self.options

  @property
  def takes_max_len(self) -> bool:
    return any(f.name == "max_len" for f in dataclasses.fields(self.module))

  @property
  def takes_grid(self) -> bool:
    return any(f.name == "grid" for f in dataclasses.fields(self.module))

  def defaults(self) -> dict[str, Any]:
    """Every option at its default (the module field's default)."""
    fields = {f.name: f.default for f in dataclasses.fields(self.module)}
    return {name: fields[name] for name in self.options}

  def forward_flops(self, options: dict[str, Any], length: int, d_model: int, causal: bool) -> float:
    """`flops` with the options not given at their defaults."""
    return float(self.flops({**self.defaults(), **options}, length, d_model, causal))

  def train_flops(self, options: dict[str, Any], length: int, d_model: int, causal: bool,
                  grid: tuple[int, int] | None = None) -> float:
    """Forward and backward FLOPs of the mixing per token of one layer: forward_flops × train_factor (on an image's
    patch grid, flops_grid's count where the mixer knows the grid)."""
    if grid is not None and self.flops_grid is not None:
      return self.train_factor * float(self.flops_grid({**self.defaults(), **options}, length, d_model,
                                                       grid[0] * grid[1]))
    return self.train_factor * self.forward_flops(options, length, d_model, causal)

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
      raise UserError(f"config.mixer.{unknown[0]}: mixer '{self.name}' has no option '{unknown[0]}'; its options: "
                      f"{self.describe()}")
    if causal and not self.can_be_causal:
      raise UserError(f"mixer '{self.name}' cannot be causal; causal mixers: "
                      f"{', '.join(n for n, s in _registry().items() if s.can_be_causal)} "
                      "(or set config.model.causal=False)")
    for name, value in options.items():
      self.options[name].check(self.name, name, value)
    resolved = {**self.defaults(), **options}
    if self.has_heads and d_model is not None and d_model % resolved["num_heads"]:
      raise UserError(f"config.model.d_model={d_model} must be divisible by config.mixer.num_heads="
                      f"{resolved['num_heads']} (mixer '{self.name}' splits the width into heads)")
    if self.relations:
      self.relations(resolved, d_model, causal)

  def __call__(self, *, causal: bool = False, max_len: int | None = None, d_model: int | None = None,
               grid: tuple[int, int] | None = None, **options) -> nn.Module:
    """The module with these options (the rest at their defaults), after `check`. `d_model`, if given, is
    checked against num_heads; `max_len` goes to mixers with per-position parameters, `grid` to grid-aware ones."""
    self.check(options, d_model, causal)
    extra = {"max_len": max_len} if max_len is not None and self.takes_max_len else {}
    if grid is not None and self.takes_grid:
      extra["grid"] = grid
    return self.module(causal=causal, **extra, **options)


def padded(length: int, block: int) -> int:
  """length rounded up to whole blocks: the positions a blocked mixer computes."""
  return -(-length // block) * block


def _registry():
  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top
  return MIXERS

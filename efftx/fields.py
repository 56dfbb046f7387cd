"""A declared config field: its meaning, allowed values and (except for a mixer option) default, stated once.

A mixer's options (`MixerSpec.options`, efftx/mixers/spec.py), config.model's fields (`CONFIG_FIELDS`,
efftx/model.py) and the other sections' (efftx/config.py) are `Field`s; `check` raises UserError naming the config
path, the value and what is allowed; `python -m efftx.config` lists them all.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from efftx.errors import UserError


@dataclasses.dataclass(frozen=True)
class Field:
  """One field: its one-line meaning, default (a mixer option's is its module field's) and allowed values."""

  help: str  # one line: meaning and unit
  default: Any = None  # the config field's default; None for a mixer option (its module field's)
  choices: tuple[Any, ...] | None = None  # allowed values, if a fixed set
  at_least: float | None = None  # smallest allowed value
  above: float | None = None  # values must be strictly larger
  below: float | None = None  # values must be strictly smaller

  def allowed(self) -> str:
    """The allowed values in words ("one of a, b", "in [0, 1)", "≥ 0", ...; "" when any value is)."""
    if self.choices is not None:
      return "one of " + ", ".join(map(str, self.choices))
    low = f"[{self.at_least:g}" if self.at_least is not None else f"({self.above:g}" if self.above is not None else None
    if low and self.below is not None:
      return f"in {low}, {self.below:g})"
    if self.at_least == 1 and type(self.default) is int:  # pylint: disable=unidiomatic-typecheck
      return "a positive integer"
    if self.at_least is not None:
      return f"≥ {self.at_least:g}"
    if self.above is not None:
      return f"> {self.above:g}"
    return f"< {self.below:g}" if self.below is not None else ""

  def _broken(self, value: Any) -> str | None:
    """The first bound `value` breaks, in words ("one of a, b", "≥ 1", "> 0", "< 1"); None if it breaks none."""
    if self.choices is not None and value not in self.choices:
      return "one of " + ", ".join(map(str, self.choices))
    if self.at_least is not None and value < self.at_least:
      return f"≥ {self.at_least:g}"
    if self.above is not None and value <= self.above:
      return f"> {self.above:g}"
    if self.below is not None and value >= self.below:
      return f"< {self.below:g}"
    return None

  def check(self, path: str, value: Any, mixer: str | None = None) -> None:
    """Raises UserError naming `path` (config.model.NAME, or config.mixer.NAME with the `mixer` whose option it is),
    the value and what is allowed: "config.model.d_model=0 must be a positive integer", "config.mixer.window=0:
    mixer 'local' needs window ≥ 1", "config.mixer.padding='x': mixer 'fnet' takes one of zero, mix"."""
    broken = self._broken(value)
    if broken is None:
      return
    if mixer is None:
      raise UserError(f"{path}={value!r} must be {self.allowed()}")
    if self.choices is not None:
      raise UserError(f"{path}={value!r}: mixer '{mixer}' takes {broken}")
    raise UserError(f"{path}={value!r}: mixer '{mixer}' needs {path.rsplit('.', 1)[-1]} {broken}")

"""Layer patterns: which mixer each layer uses, written in config.model.mixer wherever a mixer name goes.

A pattern is one of
  - a mixer name, `fnet`: every layer;
  - a period, mixer names joined by "+", each optionally repeated with "*n": `local*3+attention` (local attention
    with full attention every fourth layer). The period repeats to fill num_layers, whose count it must divide;
    `fnet*10+attention*2` spells out one model;
  - FNet's hybrids (Lee-Thorp et al.; google-research f_net, configs/base.py HybridAttentionLayout and
    models.py `_is_attention_layer`), `BASE+OTHER*k@LAYOUT`: k layers of OTHER (the paper: attention), BASE in the
    others, placed by the published rules for layer i of N:
      bottom  i < k                    middle  N − k ≤ 2i < N + k
      top     i ≥ N − k                mixed   i mod ⌊N / k⌋ = 0
    The mixed layout places ⌈N / ⌊N / k⌋⌉ layers, not k, when k does not divide N; such a pattern is refused rather
    than followed: a model with another count than the one it names is not that model;
  - a name of PATTERNS below (`python -m efftx.mixers` lists them beside the mixers).

The options of a pattern's mixers are config.mixer: flat (config.mixer.num_heads) when the pattern names one
mixer, one section per mixer (config.mixer.attention.num_heads, config.mixer.fnet.fourier_impl) when it names
several; every layer that uses a mixer uses the same options.
"""

from __future__ import annotations

import difflib
import re

from efftx.errors import UserError
from efftx.mixers import MIXERS

LAYOUTS = ("bottom", "middle", "mixed", "top")

# Named patterns: name → (pattern, what it is).
PATTERNS: dict[str, tuple[str, str]] = {
  "zoology_base_conv": (
    "base_conv+base_conv_long",
    "Zoology's BaseConv with kernel sizes [3, -1] per layer (Figure 2): a short convolution, then an implicit "
    "long one, repeating",
  ),
  "fnet_hybrid": (
    "fnet+attention*2@top",
    "FNet-Hybrid (Lee-Thorp et al.): attention in the last two layers, "
    "Fourier mixing below; recovers most of BERT's GLUE accuracy",
  ),
}

_ITEM = re.compile(r"^([a-z_][a-z0-9_]*)(?:\*(\d+))?$")  # names may hold digits: h3


def expand(pattern: str) -> str:
  """A named pattern's definition; any other pattern as it is."""
  return PATTERNS[pattern][0] if pattern in PATTERNS else pattern


def _items(body: str, pattern: str) -> list[tuple[str, int]]:
  items = []
  for text in body.split("+"):
    match = _ITEM.match(text.strip())
    if not match:
      raise UserError(
        f"config.model.mixer='{pattern}': '{text}' is not a mixer name or NAME*COUNT; a pattern is a "
        "mixer name, a period such as local*3+attention, a hybrid such as fnet+attention*2@top, or one "
        f"of {', '.join(PATTERNS)}"
      )
    name, count = match.group(1), int(match.group(2) or 1)
    if name not in MIXERS:
      guess = difflib.get_close_matches(name, list(MIXERS) + list(PATTERNS), n=1)
      hint = f" (did you mean '{guess[0]}'?)" if guess else ""
      raise UserError(
        f"config.model.mixer='{pattern}': '{name}' is not a mixer{hint}; choose from: {', '.join(MIXERS)}, or a "
        f"named pattern: {', '.join(PATTERNS)}"
      )
    if count < 1:
      raise UserError(f"config.model.mixer='{pattern}': {text} repeats a mixer 0 times")
    items.append((name, count))
  return items


def mixer_names(pattern: str) -> tuple[str, ...]:
  """The distinct mixers a pattern names, in order of first appearance (no num_layers needed). Raises UserError
  for a pattern that does not parse."""
  full = expand(pattern)
  body, _, layout = full.partition("@")
  names = [name for name, _ in _items(body, pattern)]
  if layout:
    _hybrid(full, pattern)  # checks the form
  return tuple(dict.fromkeys(names))


def _hybrid(full: str, pattern: str) -> tuple[str, str, int, str]:
  body, _, layout = full.partition("@")
  items = _items(body, pattern)
  if len(items) != 2 or items[0][1] != 1 or layout not in LAYOUTS:
    raise UserError(
      f"config.model.mixer='{pattern}': a hybrid is BASE+OTHER*k@LAYOUT (e.g. fnet+attention*2@top), "
      f"LAYOUT one of {', '.join(LAYOUTS)}"
    )
  (base, _), (other, k) = items
  return base, other, k, layout


def _in_layout(layout: str, i: int, n: int, k: int) -> bool:
  if layout == "bottom":
    return i < k
  if layout == "middle":
    return n - k <= 2 * i < n + k
  if layout == "top":
    return i >= n - k
  return i % (n // k) == 0  # mixed


def layer_mixers(pattern: str, num_layers: int) -> tuple[str, ...]:
  """The mixer of each of num_layers layers. Raises UserError naming the problem."""
  full = expand(pattern)
  if "@" in full:
    base, other, k, layout = _hybrid(full, pattern)
    if k > num_layers:
      raise UserError(f"config.model.mixer='{pattern}': {k} {other} layers in a model of {num_layers}")
    layers = tuple(other if _in_layout(layout, i, num_layers, k) else base for i in range(num_layers))
    placed = layers.count(other) if other != base else k
    if placed != k:
      raise UserError(
        f"config.model.mixer='{pattern}': FNet's {layout} layout places {placed} {other} layers, not "
        f"{k}, in {num_layers} layers (k must divide num_layers)"
      )
    return layers
  period = [name for name, count in _items(full, pattern) for _ in range(count)]
  if num_layers % len(period):
    raise UserError(
      f"config.model.mixer='{pattern}': its period of {len(period)} layers does not divide "
      f"config.model.num_layers={num_layers}"
    )
  return tuple(period * (num_layers // len(period)))


def sections(pattern: str, mixer_config) -> dict[str, dict]:
  """The options of each mixer the pattern names, from config.mixer (flat for one mixer, one section per mixer
  for several): {mixer name: {option: value}}."""
  names = mixer_names(pattern)
  if len(names) == 1:
    return {names[0]: dict(mixer_config)}
  return {name: dict(mixer_config[name]) if name in mixer_config else {} for name in names}


def check(pattern: str, mixer_config, num_layers: int, d_model: int | None, causal: bool) -> tuple[str, ...]:
  """The mixer of each layer, after checking that the pattern fits num_layers and that each of its mixers' options
  (config.mixer, or its section of it) is valid with this width and causality. Raises UserError naming the
  option as the user writes it (config.mixer.<option>, or config.mixer.<mixer>.<option> in a pattern)."""
  layers = layer_mixers(pattern, num_layers)
  options_of = sections(pattern, mixer_config)
  for name, options in options_of.items():
    try:
      MIXERS[name].check(options, d_model, causal)
    except UserError as e:
      if len(options_of) == 1:
        raise
      raise UserError(f"{e} (in pattern '{pattern}')".replace("config.mixer.", f"config.mixer.{name}.")) from None
  return layers


def describe() -> list[str]:
  """Markdown rows of the named patterns, for the mixer table."""
  return ["| pattern | layers (`config.model.mixer`) | what |", "|---|---|---|"] + [
    f"| `{name}` | `{pattern}` | {what} |" for name, (pattern, what) in PATTERNS.items()
  ]

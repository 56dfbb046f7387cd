"""Prints the mixers — name, what it can do, its options with defaults and meanings — and the named layer
patterns, from the registry: as plain text for a terminal, or with --markdown as the table efftx/mixers/README.md
shows (a test checks that it holds it).

python -m efftx.mixers              # plain text
python -m efftx.mixers --markdown   # efftx/mixers/README.md's table
"""

import sys
import textwrap

from efftx.mixers import MIXERS


def _causal(spec) -> str:
  """yes (causal or not), no (bidirectional only), only (causal only), or "yes; both ways by reversal" (causal only
  itself, bidirectional as ByReversal: efftx/mixers/spec.py)."""
  if spec.bidirectional_by_reversal:
    return "yes; both ways by reversal"
  return "only" if not spec.can_be_bidirectional else "yes" if spec.can_be_causal else "no"


def table() -> str:
  """Markdown: one row per mixer, from its declared spec, then the named layer patterns."""
  cell = lambda text: text.replace("|", "\\|")  # |t − t'| inside a table cell
  rows = [
    "| name | what; cost | causal | decodes | options `config.mixer.*` (default): meaning |",
    "|---|---|:-:|:-:|---|",
  ]
  for name, spec in MIXERS.items():
    defaults = spec.defaults()
    options = "<br>".join(f"`{n}` ({defaults[n]!r}): {cell(o.help)}" for n, o in spec.options.items()) or "—"
    rows.append(
      f"| `{name}` | {cell(spec.summary)} | {_causal(spec)} | {'yes' if spec.can_decode else 'no'} | {options} |"
    )
  # Layer patterns by name (efftx/patterns.py); any pattern can be written out in config.model.mixer.
  from efftx import patterns  # pylint: disable=g-import-not-at-top

  return "\n".join(rows + [""] + patterns.describe())


def text(width: int = 100) -> str:
  """The same as plain text: per mixer a heading line, then its options (config.mixer.NAME) indented."""
  from efftx import patterns  # pylint: disable=g-import-not-at-top

  wrap = lambda line, indent: textwrap.fill(
    line, width, initial_indent=indent, subsequent_indent=indent + "    ", break_on_hyphens=False
  )
  lines = []
  for name, spec in MIXERS.items():
    lines.append(wrap(f"{name}: {spec.summary}", ""))
    lines.append(f"  causal: {_causal(spec)}; decodes: {'yes' if spec.can_decode else 'no'}")
    defaults = spec.defaults()
    for option, declared in spec.options.items():
      lines.append(wrap(f"--config.mixer.{option} (default {defaults[option]!r}): {declared.help}", "  "))
    lines.append("")
  lines.append("Named layer patterns (config.model.mixer; any pattern can be written out there too):")
  lines += [wrap(f"{name} = {pattern}: {what}", "  ") for name, (pattern, what) in patterns.PATTERNS.items()]
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  if argv in ([], ["--markdown"]):
    print(table() if argv else text())
    return 0
  if argv in (["--help"], ["-h"]):
    print(__doc__.strip())
    return 0
  print(f"efftx.mixers: error: unexpected arguments: {' '.join(argv)} (valid: --markdown, --help)", file=sys.stderr)
  return 2


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))

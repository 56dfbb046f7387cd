"""Prints the mixers' table — name, what it can do, its options with defaults and meanings — from the registry.

python -m efftx.mixers        # the table README.md shows (a test checks that README holds it)
"""

from efftx.mixers import MIXERS


def table() -> str:
  """Markdown: one row per mixer, from its declared spec."""
  cell = lambda text: text.replace("|", "\\|")  # |t − t'| inside a table cell
  rows = [
    "| name | what; cost | causal | decodes | options `config.mixer.*` (default): meaning |",
    "|---|---|:-:|:-:|---|",
  ]
  for name, spec in MIXERS.items():
    defaults = spec.defaults()
    options = "<br>".join(f"`{n}` ({defaults[n]!r}): {cell(o.help)}" for n, o in spec.options.items()) or "—"
    rows.append(
      f"| `{name}` | {cell(spec.summary)} | {'yes' if spec.can_be_causal else 'no'} | "
      f"{'yes' if spec.can_decode else 'no'} | {options} |"
    )
  # Layer patterns by name (efftx/patterns.py); any pattern can be written out in config.model.mixer.
  from efftx import patterns  # pylint: disable=g-import-not-at-top

  return "\n".join(rows + [""] + patterns.describe())


if __name__ == "__main__":
  print(table())

"""Learning curves of one run or several side by side: the metrics their metrics.jsonl hold against step, one panel
per metric, one line per run (labelled by its workdir's name), drawn to a PNG.

    python -m efftx.plot /tmp/efftx/attention /tmp/efftx/fnet --out=curves.png [--metrics=loss,eval_accuracy]

Without --metrics: every metric the runs logged, each beside its eval_ counterpart (steps_per_sec left out: it is
tokens_per_sec scaled). A sweep's report draws its learning curves with the same `curves_figure`.
"""

from __future__ import annotations

import argparse
import io
import sys

from etils import epath

from efftx import cli
from efftx import metrics_file
from efftx.errors import UserError

Curve = list[tuple[int, float]]  # (step, value) in step order

USAGE = "python -m efftx.plot WORKDIR [WORKDIR ...] [--out=curves.png] [--metrics=loss,eval_accuracy,...]"
LEFT_OUT = ("steps_per_sec",)  # tokens_per_sec scaled by a constant: the same curve twice
LAST = ("grad_norm", "learning_rate", "tokens_per_sec")  # after the objective's metrics


def curves_figure(panels: list[tuple[str, str, dict[str, list[Curve]]]], columns: int = 1):
  """A matplotlib Figure (Agg) with one panel per (title, y label, lines) against step, `columns` panels a row.

  A line, `label: curves`, is the mean of its curves at the steps they all logged, with the band from the lowest to
  the highest where there are several (a sweep group's seeds); a line without curves keeps its colour unused, so
  panels that list the same labels give each the same colour. Past ten lines in a panel the colours repeat dashed;
  a line of 20 points or fewer marks them. One column: each legend beside its panel; more: inside it."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  rows = max(1, -(-len(panels) // columns))
  size = (11, 0.5 + 4.0 * rows) if columns == 1 else (6.0 * columns, 0.5 + 3.5 * rows)
  fig, axes = plt.subplots(rows, columns, figsize=size, squeeze=False)
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax in axes.flat[len(panels) :]:
    fig.delaxes(ax)
  for ax, (title, ylabel, lines) in zip(axes.flat, panels):
    for i, (label, curves) in enumerate(lines.items()):
      steps = sorted(set.intersection(*(set(s for s, _ in curve) for curve in curves))) if curves else []
      if not steps:
        continue
      values = [[dict(curve)[s] for s in steps] for curve in curves]
      mean = [sum(column) / len(column) for column in zip(*values)]
      colour = colours[i % len(colours)]
      ax.plot(
        steps,
        mean,
        label=label,
        color=colour,
        linestyle="-" if i < len(colours) else "--",
        marker="o" if len(steps) <= 20 else None,
        markersize=3,
      )
      if len(curves) > 1:
        ax.fill_between(steps, [min(c) for c in zip(*values)], [max(c) for c in zip(*values)], color=colour, alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if columns == 1:
      ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
      ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def write_png(fig, path: epath.PathLike) -> None:
  """Writes the figure to path (a local file or a bucket's) as a PNG, and closes it."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=120)
  plt.close(fig)
  epath.Path(path).write_bytes(buffer.getvalue())


def read_metrics(workdir: str) -> list[dict]:
  """The rows of a run's metrics.jsonl. Raises UserError for a missing workdir, one without metrics.jsonl or rows,
  or a line that is not a JSON row with a step (a last line half written by a running run is left out)."""
  folder = epath.Path(workdir)
  if not folder.is_dir():
    raise UserError(f"{workdir}: no such workdir")
  path = folder / "metrics.jsonl"
  if not path.exists():
    raise UserError(f"{workdir} has no metrics.jsonl: not a training run's --workdir, or one not logged yet")
  rows = metrics_file.rows(folder)
  if not rows:
    raise UserError(f"{path} holds no rows yet")
  return rows


def curve(rows: list[dict], metric: str) -> Curve:
  """metric against step over the rows that hold it, in step order."""
  return sorted((int(r["step"]), float(r[metric])) for r in rows if isinstance(r.get(metric), (int, float)))


def labels(workdirs: list[str]) -> list[str]:
  """Each workdir's name, with as many of its parent folders as it takes to tell the runs apart."""
  parts = [str(w).rstrip("/").split("/") for w in workdirs]
  for depth in range(1, max(map(len, parts)) + 1):
    names = ["/".join(p[-depth:]) for p in parts]
    if len(set(names)) == len(names):
      return names
  return [str(w) for w in workdirs]


def default_metrics(runs: list[list[dict]]) -> list[str]:
  """Every metric the runs logged (but LEFT_OUT): loss first, then the others as first logged and LAST last, each
  eval_ metric after its training counterpart."""
  seen = list(
    dict.fromkeys(k for rows in runs for r in rows for k, v in r.items() if k != "step" and isinstance(v, (int, float)))
  )
  base = lambda m: m.removeprefix("eval_")
  bases = list(dict.fromkeys(map(base, seen)))
  ordered = sorted(seen, key=lambda m: (base(m) != "loss", base(m) in LAST, bases.index(base(m)), m != base(m)))
  return [m for m in ordered if m not in LEFT_OUT]


def runs_figure(workdirs: list[str], metrics: list[str] | None = None):
  """The Figure of these runs' curves: one panel per metric (`metrics`, or default_metrics), one line per run that
  logged it, labelled by `labels`. Raises UserError for a workdir read_metrics refuses or a metric no run logged."""
  runs = {label: read_metrics(w) for label, w in zip(labels(workdirs), workdirs)}
  logged = default_metrics(list(runs.values()))
  metrics = metrics or logged
  unknown = [m for m in metrics if not any(curve(rows, m) for rows in runs.values())]
  if unknown:
    raise UserError(f"--metrics: no run logged {', '.join(unknown)}; they logged: {', '.join(logged)}")
  panels = [(m, "", {label: [c] if (c := curve(rows, m)) else [] for label, rows in runs.items()}) for m in metrics]
  return curves_figure(panels, columns=min(2, len(panels)))


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, exit code 2, as every efftx program
    cli.exit_with("efftx.plot", f"{message} (usage: {USAGE})")


def main(argv: list[str]) -> None:
  parser = _Parser(prog="python -m efftx.plot", usage=USAGE, description=__doc__.split("\n\n")[0])
  parser.add_argument("workdirs", nargs="+", metavar="WORKDIR", help="a training run's --workdir")
  parser.add_argument("--out", default="curves.png", help="the PNG to write (default: curves.png)")
  parser.add_argument(
    "--metrics",
    type=lambda text: [m for m in text.split(",") if m],
    default=None,
    help="comma-separated metrics to draw (default: every metric the runs logged)",
  )
  args = parser.parse_args(argv)
  with cli.one_line_errors("efftx.plot"):
    fig = runs_figure(args.workdirs, args.metrics)
    try:
      write_png(fig, args.out)
    except OSError as e:
      raise UserError(f"cannot write --out={args.out}: {e.strerror or e}") from None
  print(f"wrote {args.out}: {len(fig.axes)} metrics of {len(args.workdirs)} runs")


if __name__ == "__main__":
  main(sys.argv[1:])

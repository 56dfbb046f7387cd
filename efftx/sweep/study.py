"""A sweep file, loaded: its grid of points (training runs or bench measurements) and what its report needs.

`load` refuses a sweep file that is missing a name or has a bad value, with one UserError line; a point's command
is the same wherever the sweep was started (config files relative to the checkout)."""

from __future__ import annotations

from collections.abc import Callable
import copy
import dataclasses
import inspect
import math
import os
import runpy
import sys
from typing import Any

from etils import epath

from efftx.errors import UserError
from efftx.sweep.points import BENCH_FILE
from efftx.sweep.points import REPO
from efftx.sweep.points import final_value
from efftx.sweep.points import state


@dataclasses.dataclass(frozen=True)
class Point:
  """One run of a sweep: a training run (the config file's argument, config overrides, seed and learning rate),
  or, with program "bench", one `python -m efftx.bench` measurement whose flags are the overrides.

  `group` is the table row the point contributes to: the seeds and learning rates of one group are aggregated."""

  group: str
  arg: str = ""
  overrides: tuple[tuple[str, Any], ...] = ()
  seed: int = 0
  learning_rate: float | None = None
  program: str = "train"
  config: str = ""  # its own config file ("": the sweep file's CONFIG)

  @property
  def name(self) -> str:
    """The point's folder under the sweep's workdir."""
    if self.program == "bench":  # a repeat of a measurement: the first keeps the group's name
      name = self.group + (f"-repeat{self.seed}" if self.seed else "")
    else:
      name = self.group + (f"-lr{self.learning_rate:g}" if self.learning_rate is not None else "") + f"-seed{self.seed}"
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in name)

  def flags(self, config_file: str) -> list[str]:
    """The efftx.train flags of this point (without --workdir), or its efftx.bench flags (without --json)."""
    if self.program == "bench":
      return [
        f"--{key}={','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"
        for key, value in self.overrides
      ]
    out = [f"--config={config_file}" + (f":{self.arg}" if self.arg else "")]
    out += [f"--config.{key}={value}" for key, value in self.overrides]
    out += [f"--config.seed={self.seed}"]
    if self.learning_rate is not None:
      out += [f"--config.optim.learning_rate={self.learning_rate:g}"]
    return out

  def command(self, config_file: str, workdir: str, python: str = sys.executable) -> list[str]:
    if self.program == "bench":
      return [python, "-m", "efftx.bench", *self.flags(config_file), f"--json={workdir}/{BENCH_FILE}"]
    return [python, "-m", "efftx.train", *self.flags(config_file), f"--workdir={workdir}"]


def grid(groups: dict[str, dict[str, Any]], seeds=(0,), learning_rates=(None,), repeats: int = 1) -> list[Point]:
  """Every group × learning rate × seed. A group is {"arg": the config argument, "overrides": {key: value}} (a
  training run; "config": a config file other than the sweep's CONFIG), or {"bench": {flag: value}} (an
  efftx.bench measurement, e.g. {"mixers": "fnet", "lengths": 1024}; its metrics are the bench's JSON row, and it
  has no seeds or learning rates). A bench group is measured `repeats` times (Point.seed is the repeat), the
  repeats interleaved: every group's first measurement, then every group's second, and so on, so that a slow
  spell of the machine touches all groups alike and ratios are taken between measurements made close in time."""
  if repeats < 1:
    raise UserError(f"repeats={repeats}: measure each point at least once")
  points = []
  for group, spec in groups.items():
    unknown = set(spec) - {"arg", "overrides", "config", "bench"}
    if unknown or ("bench" in spec and len(spec) > 1):
      raise UserError(
        f"group '{group}': unknown keys {sorted(unknown or set(spec) - {'bench'})} (a group has "
        "'arg', 'overrides' and 'config', or 'bench' alone)"
      )
    if "bench" in spec:
      points += [Point(group, overrides=tuple(spec["bench"].items()), program="bench", seed=r) for r in range(repeats)]
      continue
    for lr in learning_rates:
      for seed in seeds:
        points.append(
          Point(
            group,
            spec.get("arg", ""),
            tuple(spec.get("overrides", {}).items()),
            seed,
            lr,
            config=spec.get("config", ""),
          )
        )
  return sorted(points, key=lambda p: p.seed if p.program == "bench" else 0)  # stable: repeats interleaved


def best_then_seeds(
  groups: dict[str, dict[str, Any]], learning_rates, seeds, finished: Callable[[Point], Any], goal: str
) -> list[Point]:
  """A learning-rate search at a third of the cost of every rate × every seed: every rate on seeds[0]; once all
  of a group's have finished, its other seeds at its best rate (lowest or highest final metric by goal). The
  report judges the group on those fresh seeds alone (seeds[0] chose the rate: report.aggregate). With one rate
  nothing is searched: every seed at once, all of them judged. `finished` is what a sweep file's points(scale,
  finished) receives: a point's final metric, None until it is done."""
  if len(learning_rates) == 1:
    return grid(groups, seeds=seeds, learning_rates=learning_rates)
  first = grid(groups, seeds=seeds[:1], learning_rates=learning_rates)
  out = list(first)
  for group, spec in groups.items():
    values = {p.learning_rate: finished(p) for p in first if p.group == group}
    if len(seeds) > 1 and all(v is not None for v in values.values()):
      best = (min if goal == "min" else max)(values, key=values.get)
      out += grid({group: spec}, seeds=seeds[1:], learning_rates=(best,))
  return out


@dataclasses.dataclass(frozen=True)
class Panel:
  """One panel of a claim's own quantity (Plot.quantities), drawn as given: each line's (x, value, low, high) with
  its interval as error bars, each line's individual values (seeds or repeats) as hollow dots, and reference levels
  (a claim's threshold) as dashed red lines."""

  title: str
  xlabel: str
  ylabel: str
  lines: dict[str, list[tuple[float, float, float, float]]]  # label -> [(x, value, low, high)]
  dots: dict[str, list[tuple[float, list[float]]]] = dataclasses.field(default_factory=dict)  # line -> [(x, values)]
  levels: dict[str, float] = dataclasses.field(default_factory=dict)  # label -> y
  xticks: dict[float, str] = dataclasses.field(default_factory=dict)  # x -> its tick's label ({}: numbers)
  yscale: str = "linear"  # or "log"
  each: str = "each repeat"  # the dots' legend label
  join: bool = True  # False: each line's points unjoined (x is a category, not a quantity)


@dataclasses.dataclass(frozen=True)
class Plot:
  """How the report draws a study: a sweep file's PLOT = Plot(...), every field optional."""

  x: tuple[str, dict[str, float]] | None = None  # (axis label, {group: x}); None: one labelled dot per group
  series: dict[str, str] = dataclasses.field(default_factory=dict)  # group -> its line against x
  xscale: str = ""  # "linear" or "log" (base 2); "": log where x spans 16× or more
  chance: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)  # metric -> {line label: value}
  panel: Callable[[str], str] | None = None  # group -> its panel (a task): learning curves and the metric's plot
  chance_panel: dict[str, str] = dataclasses.field(default_factory=dict)  # chance line label -> its only panel
  metrics: tuple[str, ...] | None = None  # the metrics that get a panel (None: METRIC and every one of METRICS)
  quantities: Callable[[list[dict]], list[Panel]] | None = None  # rows (as claim() gets them) -> the claims' panels


@dataclasses.dataclass
class Study:
  """A sweep file, loaded."""

  path: str
  config: str
  points: list[Point]
  metric: str
  goal: str
  doc: str
  paper: dict[str, Any]
  source: str
  claim: Callable[..., Any] | None  # claim(rows[, scale]) -> [stats.Claim] (or one line, in older sweep files)
  metrics: tuple[str, ...] = ()  # more columns, aggregated like metric (at the group's best learning rate)
  baseline: dict[str, str] = dataclasses.field(default_factory=dict)  # group -> the group it is divided by
  paper_setting: str = ""  # what the paper trained: data, depth, width, steps
  setting: dict[str, str] = dataclasses.field(default_factory=dict)  # scale -> what that scale trains
  protocol: dict[str, str] = dataclasses.field(default_factory=dict)  # scale -> how each group is trained
  paper_scales: tuple[str, ...] | None = None  # scales whose setting is the paper's (None: every scale)
  plot: Plot = dataclasses.field(default_factory=Plot)
  adaptive: bool = False  # points(scale, finished): the grid grows as points finish (best_then_seeds)
  design: dict[str, int] = dataclasses.field(default_factory=dict)  # scale -> the seeds a verdict rests on
  solved: dict[str, float] = dataclasses.field(default_factory=dict)  # metric -> the value from which a run solved

  @property
  def measured(self) -> bool:
    """Every point is an efftx.bench measurement (seeds are repeats; ratios, not paired differences)."""
    return all(p.program == "bench" for p in self.points)

  @property
  def several_seeds(self) -> bool:
    return len({p.seed for p in self.points}) > 1

  @property
  def name(self) -> str:
    return os.path.basename(os.path.dirname(os.path.abspath(self.path)))

  def paper_in_table(self, scale: str) -> bool:
    """Whether the paper's numbers stand beside ours in the table: only where the scale's setting is the paper's
    (else the report gives them in its text)."""
    return self.paper_scales is None or scale in self.paper_scales

  def paper_value(self, group: str, metric: str) -> float | None:
    """The paper's number for group: PAPER[group] is METRIC's, or {metric: value} for several metrics."""
    value = self.paper.get(group)
    return value.get(metric) if isinstance(value, dict) else value if metric == self.metric else None


def _config_path(config: str) -> str:
  """A config file's path as the points see it (they run in the checkout, wherever the sweep was started):
  relative to the checkout when inside it (e.g. "configs/mqar.py"), else absolute."""
  if not config:
    return config
  found = (
    config if os.path.exists(config) or not os.path.exists(os.path.join(REPO, config)) else os.path.join(REPO, config)
  )
  found = os.path.abspath(found)
  return os.path.relpath(found, REPO) if found.startswith(REPO + os.sep) else found


def _finished(workdir: str | None, metric: str) -> Callable[[Point], Any]:
  """A point's final METRIC in workdir, None until it is done (what an adaptive grid's points() reads)."""

  def value(point: Point):
    if not workdir:
      return None
    folder = epath.Path(workdir) / point.name
    return final_value(folder, metric) if state(folder) == "done" else None

  return value


# Every name a sweep file may set, with its default (_REQUIRED: none); efftx/sweep/README.md says what each means.
_REQUIRED = object()
NAMES = {
  "points": _REQUIRED,
  "METRIC": _REQUIRED,
  "GOAL": _REQUIRED,
  "CONFIG": "",
  "METRICS": (),
  "BASELINE": {},
  "PAPER": {},
  "SOURCE": "",
  "PAPER_SETTING": "",
  "SETTING": {},
  "PROTOCOL": {},
  "PAPER_SCALES": None,
  "PLOT": Plot(),
  "DESIGN": {},
  "SOLVED": {},
  "claim": None,
}
_IN_PLOT = {"X": "x", "SERIES": "series", "XSCALE": "xscale", "CHANCE": "chance", "PANEL": "panel"}


def load(path: str, scale: str = "cpu", workdir: str | None = None, every_point_done: bool = False) -> Study:
  """Reads a sweep file's NAMES and builds its grid at `scale` (an adaptive grid, points(scale, finished), from
  the points finished in workdir, or as if every point were done: its whole size), with one clear error for what
  is missing or wrong."""
  if not os.path.exists(path):
    raise UserError(f"{path}: no such sweep file")
  try:
    module = runpy.run_path(path)
  except UserError as e:
    raise UserError(f"{path}: {e}") from None
  missing = [n for n, default in NAMES.items() if default is _REQUIRED and n not in module]
  if missing:
    raise UserError(f"{path} does not define {', '.join(missing)} (see efftx/sweep/README.md)")
  moved = [n for n in _IN_PLOT if n in module]
  if moved:
    raise UserError(
      f"{path}: {', '.join(moved)} go in PLOT = efftx.sweep.Plot("
      + ", ".join(f"{_IN_PLOT[n]}=..." for n in moved)
      + ")"
    )
  given = {n: module.get(n, copy.copy(default)) for n, default in NAMES.items()}
  if given["GOAL"] not in ("min", "max"):
    raise UserError(f"{path}: GOAL is '{given['GOAL']}', not 'min' or 'max'")
  adaptive = len(inspect.signature(given["points"]).parameters) > 1
  if adaptive:
    finished = (lambda point: 0.0) if every_point_done else _finished(workdir, given["METRIC"])
    points = given["points"](scale, finished)
  else:
    points = given["points"](scale)
  if not points:
    raise UserError(f"{path}: no points at scale '{scale}'")
  names = [p.name for p in points]
  if len(set(names)) != len(names):
    raise UserError(f"{path}: two points share the name {next(n for n in names if names.count(n) > 1)}")
  if not given["CONFIG"] and any(p.program == "train" and not p.config for p in points):
    raise UserError(f"{path} does not define CONFIG, the config file its training points start from")
  points = [dataclasses.replace(p, config=_config_path(p.config)) if p.config else p for p in points]
  groups = {p.group for p in points}
  unknown = sorted({b for g, b in given["BASELINE"].items() if g in groups} - groups)
  if unknown:
    raise UserError(f"{path}: BASELINE names groups that are not points: {', '.join(unknown)}")
  plot = given["PLOT"]
  if not isinstance(plot, Plot):
    raise UserError(f"{path}: PLOT is a {type(plot).__name__}, not an efftx.sweep.Plot")
  if plot.xscale not in ("", "linear", "log"):
    raise UserError(f"{path}: PLOT's xscale is '{plot.xscale}', not 'linear' or 'log'")
  for name, value in (("SETTING", given["SETTING"]), ("PROTOCOL", given["PROTOCOL"]), ("PLOT's chance", plot.chance)):
    if not isinstance(value, dict):
      raise UserError(f"{path}: {name} is a {type(value).__name__}, not a dict")
  if plot.quantities is not None and not callable(plot.quantities):
    raise UserError(f"{path}: PLOT's quantities is a {type(plot.quantities).__name__}, not a function of the rows")
  drawn = (given["METRIC"], *given["METRICS"])
  if plot.metrics is not None and (not plot.metrics or set(plot.metrics) - set(drawn)):
    raise UserError(f"{path}: PLOT's metrics {plot.metrics!r} are not a non-empty subset of METRIC and METRICS {drawn}")
  if plot.panel is not None and not callable(plot.panel):
    raise UserError(f"{path}: PLOT's panel is a {type(plot.panel).__name__}, not a function of a group's name")
  design = given["DESIGN"]
  if not isinstance(design, dict) or not all(isinstance(n, int) and n >= 1 for n in design.values()):
    raise UserError(f"{path}: DESIGN is {design!r}, not a dict scale -> the number of seeds (≥ 1) a verdict rests on")
  if given["claim"] is not None and scale not in design:
    raise UserError(
      f"{path}: claim() judges, but DESIGN fixes no number of seeds at scale '{scale}' (declare it before the runs)"
    )
  solved = given["SOLVED"]
  if isinstance(solved, dict) and solved and all(isinstance(v, dict) for v in solved.values()):
    solved = solved.get(scale, {})  # per scale: {scale: {METRIC: threshold}}
  if not isinstance(solved, dict) or not all(
    m == given["METRIC"] and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    for m, v in solved.items()
  ):
    raise UserError(
      f"{path}: SOLVED is {given['SOLVED']!r}, not a dict METRIC -> a finite number (or scale -> such a dict)"
    )
  if solved and given["GOAL"] != "max":
    raise UserError(f"{path}: SOLVED counts values at or above a threshold, so GOAL must be 'max'")
  if given["SETTING"] and (scale not in given["SETTING"] or not given["PAPER_SETTING"]):
    raise UserError(f"{path}: SETTING needs this scale's setting ('{scale}') and PAPER_SETTING the paper's")
  paper_scales = None if given["PAPER_SCALES"] is None else tuple(given["PAPER_SCALES"])
  return Study(
    path,
    _config_path(given["CONFIG"]),
    points,
    given["METRIC"],
    given["GOAL"],
    module.get("__doc__") or "",
    given["PAPER"],
    given["SOURCE"],
    given["claim"],
    tuple(given["METRICS"]),
    given["BASELINE"],
    given["PAPER_SETTING"],
    given["SETTING"],
    given["PROTOCOL"],
    paper_scales,
    plot,
    adaptive,
    design,
    {m: float(v) for m, v in solved.items()},
  )

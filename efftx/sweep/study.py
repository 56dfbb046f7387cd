"""A sweep file, loaded: its grid of points (training runs or bench measurements) and what its report needs.

`load` refuses a sweep file that is missing a name or has a bad value, with one UserError line; a point's command
is the same wherever the sweep was started (config files relative to the checkout)."""
from __future__ import annotations

import dataclasses
import os
import runpy
import sys
from typing import Any, Callable

from efftx.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
BENCH_FILE = "bench.json"  # in a bench point's folder: efftx.bench's rows, written when the measurement is done


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
    name = self.group if self.program == "bench" else self.group + (
        f"-lr{self.learning_rate:g}" if self.learning_rate is not None else "") + f"-seed{self.seed}"
    return "".join(c if c.isalnum() or c in "-_.=" else "_" for c in name)

  def flags(self, config_file: str) -> list[str]:
    """The efftx.train flags of this point (without --workdir), or its efftx.bench flags (without --json)."""
    if self.program == "bench":
      return [f"--{key}={','.join(map(str, value)) if isinstance(value, (list, tuple)) else value}"
              for key, value in self.overrides]
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


def grid(groups: dict[str, dict[str, Any]], seeds=(0,), learning_rates=(None,)) -> list[Point]:
  """Every group × learning rate × seed. A group is {"arg": the config argument, "overrides": {key: value}} (a
  training run; "config": a config file other than the sweep's CONFIG), or {"bench": {flag: value}} (an
  efftx.bench measurement, e.g. {"mixers": "fnet", "lengths": 1024}; its metrics are the bench's JSON row, and it
  has no seeds or learning rates)."""
  points = []
  for group, spec in groups.items():
    unknown = set(spec) - {"arg", "overrides", "config", "bench"}
    if unknown or ("bench" in spec and len(spec) > 1):
      raise UserError(f"group '{group}': unknown keys {sorted(unknown or set(spec) - {'bench'})} (a group has "
                      "'arg', 'overrides' and 'config', or 'bench' alone)")
    if "bench" in spec:
      points.append(Point(group, overrides=tuple(spec["bench"].items()), program="bench"))
      continue
    for lr in learning_rates:
      for seed in seeds:
        points.append(Point(group, spec.get("arg", ""), tuple(spec.get("overrides", {}).items()), seed, lr,
                            config=spec.get("config", "")))
  return points


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
  x: tuple[str, dict[str, float]] | None
  claim: Callable[[list[dict]], str] | None
  metrics: tuple[str, ...] = ()  # more columns, aggregated like metric (at the group's best learning rate)
  baseline: dict[str, str] = dataclasses.field(default_factory=dict)  # group -> the group it is divided by
  series: dict[str, str] = dataclasses.field(default_factory=dict)  # group -> its line in the plot
  xscale: str = ""  # "linear" or "log" (base 2); "": log where X spans 16× or more

  @property
  def name(self) -> str:
    return os.path.basename(os.path.dirname(os.path.abspath(self.path)))

  def paper_value(self, group: str, metric: str) -> float | None:
    """The paper's number for group: PAPER[group] is METRIC's, or {metric: value} for several metrics."""
    value = self.paper.get(group)
    return value.get(metric) if isinstance(value, dict) else value if metric == self.metric else None


def _config_path(config: str) -> str:
  """A config file's path as the points see it (they run in the checkout, wherever the sweep was started):
  relative to the checkout when inside it (e.g. "configs/mqar.py"), else absolute."""
  if not config:
    return config
  found = config if os.path.exists(config) or not os.path.exists(os.path.join(REPO, config)) else os.path.join(
      REPO, config)
  found = os.path.abspath(found)
  return os.path.relpath(found, REPO) if found.startswith(REPO + os.sep) else found


def load(path: str, scale: str = "cpu") -> Study:
  """Reads a sweep file and builds its grid at `scale`, with one clear error for what is missing or wrong."""
  if not os.path.exists(path):
    raise UserError(f"{path}: no such sweep file")
  try:
    module = runpy.run_path(path)
  except UserError as e:
    raise UserError(f"{path}: {e}") from None
  missing = [n for n in ("points", "METRIC", "GOAL") if n not in module]
  if missing:
    raise UserError(f"{path} does not define {', '.join(missing)} (see `python -m efftx.sweep --help`)")
  if module["GOAL"] not in ("min", "max"):
    raise UserError(f"{path}: GOAL is '{module['GOAL']}', not 'min' or 'max'")
  points = module["points"](scale)
  if not points:
    raise UserError(f"{path}: no points at scale '{scale}'")
  names = [p.name for p in points]
  if len(set(names)) != len(names):
    raise UserError(f"{path}: two points share the name {next(n for n in names if names.count(n) > 1)}")
  if "CONFIG" not in module and any(p.program == "train" and not p.config for p in points):
    raise UserError(f"{path} does not define CONFIG, the config file its training points start from")
  points = [dataclasses.replace(p, config=_config_path(p.config)) if p.config else p for p in points]
  config = _config_path(module.get("CONFIG", ""))
  groups = {p.group for p in points}
  baseline = module.get("BASELINE", {})
  unknown = sorted({b for g, b in baseline.items() if g in groups} - groups)
  if unknown:
    raise UserError(f"{path}: BASELINE names groups that are not points: {', '.join(unknown)}")
  if module.get("XSCALE", "") not in ("", "linear", "log"):
    raise UserError(f"{path}: XSCALE is '{module['XSCALE']}', not 'linear' or 'log'")
  return Study(path, config, points, module["METRIC"], module["GOAL"], module.get("__doc__") or "",
               module.get("PAPER", {}), module.get("SOURCE", ""), module.get("X"), module.get("claim"),
               tuple(module.get("METRICS", ())), baseline, module.get("SERIES", {}), module.get("XSCALE", ""))

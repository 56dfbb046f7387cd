"""Sweeps: run a study's grid of training runs, then turn them into the study's table and plot.

    python -m efftx.sweep experiments/<study>/sweep.py --workdir=/tmp/efftx/<study> [--parallel=2]
    python -m efftx.sweep experiments/<study>/sweep.py --workdir=DIR --report [--publish]
    python -m efftx.sweep ... --launcher=slurm [--slurm_partition=gpu --gpus_per_node=8 --timeout_min=600]
    python -m efftx.sweep ... --launcher=tpu --tpu=my-slice --zone=us-central2-b   # needs a gs:// --workdir
    python -m efftx.sweep ... --dry_run                                          # what would run, any launcher

A sweep file is plain Python that defines:
  CONFIG          the config file its training points start from, e.g. "configs/lm_bytes.py" (a group may name
                  its own: {"config": ...})
  points(scale)   -> list[Point]: the grid at scale "cpu" (what this repository's tables ran) or "paper"
  METRIC, GOAL    the metric each point contributes (its last value in the point's metrics.jsonl, or in a bench
                  point's bench.json), "min" or "max"
  METRICS         optional: more metrics shown beside METRIC (a bench point's memory beside its tokens/s)
  BASELINE        optional {group: baseline group}: every metric is also shown divided by the baseline's (the
                  plot then draws the ratios), e.g. tokens/s as a ratio to softmax attention at the same length
  PAPER           optional {group: the paper's number} ({group: {metric: number}} for several metrics; a ratio
                  where BASELINE is set); SOURCE says where they come from
  X               optional (axis label, {group: x}): the plot draws ours and the paper's against x; else bars
  SERIES          optional {group: line}: with X, one line per series (e.g. per mixer, against length)
  XSCALE          optional "linear" or "log" (default: log where X spans 16× or more)
  claim(rows)     optional: one line saying whether the paper's claim held, from the aggregated rows
and holds in its docstring the claim being tested and the paper's numbers with their source.

Every point is one `python -m efftx.train` command (Point.command; printed before it runs, runnable by hand) with
its own workdir DIR/<point>: a re-run skips points that reached their total_steps, resumes the others from their
checkpoints, and retries failed ones. A bench point is one `python -m efftx.bench` command writing
DIR/<point>/bench.json (done once that file exists; run them with --parallel=1, or their timings share the cores).
A failing point is reported with its one-line error; the others go on.
On one machine `--parallel` points run at a time; `--launcher=slurm` submits each point as a SLURM job through
submitit; `--launcher=tpu` runs each point on every worker of a TPU VM slice with `gcloud compute tpus tpu-vm ssh
--worker=all` (one point at a time, in order). Seeds of a group are aggregated as mean ± std (sample std), and
learning rates as the best mean (a group's row is its best learning rate, as Zoology reports). The report is
written after every run (and alone with --report); the exit status is 1 when a point failed.
"""
from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import datetime
import io
import json
import math
import os
import platform
import runpy
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from absl import app
from absl import flags
from etils import epath

from efftx import checkpoints
from efftx import cli
from efftx.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHERS = ("local", "slurm", "tpu")
POINT_FILE = "sweep_point.json"  # in a point's workdir: its last attempt's outcome, error line and time
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


# ---------------------------------------------------------------------------------------------- Point state

def _read_json(path: epath.Path) -> dict | None:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def _metric_rows(folder: epath.Path) -> list[dict]:
  """A training point's metrics.jsonl rows, or a bench point's bench.json rows."""
  bench = _read_json(folder / BENCH_FILE)
  if bench is not None:
    return bench["rows"]
  try:
    text = (folder / "metrics.jsonl").read_text()
  except OSError:
    return []
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def state(folder: epath.Path) -> str:
  """"done" (trained to its config's total_steps, or its bench.json written), "failed" (its last attempt failed),
  "unfinished" (started, stopped before the end) or "pending"."""
  if (folder / BENCH_FILE).exists():
    return "done"
  config = _read_json(folder / "config.json")
  rows = _metric_rows(folder)
  if config and rows and max(r["step"] for r in rows) >= config["total_steps"]:
    return "done"
  outcome = _read_json(folder / POINT_FILE) or {}
  if outcome.get("status") == "failed":
    return "failed"
  return "unfinished" if rows or config else "pending"


_RUNNING: set[subprocess.Popen] = set()  # the points running now (launcher local), for stop()
_RUNNING_LOCK = threading.Lock()


def run_point(command: list[str], folder: str) -> dict:
  """Runs one point's command with its output in folder/train.log; records the outcome in folder/POINT_FILE.
  Returns {"status": "done" | "stopped" | "failed", "error": its one-line error, "seconds": this attempt's}."""
  folder = epath.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  start = time.time()
  log_path = folder / ("bench.log" if any("efftx.bench" in part for part in command) else "train.log")
  with tempfile.TemporaryFile("w+") as log:  # copied into the point's folder (which may be on a bucket) at the end
    log.write(f"$ {shlex.join(command)}\n")
    log.flush()
    # Its own session: a Ctrl-C at the terminal reaches the sweep alone, which stops the points with one SIGTERM
    # each (two signals would stop efftx.train at once, without its checkpoint).
    proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    with _RUNNING_LOCK:
      _RUNNING.add(proc)
    try:
      proc.wait()
    finally:
      with _RUNNING_LOCK:
        _RUNNING.discard(proc)
    log.seek(0)
    text = log.read()
  previous_log = log_path.read_text() if log_path.exists() else ""
  log_path.write_text(previous_log + text)
  previous = _read_json(folder / POINT_FILE) or {}
  outcome = {"command": command, "returncode": proc.returncode, "seconds": time.time() - start,
             "total_seconds": previous.get("total_seconds", 0.0) + time.time() - start}
  if proc.returncode == 0:
    outcome["status"] = "done" if state(folder) == "done" else "stopped"
  elif proc.returncode in (-signal.SIGTERM, -signal.SIGINT):  # stopped before its own handler was in place
    outcome["status"] = "stopped"
  else:
    outcome["status"] = "failed"
    lines = [l for l in text.splitlines()[1:] if l.strip()]  # after the "$ command" line
    errors = [l for l in lines if l.startswith(("efftx.train: error:", "efftx.bench: error:"))]
    if errors or proc.returncode > 0:
      outcome["error"] = (errors or lines or [f"exit status {proc.returncode}"])[-1][:500]
    else:  # killed (out of memory, a job's time limit)
      outcome["error"] = f"killed by {signal.Signals(-proc.returncode).name}" + (
          f"; its last output: {lines[-1][:300]}" if lines else "")
  (folder / POINT_FILE).write_text(json.dumps(outcome, indent=2))
  return outcome


# ---------------------------------------------------------------------------------------------- Launchers

@dataclasses.dataclass
class Launch:
  """How points run: launcher, --parallel, and the cluster's settings."""
  launcher: str = "local"
  parallel: int = 1
  slurm: dict[str, Any] = dataclasses.field(default_factory=dict)  # submitit parameters (slurm_partition, ...)
  submitit_cluster: str = "slurm"  # "local": submitit's local executor (tests)
  tpu: str = ""
  zone: str = ""
  remote_dir: str = "efftx"  # the checkout's folder on the TPU workers


def tpu_command(launch: Launch, train_command: list[str]) -> list[str]:
  """The gcloud command that runs one training point on every worker of the slice (each a JAX process), or one
  bench point on worker 0 (a single-host slice; on a multi-host slice the TPU runtime may wait for the other
  hosts — not tried: no TPU here)."""
  if train_command[2] == "efftx.bench":  # a measurement of one worker's chips
    remote, workers = shlex.join(["python3", *train_command[1:]]), "0"
  else:
    remote, workers = shlex.join(["python3", *train_command[1:], "--distributed"]), "all"
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", launch.tpu, f"--zone={launch.zone}", f"--worker={workers}",
          f"--command=cd {launch.remote_dir} && {remote}"]


def _commands(study: Study, workdir: str, launch: Launch) -> dict[str, list[str]]:
  out = {}
  for p in study.points:
    config_file = p.config or study.config  # relative to the checkout, which is also the workers' (tpu)
    if launch.launcher == "tpu":
      command = tpu_command(launch, p.command(config_file, f"{workdir}/{p.name}", python="python3"))
    else:
      command = p.command(config_file, f"{workdir}/{p.name}")
      if launch.launcher == "slurm" and launch.slurm.get("nodes", 1) > 1 and p.program == "train":
        command += ["--distributed"]
    out[p.name] = command
  return out


class _Status:
  """The sweep's status line (done / running / failed / pending, ETA), printed on every change and each 30 s."""

  def __init__(self, states: dict[str, str], parallel: int):
    self.states, self._parallel, self._lock = dict(states), parallel, threading.Lock()
    self._started, self._durations, self._last = time.time(), [], ""

  def set(self, name: str, value: str, seconds: float | None = None) -> None:
    with self._lock:
      self.states[name] = value
      if seconds is not None and value == "done":
        self._durations.append(seconds)
      self.print(force=True)

  def print(self, force: bool = False) -> None:
    counts = {k: sum(v == k for v in self.states.values()) for k in ("done", "running", "failed")}
    waiting = len(self.states) - sum(counts.values())
    line = f"sweep: {counts['done']} done, {counts['running']} running, {counts['failed']} failed, {waiting} pending"
    if self._durations and (waiting or counts["running"]):
      mean = sum(self._durations) / len(self._durations)
      eta = mean * (waiting + counts["running"] / 2) / self._parallel
      line += f"; ETA {datetime.timedelta(seconds=round(eta))}"
    line += f" ({datetime.timedelta(seconds=round(time.time() - self._started))} elapsed)"
    if force or line != self._last:
      print(line, file=sys.stderr, flush=True)
      self._last = line


def run(study: Study, workdir: str, launch: Launch, dry_run: bool = False) -> dict[str, str]:
  """Runs every point that is not done; returns {point: state} at the end."""
  commands = _commands(study, workdir, launch)
  states = {name: state(epath.Path(workdir) / name) for name in commands}
  todo = [n for n in commands if states[n] != "done"]
  for name, command in commands.items():
    verb = "skip (done)" if states[name] == "done" else {"unfinished": "resume", "failed": "retry"}.get(
        states[name], "run")
    print(f"{verb:12s} {name}: {shlex.join(command)}", flush=True)
  if launch.launcher == "slurm":
    print(f"             (each submitted through submitit with {launch.slurm or 'default parameters'}; logs in "
          f"{workdir}/submitit)", flush=True)
  if dry_run or not todo:
    return states
  status = _Status(states, launch.parallel if launch.launcher == "local" else len(todo))
  if launch.launcher == "slurm":
    return _run_slurm(study, workdir, launch, commands, todo, status)
  stop = threading.Event()

  def one(name: str) -> None:
    if stop.is_set():
      return
    status.set(name, "running")
    outcome = run_point(commands[name], f"{workdir}/{name}")
    if outcome["status"] == "failed":
      print(f"failed       {name}: {outcome['error']}", file=sys.stderr, flush=True)
    status.set(name, {"done": "done", "failed": "failed"}.get(outcome["status"], "unfinished"), outcome["seconds"])

  def on_signal(signum, frame):  # pylint: disable=unused-argument
    if not stop.is_set():
      print("efftx.sweep: stopping: the running points save a checkpoint and stop; the same command goes on",
            file=sys.stderr, flush=True)
      stop.set()
      with _RUNNING_LOCK:
        for proc in _RUNNING:
          proc.send_signal(signal.SIGTERM)

  previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
  threading.Thread(target=_tick, args=(status, stop), daemon=True).start()
  try:
    with concurrent.futures.ThreadPoolExecutor(launch.parallel if launch.launcher == "local" else 1) as pool:
      for future in [pool.submit(one, n) for n in todo]:
        future.result()
  finally:
    stop.set()
    for sig, handler in previous.items():
      signal.signal(sig, handler)
  return status.states


def _tick(status: _Status, stop: threading.Event) -> None:
  while not stop.wait(30):
    status.print()


def _run_slurm(study, workdir, launch, commands, todo, status) -> dict[str, str]:
  import submitit  # pylint: disable=g-import-not-at-top
  executor = submitit.AutoExecutor(folder=os.path.join(workdir, "submitit", "%j"), cluster=launch.submitit_cluster)
  executor.update_parameters(name=f"efftx-{study.name}", **launch.slurm)
  from efftx import sweep as importable  # pylint: disable=g-import-not-at-top,import-self
  # run_point by reference to its module (under `python -m efftx.sweep` this module is __main__, which the job's
  # process cannot import).
  bench = {p.name for p in study.points if p.program == "bench"}
  one_node = executor
  if bench and launch.slurm.get("nodes", 1) > 1:  # a measurement is one process: one node, not every node
    one_node = submitit.AutoExecutor(folder=os.path.join(workdir, "submitit", "%j"), cluster=launch.submitit_cluster)
    one_node.update_parameters(name=f"efftx-{study.name}", **{**launch.slurm, "nodes": 1})
  jobs = {name: (one_node if name in bench else executor).submit(importable.run_point, commands[name],
                                                                 f"{workdir}/{name}") for name in todo}
  for name, job in jobs.items():
    print(f"submitted    {name}: job {job.job_id}", flush=True)
    status.set(name, "running")
  for job in submitit.helpers.as_completed(list(jobs.values())):
    name = next(n for n, j in jobs.items() if j is job)
    try:
      outcome = job.result()
    except Exception as e:  # pylint: disable=broad-except  # the job itself died (timeout, node failure)
      outcome = {"status": "failed", "error": f"job {job.job_id}: {str(e).strip().splitlines()[-1][:300]}",
                 "seconds": None}
    if outcome["status"] == "failed":
      print(f"failed       {name}: {outcome['error']}", file=sys.stderr, flush=True)
    status.set(name, {"done": "done", "failed": "failed"}.get(outcome["status"], "unfinished"), outcome["seconds"])
  return status.states


# ---------------------------------------------------------------------------------------------- Report

def collect(study: Study, workdir: str) -> list[dict]:
  """One row per point: group, seed, learning rate, state, the last logged value of its metric ("value") and of
  each of study.metrics ("values"), and its seconds."""
  rows = []
  for p in study.points:
    folder = epath.Path(workdir) / p.name
    logged = _metric_rows(folder)
    last = {m: next((r[m] for r in reversed(logged) if m in r), None) for m in (study.metric, *study.metrics)}
    outcome = _read_json(folder / POINT_FILE) or {}
    rows.append({"point": p.name, "group": p.group, "seed": p.seed, "learning_rate": p.learning_rate,
                 "state": state(folder), "value": last[study.metric],
                 "values": {m: last[m] for m in study.metrics}, "seconds": outcome.get("total_seconds"),
                 "error": outcome.get("error")})
  return rows


def _mean_std(values: list[float]) -> tuple[float, float]:
  mean = sum(values) / len(values)
  return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0


def aggregate(points: list[dict], goal: str, groups: list[str] | None = None, metrics: tuple[str, ...] = (),
              ) -> list[dict]:
  """Per group: for each learning rate the mean and sample std of the finished seeds' values; the group's row is
  the learning rate with the best mean ("min" or "max" by goal). Groups in the order given (default: first seen).
  Each of `metrics` (points' "values") is aggregated over the same runs, into the row's "metrics"."""
  order = groups or list(dict.fromkeys(p["group"] for p in points))
  out = []
  for group in order:
    by_lr: dict[Any, list[dict]] = {}
    for p in points:
      if p["group"] == group and p["state"] == "done" and p["value"] is not None and math.isfinite(p["value"]):
        by_lr.setdefault(p["learning_rate"], []).append(p)
    total = sum(1 for p in points if p["group"] == group)
    if not by_lr:
      out.append({"group": group, "mean": None, "std": None, "n": 0, "of": total, "learning_rate": None,
                  "by_learning_rate": {}, "metrics": {m: {"mean": None, "std": None} for m in metrics}})
      continue
    means = {lr: _mean_std([p["value"] for p in runs])[0] for lr, runs in by_lr.items()}
    best = (min if goal == "min" else max)(means, key=means.get)
    runs = by_lr[best]
    mean, std = _mean_std([p["value"] for p in runs])
    extra = {}
    for m in metrics:
      values = [p["values"][m] for p in runs if p["values"].get(m) is not None and math.isfinite(p["values"][m])]
      extra[m] = dict(zip(("mean", "std"), _mean_std(values))) if values else {"mean": None, "std": None}
    of = sum(1 for p in points if p["group"] == group and p["learning_rate"] == best)  # seeds at that rate
    out.append({"group": group, "mean": mean, "std": std, "n": len(runs), "of": of, "learning_rate": best,
                "by_learning_rate": {str(lr): m for lr, m in means.items()}, "metrics": extra})
  return out


def _with_ratios(study: Study, rows: list[dict]) -> list[dict]:
  """Puts METRIC beside the others in each row's "metrics", and adds "ratio": {metric: its mean ÷ the mean of its
  BASELINE group} (None without a baseline)."""
  for r in rows:
    r["metrics"][study.metric] = {"mean": r["mean"], "std": r["std"]}
  by_group = {r["group"]: r for r in rows}
  for r in rows:
    base = by_group.get(study.baseline.get(r["group"], ""))
    r["ratio"] = {}
    for m in (study.metric, *study.metrics):
      ours, theirs = (r["metrics"][m]["mean"], base["metrics"][m]["mean"]) if base else (None, None)
      r["ratio"][m] = ours / theirs if ours is not None and theirs else None
  return rows


def _fmt(value: float | None) -> str:
  return "—" if value is None else f"{value:.4g}"


def _columns(study: Study) -> list[tuple[str, str, str]]:
  """The table's columns after "setting": (header, kind, metric), kind one of paper / ours / ratio."""
  several = bool(study.metrics) or bool(study.baseline)
  out = []
  for m in (study.metric, *study.metrics):
    has_paper = any(study.paper_value(g, m) is not None for g in study.paper) or (m == study.metric and not several)
    if has_paper:
      out.append((f"paper: {m}" if several else "paper", "paper", m))
    if study.baseline:
      out.append((f"ours: {m} ÷ baseline", "ratio", m))
    out.append((f"ours: {m}" if several else "ours (mean ± std)", "ours", m))
  return out


def report(study: Study, workdir: str, scale: str, command: str) -> dict[str, str]:
  """Writes DIR/report.md, report.csv, report.png and results.json; returns their paths."""
  points = collect(study, workdir)
  rows = _with_ratios(study, aggregate(points, study.goal, list(dict.fromkeys(p.group for p in study.points)),
                                       study.metrics))
  several_lrs = len({p.learning_rate for p in study.points}) > 1
  seconds = sum(p["seconds"] or 0 for p in points)
  lines = [f"# {study.name}: {study.metric} ({'lower' if study.goal == 'min' else 'higher'} is better)", ""]
  first_paragraph = study.doc.strip().split("\n\n")[0]
  if first_paragraph:
    lines += [" ".join(first_paragraph.split()), ""]
  example = next(((g, b) for g, b in study.baseline.items() if g != b and g in {r["group"] for r in rows}), None)
  if example:
    lines += [f"\"÷ baseline\": each setting divided by its baseline's value (e.g. {example[0]} ÷ {example[1]}).", ""]
  columns = _columns(study)
  header = ["setting", *(c[0] for c in columns), "seeds"] + (["best learning rate"] if several_lrs else [])
  lines += ["| " + " | ".join(header) + " |", "|" + "---|" + "---:|" * (len(header) - 1)]
  for r in rows:
    cells = [r["group"]]
    for _, kind, m in columns:
      if kind == "paper":
        cells.append(_fmt(study.paper_value(r["group"], m)))
      elif kind == "ratio":
        cells.append("—" if r["ratio"][m] is None else f"{r['ratio'][m]:.3g}")
      else:
        mean, std = r["metrics"][m]["mean"], r["metrics"][m]["std"]
        cells.append("—" if mean is None else f"{mean:.4g}" + (f" ± {std:.2g}" if r["n"] > 1 else ""))
    cells.append(f"{r['n']}/{r['of']}")
    if several_lrs:
      cells.append("—" if r["learning_rate"] is None else f"{r['learning_rate']:g}")
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  if study.source:
    lines += [f"Paper: {study.source}", ""]
  if study.claim and all(r["mean"] is not None for r in rows):
    lines += [f"**Claim at our scale:** {study.claim(rows)}", ""]
  missing = [p["point"] for p in points if p["state"] == "done" and p["value"] is None]
  if missing:
    lines += [f"Done but without {study.metric} in their output (left out): " + ", ".join(missing), ""]
  failed = [p for p in points if p["state"] != "done"]
  if failed:
    lines += ["Not finished: " + "; ".join(f"{p['point']} ({p['state']}"
                                            + (f": {p['error']}" if p["error"] else "") + ")" for p in failed), ""]
  lines += [f"Scale: `{scale}` ({len(study.points)} runs). Command: `{command}`",
            f"Machine: {_machine()}. Time of all runs together: {datetime.timedelta(seconds=round(seconds))}. "
            f"Written {datetime.datetime.now():%Y-%m-%d %H:%M}.", ""]
  folder = epath.Path(workdir)
  folder.mkdir(parents=True, exist_ok=True)
  paths = {"md": folder / "report.md", "csv": folder / "report.csv", "png": folder / "report.png",
           "json": folder / "results.json"}
  paths["md"].write_text("\n".join(lines))
  out = io.StringIO()
  writer = csv.writer(out)
  extra_header = [f"{m}_{k}" for m in study.metrics for k in ("mean", "std")]
  ratio_header = [f"{m}_ratio" for m in (study.metric, *study.metrics)] if study.baseline else []
  writer.writerow(["setting", "paper", "mean", "std", "seeds", "runs", "best_learning_rate", *extra_header,
                   *ratio_header])
  for r in rows:
    paper = study.paper_value(r["group"], study.metric)
    writer.writerow([r["group"], "" if paper is None else paper, r["mean"], r["std"], r["n"], r["of"],
                     r["learning_rate"], *(r["metrics"][m][k] for m in study.metrics for k in ("mean", "std")),
                     *(r["ratio"][m] for m in (study.metric, *study.metrics) if study.baseline)])
  paths["csv"].write_text(out.getvalue())
  paths["json"].write_text(json.dumps({"study": study.name, "metric": study.metric, "metrics": study.metrics,
                                       "goal": study.goal, "scale": scale, "command": command,
                                       "machine": _machine(), "seconds": seconds, "rows": rows, "points": points},
                                      indent=2))
  _plot(study, rows, paths["png"])
  return {k: os.fspath(v) for k, v in paths.items()}


def _plot(study: Study, rows: list[dict], path: epath.Path) -> None:
  """One panel per metric: ours (ratios where BASELINE is set) and the paper's, against X (one line per SERIES)
  or as bars."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  metrics = (study.metric, *study.metrics)
  fig, axes = plt.subplots(1, len(metrics), figsize=(7 * len(metrics), 4.5), squeeze=False)
  for ax, metric in zip(axes[0], metrics):
    value = lambda r, m=metric: r["ratio"][m] if study.baseline else r["metrics"][m]["mean"]
    std = lambda r, m=metric: 0.0 if study.baseline else r["metrics"][m]["std"]
    done = [r for r in rows if value(r) is not None]
    if study.x:
      label, xs = study.x
      on_axis = [r for r in done if r["group"] in xs]
      for series in dict.fromkeys(study.series.get(r["group"], "ours") for r in on_axis):
        line = [r for r in on_axis if study.series.get(r["group"], "ours") == series]
        ax.errorbar([xs[r["group"]] for r in line], [value(r) for r in line], yerr=[std(r) for r in line],
                    marker="o", capsize=3, label=series)
        paper = sorted((xs[g], study.paper_value(g, metric)) for g in study.paper
                       if g in xs and study.series.get(g, "ours") == series
                       and study.paper_value(g, metric) is not None)
        if paper:
          ax.plot(*zip(*paper), "s--", color=ax.lines[-1].get_color(), label=f"{series} (paper)"
                  if study.series else "paper")
      if study.xscale == "log" or (not study.xscale and all(v > 0 for v in xs.values())
                                   and max(xs.values()) / min(xs.values()) >= 16):
        ax.set_xscale("log", base=2)
      for r in done:  # groups off the axis (baselines): horizontal lines
        if r["group"] not in xs:
          ax.axhline(value(r), linestyle=":", color="gray")
          ax.annotate(r["group"], (ax.get_xlim()[0], value(r)), fontsize=8, va="bottom")
      ax.set_xlabel(label)
    else:
      positions = range(len(done))
      ax.bar(positions, [value(r) for r in done], yerr=[std(r) for r in done], capsize=3, label="ours")
      paper = [(i, study.paper_value(r["group"], metric)) for i, r in enumerate(done)
               if study.paper_value(r["group"], metric) is not None]
      if paper:
        ax.plot(*zip(*paper), "k_", markersize=20, label="paper")
      ax.set_xticks(list(positions), [r["group"] for r in done], rotation=30, ha="right")
    ax.set_ylabel(f"{metric} ÷ baseline" if study.baseline else metric)
    if study.baseline:
      ax.axhline(1.0, color="black", linewidth=0.8)
      shown = [value(r) for r in done]
      if shown and min(shown) > 0 and max(shown) / min(shown) >= 10:
        ax.set_yscale("log")
    ax.set_title(study.name if len(metrics) == 1 else f"{study.name}: {metric}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  buffer = io.BytesIO()
  fig.savefig(buffer, format="png", dpi=120)
  plt.close(fig)
  path.write_bytes(buffer.getvalue())


def _machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  import jax  # pylint: disable=g-import-not-at-top
  return f"{cpu}, {os.cpu_count()} cores, JAX {jax.__version__}"


def publish(study: Study, paths: dict[str, str]) -> list[str]:
  """Copies the report into the sweep file's folder (experiments/<study>/) as table.md, table.csv, plot.png and
  results.json."""
  folder = os.path.dirname(os.path.abspath(study.path))
  names = {"md": "table.md", "csv": "table.csv", "png": "plot.png", "json": "results.json"}
  out = []
  for kind, name in names.items():
    target = os.path.join(folder, name)
    with open(target, "wb") as f:
      f.write(epath.Path(paths[kind]).read_bytes())
    out.append(target)
  return out


# ---------------------------------------------------------------------------------------------- Program

def _define_flags() -> None:
  global _WORKDIR, _SCALE, _PARALLEL, _LAUNCHER, _DRY_RUN, _REPORT, _PUBLISH, _TPU, _ZONE, _REMOTE_DIR
  global _SLURM_PARTITION, _NODES, _GPUS_PER_NODE, _TIMEOUT_MIN, _SUBMITIT_CLUSTER
  _WORKDIR = flags.DEFINE_string("workdir", None, "The sweep's folder: one workdir per point, the report.")
  _SCALE = flags.DEFINE_enum("scale", "cpu", ["cpu", "paper"], "The grid: reduced (cpu) or the paper's.")
  _PARALLEL = flags.DEFINE_integer("parallel", 1, "Points at a time (launcher local).", lower_bound=1)
  _LAUNCHER = flags.DEFINE_enum("launcher", "local", LAUNCHERS, "Where points run.")
  _DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print each point's state and command; run nothing.")
  _REPORT = flags.DEFINE_bool("report", False, "Only write the report from the points' workdirs.")
  _PUBLISH = flags.DEFINE_bool("publish", False, "Copy the report next to the sweep file.")
  _TPU = flags.DEFINE_string("tpu", "", "launcher tpu: the TPU VM slice's name.")
  _ZONE = flags.DEFINE_string("zone", "", "launcher tpu: its zone.")
  _REMOTE_DIR = flags.DEFINE_string("remote_dir", "efftx", "launcher tpu: the efftx checkout on the workers.")
  _SLURM_PARTITION = flags.DEFINE_string("slurm_partition", "", "launcher slurm: the partition.")
  _NODES = flags.DEFINE_integer("nodes", 1, "launcher slurm: nodes per point (one process per node).")
  _GPUS_PER_NODE = flags.DEFINE_integer("gpus_per_node", 0, "launcher slurm: GPUs per node.")
  _TIMEOUT_MIN = flags.DEFINE_integer("timeout_min", 24 * 60, "launcher slurm: a point's time limit (minutes).")
  _SUBMITIT_CLUSTER = flags.DEFINE_enum("submitit_cluster", "slurm", ["slurm", "local"],
                                        "launcher slurm: submitit's executor (local: on this machine, for tests).")


def main(argv: list[str]) -> None:
  if len(argv) != 2:
    cli.exit_with("efftx.sweep", "give one sweep file: python -m efftx.sweep experiments/<study>/sweep.py "
                         "--workdir=DIR")
  if not _WORKDIR.value:
    cli.exit_with("efftx.sweep", "--workdir is required: the folder for the points' runs and the report")
  with cli.one_line_errors("efftx.sweep"):
    study = load(argv[1], _SCALE.value)
    workdir = os.fspath(checkpoints.run_folder(_WORKDIR.value))  # as efftx.train reads each point's --workdir
    launch = Launch(_LAUNCHER.value, _PARALLEL.value, tpu=_TPU.value, zone=_ZONE.value, remote_dir=_REMOTE_DIR.value,
                    submitit_cluster=_SUBMITIT_CLUSTER.value)
    if launch.launcher == "tpu" and not (launch.tpu and launch.zone):
      raise UserError("--launcher=tpu needs --tpu=<slice name> and --zone=<zone>")
    if launch.launcher == "tpu" and not workdir.startswith("gs://") and not _DRY_RUN.value:
      raise UserError("--launcher=tpu needs a --workdir every worker and this machine reach: gs://bucket/folder")
    if launch.launcher == "slurm":
      launch.slurm = {"timeout_min": _TIMEOUT_MIN.value, "nodes": _NODES.value, "tasks_per_node": 1}
      if _SLURM_PARTITION.value:
        launch.slurm["slurm_partition"] = _SLURM_PARTITION.value
      if _GPUS_PER_NODE.value:
        launch.slurm["gpus_per_node"] = _GPUS_PER_NODE.value
      if launch.submitit_cluster == "local":
        launch.slurm = {"timeout_min": _TIMEOUT_MIN.value}
    command = shlex.join(["python", "-m", "efftx.sweep", os.path.relpath(os.path.abspath(argv[1]), REPO)]
                         + ([f"--scale={_SCALE.value}"] if _SCALE.value != "cpu" else []) + ["--workdir=DIR"])
    if not _REPORT.value:
      states = run(study, workdir, launch, dry_run=_DRY_RUN.value)
      if _DRY_RUN.value:
        return
      unfinished = [n for n, s in states.items() if s != "done"]
      if unfinished:
        print(f"efftx.sweep: not finished: {', '.join(unfinished)}", file=sys.stderr)
    paths = report(study, workdir, _SCALE.value, command)
    print(epath.Path(paths["md"]).read_text())
    print(f"report: {', '.join(paths.values())}")
    if _PUBLISH.value:
      print(f"published: {', '.join(publish(study, paths))}")
  if not _REPORT.value and not _DRY_RUN.value and "failed" in states.values():
    sys.exit(1)  # after the report: a script running the sweep learns that a point failed


if __name__ == "__main__":
  _define_flags()
  app.run(main)

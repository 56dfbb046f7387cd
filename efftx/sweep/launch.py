"""Running points: a point's state from its folder, one point as a subprocess, and the launchers (local,
SLURM through submitit, TPU VM through gcloud) with the sweep's status line.

A point's folder holds everything about it: a re-run skips done points, resumes unfinished ones from their
checkpoints and retries failed ones. SIGINT / SIGTERM to the sweep reach each running point once, so it saves a
checkpoint and stops."""
from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import functools
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from etils import epath

from efftx.errors import UserError
from efftx.sweep.study import BENCH_FILE
from efftx.sweep.study import REPO
from efftx.sweep.study import Study

LAUNCHERS = ("local", "slurm", "tpu")
POINT_FILE = "sweep_point.json"  # in a point's workdir: its last attempt's outcome, error line and time
RECORDS = "runs"  # beside the sweep file: one published record per finished point (see publish_records)


# ---------------------------------------------------------------------------------------------- Point state

def _read_json(path: epath.Path) -> dict | None:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def metric_rows(folder: epath.Path) -> list[dict]:
  """A training point's metrics.jsonl rows, or a bench point's bench.json rows."""
  bench = _read_json(folder / BENCH_FILE)
  if bench is not None:
    return bench["rows"]
  try:
    text = (folder / "metrics.jsonl").read_text()
  except OSError:
    return []
  return [json.loads(line) for line in text.splitlines() if line.strip()]


def final_value(folder: epath.Path, metric: str, rows: list[dict] | None = None):
  """The last logged value of metric in a point's folder (its metric_rows, or `rows` already read), None without."""
  rows = metric_rows(folder) if rows is None else rows
  return next((r[metric] for r in reversed(rows) if r.get(metric) is not None), None)


def state(folder: epath.Path) -> str:
  """"done" (trained to its config's total_steps, or its bench.json written), "failed" (its last attempt failed),
  "unfinished" (started, stopped before the end) or "pending"."""
  if (folder / BENCH_FILE).exists():
    return "done"
  config = _read_json(folder / "config.json")
  rows = metric_rows(folder)
  if config and rows and max(r["step"] for r in rows) >= config["total_steps"]:
    return "done"
  outcome = _read_json(folder / POINT_FILE) or {}
  if outcome.get("status") == "failed":
    return "failed"
  return "unfinished" if rows or config else "pending"


def checkout_commit() -> str | None:
  """The checkout's git commit, with "+dirty" when efftx/ or configs/ (the code a point runs) differ from it; None
  outside a git checkout. Recorded in each point's outcome, so a published record says which code produced it."""
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "efftx", "configs"],
                           cwd=REPO, capture_output=True, text=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return None
  if head.returncode != 0:
    return None
  return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


@functools.cache
def machine() -> str:
  """This machine in words: CPU model, cores, JAX version."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  import jax  # pylint: disable=g-import-not-at-top
  return f"{cpu}, {os.cpu_count()} cores, JAX {jax.__version__}"


# ---------------------------------------------------------------------------------------------- Published records
# A finished point's record holds what the report reads from its folder (the config efftx.train wrote, its metric
# rows or bench.json), the flags it ran with, its run time, commits and machine, in
# experiments/<study>/runs/<scale>/<point>.json. Committed with the study, the records are its raw data, and a sweep
# started elsewhere with --reuse_published takes each one whose flags are the point's as done instead of running
# the point again: a sweep longer than one machine's life finishes across several.

def records_folder(study: Study, scale: str) -> str:
  return os.path.join(os.path.dirname(os.path.abspath(study.path)), RECORDS, scale)


def record(folder: epath.Path, flags: list[str]) -> dict:
  """A finished point's published record, from its folder."""
  outcome = _read_json(folder / POINT_FILE) or {}
  out = {"flags": flags, "commits": outcome.get("commits", []), "machine": outcome.get("machine"),
         "seconds": outcome.get("total_seconds")}
  bench = _read_json(folder / BENCH_FILE)
  if bench is not None:
    return {**out, "bench": bench}
  return {**out, "config": _read_json(folder / "config.json"), "metrics": metric_rows(folder)}


def _complete(published: dict) -> bool:
  """A record that makes its point done: a bench row, or a config with total_steps and metric rows reaching it."""
  if "bench" in published:
    return isinstance(published["bench"], dict) and bool(published["bench"].get("rows"))
  config, rows = published.get("config"), published.get("metrics")
  return (isinstance(config, dict) and isinstance(config.get("total_steps"), int) and isinstance(rows, list)
          and all(isinstance(r, dict) for r in rows)
          and max((r.get("step", -1) for r in rows), default=-1) >= config["total_steps"])


def _dump(value: dict) -> str:
  """JSON with one metric row per line: small, and a diff shows which rows changed."""
  if not value.get("metrics"):
    return json.dumps(value, indent=1) + "\n"
  head = json.dumps({k: v for k, v in value.items() if k != "metrics"}, indent=1)
  rows = ",\n  ".join(json.dumps(r) for r in value["metrics"])
  return head[:-2] + ',\n "metrics": [\n  ' + rows + "\n ]\n}\n"


def publish_records(study: Study, workdir: str, scale: str) -> list[str]:
  """Writes the record of every point done in workdir to experiments/<study>/runs/<scale>/<point>.json (replacing
  an older record of the same point); returns the paths written."""
  folder = records_folder(study, scale)
  out = []
  for p in study.points:
    source = epath.Path(workdir) / p.name
    if state(source) != "done":
      continue
    published = record(source, p.flags(p.config or study.config))
    if not _complete(published):  # done, but a file could not be read back (a bucket's passing error)
      raise UserError(f"{source}: done, but its config.json / metrics.jsonl / bench.json could not be read back")
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, f"{p.name}.json")
    with open(target, "w") as f:
      f.write(_dump(published))
    out.append(target)
  return out


def reuse_records(study: Study, workdir: str, scale: str, dry_run: bool = False) -> dict[str, tuple[bool, str]]:
  """For each point not started in workdir (no config written, no failed attempt) whose published record ran with
  the point's own flags: writes the record into its folder (config.json and metrics.jsonl, or bench.json, and an
  outcome that names the record), so that it counts as done. A bench record (a timing) is taken only on the
  machine that measured it. Returns {point: (reused, what to say)} for every record of a point not done in
  workdir."""
  folder = records_folder(study, scale)
  commit = checkout_commit()
  out = {}
  for p in study.points:
    path = os.path.join(folder, f"{p.name}.json")
    published = _read_json(epath.Path(path))
    now = state(epath.Path(workdir) / p.name)
    if published is None or now == "done":
      continue
    if published.get("flags") != p.flags(p.config or study.config):
      out[p.name] = (False, "its record ran with other flags")
      continue
    if not _complete(published):
      out[p.name] = (False, "its record is incomplete")
      continue
    if now != "pending":
      out[p.name] = (False, f"{now} in the workdir, which goes on with its own run")
      continue
    if "bench" in published and published.get("machine") != machine():
      out[p.name] = (False, f"a timing measured on {published.get('machine') or 'an unnamed machine'}, not this one")
      continue
    commits = published.get("commits") or []
    note = "its published record" + (f" (commit {', '.join(c[:12] for c in commits)}; this checkout "
                                     f"{(commit or 'unknown')[:12]})" if commits and commits[-1] != commit else "")
    out[p.name] = (True, note)
    if dry_run:
      continue
    target = epath.Path(workdir) / p.name
    target.mkdir(parents=True, exist_ok=True)
    if "bench" in published:
      (target / BENCH_FILE).write_text(json.dumps(published["bench"], indent=2))
    else:
      (target / "config.json").write_text(json.dumps(published["config"], indent=2))
      (target / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in published["metrics"]))
    (target / POINT_FILE).write_text(json.dumps(
        {"status": "done", "reused_record": os.path.relpath(path, REPO), "commits": commits,
         "machine": published.get("machine"), "total_seconds": published.get("seconds"), "seconds": 0.0},
        indent=2))
  return out


_RUNNING: set[subprocess.Popen] = set()  # the points running now (launcher local), for stop()
_RUNNING_LOCK = threading.Lock()


def run_point(command: list[str], folder: str) -> dict:
  """Runs one point's command with its output in folder/train.log; records the outcome in folder/POINT_FILE.
  Returns {"status": "done" | "stopped" | "failed", "error": its one-line error, "seconds": this attempt's}."""
  folder = epath.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  start = time.time()
  remote = command[0] == "gcloud"  # launcher tpu: the code and machine are the workers', not this checkout's
  commit = None if remote else checkout_commit()
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
             "total_seconds": (previous.get("total_seconds") or 0.0) + time.time() - start,
             "commits": list(dict.fromkeys([*previous.get("commits", []), *([commit] if commit else [])])),
             "machine": None if remote else machine()}
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
  hosts; untested)."""
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


def run(study: Study, workdir: str, launch: Launch, dry_run: bool = False,
        reused: set[str] = frozenset()) -> dict[str, str]:
  """Runs every point that is not done; returns {point: state} at the end. `reused`: points a dry run would take
  from their published records (printed as such, not as runs)."""
  commands = _commands(study, workdir, launch)
  states = {name: state(epath.Path(workdir) / name) for name in commands}
  todo = [n for n in commands if states[n] != "done"]
  for name, command in commands.items():
    verb = "skip (done)" if states[name] == "done" else "reuse" if name in reused else {
        "unfinished": "resume", "failed": "retry"}.get(states[name], "run")
    print(f"{verb:12s} {name}: {shlex.join(command)}", flush=True)
  if launch.launcher == "slurm":
    print(f"             (each submitted through submitit with {launch.slurm or 'default parameters'}; logs in "
          f"{workdir}/submitit)", flush=True)
  if dry_run or not todo:
    return states
  # A point that failed before is retried: pending until it runs, not counted among this run's failures.
  status = _Status({n: "retry" if s == "failed" else s for n, s in states.items()},
                   launch.parallel if launch.launcher == "local" else len(todo))
  if launch.launcher == "slurm":
    return _with_retries_failed(_run_slurm(study, workdir, launch, commands, todo, status))
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
  return _with_retries_failed(status.states)


def _with_retries_failed(states: dict[str, str]) -> dict[str, str]:
  """A point stopped before its retry ran is still failed."""
  return {n: "failed" if s == "retry" else s for n, s in states.items()}


def _tick(status: _Status, stop: threading.Event) -> None:
  while not stop.wait(30):
    status.print()


def _run_slurm(study, workdir, launch, commands, todo, status) -> dict[str, str]:
  import submitit  # pylint: disable=g-import-not-at-top
  executor = submitit.AutoExecutor(folder=os.path.join(workdir, "submitit", "%j"), cluster=launch.submitit_cluster)
  executor.update_parameters(name=f"efftx-{study.name}", **launch.slurm)
  bench = {p.name for p in study.points if p.program == "bench"}
  one_node = executor
  if bench and launch.slurm.get("nodes", 1) > 1:  # a measurement is one process: one node, not every node
    one_node = submitit.AutoExecutor(folder=os.path.join(workdir, "submitit", "%j"), cluster=launch.submitit_cluster)
    one_node.update_parameters(name=f"efftx-{study.name}", **{**launch.slurm, "nodes": 1})
  # run_point is pickled by reference to this module, which the job's process imports (the entry point, run as
  # __main__, is not).
  jobs = {name: (one_node if name in bench else executor).submit(run_point, commands[name], f"{workdir}/{name}")
          for name in todo}
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


def collect(study: Study, workdir: str) -> list[dict]:
  """One row per point: group, seed, learning rate, state, the last logged value of its metric ("value") and of
  each of study.metrics ("values"), and its seconds."""
  rows = []
  for p in study.points:
    folder = epath.Path(workdir) / p.name
    logged = metric_rows(folder)
    last = {m: final_value(folder, m, logged) for m in (study.metric, *study.metrics)}
    outcome = _read_json(folder / POINT_FILE) or {}
    rows.append({"point": p.name, "group": p.group, "seed": p.seed, "learning_rate": p.learning_rate,
                 "state": state(folder), "value": last[study.metric],
                 "values": {m: last[m] for m in study.metrics}, "seconds": outcome.get("total_seconds"),
                 "error": outcome.get("error"), "machine": outcome.get("machine")})
  return rows


def curves(study: Study, workdir: str) -> dict[str, list[tuple[int, float]]]:
  """Each finished or started training point's learning curve of METRIC from its metrics.jsonl: {point name:
  [(step, value), ...]} in step order (bench points have none)."""
  out = {}
  for p in study.points:
    if p.program != "train":
      continue
    logged = metric_rows(epath.Path(workdir) / p.name)
    curve = sorted((int(r["step"]), float(r[study.metric])) for r in logged
                   if study.metric in r and "step" in r and r[study.metric] is not None)
    if curve:
      out[p.name] = curve
  return out

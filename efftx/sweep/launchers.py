"""Launchers: one point as a subprocess (its outcome recorded in its folder), and a sweep's points run where
--launcher says (local processes, SLURM jobs through submitit, a TPU VM slice through gcloud) with the sweep's
status line.

SIGINT / SIGTERM to the sweep reach each running point once, so it saves a checkpoint and stops."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from etils import epath

from efftx.sweep.points import POINT_FILE
from efftx.sweep.points import REPO
from efftx.sweep.points import checkout_commit
from efftx.sweep.points import machine
from efftx.sweep.points import read_json
from efftx.sweep.points import state
from efftx.sweep.study import Study

LAUNCHERS = ("local", "slurm", "tpu")
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
  previous = read_json(folder / POINT_FILE) or {}
  outcome = {
    "command": command,
    "returncode": proc.returncode,
    "seconds": time.time() - start,
    "total_seconds": (previous.get("total_seconds") or 0.0) + time.time() - start,
    "commits": list(dict.fromkeys([*previous.get("commits", []), *([commit] if commit else [])])),
    "machine": None if remote else machine(),
  }
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
        f"; its last output: {lines[-1][:300]}" if lines else ""
      )
  (folder / POINT_FILE).write_text(json.dumps(outcome, indent=2))
  return outcome


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
  return [
    "gcloud",
    "compute",
    "tpus",
    "tpu-vm",
    "ssh",
    launch.tpu,
    f"--zone={launch.zone}",
    f"--worker={workers}",
    f"--command=cd {launch.remote_dir} && {remote}",
  ]


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


def grid_summary(workdir: str, verbs: dict[str, str], parallel: int, later: int = 0) -> str:
  """One line: the grid's points by what this run does with them, the points an adaptive grid adds later, and the
  time the runs left would take at `parallel` at a time, at the mean time of the points done so far."""
  count = lambda verb: sum(v == verb for v in verbs.values())
  left = count("run") + count("resume") + count("retry")
  line = f"grid: {len(verbs)} points: {count('skip (done)')} done, {left} to run"
  extra = [f"{count(v)} to {v}" for v in ("resume", "retry") if count(v)] + [f"{count('reuse')} reused"] * bool(
    count("reuse")
  )
  line += f" ({', '.join(extra)})" if extra else ""
  if later:
    line += f"; {later} more once their searches finish ({len(verbs) + later} in all)"
  seconds = [
    (read_json(epath.Path(workdir) / name / POINT_FILE) or {}).get("total_seconds")
    for name, verb in verbs.items()
    if verb == "skip (done)"
  ]
  seconds = [s for s in seconds if s]
  if seconds and left + later:
    mean = sum(seconds) / len(seconds)
    eta = mean * (left + later) / max(1, min(parallel, left + later))
    line += (
      f"; about {datetime.timedelta(seconds=round(eta))} left at {parallel} at a time (the "
      f"{len(seconds)} done points' mean, {datetime.timedelta(seconds=round(mean))})"
    )
  return line


def run(
  study: Study,
  workdir: str,
  launch: Launch,
  dry_run: bool = False,
  reused: set[str] = frozenset(),
  later: int = 0,
) -> dict[str, str]:
  """Runs every point that is not done; returns {point: state} at the end. `reused`: points a dry run would take
  from their published records (printed as such, not as runs); `later`: points an adaptive grid adds once its
  searches finish (counted in the summary line)."""
  commands = _commands(study, workdir, launch)
  states = {name: state(epath.Path(workdir) / name) for name in commands}
  todo = [n for n in commands if states[n] != "done"]
  verbs = {}
  for name, command in commands.items():
    verbs[name] = (
      "skip (done)"
      if states[name] == "done"
      else "reuse"
      if name in reused
      else {"unfinished": "resume", "failed": "retry"}.get(states[name], "run")
    )
    print(f"{verbs[name]:12s} {name}: {shlex.join(command)}", flush=True)
  print(grid_summary(workdir, verbs, launch.parallel if launch.launcher == "local" else len(todo), later), flush=True)
  if launch.launcher == "slurm":
    print(
      f"             (each submitted through submitit with {launch.slurm or 'default parameters'}; logs in "
      f"{workdir}/submitit)",
      flush=True,
    )
  if dry_run or not todo:
    return states
  # A point that failed before is retried: pending until it runs, not counted among this run's failures.
  status = _Status(
    {n: "retry" if s == "failed" else s for n, s in states.items()},
    launch.parallel if launch.launcher == "local" else len(todo),
  )
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
      print(
        "efftx.sweep: stopping: the running points save a checkpoint and stop; the same command goes on",
        file=sys.stderr,
        flush=True,
      )
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
  jobs = {
    name: (one_node if name in bench else executor).submit(run_point, commands[name], f"{workdir}/{name}")
    for name in todo
  }
  for name, job in jobs.items():
    print(f"submitted    {name}: job {job.job_id}", flush=True)
    status.set(name, "running")
  # SLURM's queue is asked every 10 s (submitit's default); a local executor's jobs every second.
  poll_seconds = 1 if launch.submitit_cluster == "local" else 10
  for job in submitit.helpers.as_completed(list(jobs.values()), poll_frequency=poll_seconds):
    name = next(n for n, j in jobs.items() if j is job)
    try:
      outcome = job.result()
    except Exception as e:  # pylint: disable=broad-except  # the job itself died (timeout, node failure)
      outcome = {
        "status": "failed",
        "error": f"job {job.job_id}: {str(e).strip().splitlines()[-1][:300]}",
        "seconds": None,
      }
    if outcome["status"] == "failed":
      print(f"failed       {name}: {outcome['error']}", file=sys.stderr, flush=True)
    status.set(name, {"done": "done", "failed": "failed"}.get(outcome["status"], "unfinished"), outcome["seconds"])
  return status.states

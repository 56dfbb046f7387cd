"""A point's folder: everything about one run of a sweep, read back as its state, its metric rows and its last
attempt's outcome; and where the code and machine that ran it came from.

A re-run of a sweep goes by these states alone: done points are skipped, unfinished ones resume from their
checkpoints, failed ones are retried."""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess

from etils import epath

from efftx import metrics_file
from efftx import run_files
from efftx.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
BENCH_FILE = "bench.json"  # in a bench point's folder: efftx.bench's rows, written when the measurement is done
POINT_FILE = "sweep_point.json"  # in a point's folder: its last attempt's outcome, error line and time


def read_json(path: epath.Path) -> dict | None:
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def config_history(folder: epath.Path) -> list[dict] | None:
  """A training point's config_history.jsonl lines: the settings changed on resume ([] if none; None if it
  cannot be read)."""
  try:
    return run_files.read_history(folder)
  except UserError:
    return None


def config_in_effect(folder: epath.Path) -> dict | None:
  """A training point's config as efftx.train resumes it: config.json with the changes of config_history.jsonl
  applied; None if either cannot be read."""
  config, history = read_json(folder / "config.json"), config_history(folder)
  return run_files.apply_history(config, history) if isinstance(config, dict) and history is not None else None


def metric_rows(folder: epath.Path) -> list[dict]:
  """A training point's metrics.jsonl rows (metrics_file.rows: a half-written last line left out), or a bench
  point's bench.json rows."""
  bench = read_json(folder / BENCH_FILE)
  if bench is not None:
    return bench["rows"]
  return metrics_file.rows(folder)


def final_value(folder: epath.Path, metric: str, rows: list[dict] | None = None):
  """The last logged value of metric in a point's folder (its metric_rows, or `rows` already read), None without."""
  rows = metric_rows(folder) if rows is None else rows
  return next((r[metric] for r in reversed(rows) if r.get(metric) is not None), None)


def state(folder: epath.Path) -> str:
  """ "done" (trained to its config's total_steps or stopped early, or its bench.json written), "failed" (its last
  attempt failed), "unfinished" (started, stopped before the end) or "pending"."""
  if (folder / BENCH_FILE).exists():
    return "done"
  config = config_in_effect(folder)
  rows = metric_rows(folder)
  if config and metrics_file.finished(rows, config["total_steps"]):
    return "done"
  outcome = read_json(folder / POINT_FILE) or {}
  if outcome.get("status") == "failed":
    return "failed"
  return "unfinished" if rows or config else "pending"


def checkout_commit() -> str | None:
  """The checkout's git commit, with "+dirty" when efftx/ or configs/ (the code a point runs) differ from it; None
  outside a git checkout. Recorded in each point's outcome, so a published record says which code produced it."""
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=30)
    dirty = subprocess.run(
      ["git", "status", "--porcelain", "--untracked-files=no", "--", "efftx", "configs"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=30,
    )
  except (OSError, subprocess.SubprocessError):
    return None
  if head.returncode != 0:
    return None
  return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def outside_history(commits) -> list[str]:
  """Of the commits that records name, those this checkout cannot check out again: "+dirty" ones (the code differed
  from its commit) and any that is not an ancestor of HEAD (amended, rebased away, or never landed). [] outside a git
  checkout."""
  out = []
  for c in sorted(set(commits)):
    if c.endswith("+dirty"):
      out.append(c)
      continue
    try:
      known = subprocess.run(
        ["git", "merge-base", "--is-ancestor", c, "HEAD"], cwd=REPO, capture_output=True, timeout=30
      ).returncode
    except (OSError, subprocess.SubprocessError):
      return []
    if known != 0:
      out.append(c)
  return out


@functools.cache
def machine() -> str:
  """This machine in words: CPU model, its widest vector instructions (a cloud VM may name only the CPU family, whose
  generations differ twice over in float32 matmul speed), cores, JAX version."""
  cpu = platform.processor() or platform.machine()
  flags = set()
  try:
    with open("/proc/cpuinfo") as f:
      info = f.read().splitlines()
    cpu = next(l.split(":", 1)[1].strip() for l in info if l.startswith("model name"))
    flags = set(next((l.split(":", 1)[1].split() for l in info if l.startswith("flags")), []))
  except (OSError, StopIteration):
    pass
  isa = next((name for flag, name in (("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), "")
  import jax  # pylint: disable=g-import-not-at-top

  return f"{cpu}{f' ({isa})' if isa else ''}, {os.cpu_count()} cores, JAX {jax.__version__}"

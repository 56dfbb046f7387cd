"""Published records: a finished point's record holds what the report reads from its folder (the config in effect
at its end, with the changes accepted on resume if any, its metric rows or bench.json), the flags it ran with, its
run time, commits and machine, in experiments/<study>/runs/<scale>/<point>.json.

Committed with the study, the records are its raw data, and a sweep started elsewhere with --reuse_published takes
each one whose flags are the point's as done instead of running the point again: a sweep longer than one machine's
life finishes across several."""

from __future__ import annotations

import json
import os

from etils import epath

from efftx import metrics_file
from efftx.errors import UserError
from efftx.sweep.points import BENCH_FILE
from efftx.sweep.points import POINT_FILE
from efftx.sweep.points import REPO
from efftx.sweep.points import checkout_commit
from efftx.sweep.points import config_history
from efftx.sweep.points import config_in_effect
from efftx.sweep.points import machine
from efftx.sweep.points import metric_rows
from efftx.sweep.points import outside_history
from efftx.sweep.points import read_json
from efftx.sweep.points import state
from efftx.sweep.study import Study

RECORDS = "runs"  # beside the sweep file: one published record per finished point (see publish_records)


def records_folder(study: Study, scale: str) -> str:
  return os.path.join(os.path.dirname(os.path.abspath(study.path)), RECORDS, scale)


def record(folder: epath.Path, flags: list[str]) -> dict:
  """A finished point's published record, from its folder."""
  outcome = read_json(folder / POINT_FILE) or {}
  out = {
    "flags": flags,
    "commits": outcome.get("commits", []),
    "machine": outcome.get("machine"),
    "seconds": outcome.get("total_seconds"),
  }
  bench = read_json(folder / BENCH_FILE)
  if bench is not None:
    return {**out, "bench": bench}
  history = config_history(folder)
  return {
    **out,
    "config": config_in_effect(folder),
    **({"config_history": history} if history else {}),
    "metrics": metric_rows(folder),
  }


def _complete(published: dict) -> bool:
  """A record that makes its point done: a bench row, or a config with total_steps and metric rows reaching it."""
  if "bench" in published:
    return isinstance(published["bench"], dict) and bool(published["bench"].get("rows"))
  config, rows = published.get("config"), published.get("metrics")
  return (
    isinstance(config, dict)
    and isinstance(config.get("total_steps"), int)
    and isinstance(rows, list)
    and all(isinstance(r, dict) for r in rows)
    and metrics_file.finished(rows, config["total_steps"])
  )


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


def unreproducible(paths: list[str]) -> dict[str, int]:
  """{commit: number of the records at paths that name it} for the commits this checkout's history lacks or that
  ran with changed code (points.outside_history): a record is raw data only with the code that produced it."""
  named = [c for path in paths for c in (read_json(epath.Path(path)) or {}).get("commits") or []]
  lacking = set(outside_history(named))
  return {c: named.count(c) for c in sorted(lacking)}


def reuse_records(
  study: Study, workdir: str, scale: str, dry_run: bool = False, any_machine: bool = False
) -> dict[str, tuple[bool, str]]:
  """For each point not started in workdir (no config written, no failed attempt) whose published record ran with
  the point's own flags: writes the record into its folder (config.json and metrics.jsonl, or bench.json, and an
  outcome that names the record), so that it counts as done. A bench record (a timing) is taken only on the
  machine that measured it, so that a sweep going on here does not mix its timings with another machine's; with
  any_machine (a report rebuilt from the records, measuring nothing) from any. Returns {point: (reused, what to
  say)} for every record of a point not done in workdir."""
  folder = records_folder(study, scale)
  commit = checkout_commit()
  out = {}
  for p in study.points:
    path = os.path.join(folder, f"{p.name}.json")
    published = read_json(epath.Path(path))
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
    if "bench" in published and not any_machine and published.get("machine") != machine():
      out[p.name] = (False, f"a timing measured on {published.get('machine') or 'an unnamed machine'}, not this one")
      continue
    commits = published.get("commits") or []
    note = "its published record" + (
      f" (commit {', '.join(c[:12] for c in commits)}; this checkout {(commit or 'unknown')[:12]})"
      if commits and commits[-1] != commit
      else ""
    )
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
    (target / POINT_FILE).write_text(
      json.dumps(
        {
          "status": "done",
          "reused_record": os.path.relpath(path, REPO),
          "commits": commits,
          "machine": published.get("machine"),
          "total_seconds": published.get("seconds"),
          "seconds": 0.0,
        },
        indent=2,
      )
    )
  return out

"""Reading a run's metrics.jsonl (efftx.metrics writes it): its rows, {"step": k, ...} each, without importing
JAX, for train's resume, the plot command and the sweep's reports alike."""

from __future__ import annotations

import json

from etils import epath

from efftx.errors import UserError


def read_rows(workdir: epath.PathLike) -> tuple[list[str], bool]:
  """(rows, torn): the lines of workdir/metrics.jsonl that are rows ({"step": k, ...}), with their newlines, and
  whether a half-written last line (no newline) was left out. UserError naming the first other line that is not
  a row."""
  path = epath.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return [], False
  try:
    lines = path.read_bytes().decode("utf-8", errors="replace").splitlines(keepends=True)
  except OSError as e:
    raise UserError(f"{path} cannot be read ({e.strerror or e})") from None
  rows = []
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
      if not (isinstance(row, dict) and isinstance(row.get("step"), int)):
        raise ValueError('not a row {"step": k, ...}')
    except ValueError as e:
      if i == len(lines) and not line.endswith("\n"):
        return rows, True
      why = (str(e).splitlines() or [type(e).__name__])[0]
      raise UserError(
        f"{path}, line {i}, cannot be read ({why}): delete that line, or put back a good copy of the file, and re-run"
      ) from None
    rows.append(line if line.endswith("\n") else line + "\n")
  return rows, False


def rows(workdir: epath.PathLike) -> list[dict]:
  """The rows of workdir/metrics.jsonl, decoded ([] without the file; a half-written last line left out: a run
  logging now, or one killed while logging). UserError naming any other line that is not a row."""
  return [json.loads(line) for line in read_rows(workdir)[0]]


STOPPED_EARLY = "stopped_early"  # the row {"step": k, "stopped_early": value} train writes when it stops early


def finished(rows: list[dict], total_steps: int) -> bool:
  """A run is finished when its rows reach total_steps, or one says it stopped early (config.stop_metric)."""
  return bool(rows) and (max(r.get("step", -1) for r in rows) >= total_steps or any(STOPPED_EARLY in r for r in rows))

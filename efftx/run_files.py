"""A run's folder (a local path or gs://bucket/folder) and its config_history.jsonl, without importing JAX: for
efftx.train and the programs that read a run's record (the sweep's launcher and reports)."""

from __future__ import annotations

import json
import os

from etils import epath

from efftx.errors import UserError


def run_folder(path: str) -> epath.Path:
  """A run's folder as given (--workdir, config.init_from): a local path, made absolute, or a gs:// bucket path."""
  if "://" not in path:
    return epath.Path(os.path.abspath(os.path.expanduser(path)))
  if not path.startswith("gs://"):
    raise UserError(f"{path}: a run's folder is a local path or a gs:// bucket path, not {path.split('://')[0]}://")
  return epath.Path(path)


def on_bucket(path: os.PathLike | str) -> bool:
  return os.fspath(path).startswith("gs://")


# The run's record in its workdir: config.json holds the config the run started with and is never rewritten while
# the run has checkpoints; config_history.jsonl holds, one line each, the settings changed on resume and the step
# they took effect after: {"step": k, "time": ..., "changes": {"optim.learning_rate": [old, new], ...}}.
HISTORY_FILE = "config_history.jsonl"


def read_history(workdir: epath.PathLike) -> list[dict]:
  """The lines of workdir/config_history.jsonl ([] without one). UserError naming the file and line that cannot
  be read (it is written whole, so a line is never half written)."""
  path = epath.Path(workdir) / HISTORY_FILE
  unreadable = lambda why: UserError(
    f"{path} cannot be read ({why}): it records the settings changed on resume; put back a good copy of it "
    "(deleting it returns the run to config.json's settings)"
  )
  try:
    lines = path.read_text().splitlines() if path.exists() else []
  except (OSError, ValueError) as e:  # ValueError: not UTF-8 text
    raise unreadable(reason(e)) from None
  entries = []
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      entry = json.loads(line)
    except ValueError as e:
      raise unreadable(f"line {i}: {reason(e)}") from None
    step, changes = (entry.get("step"), entry.get("changes")) if isinstance(entry, dict) else (None, None)
    if not (isinstance(step, int) and isinstance(changes, dict)) or not all(
      isinstance(c, list) and len(c) == 2 for c in changes.values()
    ):
      raise unreadable(f'line {i}: not {{"step": k, "changes": {{field: [old, new], ...}}}}')
    entries.append(entry)
  return entries


def reason(error: Exception) -> str:
  """An OSError's or other error's reason in a few words, for a one-line message."""
  return getattr(error, "strerror", None) or (str(error).strip().splitlines() or [type(error).__name__])[0]


def apply_history(config, entries: list[dict]):
  """config (a ConfigDict, or a config.json's dict) with the new value of each change of `entries` (read_history's
  lines) set, in order; returns it."""
  for entry in entries:
    for field, (_, value) in entry["changes"].items():
      *sections, name = field.split(".")
      tree = config
      for section in sections:
        if section not in tree:
          tree[section] = {}
        tree = tree[section]
      tree[name] = value
  return config

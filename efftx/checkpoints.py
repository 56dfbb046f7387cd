"""A run's workdir, checkpoints and record: the workdir's lock, the orbax manager, saving and restoring the train
state (falling back past unreadable checkpoints; the data position is the step), the run's config (config.json
and the settings changed on resume, config_history.jsonl: checked, recorded, read back), and reading a run's
parameters (efftx.init_from loads them, or an HF checkpoint's, as a new run's encoder).

A workdir is a local folder or a bucket path (gs://bucket/folder), reached through each library's own path
handling: etils epath (gcsfs) here, orbax's TensorStore for checkpoints, tensorboardX's google-cloud-storage writer
for event files. The differences a bucket makes: no lock (an object store has none), and files rewritten whole
instead of appended to (efftx.metrics)."""

from __future__ import annotations

import datetime
import difflib
import fcntl
import gc
import json
import logging as logging_std
import os
import socket
import sys

from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import ml_collections
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import array_metadata_store

from efftx import run_files
from efftx import saved_configs
from efftx import sharding
from efftx import trainer
from efftx.errors import UserError


class WorkdirLock:
  """An exclusive lock on the workdir folder (flock), held by one run's process 0 for the run's life, so a second
  run started on the same workdir is refused instead of writing over the first. The kernel releases it when the
  holder exits in any way, kill -9 included, so a dead run's lock never blocks. Who holds it is written to
  workdir/running.json (removed on release) for the refusal's message: a note, not part of the run's record, so a
  stale or unreadable one is written over. A workdir this lock created is removed
  again on release if the run failed before writing anything else into it.

  A bucket has no locks: there running.json is only read, to warn that another run may be writing (a killed
  run leaves it behind, so it cannot refuse); one run per bucket workdir is the launcher's to ensure."""

  def __init__(self, workdir: epath.PathLike):
    workdir = epath.Path(workdir)
    self._workdir, self._fd, self._created = workdir, None, not workdir.exists()
    self._running = workdir / "running.json"
    if not self._created and not workdir.is_dir():
      raise UserError(f"--workdir={workdir} is a file, not a folder")
    try:
      if run_files.on_bucket(workdir):  # no folders to make (and gcsfs's makedirs would create a mistyped bucket)
        bucket = "gs://" + os.fspath(workdir).removeprefix("gs://").split("/")[0]
        if not epath.Path(bucket).exists():
          raise UserError(f"--workdir={workdir}: the bucket {bucket} does not exist or cannot be reached")
      else:
        workdir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(workdir, os.O_RDONLY)
    except OSError as e:
      raise UserError(f"cannot create --workdir={workdir}: {e.strerror or e}") from None
    if run_files.on_bucket(workdir):
      if self._running.exists():
        logging.warning(
          "%s may be in use by another run (%s): a bucket has no lock, so if that run is still "
          "going, stop one of the two",
          workdir,
          self._holder(),
        )
    else:
      try:
        fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(self._fd)
        raise UserError(
          f"{workdir} is in use by another run ({self._holder()}): wait for it to end or stop it, "
          "or use another --workdir"
        ) from None
      except OSError as e:  # a filesystem without locks: go on, unprotected
        logging.warning("cannot lock %s (%s): nothing stops a second run from writing into it", workdir, e.strerror)
    try:
      self._running.write_text(
        json.dumps(
          {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
          }
        )
      )
    except OSError as e:
      self.release()
      raise UserError(f"cannot write in --workdir={workdir}: {e.strerror or e}") from None

  def _holder(self) -> str:
    try:
      h = json.loads(self._running.read_text())
      return f"pid {h['pid']} on {h['host']}, since {h['since']}"
    except (OSError, ValueError, KeyError):
      return "its process holds the folder's lock"

  def release(self) -> None:
    self._running.unlink(missing_ok=True)
    if self._fd is not None:
      if self._created and self._workdir.is_dir() and not any(self._workdir.iterdir()):
        self._workdir.rmdir()  # the run failed before writing anything: leave no trace
      os.close(self._fd)


# orbax writes a replicated array in slices, one per replica, each copied to the host by a small program of its
# own (compiled once per array shape). Below this size one replica writes the whole array: for the small arrays
# (norms, biases, a small model's every parameter) the slicing cost more than it saved (experiments/performance/
# DECISIONS.md: checkpoint-replica-parallel-min-bytes). Larger arrays are still written in parallel slices. The
# handler is orbax's default for jax.Array (with its array metadata store), this one option changed.
REPLICA_PARALLEL_MIN_BYTES = 1 << 20
_absl_logger = logging_std.getLogger("absl")
_level = _absl_logger.level
_absl_logger.setLevel(logging_std.ERROR)  # orbax warns of every override: not a line for the user's terminal
try:
  ocp.type_handlers.register_type_handler(
    jax.Array,
    ocp.type_handlers.ArrayHandler(
      array_metadata_store=array_metadata_store.Store(), min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_BYTES
    ),
    override=True,
  )
finally:
  _absl_logger.setLevel(_level)


def manager(workdir: epath.PathLike, keep: int) -> ocp.CheckpointManager:
  """workdir/checkpoints, keeping the last `keep`. A save is written to a temporary folder and renamed when
  complete (on a bucket: marked complete by a last file, commit_success.txt), so a run killed while saving leaves
  the previous checkpoints as they were; the temporary folder is removed when the next run opens the manager."""
  return ocp.CheckpointManager(
    epath.Path(workdir) / "checkpoints",
    options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, cleanup_tmp_directories=True),
  )


def has_checkpoint(workdir: epath.PathLike) -> bool:
  folder = epath.Path(workdir) / "checkpoints"
  return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def save(checkpoints: ocp.CheckpointManager, step: int, state: trainer.TrainState) -> None:
  """Starts writing a checkpoint (asynchronously: training goes on); records the sizes of the earlier ones, which
  orbax has completed by now. The data position is the step (efftx.data.pipeline.train_iterator): nothing else
  to save."""
  # The previous save has ended long since, as a rule (orbax's save would wait for it too); its sizes are final
  # only then (on a bucket a checkpoint's folder has its step's name while it is written, and the end of the save
  # rewrites _CHECKPOINT_METADATA).
  checkpoints.wait_until_finished()
  record_sizes(checkpoints)
  checkpoints.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state)))


# Written into each completed checkpoint: the size of every file in it, so that a checkpoint whose files were
# truncated or lost since (a full disk, a copy cut short) is found before orbax is asked to read it.
SIZES_FILE = "efftx_file_sizes.json"


def record_sizes(checkpoints: ocp.CheckpointManager) -> None:
  """Writes SIZES_FILE into every checkpoint that lacks one (process 0; call it when no save is in flight)."""
  if jax.process_index() != 0:
    return
  for step in checkpoints.all_steps():
    folder = _folder(checkpoints, step)
    if folder.is_dir() and not (folder / SIZES_FILE).exists():
      write_whole(folder / SIZES_FILE, json.dumps(_file_sizes(folder)))


def _file_sizes(folder: epath.Path) -> dict[str, int]:
  """{path under folder: bytes} of every file in it."""
  sizes = {}
  for d, _, files in folder.walk():
    # On a bucket, the walk names folders without their gs:// scheme: take the part below `folder` by name.
    below = os.fspath(d).removeprefix("gs://").removeprefix(os.fspath(folder).removeprefix("gs://")).strip("/")
    for name in files:
      sizes[f"{below}/{name}" if below else name] = (folder / below / name).stat().length
  return sizes


def write_whole(path: epath.Path, text: str) -> None:
  """Writes a file so that a reader sees the old text or the new, never part (a bucket's upload is that already;
  locally, through a temporary file and a rename)."""
  if run_files.on_bucket(path):
    path.write_text(text)
  else:
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _folder(checkpoints: ocp.CheckpointManager, step: int) -> epath.Path:
  return epath.Path(checkpoints.directory) / str(step)


def _reason(error: Exception) -> str:
  """An orbax/TensorStore read error in one line (their messages run to pages of JSON specs)."""
  return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def _damage(folder: epath.Path) -> str | None:
  """What is wrong with a checkpoint's files by its SIZES_FILE (None: nothing, or no record to tell)."""
  try:
    sizes = json.loads((folder / SIZES_FILE).read_text())
  except (OSError, ValueError):
    return None
  for name, size in sizes.items():
    path = folder / name
    if not path.exists():
      return f"{name} is missing"
    length = path.stat().length
    if length != size:
      return f"{name} holds {length} bytes, {size} when written"
  return None


def restore(checkpoints: ocp.CheckpointManager, step: int, abstract_state: trainer.TrainState) -> trainer.TrainState:
  """The train state at `step`, laid out as abstract_state's shardings (any mesh: orbax reshards). Checkpoints of
  efftx before the data position was the step also hold the pipeline's state ("data"), which is not needed."""
  return checkpoints.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))["state"]


def restore_latest_readable(
  checkpoints: ocp.CheckpointManager, abstract_state: trainer.TrainState
) -> tuple[trainer.TrainState, int]:
  """(state, step) of the newest checkpoint that restores (see `restore`). Newer ones that do not (truncated or
  missing files: a disk that filled up, a copy cut short) are moved to workdir/unreadable_checkpoints/ with a
  warning naming both steps; if none restores, UserError says so and how to start over."""
  failed = []
  _quiet_failed_reads()
  for step in sorted(checkpoints.all_steps(), reverse=True):
    damage = _damage(_folder(checkpoints, step))
    if damage:
      failed.append((step, damage))
      continue
    try:
      state = restore(checkpoints, step, abstract_state)
    except Exception as e:  # pylint: disable=broad-except  # whatever else the damage, try the previous one
      failed.append((step, _reason(e)))
    else:
      break
    # Collect the failed reads now, out of the except block (its frames hold them): on Python 3.11, a collection
    # that lands inside a later compile can fail it.
    gc.collect()
  else:
    raise UserError(
      f"no checkpoint in {checkpoints.directory} can be read ("
      + "; ".join(f"step {s}: {why}" for s, why in failed)
      + f"): to start over, remove {checkpoints.directory} or use "
      "another --workdir"
    )
  if failed:
    _set_aside(checkpoints, failed, step)
  logging.info("resuming from %s at step %d", checkpoints.directory, step)
  return state, step


class _DropUnretrieved(logging_std.Filter):
  def filter(self, record):
    return "exception was never retrieved" not in record.getMessage()


def _quiet_failed_reads() -> None:
  """When orbax fails to read a checkpoint, its other reads fail too, each printing a page of TensorStore details
  as it is collected ("exception was never retrieved"), and the reads still in flight find orbax's event loop
  closed when they end, each printing a traceback: the one warning line says it all, so drop those."""
  asyncio_log = logging_std.getLogger("asyncio")
  if any(isinstance(f, _DropUnretrieved) for f in asyncio_log.filters):
    return
  asyncio_log.addFilter(_DropUnretrieved())
  previous = sys.unraisablehook

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError) and "Event loop is closed" in str(unraisable.exc_value)):
      previous(unraisable)

  sys.unraisablehook = hook


def _set_aside(checkpoints: ocp.CheckpointManager, failed: list[tuple[int, str]], good_step: int) -> None:
  aside = epath.Path(checkpoints.directory).parent / "unreadable_checkpoints"
  for step, why in failed:
    if jax.process_index() == 0:
      aside.mkdir(parents=True, exist_ok=True)
      if not (aside / "README.txt").exists():  # also makes the folder exist on a bucket, where a move needs it
        (aside / "README.txt").write_text(
          "Checkpoints efftx could not read when resuming, set aside as "
          "<step>-<when>; the run went on from an earlier one.\n"
        )
      _folder(checkpoints, step).rename(aside / f"{step}-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    logging.warning(
      "checkpoint %d cannot be read (%s); resuming from step %d instead (the unreadable one is in %s)",
      step,
      why,
      good_step,
      aside,
    )
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("efftx: unreadable checkpoints set aside")
  checkpoints.reload()


# Where and how a run executes, not what it computes: free to differ on resume (a run moved to another machine,
# its devices laid out otherwise, another logging rhythm); a change is recorded all the same.
FREE_ON_RESUME = (
  "data.data_dir",
  "data.corpus_dir",
  "data.worker_count",
  "data.read_threads",
  "mesh.fsdp",
  "init_from",  # read only when a run starts
  "log_every",
  "eval_every",
  "checkpoint_every",
  "keep_checkpoints",
)
# What a checkpoint is bound to: its parameters' shapes and the examples its steps index. Never changes on resume
# (but the fields above, and data.eval_examples: which validation examples the evaluations read).
FIXED_ON_RESUME = ("model", "mixer", "data")


def read_config(workdir: epath.PathLike) -> ml_collections.ConfigDict:
  """The config in effect in workdir: config.json with the changes of config_history.jsonl applied in order, and
  fields added to efftx since at their defaults (older layouts converted). UserError naming the file that cannot
  be read."""
  workdir = epath.Path(workdir)
  path = workdir / "config.json"
  try:
    saved = json.loads(path.read_text())
  except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text
    raise UserError(
      f"{path} cannot be read ({run_files.reason(e)}): put back a good copy of it, or delete it and re-run "
      "efftx.train with the run's command, which writes it again"
    ) from None
  try:
    if not isinstance(saved, dict):
      raise TypeError(f"a JSON {type(saved).__name__}, not an object")
    config = saved_configs.from_saved(saved)
  except (TypeError, ValueError, AttributeError, KeyError) as e:
    raise UserError(
      f"{path} does not hold a run's config ({run_files.reason(e)}): put back a good copy of it"
    ) from None
  return run_files.apply_history(config, run_files.read_history(workdir))


def _flat(tree: dict, prefix: str = "") -> dict:
  """{"section.field": value} of a config's JSON."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict) and value:
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def check_change_names(config: ml_collections.ConfigDict, names) -> None:
  """Raises UserError for a name in --resume_changes that is neither a field of config nor a section of fields."""
  fields = _flat(json.loads(config.to_json_best_effort()))
  for name in names:
    name = name.removeprefix("config.")
    if any(f == name or f.startswith(name + ".") for f in fields):
      continue
    section, _, field = name.rpartition(".")
    siblings = sorted({f[len(section) + 1 :].split(".")[0] for f in fields if f.startswith(section + ".")})
    if section and siblings:
      guess = difflib.get_close_matches(field, siblings, n=1)
      hint = f" (did you mean '{section}.{guess[0]}'?)" if guess else ""
      raise UserError(
        f"--resume_changes={name}: config.{section} has no field '{field}'{hint}; its fields: {', '.join(siblings)}"
      )
    guess = difflib.get_close_matches(name, list(fields) + sorted({f.split(".")[0] for f in fields}), n=1)
    hint = f" (did you mean '{guess[0]}'?)" if guess else ""
    raise UserError(f"--resume_changes={name}: not a config field or section{hint}")


def check_resume(config: ml_collections.ConfigDict, workdir: epath.PathLike, allowed=()) -> dict[str, list]:
  """{field: [old, new]}: how `config` differs from the config in effect in workdir (read_config), which a run
  resuming with it records (record_changes). Raises UserError, naming every changed field with its old and new
  value, if a field of FIXED_ON_RESUME changed, or a setting (not FREE_ON_RESUME) that `allowed` does not name
  (by its field, "optim.learning_rate", or its section, "optim"). {} when workdir has no config.json."""
  workdir = epath.Path(workdir)
  if not (workdir / "config.json").exists():
    if (workdir / run_files.HISTORY_FILE).exists():
      raise UserError(
        f"{workdir} has checkpoints and {run_files.HISTORY_FILE} but no config.json, the config those changes apply "
        f"to: put it back, or delete {run_files.HISTORY_FILE} too to resume with this command's config as the run's"
      )
    return {}
  saved = _flat(json.loads(read_config(workdir).to_json_best_effort()))
  current = _flat(json.loads(config.to_json_best_effort()))
  changes = {
    f: [saved.get(f), current.get(f)] for f in sorted(saved.keys() | current.keys()) if saved.get(f) != current.get(f)
  }
  fixed = [
    f for f in changes if f.split(".")[0] in FIXED_ON_RESUME and f not in FREE_ON_RESUME and f != "data.eval_examples"
  ]
  allowed = [name.removeprefix("config.") for name in allowed]
  refused = [
    f
    for f in changes
    if f not in fixed and f not in FREE_ON_RESUME and not any(f == a or f.startswith(a + ".") for a in allowed)
  ]
  listed = lambda fields: ", ".join(f"config.{f} {changes[f][0]!r} → {changes[f][1]!r}" for f in fields)
  if fixed:
    raise UserError(
      f"{workdir} holds a run of another model or data ({listed(fixed)}): its checkpoints cannot go on with "
      "those; use another --workdir, or the run's own values to resume"
    )
  if refused:
    raise UserError(
      f"{workdir} holds a run with other settings ({listed(refused)}): to go on with them, re-run with "
      f"--resume_changes={','.join(allowed + refused)} (recorded in {run_files.HISTORY_FILE} with the step they take "
      "effect after), or use another --workdir"
    )
  return changes


def write_config(config: ml_collections.ConfigDict, workdir: epath.PathLike, resuming: bool) -> None:
  """Starts the record: config.json for a run that starts (and no config history: one left by a run whose
  checkpoints are gone is removed); on resume nothing, unless config.json is missing (then written from
  `config`, with a warning)."""
  workdir = epath.Path(workdir)
  path = workdir / "config.json"
  if resuming and path.exists():
    return
  if resuming:
    logging.warning("%s was missing: written from this run's config", path)
  try:
    write_whole(path, config.to_json_best_effort(indent=2, sort_keys=True))
    if not resuming:
      (workdir / run_files.HISTORY_FILE).unlink(missing_ok=True)
  except OSError as e:
    raise UserError(f"cannot write in --workdir={workdir}: {e.strerror or e}") from None


def record_changes(workdir: epath.PathLike, step: int, changes: dict[str, list]) -> None:
  """Appends {"step": step, "time": now, "changes": changes} to workdir/config_history.jsonl: the settings in
  effect after `step`. The file is rewritten whole (a bucket cannot append), so a reader never sees part of a
  line."""
  path = epath.Path(workdir) / run_files.HISTORY_FILE
  run_files.read_history(workdir)  # the lines before must be readable: they are kept as they are
  before = path.read_text() if path.exists() else ""
  when = datetime.datetime.now().isoformat(timespec="seconds")
  line = json.dumps({"step": step, "time": when, "changes": changes})
  try:
    write_whole(path, before + ("\n" if before and not before.endswith("\n") else "") + line + "\n")
  except OSError as e:
    raise UserError(f"cannot write {path}: {e.strerror or e}") from None


def restore_params(
  path: str, step: int | None = None, mesh: jax.sharding.Mesh | None = None
) -> tuple[ml_collections.ConfigDict, dict, int]:
  """(config, parameters, step) of a run: `path` is its workdir or workdir/checkpoints/<step>; `step` (default:
  the one in the path, else the latest) picks the checkpoint. The parameters are laid out on `mesh` by the rule
  of efftx.sharding (default: on one device)."""
  path = run_files.run_folder(os.fspath(path))
  if not path.exists():
    raise UserError(f"{path}: no such workdir or checkpoint")
  if not (path / "config.json").exists():
    if path.name.isdigit() and path.parent.name == "checkpoints" and (path.parent.parent / "config.json").exists():
      path, step = path.parent.parent, int(path.name) if step is None else step
    else:
      raise UserError(f"{path} is neither a training run's workdir (with config.json) nor <workdir>/checkpoints/<step>")
  config = read_config(path)
  if not (path / "checkpoints").is_dir():
    raise UserError(f"{path} has no checkpoint yet")
  checkpoints = ocp.CheckpointManager(
    path / "checkpoints", options=ocp.CheckpointManagerOptions(create=False, read_only=True)
  )
  steps = sorted(checkpoints.all_steps())
  step = steps[-1] if step is None and steps else step
  if step is None or step not in steps:
    raise UserError(
      f"{path} has no checkpoint"
      + (f" at step {step} (its checkpoints: {', '.join(map(str, steps)) or 'none'})" if step is not None else " yet")
    )
  model = trainer.parts(config).model
  shapes = jax.eval_shape(lambda: trainer.init_params(model, jax.random.key(0)))
  layout = (
    sharding.shardings(mesh, shapes)
    if mesh is not None
    else jax.tree.map(lambda _: jax.sharding.SingleDeviceSharding(jax.devices()[0]), shapes)
  )
  abstract_params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, layout)
  target = {"params": abstract_params}
  damage = _damage(path / "checkpoints" / str(step))
  if damage:
    checkpoints.close()
    raise UserError(f"checkpoint {step} of {path} cannot be read ({damage})")
  _quiet_failed_reads()
  try:
    restored = checkpoints.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
          target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        )
      ),
    )
  except Exception as e:  # pylint: disable=broad-except  # truncated or missing files
    raise UserError(f"checkpoint {step} of {path} cannot be read ({_reason(e)})") from None
  finally:
    checkpoints.close()
  return config, restored["state"]["params"], step

"""A run's checkpoints and saved config: the orbax manager of a workdir, saving and restoring the train state with
the data pipeline's position, reading a finished run's parameters, and loading another run's encoder."""
from __future__ import annotations

import json
import os

from absl import logging
import flax.traverse_util
import grain
import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from efftx import config as config_lib
from efftx import trainer
from efftx.errors import UserError


def manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  """workdir/checkpoints, keeping the last `keep`."""
  return ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                               options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))


def has_checkpoint(workdir: str) -> bool:
  folder = os.path.join(workdir, "checkpoints")
  return os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder))


def save(checkpoints: ocp.CheckpointManager, step: int, state: trainer.TrainState,
         train_iter: grain.DatasetIterator) -> None:
  checkpoints.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(train_iter)))


def restore(checkpoints: ocp.CheckpointManager, step: int, abstract_state: trainer.TrainState,
            train_iter: grain.DatasetIterator) -> trainer.TrainState:
  """The train state at `step`, laid out as abstract_state's shardings; train_iter is moved to where it was."""
  restored = checkpoints.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(train_iter)))
  return restored["state"]


def read_config(workdir: str) -> ml_collections.ConfigDict:
  """workdir/config.json, with fields added since the run at their defaults (older layouts converted)."""
  with open(os.path.join(workdir, "config.json")) as f:
    return config_lib.from_saved(json.load(f))


def check_same_run(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses to resume a workdir whose checkpoint belongs to a different model or data setup."""
  if not os.path.exists(os.path.join(workdir, "config.json")) or not os.path.isdir(
      os.path.join(workdir, "checkpoints")):
    return
  saved = json.loads(read_config(workdir).to_json_best_effort())
  current = json.loads(config.to_json_best_effort())
  for section in ("model", "mixer", "data"):
    for key, value in current[section].items():
      if key in ("data_dir", "worker_count", "read_threads"):
        continue
      if saved[section].get(key) != value:
        raise UserError(f"{workdir} holds a run with config.{section}.{key}={saved[section].get(key)!r}, "
                        f"not {value!r}: use another --workdir, or the same config to resume")


def restore_params(path: str) -> tuple[ml_collections.ConfigDict, dict, int]:
  """(config, parameters, step) of a run: `path` is its workdir (latest checkpoint) or workdir/checkpoints/<step>.
  The parameters are restored on one device."""
  path = os.path.abspath(os.path.expanduser(path))
  step = None
  if not os.path.exists(path):
    raise UserError(f"{path}: no such workdir or checkpoint")
  if not os.path.exists(os.path.join(path, "config.json")):
    workdir = os.path.dirname(os.path.dirname(path))
    if (os.path.basename(path).isdigit() and os.path.basename(os.path.dirname(path)) == "checkpoints"
        and os.path.exists(os.path.join(workdir, "config.json"))):
      path, step = workdir, int(os.path.basename(path))
    else:
      raise UserError(f"{path} is neither a training run's workdir (with config.json) nor "
                      "<workdir>/checkpoints/<step>")
  config = read_config(path)
  if not os.path.isdir(os.path.join(path, "checkpoints")):
    raise UserError(f"{path} has no checkpoint yet")
  checkpoints = ocp.CheckpointManager(os.path.join(path, "checkpoints"),
                                      options=ocp.CheckpointManagerOptions(create=False, read_only=True))
  step = checkpoints.latest_step() if step is None else step
  if step is None or step not in checkpoints.all_steps():
    raise UserError(f"{path} has no checkpoint" + (f" at step {step}" if step is not None else " yet"))
  model = trainer.parts(config).model
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract_params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
                                 jax.eval_shape(lambda: trainer.init_params(model, jax.random.key(0))))
  target = {"params": abstract_params}
  restored = checkpoints.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
  checkpoints.close()
  return config, restored["state"]["params"], step


def load_encoder(params: dict, path: str, fresh: tuple[str, ...]) -> dict:
  """`params` with every parameter but the head's (top-level names in `fresh`: the objective's fresh_params)
  replaced by the run's at `path` (see restore_params).

  The encoders must match (mixer, widths, layers); position embeddings may be longer there (the first rows are
  taken), so a model pre-trained at length 512 fine-tunes at 128. The source run's own head is left behind.
  """
  try:
    source_config, loaded, step = restore_params(path)
  except UserError as e:
    raise UserError(f"config.init_from: {e}") from None
  source_head = trainer.parts(source_config).objective.fresh_params
  flat_loaded = flax.traverse_util.flatten_dict(jax.device_get(loaded), sep="/")
  m = source_config.model
  source_model = f"mixer={m.mixer}, num_layers={m.num_layers}, reversible={m.reversible}, d_model={m.d_model}"
  flat_params = flax.traverse_util.flatten_dict(params, sep="/")
  unused = sorted(n for n in flat_loaded if n.split("/")[0] not in source_head and n not in flat_params)
  if unused:
    raise UserError(f"config.init_from: this model has no parameter {unused[0]} of {path} ({source_model}): "
                    "the encoders must match")
  out = {}
  for name, value in flat_params.items():
    if name.split("/")[0] in fresh:
      out[name] = value
      continue
    if name not in flat_loaded:
      raise UserError(f"config.init_from: {path} has no parameter {name} (it trained {source_model}): "
                      "the encoders must match")
    old = np.asarray(flat_loaded[name])
    if name == "pos_embed" and old.shape[1:] == value.shape[1:] and len(old) >= len(value):
      old = old[:len(value)]
    if old.shape != value.shape:
      raise UserError(f"config.init_from: parameter {name} has shape {old.shape} in {path}, {value.shape} "
                      "here: the encoders must match")
    out[name] = old.astype(value.dtype)
  logging.info("fine-tuning from %s (step %d): encoder loaded, new head: %s", path, step, ", ".join(fresh))
  return flax.traverse_util.unflatten_dict(out, sep="/")

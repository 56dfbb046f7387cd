"""Train and evaluate one model: config → data → model → sharded jit steps → checkpoints and metrics.

    python -m efftx.train --config=configs/quickstart.py:mixer=fnet --workdir=/tmp/efftx/fnet \
        [--config.model.d_model=256 ...]

Re-running the same command resumes from the latest checkpoint in --workdir (model, optimizer and the position of
the data pipeline), so no example is seen twice or skipped. SIGTERM or Ctrl-C saves a checkpoint and stops; a
second Ctrl-C stops at once. Outputs in --workdir: config.json, metrics.jsonl, tensorboard/, checkpoints/.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from absl import app
from absl import flags
from absl import logging
import flax.struct
import flax.traverse_util
import grain
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
from ml_collections import config_flags
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tensorboardX
import tqdm

from efftx import config as config_lib
import efftx.data as data_lib
from efftx.data import pipeline
from efftx.data import TASKS
from efftx.model import build_model

_DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                               "quickstart.py")


def _define_flags() -> None:
  """Command-line flags, defined only when run as a program (so that other entry points can import this one)."""
  global _CONFIG, _WORKDIR, _DISTRIBUTED
  _CONFIG = config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Config file[:argument string].",
                                            lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, TensorBoard, config.json.")
  _DISTRIBUTED = flags.DEFINE_bool("distributed", False,
                                   "Call jax.distributed.initialize() first (multi-host: TPU pods, SLURM, ...).")


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  params: Any
  opt_state: Any


def make_optimizer(config: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW with linear warmup and cosine decay to 0 at total_steps, after global-norm gradient clipping."""
  o = config.optim
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, o.learning_rate, warmup_steps=o.warmup_steps, decay_steps=max(config.total_steps, o.warmup_steps + 1))
  # Decay weight matrices and embeddings only, not biases, norm scales or position biases — chosen by name: shapes
  # do not tell (DenseGeneral biases are 3-D; the reversible stack adds a layer axis to every leaf).
  decay_mask = lambda params: jax.tree_util.tree_map_with_path(
      lambda path, _: getattr(path[-1], "key", None) in ("kernel", "embedding"), params)
  tx = optax.chain(
      optax.clip_by_global_norm(o.grad_clip) if o.grad_clip else optax.identity(),
      optax.adamw(schedule, weight_decay=o.weight_decay, mask=decay_mask))
  return tx, schedule


def loss_sums(objective: str, logits: jax.Array, batch: dict[str, jax.Array], row_weights_B: jax.Array
              ) -> dict[str, jax.Array]:
  """Weighted sums (not means) of loss, correct predictions and predictions, so that batches, devices and padded
  eval rows combine exactly. "classify": one label per row; "lm"/"mlm": the targets at positions of weight > 0
  (the next token, the value of a recall query, a masked token)."""
  if objective == "classify":
    logits_NxC, labels_N, weights_N = logits, batch["label"], row_weights_B
  else:
    logits_NxC = logits.reshape(-1, logits.shape[-1])
    labels_N = batch["targets"].reshape(-1)
    weights_N = (batch["weights"] * row_weights_B[:, None]).reshape(-1).astype(jnp.float32)
  loss_N = optax.softmax_cross_entropy_with_integer_labels(logits_NxC.astype(jnp.float32), labels_N)
  correct_N = (jnp.argmax(logits_NxC, -1) == labels_N).astype(jnp.float32)
  return {"loss": (loss_N * weights_N).sum(), "correct": (correct_N * weights_N).sum(), "count": weights_N.sum()}


def summarize(sums: dict[str, jax.Array], objective: str, token_unit: str | None = None, prefix: str = ""
              ) -> dict[str, jax.Array]:
  """loss (nats), accuracy, and for next-token LM tasks bits per token_unit (per byte, per dim, ...)."""
  count = jnp.maximum(sums["count"], 1.0)
  out = {f"{prefix}loss": sums["loss"] / count, f"{prefix}accuracy": sums["correct"] / count}
  if objective == "lm" and token_unit:
    out[f"{prefix}bits_per_{token_unit}"] = sums["loss"] / count / jnp.log(2.0)
  return out


def make_steps(model, objective: str, tx: optax.GradientTransformation, schedule: optax.Schedule,
               dropout_key: jax.Array, token_unit: str | None = None):
  """The train step (loss, grads, AdamW update, metrics) and eval step (weighted sums), not yet jitted."""

  def train_step(state: TrainState, batch: dict[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
    rng = jax.random.fold_in(dropout_key, state.step)  # dropout differs every step, reproducibly

    def loss_fn(params):
      logits = model.apply({"params": params}, batch["tokens"], mask=batch["mask"], deterministic=False,
                           rngs={"dropout": rng})
      sums = loss_sums(objective, logits, batch, jnp.ones(batch["tokens"].shape[:1], jnp.float32))
      return sums["loss"] / jnp.maximum(sums["count"], 1.0), sums

    (_, sums), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = TrainState(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                           opt_state=opt_state)
    metrics = {**summarize(sums, objective, token_unit), "grad_norm": optax.tree.norm(grads),
               "learning_rate": schedule(state.step)}
    return new_state, metrics

  def eval_step(params, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    logits = model.apply({"params": params}, batch["tokens"], mask=batch["mask"], deterministic=True)
    return loss_sums(objective, logits, batch, batch["weight"])

  return train_step, eval_step


HEADS = ("classifier", "pool_dense", "lm_head")  # the parameters a fine-tuning run initialises anew


def restore_params(path: str) -> tuple[ml_collections.ConfigDict, dict, int]:
  """(config, parameters, step) of a run: `path` is its workdir (latest checkpoint) or workdir/checkpoints/<step>.
  The parameters are restored on one device."""
  path = os.path.abspath(os.path.expanduser(path))
  step = None
  if not os.path.exists(path):
    raise ValueError(f"{path}: no such workdir or checkpoint")
  if not os.path.exists(os.path.join(path, "config.json")):
    workdir = os.path.dirname(os.path.dirname(path))
    if (os.path.basename(path).isdigit() and os.path.basename(os.path.dirname(path)) == "checkpoints"
        and os.path.exists(os.path.join(workdir, "config.json"))):
      path, step = workdir, int(os.path.basename(path))
    else:
      raise ValueError(f"{path} is neither a training run's workdir (with config.json) nor "
                       "<workdir>/checkpoints/<step>")
  config = config_lib.default_config()  # fields added since the run was made take their defaults
  with open(os.path.join(path, "config.json")) as f:
    config.update(json.load(f))
  if not os.path.isdir(os.path.join(path, "checkpoints")):
    raise ValueError(f"{path} has no checkpoint yet")
  checkpoints = ocp.CheckpointManager(os.path.join(path, "checkpoints"),
                                      options=ocp.CheckpointManagerOptions(create=False, read_only=True))
  step = checkpoints.latest_step() if step is None else step
  if step is None or step not in checkpoints.all_steps():
    raise ValueError(f"{path} has no checkpoint" + (f" at step {step}" if step is not None else " yet"))
  model = build_model(config)
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract_params = jax.tree.map(
      lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=device),
      jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, config.model.max_len), jnp.int32))["params"]))
  target = {"params": abstract_params}
  restored = checkpoints.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)))
  checkpoints.close()
  return config, restored["state"]["params"], step


def load_encoder(params: dict, path: str) -> dict:
  """`params` with every parameter but the heads replaced by the run's at `path` (see restore_params).

  The encoders must match (mixer, widths, layers); position embeddings may be longer there (the first rows are
  taken), so a model pre-trained at length 512 fine-tunes at 128. The heads (HEADS) keep their new values.
  """
  try:
    source_config, loaded, step = restore_params(path)
  except ValueError as e:
    raise ValueError(f"config.init_from: {e}") from None
  flat_loaded = flax.traverse_util.flatten_dict(jax.device_get(loaded), sep="/")
  m = source_config.model
  source_model = f"mixer={m.mixer}, num_layers={m.num_layers}, reversible={m.reversible}, d_model={m.d_model}"
  flat_params = flax.traverse_util.flatten_dict(params, sep="/")
  unused = sorted(n for n in flat_loaded if n.split("/")[0] not in HEADS and n not in flat_params)
  if unused:
    raise ValueError(f"config.init_from: this model has no parameter {unused[0]} of {path} ({source_model}): "
                     "the encoders must match")
  out = {}
  for name, value in flat_params.items():
    if name.split("/")[0] in HEADS:
      out[name] = value
      continue
    if name not in flat_loaded:
      raise ValueError(f"config.init_from: {path} has no parameter {name} (it trained {source_model}): "
                       "the encoders must match")
    old = np.asarray(flat_loaded[name])
    if name == "pos_embed" and old.shape[1:] == value.shape[1:] and len(old) >= len(value):
      old = old[:len(value)]
    if old.shape != value.shape:
      raise ValueError(f"config.init_from: parameter {name} has shape {old.shape} in {path}, {value.shape} here: "
                       "the encoders must match")
    out[name] = old.astype(value.dtype)
  logging.info("fine-tuning from %s (step %d): encoder loaded, new heads: %s", path, step,
               ", ".join(sorted({n.split("/")[0] for n in out if n.split("/")[0] in HEADS})))
  return flax.traverse_util.unflatten_dict(out, sep="/")


def make_mesh(devices=None) -> jax.sharding.Mesh:
  """One "data" axis over the devices (default: every device of every process)."""
  devices = jax.devices() if devices is None else devices
  # Auto axes: XLA propagates the shardings (jax.make_mesh defaults to Explicit sharding-in-types).
  return jax.make_mesh((len(devices),), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains to config.total_steps (resuming from workdir if it holds a checkpoint); returns the last metrics."""
  config_lib.validate(config, jax.device_count())
  task = TASKS[config.data.task]
  objective = data_lib.objective(config)
  workdir = os.path.abspath(os.path.expanduser(workdir))
  is_chief = jax.process_index() == 0
  resuming = _has_checkpoint(workdir)
  if config.init_from and not resuming and not os.path.exists(os.path.expanduser(config.init_from)):
    raise ValueError(f"config.init_from='{config.init_from}': no such workdir or checkpoint")
  # Process 0 checks the workdir, prepares the data, encodes a few examples of each split (so that a setting
  # that cannot work fails before anything is written in workdir), then writes config.json; the others wait,
  # and stop with it if it failed (instead of waiting forever at the next collective).
  error = None
  if is_chief:
    try:
      _check_same_run(config, workdir)
      pipeline.prepare(config)
      pipeline.check(config, pipeline.source(config, "train"), pipeline.source(config, "eval"))
      if config.init_from and not resuming:  # the encoder must load before anything is written
        load_encoder(jax.eval_shape(lambda: build_model(config).init(
            jax.random.key(0), jnp.zeros((1, config.model.max_len), jnp.int32))["params"]), config.init_from)
      os.makedirs(workdir, exist_ok=True)
      with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2, sort_keys=True))
    except ValueError as e:
      error = str(e)
  if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(error is not None)) and not error:
    error = "process 0 failed during set-up (see its log)"
  if error:
    raise ValueError(error)

  # --------------------------------------------------------------------------------------------------- Mesh
  # One data axis over every device of every process: the batch is split along it, parameters are replicated.
  mesh = make_mesh()
  replicated = NamedSharding(mesh, P())
  batch_sharding = NamedSharding(mesh, P("data"))

  def to_global(local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
    return {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in local_batch.items()}

  # --------------------------------------------------------------------------------------------------- Data
  train_source = pipeline.source(config, "train")  # prepared above by process 0
  eval_source = pipeline.source(config, "eval")
  train_iter = pipeline.train_iterator(config, train_source)

  # ---------------------------------------------------------------------------------------- Model, optimizer
  model = build_model(config)
  tx, schedule = make_optimizer(config)
  init_key, dropout_key = jax.random.split(jax.random.key(config.seed))

  def init_state() -> TrainState:
    params = model.init(init_key, jnp.zeros((1, config.model.max_len), jnp.int32))["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

  state_sharding = jax.tree.map(lambda _: replicated, jax.eval_shape(init_state))

  # ------------------------------------------------------------------------------------ Restore or initialise
  checkpoints = ocp.CheckpointManager(
      os.path.join(workdir, "checkpoints"),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.keep_checkpoints, create=True))
  start_step = checkpoints.latest_step() or 0
  if start_step:
    abstract_state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                                  jax.eval_shape(init_state), state_sharding)
    restored = checkpoints.restore(start_step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), data=grain.checkpoint.CheckpointRestore(train_iter)))
    state = restored["state"]
    logging.info("resumed from %s at step %d", checkpoints.directory, start_step)
  else:
    state = jax.jit(init_state, out_shardings=state_sharding)()
    if config.init_from:  # fine-tuning: the encoder from another run, new heads, a fresh optimizer
      params = load_encoder(jax.device_get(state.params), config.init_from)
      state = jax.jit(lambda p: TrainState(step=jnp.zeros((), jnp.int32), params=p, opt_state=tx.init(p)),
                      out_shardings=state_sharding)(params)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  logging.info("model: %s mixer, %d parameters; %d devices", config.model.mixer, num_params, jax.device_count())

  # ---------------------------------------------------------------------------------------------- Steps
  train_step, eval_step = make_steps(model, objective, tx, schedule, dropout_key, task.token_unit)
  jit_train_step = jax.jit(train_step, in_shardings=(state_sharding, batch_sharding),
                           out_shardings=(state_sharding, replicated), donate_argnums=0)
  jit_eval_step = jax.jit(eval_step, in_shardings=(state_sharding.params, batch_sharding), out_shardings=replicated)

  def evaluate(params) -> dict[str, float]:
    totals = None
    for batch in pipeline.eval_batches(config, eval_source):
      sums = jit_eval_step(params, to_global(batch))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    return {k: float(v) for k, v in jax.device_get(summarize(totals, objective, task.token_unit, prefix="eval_")).items()}

  def save(step: int) -> None:
    checkpoints.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(train_iter)))

  # ----------------------------------------------------------------------------------------------- Loop
  writer = MetricWriter(workdir, start_step) if is_chief else None
  tokens_per_step = config.data.batch_size * config.model.max_len
  stop = _StopOnSignal()
  last: dict[str, float] = {}
  bar = tqdm.tqdm(total=config.total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True,
                  disable=None if is_chief else True)  # None: shown on a terminal only
  # On a terminal, lines go above the progress bar; elsewhere to the log.
  report = (lambda line: bar.write(line, file=sys.stderr)) if not bar.disable else logging.info
  if start_step >= config.total_steps:
    logging.info("%s is already trained to step %d (config.total_steps=%d)", workdir, start_step, config.total_steps)
  window: list[dict[str, jax.Array]] = []
  window_start, window_steps = time.perf_counter(), 0
  try:
    step = start_step
    while step < config.total_steps:
      state, metrics = jit_train_step(state, to_global(next(train_iter)))
      step += 1
      bar.update()
      window.append(metrics)
      window_steps += 1
      if step == start_step + 1:  # leave the first step's compile time out of the throughput
        jax.block_until_ready(metrics)
        window_start, window_steps = time.perf_counter(), 0
      done = step == config.total_steps
      if step % config.log_every == 0 or done:
        row = {k: float(np.mean(v)) for k, v in jax.device_get(jax.tree.map(lambda *x: jnp.stack(x), *window)).items()}
        seconds = time.perf_counter() - window_start
        if window_steps:
          row["steps_per_sec"] = window_steps / seconds
          row["tokens_per_sec"] = window_steps * tokens_per_step / seconds
        window, window_start, window_steps = [], time.perf_counter(), 0
        last.update(row)
        bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['accuracy']:.3f}")
        if writer:
          writer.write(step, row)
        report(f"step {step}: {_fmt(row)}")
      if step % config.eval_every == 0 or done:
        eval_start = time.perf_counter()
        row = evaluate(state.params)
        last.update(row)
        if writer:
          writer.write(step, row)
        report(f"step {step}: {_fmt(row)}")
        window_start += time.perf_counter() - eval_start  # keep eval time out of the train throughput
      stopping = stop.requested
      if jax.process_count() > 1:  # every process must stop at the same step, or the others hang
        stopping = bool(multihost_utils.process_allgather(np.int32(stopping)).max())
      if step % config.checkpoint_every == 0 or done or stopping:
        save(step)
      if stopping:
        logging.warning("stopped by signal at step %d (checkpoint saved); re-run the same command to resume", step)
        break
  finally:
    bar.close()
    stop.restore()
    checkpoints.wait_until_finished()
    checkpoints.close()
    if writer:
      writer.close()
  last["step"] = int(step)
  return last


class _StopOnSignal:
  """SIGTERM/SIGINT ask the loop to save and stop at the next step boundary; a second SIGINT interrupts."""

  def __init__(self):
    self.requested = False
    self._previous = {}
    if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread
      for sig in (signal.SIGTERM, signal.SIGINT):
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    if self.requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self.requested = True

  def restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class MetricWriter:
  """metrics.jsonl (one JSON object per logged step) and TensorBoard event files, in workdir.

  On resume, rows logged after the restored checkpoint (by a run that stopped before saving) are dropped, so
  every step appears once.
  """

  def __init__(self, workdir: str, start_step: int):
    self._path = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(self._path):
      with open(self._path) as f:
        rows = [line for line in f if line.strip() and json.loads(line)["step"] <= start_step]
      with open(self._path, "w") as f:
        f.writelines(rows)
    self._jsonl = open(self._path, "a")
    self._tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=start_step + 1)

  def write(self, step: int, row: dict[str, float]) -> None:
    self._jsonl.write(json.dumps({"step": step, **row}) + "\n")
    self._jsonl.flush()
    for name, value in row.items():
      self._tb.add_scalar(name, value, step)
    self._tb.flush()

  def close(self) -> None:
    self._jsonl.close()
    self._tb.close()


def _fmt(row: dict[str, float]) -> str:
  return ", ".join(f"{k}={v:.4g}" for k, v in row.items())


def _has_checkpoint(workdir: str) -> bool:
  folder = os.path.join(workdir, "checkpoints")
  return os.path.isdir(folder) and any(name.isdigit() for name in os.listdir(folder))


def _check_same_run(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Refuses to resume a workdir whose checkpoint belongs to a different model or data setup."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path) or not os.path.isdir(os.path.join(workdir, "checkpoints")):
    return
  saved = json.loads(config_lib.default_config().to_json_best_effort())  # fields added since take their defaults
  with open(path) as f:
    for section, values in json.load(f).items():
      saved[section] = {**saved.get(section, {}), **values} if isinstance(values, dict) else values
  current = json.loads(config.to_json_best_effort())
  for section in ("model", "data"):
    for key, value in current[section].items():
      if key in ("data_dir", "worker_count", "read_threads"):
        continue
      if saved.get(section, {}).get(key) != value:
        raise ValueError(f"{workdir} holds a run with config.{section}.{key}={saved.get(section, {}).get(key)!r}, "
                         f"not {value!r}: use another --workdir, or the same config to resume")


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with one clear line instead of a traceback for a bad config or override."""
  try:
    rest = flags.FLAGS(argv)
    _CONFIG.value.model  # a config file that failed to load raises here  # pylint: disable=pointless-statement
    return rest
  except (flags.Error, AttributeError, KeyError, ValueError, TypeError, OSError) as e:
    config_lib.exit_with("efftx.train", config_lib.explain_flag_error(argv, e))


def main(argv: list[str]) -> None:
  config_lib.quiet_orbax_logs()
  if len(argv) > 1:
    config_lib.exit_with("efftx.train", f"unexpected arguments: {' '.join(argv[1:])}")
  if not _WORKDIR.value:
    config_lib.exit_with("efftx.train", "--workdir is required (where checkpoints and metrics go)")
  if _DISTRIBUTED.value:
    jax.distributed.initialize()
  try:
    config_lib.validate(_CONFIG.value, jax.device_count())
  except ValueError as e:
    config_lib.exit_with("efftx.train", str(e))
  try:
    result = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  except ValueError as e:  # a workdir holding another run, a bad corpus, an example too long: one clear line
    config_lib.exit_with("efftx.train", str(e))
  if jax.process_index() == 0:
    print(f"step {result['step']}: " + (_fmt({k: v for k, v in result.items() if k != "step"}) or "nothing to do"))
    print(f"outputs in {os.path.abspath(_WORKDIR.value)}")


if __name__ == "__main__":
  _define_flags()
  app.run(main, flags_parser=_parse_flags)

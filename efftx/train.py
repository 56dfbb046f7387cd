"""Train and evaluate one model: config → data → model → sharded jit steps → checkpoints and metrics.

    python -m efftx.train --config=configs/quickstart.py:mixer=fnet --workdir=/tmp/efftx/fnet \
        [--config.model.d_model=256 ...]

Re-running the same command resumes from the latest checkpoint in --workdir (model, optimizer and the position of
the data pipeline), so no example is seen twice or skipped. SIGTERM or Ctrl-C saves a checkpoint and stops; a
second Ctrl-C stops at once. Outputs in --workdir: config.json, metrics.jsonl, tensorboard/, checkpoints/.

The run's record is append-only. config.json is the config the run started with, never rewritten while the run
has checkpoints. Resuming with other settings is refused, naming each changed field (old → new), unless
--resume_changes names them (`--resume_changes=total_steps,optim.learning_rate`, or a section: `optim`); an
accepted change is appended to config_history.jsonl with the step it took effect after, and the config in effect
is config.json with those changes applied (efftx.checkpoints.read_config, which evaluate and sample read). The
model, mixer and data cannot change on resume, flag or not; where and how the run executes (data paths, reader
threads, mesh.fsdp, logging and checkpoint intervals) may change freely and is recorded all the same
(efftx.checkpoints: FREE_ON_RESUME).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import signal
import sys
import threading
import time
from typing import Any

from absl import app
from absl import flags
from absl import logging
from etils import epath
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
from jax.sharding import NamedSharding
import ml_collections
from ml_collections import config_flags
import numpy as np
import tqdm

from efftx import checkpoints as checkpoints_lib
from efftx import cli
from efftx import config as config_lib
from efftx import distributed
from efftx import init_from
from efftx import metrics as metrics_lib
from efftx import metrics_file
from efftx import patterns
from efftx import platform as platform_lib
from efftx import run_files
from efftx import sharding
from efftx import trainer
from efftx.data import pipeline
from efftx.errors import UserError
from efftx.mixers import MIXERS


def _define_flags() -> None:
  """Command-line flags, defined only when run as a program (so that other entry points can import this one)."""
  global _CONFIG, _WORKDIR, _RESUME_CHANGES
  _CONFIG = config_flags.DEFINE_config_file(
    "config", cli.default_config_file(), "Config file[:argument string].", lock_config=True
  )
  _WORKDIR = flags.DEFINE_string("workdir", None, "Run directory: checkpoints, metrics, TensorBoard, config.json.")
  _RESUME_CHANGES = flags.DEFINE_list(
    "resume_changes",
    [],
    "On resume: the settings (fields or sections of the config, e.g. total_steps,optim.learning_rate) allowed to "
    "differ from the run's; each change is recorded in the workdir's config_history.jsonl.",
  )
  distributed.define_flags()


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, resume_changes: Sequence[str] = ()
) -> dict[str, float]:
  """Trains to config.total_steps (resuming from workdir if it holds a checkpoint, with the settings
  `resume_changes` names allowed to differ from the run's); returns the last metrics."""
  config_lib.validate(config, jax.device_count())
  checkpoints_lib.check_change_names(config, resume_changes)
  # The task, objective and model, built once (set-up checks an init_from encoder against the model), and before
  # the workdir is touched: a config that cannot be built leaves nothing behind.
  parts = trainer.parts(config)
  workdir = run_files.run_folder(workdir)
  # Process 0 holds the workdir's lock for the whole run: a second run on it is refused, not interleaved.
  lock = checkpoints_lib.WorkdirLock(workdir) if jax.process_index() == 0 else None
  try:
    return _train(config, parts, workdir, resume_changes)
  finally:
    if lock:
      lock.release()


def _train(
  config: ml_collections.ConfigDict, parts: trainer.Parts, workdir: epath.Path, resume_changes: Sequence[str]
) -> dict[str, float]:
  resuming = checkpoints_lib.has_checkpoint(workdir)
  changes = _set_up_workdir(config, parts, workdir, resuming, resume_changes)
  # A schedule the run is too short for (a warmup past its end, an eval interval that never comes) is allowed, and
  # said once, in one line.
  warning = config_lib.schedule_warning(config)
  if warning and jax.process_index() == 0:
    logging.warning("%s", warning)

  # --------------------------------------------------------------------------------------------------- Mesh
  # ("data", "fsdp") over every device of every process: the batch is split over both axes, parameters and
  # optimizer state along fsdp by the rule in efftx/sharding.py (fsdp = 1: replicated, plain data parallelism).
  mesh = sharding.make_mesh(config.mesh.fsdp)
  batch_sharding = sharding.batch(mesh)

  # --------------------------------------------------------------------------------------------------- Data
  # The data position is the step: any number of processes reads the same global batches from a step on (the
  # iterator starts at the step the state is restored at, below).
  train_source = pipeline.source(config, "train")

  # ---------------------------------------------------------------------------------------- Model, optimizer
  # The model is parts.model, built once from the validated config (train_and_evaluate).
  tx, schedule = trainer.make_optimizer(config)
  init_key, dropout_key = jax.random.split(jax.random.key(config.seed))
  abstract_state = jax.eval_shape(lambda: trainer.create_state(parts.model, tx, init_key))
  state_sharding = sharding.shardings(mesh, abstract_state)

  # ------------------------------------------------------------------------------------ Restore or initialise
  checkpoints = checkpoints_lib.manager(workdir, config.keep_checkpoints)
  state, start_step = _restore_or_init(config, checkpoints, parts, tx, init_key, abstract_state, state_sharding)
  if changes:  # recorded at the step restored (an unreadable latest checkpoint may have set it back)
    _on_process_0(lambda: checkpoints_lib.record_changes(workdir, start_step, changes), "recording the changes")
    logging.warning(
      "changed on resume, from step %d on (recorded in %s): %s",
      start_step,
      workdir / run_files.HISTORY_FILE,
      ", ".join(f"{f} {old!r} → {new!r}" for f, (old, new) in changes.items()),
    )
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  logging.info("data: %s (%s) in %s", config.data.task, config.data.variant, pipeline.data_dir(config))
  layers = patterns.layer_mixers(config.model.mixer, config.model.num_layers)
  logging.info(
    "model: %s mixer%s, %d parameters; %d devices (data %d × fsdp %d)",
    config.model.mixer,
    "" if len(set(layers)) == 1 else f" (layers from the input up: {', '.join(layers)})",
    num_params,
    jax.device_count(),
    mesh.shape["data"],
    mesh.shape["fsdp"],
  )
  train_iter = pipeline.train_iterator(config, train_source, start_step)

  # ---------------------------------------------------------------------------------------------- Steps
  # Compiled ahead of the first step, from its batch, so that the log can say which kernels the step calls.
  train_step = build_train_step(config, mesh, parts, tx, schedule, dropout_key, state_sharding)
  compiled_step = None

  def step(state):
    nonlocal compiled_step
    batch = _to_global(batch_sharding, next(train_iter))
    if compiled_step is None:
      with jax.set_mesh(mesh):
        compiled_step = train_step.lower(state, batch).compile()
      report_kernels(config, compiled_step.as_text())
    return compiled_step(state, batch)

  evaluate = make_evaluator(config, parts, mesh, state_sharding.params, "eval", config.data.eval_examples)

  # ----------------------------------------------------------------------------------------------- Loop
  try:
    return _loop(
      config,
      workdir,
      state,
      start_step,
      step,
      lambda params: evaluate(params, prefix="eval_"),
      lambda step, state: checkpoints_lib.save(checkpoints, step, state),
      checkpoints.wait_until_finished,
    )
  finally:
    checkpoints.wait_until_finished()
    checkpoints_lib.record_sizes(checkpoints)
    checkpoints.close()


def build_train_step(
  config: ml_collections.ConfigDict,
  mesh: jax.sharding.Mesh,
  parts: trainer.Parts,
  tx,
  schedule,
  dropout_key: jax.Array,
  state_sharding,
):
  """The jitted training step as a run compiles it: (state, batch) → (state, metrics), the state laid out as
  state_sharding (and donated), the batch split over the mesh, the metrics replicated. Lower it under
  `jax.set_mesh(mesh)`: mixers that run per-device kernels (splash attention) split their work by that mesh."""
  return jax.jit(
    trainer.make_train_step(parts.model, parts.objective, tx, schedule, dropout_key, parts.task.token_unit),
    in_shardings=(state_sharding, sharding.batch(mesh)),
    out_shardings=(state_sharding, sharding.replicated(mesh)),
    donate_argnums=0,
    compiler_options=sharding.step_compiler_options(config.data.batch_size, mesh),
  )


def expected_kernels(config: ml_collections.ConfigDict, platform: str) -> dict[str, str | None]:
  """{mixer: the kernel (a name in efftx.platform.KERNELS) its training step should call on `platform`, or None
  for XLA's own code}, for each mixer of the model that declares one (MixerSpec.kernel)."""
  m = config.model
  options = {
    name: {**MIXERS[name].defaults(), **section} for name, section in patterns.sections(m.mixer, config.mixer).items()
  }
  dropout = any(options[name].get("attention_dropout", 0) > 0 for name in options)
  return {
    name: MIXERS[name].kernel(options[name], m.max_len, jnp.dtype(m.dtype), platform, dropout)
    for name in options
    if MIXERS[name].kernel
  }


def report_kernels(config: ml_collections.ConfigDict, program_text: str, platform: str | None = None) -> list[str]:
  """Logs which kernels beyond XLA's own code the compiled step calls (efftx.platform.KERNELS), and warns for each
  mixer of the model whose expected kernel on `platform` (default: this backend) is missing, e.g. attention in
  bfloat16 on a GPU whose cuDNN refused the shape and fell back to XLA's attention. Returns the warnings."""
  platform = platform or jax.default_backend()
  found = platform_lib.kernels(program_text)
  expected = expected_kernels(config, platform)
  paths = ", ".join(f"{name} → {kernel or 'XLA'}" for name, kernel in expected.items())
  logging.info(
    "compiled train step (%s): kernels %s%s",
    platform,
    ", ".join(f"{k} ×{n}" for k, n in found.items()) or "none beyond XLA's",
    f"; expected {paths}" if paths else "",
  )
  warnings = [
    f"{name}: expected {kernel} on {platform}, but the compiled step does not call it (XLA's code runs instead)"
    for name, kernel in expected.items()
    if kernel and kernel not in found
  ]
  for warning in warnings:
    logging.warning("%s", warning)
  return warnings


def _to_global(batch_sharding: NamedSharding, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
  """This process's rows of a batch → global arrays sharded over the data axis."""
  return {k: jax.make_array_from_process_local_data(batch_sharding, v) for k, v in local_batch.items()}


def make_evaluator(
  config: ml_collections.ConfigDict,
  parts: trainer.Parts,
  mesh: jax.sharding.Mesh,
  params_sharding,
  split: str,
  examples: int = 0,
):
  """params (laid out as params_sharding on mesh) → the objective's metrics over `split` ("eval": the task's
  evaluation split, or a TFDS split name; its first `examples` examples if > 0, else all of it), each process
  reading its shard. Used by training (examples = config.data.eval_examples) and efftx.evaluate (all)."""
  source = pipeline.source(config, split)
  batch_sharding = sharding.batch(mesh)
  eval_step = jax.jit(
    trainer.make_eval_step(parts.model, parts.objective),
    in_shardings=(params_sharding, batch_sharding),
    out_shardings=sharding.replicated(mesh),
    compiler_options=sharding.step_compiler_options(config.data.batch_size, mesh),
  )

  def evaluate(params, prefix: str) -> dict[str, float]:
    totals = None
    for batch in pipeline.eval_batches(config, source, examples=examples):
      with jax.set_mesh(mesh):  # traced here on the first batch (see build_train_step)
        sums = eval_step(params, _to_global(batch_sharding, batch))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    metrics = parts.objective.summarize(totals, parts.task.token_unit, prefix=prefix)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}

  return evaluate


def _set_up_workdir(
  config: ml_collections.ConfigDict,
  parts: trainer.Parts,
  workdir: epath.Path,
  resuming: bool,
  resume_changes: Sequence[str],
) -> dict[str, list]:
  """Process 0 checks the workdir (on resume: the changes from the run's config, refused unless free or allowed by
  resume_changes), prepares the data, encodes a few examples of each split (so that a setting that cannot work
  fails before anything is written in workdir), then writes config.json for a run that starts. Returns the changes
  to record ({} on the other processes)."""
  if config.init_from and not resuming and not run_files.run_folder(config.init_from).exists():
    raise UserError(f"config.init_from='{config.init_from}': no such workdir or checkpoint")

  def set_up() -> dict[str, list]:
    changes = checkpoints_lib.check_resume(config, workdir, resume_changes) if resuming else {}
    if resuming:
      metrics_lib.read_rows(workdir)  # a line that is not a row stops the run here, before anything is written
    pipeline.prepare(config)
    pipeline.check(config, pipeline.source(config, "train"), pipeline.source(config, "eval"))
    if config.init_from and not resuming:  # the encoder must load before anything is written
      abstract_params = jax.eval_shape(lambda: trainer.init_params(parts.model, jax.random.key(0)))
      init_from.load_encoder(
        abstract_params, config.init_from, parts.objective.fresh_params, parts.objective.optional_params, config
      )
    checkpoints_lib.write_config(config, workdir, resuming)
    return changes

  return _on_process_0(set_up, "set-up") or {}


def _on_process_0(do: Callable[[], Any], what: str) -> Any:
  """do() on process 0 alone (its result there, None elsewhere); if it raises UserError, every process stops with
  it (the others with a line pointing to process 0's log) instead of waiting forever at the next collective."""
  error = result = None
  if jax.process_index() == 0:
    try:
      result = do()
    except UserError as e:
      error = e
  if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(error is not None)) and not error:
    error = UserError(f"process 0 failed during {what} (see its log)")
  if error:
    raise error
  return result


def _restore_or_init(
  config, checkpoints, parts: trainer.Parts, tx, init_key, abstract_state, state_sharding
) -> tuple[trainer.TrainState, int]:
  """(state, step): the latest readable checkpoint's (laid out on this run's mesh, whatever mesh wrote it), else a
  new state — with another run's encoder if config.init_from names one (fine-tuning: new head, fresh optimizer)."""
  if checkpoints.all_steps():
    target = jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), abstract_state, state_sharding
    )
    return checkpoints_lib.restore_latest_readable(checkpoints, target)
  state = jax.jit(lambda: trainer.create_state(parts.model, tx, init_key), out_shardings=state_sharding)()
  if config.init_from:
    params = init_from.load_encoder(
      jax.device_get(state.params),
      config.init_from,
      parts.objective.fresh_params,
      parts.objective.optional_params,
      config,
    )
    state = jax.jit(lambda p: trainer.create_state(parts.model, tx, params=p), out_shardings=state_sharding)(params)
  return state, 0


class Diverged(UserError):
  """A non-finite loss, gradient norm or parameter: the run stops without saving (its last checkpoint is good)."""


def _loop(config, workdir, state, start_step, train_step, evaluate, save, save_wait=lambda: None) -> dict[str, float]:
  """Steps to config.total_steps: log every log_every, evaluate every eval_every, save every checkpoint_every
  (and at the end, and when a signal asks to stop). Returns the last metrics with "step".

  The host waits for the device only at those boundaries: there the window's losses and gradient norms are checked
  (a non-finite one stops the run — Diverged — and nothing non-finite is ever saved), and, on several processes,
  a stop signal is agreed (so a signal stops every process at the same boundary, at most log_every steps on).
  """
  is_chief = jax.process_index() == 0
  writer = metrics_lib.MetricWriter(workdir, start_step) if is_chief else None
  throughput = metrics_lib.Throughput(config.data.batch_size * config.model.max_len)
  stop = _StopOnSignal()
  last: dict[str, float] = {}
  bar = tqdm.tqdm(
    total=config.total_steps,
    initial=start_step,
    desc="train",
    unit="step",
    dynamic_ncols=True,
    disable=None if is_chief else True,
  )  # None: shown on a terminal only
  # On a terminal, lines go above the progress bar; elsewhere to the log.
  report = (lambda line: bar.write(line, file=sys.stderr)) if not bar.disable else logging.info
  leaf_names = [
    "/".join(str(getattr(k, "key", k)) for k in path)
    for path, _ in jax.tree_util.tree_flatten_with_path(state.params)[0]
  ]
  all_finite = jax.jit(lambda tree: jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)])))

  def log(step: int, row: dict[str, float]) -> None:
    last.update(row)
    if writer:
      writer.write(step, row)
    report(f"step {step}: {metrics_lib.fmt(row)}")

  if start_step >= config.total_steps:
    logging.info("%s is already trained to step %d (config.total_steps=%d)", workdir, start_step, config.total_steps)
  stopped_early, written = _stopped_early(config, workdir, start_step)
  if stopped_early is not None:
    logging.info("%s stopped early at step %d (%s > %g)", workdir, start_step, config.stop_metric, config.stop_above)
    if not written:  # killed after its checkpoint, before the row: the row now
      log(start_step, stopped_early)
    last.update(stopped_early)
  step, last_saved = start_step, start_step or None
  try:
    while step < config.total_steps and stopped_early is None:
      state, metrics = train_step(state)
      step += 1
      bar.update()
      throughput.add(metrics)
      done = step == config.total_steps
      log_now, eval_now = step % config.log_every == 0 or done, step % config.eval_every == 0 or done
      save_now = step % config.checkpoint_every == 0 or done
      if not (log_now or eval_now or save_now or (stop.requested and jax.process_count() == 1)):
        continue  # keep dispatching: nothing below is needed before the next boundary
      diverged = _first_nonfinite(throughput.window(), step, leaf_names)
      stopping = stop.requested
      if jax.process_count() > 1:  # every process must stop at the same step, or the others hang
        stopping = bool(multihost_utils.process_allgather(np.int32(stopping)).max())
      if log_now or diverged:
        row = throughput.row()
        if not diverged:
          bar.set_postfix(loss=f"{row['loss']:.3f}", acc=f"{row['accuracy']:.3f}")
        log(step, row)
      if diverged:
        raise Diverged(f"{diverged}; nothing after it was saved. {_advice(last_saved)}")
      if eval_now:
        eval_start = time.perf_counter()
        row = evaluate(state.params)
        log(step, row)
        throughput.pause(time.perf_counter() - eval_start)  # keep eval time out of the train throughput
        if config.stop_metric:
          if config.stop_metric not in row:
            raise UserError(
              f"config.stop_metric='{config.stop_metric}' is not an evaluation metric of this run; "
              f"its metrics: {', '.join(sorted(row))}"
            )
          if row[config.stop_metric] > config.stop_above:
            stopped_early = {metrics_file.STOPPED_EARLY: row[config.stop_metric]}
            save_now = True
      if save_now or stopping:
        if not all_finite(state):  # an update can overflow where the loss and gradients were finite
          raise Diverged(
            f"non-finite parameters or optimizer state after step {step}; not saved. " + _advice(last_saved)
          )
        save(step, state)
        last_saved = step
      if stopped_early is not None:
        save_wait()  # the checkpoint complete before the row that says the run is finished
        log(step, stopped_early)
        report(f"step {step}: {config.stop_metric} above {config.stop_above:g}: stopped early")
      if stopping:
        logging.warning("stopped by signal at step %d (checkpoint saved); re-run the same command to resume", step)
        break
  finally:
    bar.close()
    stop.restore()
    if writer:
      writer.close()
  return {**last, "step": int(step)}


def _stopped_early(config, workdir, start_step: int) -> tuple[dict | None, bool]:
  """({"stopped_early": value}, whether metrics.jsonl says so already) where the run resumes at a step whose
  evaluation had stop_metric above stop_above (a run killed between that evaluation and its row still stops
  there); (None, False) otherwise, or without stop_metric."""
  if not config.stop_metric or not start_step:
    return None, False
  value, written = None, False
  if jax.process_index() == 0:
    rows = [r for r in metrics_file.rows(workdir) if r["step"] == start_step]
    value = next((r[config.stop_metric] for r in rows if config.stop_metric in r), None)
    written = any(metrics_file.STOPPED_EARLY in r for r in rows)
  stopped = value is not None and value > config.stop_above
  if jax.process_count() > 1:  # every process must agree, or the others train on alone
    stopped = bool(multihost_utils.broadcast_one_to_all(np.int32(stopped)))
  return ({metrics_file.STOPPED_EARLY: value if value is not None else 0.0}, written) if stopped else (None, False)


def _first_nonfinite(window: dict[str, np.ndarray], step: int, leaf_names: list[str]) -> str | None:
  """What went wrong at the first step of the window (its last step is `step`) whose loss or gradient norm
  is not finite, naming the first parameter whose gradient is; None if all are finite."""
  bad_B = ~(np.isfinite(window["loss"]) & np.isfinite(window["grad_norm"]))
  if not bad_B.any():
    return None
  i = int(np.argmax(bad_B))
  at = step - len(bad_B) + 1 + i
  leaf = int(window["nonfinite_grad_leaf"][i])
  where = f"; first non-finite gradient: {leaf_names[leaf]}" if leaf >= 0 else ""
  return f"diverged at step {at}: loss={window['loss'][i]:.4g}, grad_norm={window['grad_norm'][i]:.4g}{where}"


def _advice(last_good: int | None) -> str:
  if last_good is None:
    return "No checkpoint was saved: lower config.optim.learning_rate or set config.optim.grad_clip and start again"
  return (
    f"The last checkpoint (step {last_good}) is good: lower config.optim.learning_rate or set "
    "config.optim.grad_clip, and re-run to continue from it"
  )


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


def _parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with one clear line instead of a traceback for a bad config or override."""
  try:
    rest = flags.FLAGS(argv)
    if _CONFIG.value is None:  # no --config, and no default config file to fall back on
      cli.exit_with("efftx.train", cli.NO_DEFAULT_CONFIG)
    _CONFIG.value.model  # noqa: B018  (a config file that failed to load raises here)
    return rest
  except Exception as e:  # pylint: disable=broad-except  # flags.Error, or whatever the config file raised
    message = cli.explain_flag_error(argv, e)
    if message is None:  # a bug in code the config file calls: its traceback
      raise
    cli.exit_with("efftx.train", message)


def main(argv: list[str]) -> None:
  cli.start_program("efftx.train", argv, _WORKDIR.value, "where checkpoints and metrics go")
  # A bad config, a workdir holding another run, a bad corpus, divergence: one clear line; bugs keep their traceback.
  with cli.one_line_errors("efftx.train"):
    distributed.initialize_from_flags()
    sharding.use_cpu_cores(_CONFIG.value.data.batch_size)  # on a CPU: one device per core
    result = train_and_evaluate(_CONFIG.value, _WORKDIR.value, _RESUME_CHANGES.value)
  if jax.process_index() == 0:
    print(final_line(result, _CONFIG.value.total_steps))
    print(f"outputs in {run_files.run_folder(_WORKDIR.value)}")


def final_line(result: dict, total_steps: int) -> str:
  """What train prints last: the step and its metrics; or, where none were logged, whether the run was already
  trained or was stopped (a signal during compilation) before its first logged step."""
  row = {k: v for k, v in result.items() if k != "step"}
  if row:
    return f"step {result['step']}: {metrics_lib.fmt(row)}"
  if result["step"] >= total_steps:
    return f"step {result['step']}: nothing to do (already trained to config.total_steps={total_steps})"
  return f"step {result['step']}: stopped before its first logged step; re-run the same command to resume"


if __name__ == "__main__":
  try:  # ml_collections loads the default config and applies --config.* overrides while defining the flag
    _define_flags()
  except Exception as e:  # pylint: disable=broad-except  # whatever the default config file raised
    message = cli.explain_flag_error(sys.argv, e)
    if message is None:  # a bug in code the config file calls: its traceback
      raise
    cli.exit_with("efftx.train", message)
  app.run(main, flags_parser=_parse_flags)

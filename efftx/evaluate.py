"""Evaluate a checkpoint of a training run on a whole split, without training.

    python -m efftx.evaluate --workdir=/tmp/efftx/quickstart [--checkpoint=STEP] [--split=validation|test]

Reads workdir/config.json and the checkpoint's parameters (default: the latest), runs the task's metrics over
every example of the split — `validation` is the split training evaluates on, `test` the task's held-out split
that papers report (ListOps test, Fashion-MNIST test, CIFAR-10 test, ...) — writes
workdir/eval_<split>_<step>.json and prints one line. Runs on any number of devices and processes (the
multi-process flags are efftx.train's), also while the run is still training.
"""

from __future__ import annotations

import json
import sys

from absl import app
from absl import flags
import jax

from efftx import checkpoints
from efftx import cli
from efftx import config as config_lib
from efftx import distributed
from efftx import metrics as metrics_lib
from efftx import run_files
from efftx import sharding
from efftx import train
from efftx import trainer
from efftx.data import pipeline
from efftx.errors import UserError

SPLITS = ("validation", "test")


def _define_flags() -> None:
  """Command-line flags, defined only when run as a program (so that this module imports cleanly)."""
  global _WORKDIR, _CHECKPOINT, _SPLIT
  _WORKDIR = flags.DEFINE_string("workdir", None, "A training run's --workdir.")
  _CHECKPOINT = flags.DEFINE_integer("checkpoint", None, "The checkpoint's step (default: the latest).")
  _SPLIT = flags.DEFINE_string("split", "validation", "validation (the split training evaluates on) or test.")
  distributed.define_flags()


def evaluate(workdir: str, step: int | None = None, split: str = "validation") -> tuple[dict[str, float], int]:
  """(metrics, step): the task's metrics of the checkpoint at `step` (default: the latest) over all of `split`;
  process 0 writes them to workdir/eval_<split>_<step>.json with the split's name and size."""
  if split not in SPLITS:
    raise UserError(f"--split={split}: choose from {', '.join(SPLITS)}")
  workdir = run_files.run_folder(workdir)
  if not (workdir / "config.json").exists():
    raise UserError(f"{workdir} is not a training run's workdir (no config.json)")
  config = checkpoints.read_config(workdir)
  parts = trainer.parts(config)
  tfds_split = parts.task.split_names(config.data.variant)[1] if split == "validation" else parts.task.test_split
  if tfds_split is None:
    raise UserError(f"task '{config.data.task}' has no labelled test split: use --split=validation")
  # Any batch that splits over this machine's devices will do: padding rows carry weight 0.
  config.data.batch_size = -(-config.data.batch_size // jax.device_count()) * jax.device_count()
  if jax.device_count() % config.mesh.fsdp:
    config.mesh.fsdp = 1  # trained on another machine: any layout will do here
  config_lib.validate(config, jax.device_count())

  mesh = sharding.make_mesh(config.mesh.fsdp)
  _, params, step = checkpoints.restore_params(workdir, step, mesh)
  params_sharding = jax.tree.map(lambda x: x.sharding, params)
  metrics = train.make_evaluator(config, parts, mesh, params_sharding, tfds_split)(params, prefix="")
  if jax.process_index() == 0:
    record = {
      "step": step,
      "split": split,
      "tfds_split": tfds_split,
      "examples": len(pipeline.source(config, tfds_split)),
      **metrics,
    }
    checkpoints.write_whole(workdir / f"eval_{split}_{step}.json", json.dumps(record, indent=2))
  return metrics, step


def main(argv: list[str]) -> None:
  cli.start_program("efftx.evaluate", argv, _WORKDIR.value, "a training run's")
  with cli.one_line_errors("efftx.evaluate"):
    distributed.initialize_from_flags()
    sharding.use_cpu_cores()  # on a CPU: one device per core (the batch is rounded up to split over them)
    metrics, step = evaluate(_WORKDIR.value, _CHECKPOINT.value, _SPLIT.value)
  if jax.process_index() == 0:
    print(
      f"{_SPLIT.value} at step {step}: {metrics_lib.fmt(metrics)} "
      f"(written to {run_files.run_folder(_WORKDIR.value) / f'eval_{_SPLIT.value}_{step}.json'})"
    )
    sys.stdout.flush()


if __name__ == "__main__":
  _define_flags()
  app.run(main)

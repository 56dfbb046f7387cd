"""Writing a run's metrics: metrics.jsonl and TensorBoard event files, and the train-throughput window."""

from __future__ import annotations

import json
import os
import time

from absl import logging
from etils import epath
import jax
import jax.numpy as jnp
import numpy as np
import tensorboardX

from efftx import checkpoints
from efftx import run_files
from efftx.metrics_file import read_rows

# Per-step values that are not averaged into a logged row: the index of the first parameter whose gradient is not
# finite (-1: none), read when a run diverges.
DIAGNOSTICS = ("nonfinite_grad_leaf",)


class MetricWriter:
  """metrics.jsonl (one JSON object per logged step) and TensorBoard event files, in workdir.

  On resume, rows logged after the restored checkpoint (by a run that stopped before saving) are dropped, so
  every step appears once; so is a half-written last line (kill -9 while writing a row, which comes after the last
  checkpoint). Any other line that is not a row stops the run (UserError naming the line) with the file as it was.
  A local metrics.jsonl is appended to; one on a bucket (which cannot append) is uploaded whole at every row — a
  few kB per thousand steps.
  """

  def __init__(self, workdir: epath.PathLike, start_step: int):
    self._path = epath.Path(workdir) / "metrics.jsonl"
    self._rows = []
    if self._path.exists():
      rows, torn = read_rows(workdir) if start_step else ([], False)
      if torn:
        logging.warning("%s: its last line was half written (a run killed while logging): dropped", self._path)
      self._rows = [line for line in rows if json.loads(line)["step"] <= start_step]
      checkpoints.write_whole(self._path, "".join(self._rows))
    self._jsonl = None if run_files.on_bucket(workdir) else self._path.open("a")
    self._tb = tensorboardX.SummaryWriter(os.fspath(workdir / "tensorboard"), purge_step=start_step + 1)

  def write(self, step: int, row: dict[str, float]) -> None:
    line = json.dumps({"step": step, **row}) + "\n"
    if self._jsonl:
      self._jsonl.write(line)
      self._jsonl.flush()
    else:
      self._rows.append(line)
      self._path.write_text("".join(self._rows))
    for name, value in row.items():
      self._tb.add_scalar(name, value, step)
    self._tb.flush()

  def close(self) -> None:
    if self._jsonl:
      self._jsonl.close()
    self._tb.close()


class Throughput:
  """The train metrics of the steps since the last log row, and their steps/s and tokens/s.

  The first step after (re)start is left out of the timing (it compiles), and so is time spent in evaluation
  (`pause`)."""

  def __init__(self, tokens_per_step: int):
    self._tokens_per_step = tokens_per_step
    self._metrics: list[dict[str, jax.Array]] = []
    self._window: dict[str, np.ndarray] | None = None
    self._start, self._steps, self._first = time.perf_counter(), 0, True

  def add(self, metrics: dict[str, jax.Array]) -> None:
    self._metrics.append(metrics)
    self._window = None
    self._steps += 1
    if self._first:
      jax.block_until_ready(metrics)
      self._start, self._steps, self._first = time.perf_counter(), 0, False

  def pause(self, seconds: float) -> None:
    self._start += seconds

  def window(self) -> dict[str, np.ndarray]:
    """Every metric of the steps since the last row, one entry per step (waits for those steps)."""
    if self._window is None:
      self._window = jax.device_get(jax.tree.map(lambda *x: jnp.stack(x), *self._metrics))
    return self._window

  def row(self) -> dict[str, float]:
    """Means of the window's metrics (diagnostics left out), with steps_per_sec and tokens_per_sec; starts a new
    window."""
    row = {k: float(np.mean(v)) for k, v in self.window().items() if k not in DIAGNOSTICS}
    seconds = time.perf_counter() - self._start
    if self._steps:
      row["steps_per_sec"] = self._steps / seconds
      row["tokens_per_sec"] = self._steps * self._tokens_per_step / seconds
    self._metrics, self._window, self._start, self._steps = [], None, time.perf_counter(), 0
    return row


def fmt(row: dict[str, float]) -> str:
  return ", ".join(f"{k}={v:.4g}" for k, v in row.items())

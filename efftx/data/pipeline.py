"""The input pipeline: TFDS array_record → tfds.data_source → grain → per-process numpy batches.

Each JAX process reads its own shard of every split (`index::process_count`), so on a pod the processes together
cover the data once per epoch without overlap; train.py assembles the global batch from the process-local ones.
"""
from __future__ import annotations

import functools
import os
from typing import Iterator

from absl import logging
import grain
import jax
import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from efftx.data import TASKS


def data_dir(config: ml_collections.ConfigDict) -> str:
  """config.data.data_dir, or ~/tensorflow_datasets (TFDS's default) when unset."""
  return os.path.expanduser(config.data.data_dir or "~/tensorflow_datasets")


def prepare(config: ml_collections.ConfigDict) -> None:
  """Generates and writes the task's dataset as array_record in data_dir, unless it is there already.

  Call it on process 0 only (train.py does, then synchronises): data_dir must be shared storage on several
  hosts (or prepared beforehand with `tfds build`).
  """
  builder = TASKS[config.data.task].builder(config=config.data.variant, data_dir=data_dir(config),
                                            file_format="array_record")
  if not builder.is_prepared():
    logging.info("preparing %s/%s in %s (once; later runs reuse it)", builder.name, config.data.variant,
                 data_dir(config))
  manual_dir = os.path.abspath(os.path.expanduser(config.data.corpus_dir)) if config.data.corpus_dir else None
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  # A dataset prepared from a folder remembers which: the same variant from another folder needs another data_dir.
  marker = os.path.join(builder.data_dir, "efftx_corpus_dir.txt")
  if manual_dir and not os.path.exists(marker):
    with open(marker, "w") as f:
      f.write(manual_dir)
  if manual_dir and open(marker).read() != manual_dir:
    raise ValueError(f"{builder.data_dir} was prepared from {open(marker).read()}, not {manual_dir}: "
                     "set another config.data.data_dir for this corpus")


def source(config: ml_collections.ConfigDict, split: str):
  """The random-access source of one prepared split (see `prepare`)."""
  task = TASKS[config.data.task]
  return tfds.data_source(f"{task.builder.name}/{config.data.variant}", split=split, data_dir=data_dir(config),
                          download=False, try_gcs=False)


def _encode(example: dict, *, task_name: str, max_len: int) -> dict[str, np.ndarray]:
  return TASKS[task_name].encode(example, max_len)


def _local_batch_size(config: ml_collections.ConfigDict) -> int:
  return config.data.batch_size // jax.process_count()


def train_iterator(config: ml_collections.ConfigDict, train_source) -> grain.DatasetIterator:
  """Endless process-local batches, reshuffled every epoch from config.seed; checkpointable (get/set_state)."""
  ds = grain.MapDataset.source(train_source)[jax.process_index()::jax.process_count()]
  ds = ds.seed(config.seed).shuffle().repeat()  # shuffle before repeat: a new order each epoch
  ds = ds.map(functools.partial(_encode, task_name=config.data.task, max_len=config.model.max_len))
  ds = ds.batch(_local_batch_size(config), drop_remainder=True)
  it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=config.data.read_threads, prefetch_buffer_size=8))
  if config.data.worker_count:
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=config.data.worker_count))
  return iter(it_ds)


def eval_batches(config: ml_collections.ConfigDict, eval_source) -> Iterator[dict[str, np.ndarray]]:
  """One pass over a split in process-local batches of fixed size; rows with `weight` 0 are padding.

  Every process yields the same number of batches (padding whole batches if its shard is shorter), so the
  sharded eval step runs in lockstep on all processes.
  """
  local_batch = _local_batch_size(config)
  shard = grain.MapDataset.source(eval_source)[jax.process_index()::jax.process_count()]
  shard = shard.map(functools.partial(_encode, task_name=config.data.task, max_len=config.model.max_len))
  largest_shard = -(-len(eval_source) // jax.process_count())
  num_batches = -(-largest_shard // local_batch)
  # Shapes from the split's first example: a process's shard may be empty when the split has fewer examples.
  template = {k: np.asarray(v) for k, v in _encode(eval_source[0], task_name=config.data.task,
                                                   max_len=config.model.max_len).items()}
  for b in range(num_batches):
    rows = [shard[i] for i in range(b * local_batch, min((b + 1) * local_batch, len(shard)))]
    batch = {k: np.zeros((local_batch,) + template[k].shape, template[k].dtype) for k in template}
    for i, row in enumerate(rows):
      for k in batch:
        batch[k][i] = row[k]
    batch["weight"] = (np.arange(local_batch) < len(rows)).astype(np.float32)
    yield batch

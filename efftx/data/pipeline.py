"""The input pipeline: TFDS array_record → tfds.data_source → grain → per-process numpy batches.

Each JAX process reads its own rows of every global batch (training) or its own shard of a split (evaluation), so
on a pod the processes together cover the data once per epoch without overlap, and the global batches are the same
for any number of processes; train.py assembles them from the process-local ones.
"""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
import dataclasses
import fcntl
import os
import queue
import socket
import sys
import threading
import time
import urllib.parse
import urllib.request

from absl import logging
import grain
import jax
import ml_collections
import numpy as np
import tensorflow_datasets as tfds
import tqdm

from efftx import objectives
from efftx.data import TASKS
from efftx.data import resolve
from efftx.data import task_of
from efftx.errors import UserError


def data_dir(config: ml_collections.ConfigDict) -> str:
  """config.data.data_dir, or ~/tensorflow_datasets (TFDS's default) when unset."""
  return os.path.expanduser(config.data.data_dir or "~/tensorflow_datasets")


def prepare(config: ml_collections.ConfigDict) -> None:
  """`_prepare` under an exclusive lock on data_dir (data_dir/.efftx_prepare.lock, flock): runs started together
  on one data_dir (a sweep's points) prepare a dataset once; the others wait, then find it prepared. When
  preparing fails (a missing corpus folder, no network), the lock file and data_dir are removed again if this call
  created them."""
  folder = data_dir(config)
  path = os.path.join(folder, ".efftx_prepare.lock")
  created = [p for p in (folder, path) if not os.path.exists(p)]
  try:
    os.makedirs(folder, exist_ok=True)
    lock = open(path, "a")
  except OSError:  # a data_dir this run cannot write: only reading a prepared dataset can work (_prepare says)
    _prepare(config)
    return
  try:
    with lock:
      fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the holder dies
      _prepare(config)
  except BaseException:
    with contextlib.suppress(OSError):  # a data_dir that now holds something else stays
      if path in created:
        os.remove(path)
      if folder in created:
        os.rmdir(folder)
    raise


def _prepare(config: ml_collections.ConfigDict) -> None:
  """Makes the task's dataset ready as array_record in data_dir, unless it is there already.

  Local builders generate or read their data (a folder of files: config.data.corpus_dir); registered TFDS
  datasets are downloaded and prepared by TFDS, which needs the network (or a data_dir where
  `tfds build <name> --file_format=array_record` ran): when none of the dataset's download hosts answers within
  PROBE_S, it stops at once with the command that prepares it (TFDS's own retries would take minutes to fail).
  Call it on process 0 only (train.py does, then synchronises): data_dir must be shared storage on several hosts.
  TFDS's progress bars show on a terminal only, as efftx's own do.
  """
  if not sys.stderr.isatty():
    tfds.disable_progress_bar()
  task = TASKS[config.data.task]
  name = task.tfds_name(config.data.variant)
  if not task.local:
    builder = tfds.builder(name, data_dir=data_dir(config), file_format="array_record")
    if builder.is_prepared():
      return
    build = f"tfds build {name} --file_format=array_record --data_dir={data_dir(config)}"
    mocked = _download_is_mocked(builder)
    # A dataset TFDS cannot download (ImageNet) is built from files a user puts in its manual_dir; its URLs are
    # never fetched, so they are not probed either.
    instructions = " ".join((builder.MANUAL_DOWNLOAD_INSTRUCTIONS or "").split())
    manual_dir = os.path.join(data_dir(config), "downloads", "manual")
    if instructions and not mocked and not (os.path.isdir(manual_dir) and os.listdir(manual_dir)):
      raise UserError(
        f"{name} is not prepared in {data_dir(config)}, and TFDS cannot download it: put its files in "
        f"{manual_dir} ({instructions}), then run again, or prepare it with: {build}"
      )
    targets = [] if instructions else _download_targets(builder)
    if targets and not mocked and not _reachable(targets, PROBE_S):
      hosts = ("host " if len(targets) == 1 else "hosts ") + ", ".join(f"{host}:{port}" for host, port in targets)
      raise UserError(
        f"{name} is not prepared in {data_dir(config)}, and its download {hosts} cannot be "
        f"reached from this machine; where the network reaches, efftx downloads and prepares it "
        f"itself, or prepare it there with: {build}"
      )
    logging.info("preparing %s in %s with TFDS (downloads; once)", name, data_dir(config))
    try:
      builder.download_and_prepare()
    except Exception as e:  # pylint: disable=broad-except  # no network, no TensorFlow for its generator, ...
      first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise UserError(
        f"TFDS could not prepare {name} ({type(e).__name__}: {first_line}); on a machine that can "
        f"download it, run: {build}"
      ) from None
    return
  builder = task.dataset(config=config.data.variant, data_dir=data_dir(config), file_format="array_record")
  folder = config.data.corpus_dir or getattr(task.dataset, "DEFAULT_MANUAL_DIR", "")
  manual_dir = os.path.abspath(os.path.expanduser(folder)) if folder else None
  if manual_dir and not builder.is_prepared() and not (os.path.isdir(manual_dir) and os.listdir(manual_dir)):
    raise UserError(
      f"{name}: the folder {manual_dir} is missing or empty; "
      f"{getattr(task.dataset, 'MANUAL_DOWNLOAD_INSTRUCTIONS', 'set config.data.corpus_dir')}"
    )
  if not builder.is_prepared():
    logging.info("preparing %s in %s (once; later runs reuse it)", name, data_dir(config))
  try:
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  except UserError:
    raise
  except (OSError, UnicodeError) as e:  # an unreadable folder or file; anything else is a bug: its traceback stays
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise UserError(
      f"preparing {name} from {manual_dir or 'generated data'} failed: {type(e).__name__}: {first_line}"
    ) from e
  # A dataset prepared from a folder remembers which: the same variant from another folder needs another data_dir.
  marker = os.path.join(builder.data_dir, "efftx_corpus_dir.txt")
  if manual_dir and not os.path.exists(marker):
    with open(marker, "w") as f:
      f.write(manual_dir)
  if manual_dir and open(marker).read() != manual_dir:
    raise UserError(
      f"{builder.data_dir} was prepared from {open(marker).read()}, not {manual_dir}: "
      "set another config.data.data_dir for this corpus"
    )


PROBE_S = 3.0  # seconds a registered dataset's download host has to accept a TCP connection (name lookup included)
_DEFAULT_PORTS = {"http": 80, "https": 443, "ftp": 21}


def _download_targets(builder: tfds.core.DatasetBuilder) -> list[tuple[str, int]]:
  """The (host, port) pairs TFDS's download of builder's dataset connects to first: the hosts of the URLs in its
  checksums file (every builder config's), or the proxy the environment sets for a URL (TFDS downloads with
  requests, which reads the same variables). Empty when TFDS lists no URLs for the dataset. The checksums file
  covers all of a dataset's configs (GLUE's eight tasks), so where one of their hosts answers and this config's does
  not, the probe passes and TFDS's own retries decide, as without it."""
  proxies = urllib.request.getproxies()
  targets = set()
  for url in builder.url_infos or ():
    try:
      parts = urllib.parse.urlsplit(url)
      proxy = (
        None if urllib.request.proxy_bypass(parts.hostname or "") else (proxies.get(parts.scheme) or proxies.get("all"))
      )
      if proxy:
        parts = urllib.parse.urlsplit(proxy if "://" in proxy else f"http://{proxy}")
      if parts.hostname:
        targets.add((parts.hostname, parts.port or _DEFAULT_PORTS.get(parts.scheme, 80)))
    except ValueError:  # a malformed URL or port: TFDS will say so itself
      continue
  return sorted(targets)


def _download_is_mocked(builder: tfds.core.DatasetBuilder) -> bool:
  """Whether tfds.testing.mock_data is active: it makes download_and_prepare a no-op (and reads random examples),
  so nothing is downloaded and the network does not matter."""
  return getattr(type(builder).download_and_prepare, "__module__", "").startswith("tensorflow_datasets.testing")


def _reachable(targets: list[tuple[str, int]], timeout_s: float) -> bool:
  """Whether a TCP connection to any of targets opens within timeout_s in all. Each try runs in a daemon thread,
  so a name lookup that hangs (an unreachable DNS server ignores socket timeouts) is abandoned, not waited for."""
  results: queue.SimpleQueue[bool] = queue.SimpleQueue()

  def connect(host: str, port: int) -> None:
    try:
      socket.create_connection((host, port), timeout=timeout_s).close()
      results.put(True)
    except (OSError, UnicodeError, ValueError):  # refused, timed out, no such host, no route, a bad name
      results.put(False)

  for host, port in targets:
    threading.Thread(target=connect, args=(host, port), daemon=True, name=f"efftx-probe-{host}").start()
  deadline = time.monotonic() + timeout_s
  for _ in targets:
    try:
      if results.get(timeout=max(0.0, deadline - time.monotonic())):
        return True
    except queue.Empty:
      return False
  return False


def source(config: ml_collections.ConfigDict, split: str):
  """The random-access source of one prepared split (see `prepare`): "train" and "eval" are the task's training
  and evaluation splits; any other name is a TFDS split of the dataset ("test", "train[:10%]", ...)."""
  task = TASKS[config.data.task]
  train_split, eval_split = task.split_names(config.data.variant)
  split = {"train": train_split, "eval": eval_split}.get(split, split)
  name = task.tfds_name(config.data.variant)
  try:
    src = tfds.data_source(name, split=split, data_dir=data_dir(config), download=False, try_gcs=False)
  except Exception as e:  # pylint: disable=broad-except  # e.g. prepared as tfrecord: no random access
    first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise UserError(
      f"cannot read {name} split '{split}' from {data_dir(config)} ({type(e).__name__}: "
      f"{first_line}); it must be prepared as array_record: tfds build {name} "
      f"--file_format=array_record --data_dir={data_dir(config)}"
    ) from None
  return in_memory(config, src, f"{name} {split}") if config.data.get("in_memory") else src


class InMemory:
  """A split read once and encoded (Encode), held in memory: random access without a file read and a decode per
  example. Its elements are what `_encoded`'s Encode step would make of the source's."""

  encoded = True

  def __init__(self, examples: list[dict[str, np.ndarray]]):
    self._examples = examples

  def __len__(self) -> int:
    return len(self._examples)

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return self._examples[index]


_IN_MEMORY: dict[tuple, InMemory] = {}  # one copy per process of each split and encoding


def in_memory(config: ml_collections.ConfigDict, src, what: str) -> InMemory:
  """src read in chunks (the data source's batched read) and encoded, once per process and encoding."""
  encode = _encode_step(config)
  key = (data_dir(config), what, encode)
  if key not in _IN_MEMORY:
    examples, chunk = [], 4096
    for start in tqdm.trange(0, len(src), chunk, desc=f"reading {what} into memory", disable=None, leave=False):
      examples += [encode(x) for x in src.__getitems__(list(range(start, min(start + chunk, len(src)))))]
    _IN_MEMORY[key] = InMemory(examples)
  return _IN_MEMORY[key]


@dataclasses.dataclass(frozen=True)
class Encode:
  """A raw TFDS example → the model's fixed-length arrays (efftx.data.sequence), with its token ids checked."""

  task_name: str
  max_len: int
  truncate: bool
  variant: str = ""  # needed where the task's vocabulary depends on its variant (MQAR)
  tokenizer: str = ""  # config.data.tokenizer: a checkpoint's tokenizer encodes the text (efftx.data.resolve)
  vocab_size: int = 0  # config.data.vocab_size

  def __call__(self, example: dict) -> dict[str, np.ndarray]:
    task = resolve(self.task_name, self.tokenizer, self.vocab_size)
    out = task.encode(example, self.max_len, self.truncate)
    vocab_size = task.vocab(self.variant)
    for key in ("tokens", "targets"):
      if key in out and len(out[key]) and (out[key].max() >= vocab_size or out[key].min() < 0):
        bad = out[key][(out[key] >= vocab_size) | (out[key] < 0)][0]
        raise UserError(
          f"task '{self.task_name}': an example has token id {bad} in its {key}, outside the "
          f"vocabulary [0, {vocab_size})"
        )
    return out


def _encode_step(config: ml_collections.ConfigDict) -> Encode:
  return Encode(
    config.data.task,
    config.model.max_len,
    config.data.truncate,
    config.data.variant,
    config.data.tokenizer,
    config.data.vocab_size,
  )


def _encoded(config: ml_collections.ConfigDict, ds: grain.MapDataset, encoded: bool = False) -> grain.MapDataset:
  """Encodes the elements of ds (unless `encoded`: an InMemory source's are), then lets the objective corrupt them
  (masked-LM does), seeded from config.seed and the element's index in ds."""
  task = task_of(config)
  if not encoded:
    ds = ds.map(_encode_step(config))
  seed = int(np.random.SeedSequence([config.seed, 0]).generate_state(1)[0])
  return objectives.for_run(config, task).corrupt(ds, task, seed)


def check(config: ml_collections.ConfigDict, *sources, num_examples: int = 10_000) -> None:
  """Encodes the first num_examples of each source, so that an example too long for max_len or a token outside the
  vocabulary there stops the run before it writes anything."""
  for src in sources:
    if not len(src):
      raise UserError(f"task '{config.data.task}' ({config.data.variant}): a split is empty")
    ds = _encoded(config, grain.MapDataset.source(src), getattr(src, "encoded", False))
    for i in tqdm.trange(min(num_examples, len(src)), desc="checking examples", unit="ex", disable=None, leave=False):
      ds[i]  # pylint: disable=pointless-statement


def _process(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  return (
    jax.process_index() if process_index is None else process_index,
    jax.process_count() if process_count is None else process_count,
  )


def train_iterator(
  config: ml_collections.ConfigDict,
  train_source,
  start_step: int = 0,
  process_index: int | None = None,
  process_count: int | None = None,
) -> grain.DatasetIterator:
  """Endless process-local batches from training step `start_step` on, reshuffled every epoch from config.seed.

  The global batches do not depend on how many processes read them: global batch k is the examples
  k·B … (k+1)·B − 1 of one seeded, endlessly reshuffled stream (B = config.data.batch_size), and process p of n
  reads its rows p·B/n … (p+1)·B/n − 1. So the data position is the step: a run resumes from a checkpoint's step
  alone, on any number of processes and devices, with exactly the batches an uninterrupted run would have seen.
  """
  index, count = _process(process_index, process_count)
  ds = grain.MapDataset.source(train_source).seed(config.seed).shuffle().repeat()  # a new order each epoch
  # (masked-LM corruption is seeded by the element's place in the stream)
  ds = _encoded(config, ds, getattr(train_source, "encoded", False))
  # Local batches of B/n consecutive examples; global batch k is local batches k·n … k·n + n − 1.
  local = ds.batch(config.data.batch_size // count, drop_remainder=True)[index::count][start_step:]
  it_ds = local.to_iter_dataset(grain.ReadOptions(num_threads=config.data.read_threads, prefetch_buffer_size=8))
  if config.data.worker_count:
    it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=config.data.worker_count))
  return iter(it_ds)


def eval_batches(
  config: ml_collections.ConfigDict,
  eval_source,
  process_index: int | None = None,
  process_count: int | None = None,
  examples: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
  """One pass over a split (its first `examples` examples if > 0) in process-local batches of fixed size; rows
  with `weight` 0 are padding.

  Every process yields the same number of batches (padding whole batches if its shard is shorter), so the
  sharded eval step runs in lockstep on all processes. Masked-LM corruption is the same on every pass.
  """
  index, count = _process(process_index, process_count)
  local_batch = config.data.batch_size // count
  # Sharded after encoding: masked-LM corruption is seeded by the global index, the same for any process count.
  encoded = _encoded(config, grain.MapDataset.source(eval_source), getattr(eval_source, "encoded", False))
  if examples:
    encoded = encoded[:examples]
  shard = encoded[index::count]
  largest_shard = -(-len(encoded) // count)
  num_batches = -(-largest_shard // local_batch)
  # Shapes from the split's first example: a process's shard may be empty when the split has fewer examples.
  template = {k: np.asarray(v) for k, v in encoded[0].items()}
  for b in range(num_batches):
    rows = [shard[i] for i in range(b * local_batch, min((b + 1) * local_batch, len(shard)))]
    batch = {k: np.zeros((local_batch,) + template[k].shape, template[k].dtype) for k in template}
    for i, row in enumerate(rows):
      for k in batch:
        batch[k][i] = row[k]
    batch["weight"] = (np.arange(local_batch) < len(rows)).astype(np.float32)
    yield batch

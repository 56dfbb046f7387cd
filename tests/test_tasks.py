"""The tasks and the pipeline: generators against independent checkers, splits, determinism, sharding over
processes, iterator state, images from idx files, masked-LM corruption, registered TFDS tasks (mocked)."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import REPO
from conftest import compiled
from conftest import write_idx
from efftx import config as config_lib
from efftx import train
from efftx import trainer
from efftx.data import TASKS
from efftx.data import images
from efftx.data import mqar
from efftx.data import pipeline
from efftx.objectives import OBJECTIVES
from efftx.objectives import mlm


# ------------------------------------------------------------------------------------------------------ MQAR
@pytest.mark.parametrize("seq_len,num_kv,vocab", [(64, 4, 8192), (128, 8, 8192), (256, 16, 8192), (64, 4, 256)])
def test_mqar_every_query_is_answered_by_its_keys_value(seq_len, num_kv, vocab):
  tokens, targets = mqar.generate(300, seq_len=seq_len, num_kv=num_kv, seed=1, vocab_size=vocab)
  assert tokens.shape == targets.shape == (300, seq_len)
  first_offsets = []
  for row_tokens, row_targets in zip(tokens, targets):
    keys, values = row_tokens[0 : 2 * num_kv : 2], row_tokens[1 : 2 * num_kv : 2]
    assert len(set(keys)) == num_kv and len(set(values)) == num_kv
    assert all(1 <= k < vocab // 2 for k in keys) and all(vocab // 2 <= v < vocab for v in values)
    value_of = dict(zip(keys.tolist(), values.tolist()))
    queries = np.flatnonzero(row_targets)
    assert len(queries) == num_kv and all(q >= 2 * num_kv and (q - 2 * num_kv) % 2 == 0 for q in queries)
    assert sorted(row_tokens[queries].tolist()) == sorted(keys.tolist())  # each key queried once
    for q in queries:
      assert row_targets[q] == value_of[row_tokens[q]]
    rest = np.ones(seq_len, bool)
    rest[: 2 * num_kv] = False
    rest[queries] = False
    assert (row_tokens[rest] == 0).all()  # every other slot is blank: answers are never inputs
    first_offsets.append((queries.min() - 2 * num_kv) // 2)
  # Power-law placement favours near slots: the nearest query sits well before a uniform draw's expectation.
  slots = (seq_len - 2 * num_kv) // 2
  assert np.mean(first_offsets) < 0.5 * slots / (num_kv + 1)


def test_mqar_vocabulary_follows_the_variant():
  """64x4_v256 (Zoology's first example) has 256 token ids: the model's embedding and head have 256 rows, and an
  id of the 8192 vocabulary is refused by its pipeline; the Figure-2 settings keep 8192."""
  assert TASKS["mqar"].vocab("64x4") == TASKS["mqar"].vocab("256x16") == mqar.VOCAB_SIZE == 8192
  assert TASKS["mqar"].vocab("64x4_v256") == 256
  config = config_lib.default_config("attention")
  config.model.update(causal=True, d_model=16, num_layers=1, d_ff=32, max_len=64)
  config.data.update(task="mqar", variant="64x4_v256")
  params = jax.eval_shape(lambda: trainer.init_params(trainer.parts(config).model, jax.random.key(0)))  # shapes
  assert params["embed"]["embedding"].shape == (256, 16) and params["lm_head"]["kernel"].shape == (16, 256)
  tokens, targets = mqar.generate(1, seq_len=64, num_kv=4, seed=0, vocab_size=8192)
  with pytest.raises(config_lib.UserError, match=r"outside the vocabulary \[0, 256\)"):
    pipeline.Encode("mqar", 64, False, "64x4_v256")({"tokens": tokens[0], "targets": targets[0]})
  pipeline.Encode("mqar", 64, False, "64x4")({"tokens": tokens[0], "targets": targets[0]})


def test_mqar_logits_and_loss_at_the_query_positions_only():
  tokens, targets = mqar.generate(3, seq_len=64, num_kv=4, seed=0)
  examples = [mqar.encode({"tokens": t, "targets": y}, 80) for t, y in zip(tokens, targets)]  # padded to 80
  batch = {k: jnp.asarray(np.stack([e[k] for e in examples])) for k in examples[0]}
  assert batch["positions"].shape == batch["targets"].shape == (3, 4) and batch["tokens"].shape == (3, 80)
  for e, t, y in zip(examples, tokens, targets):
    assert (e["positions"] == np.flatnonzero(y)).all() and (e["targets"] == y[y > 0]).all()
    assert (t[e["positions"]] < mqar.VOCAB_SIZE // 2).all()  # each a key, asked again
  config = config_lib.default_config("attention")
  config.model.update(causal=True, d_model=32, num_layers=1, d_ff=64, max_len=80)
  config.data.update(task="mqar", variant="tiny")
  model = trainer.parts(config).model
  params = compiled(model).init(jax.random.key(0), batch["tokens"], batch["mask"])["params"]
  full_BxLxV = compiled(model).apply({"params": params}, batch["tokens"], mask=batch["mask"])
  at_BxKxV = compiled(model).apply(
    {"params": params}, batch["tokens"], mask=batch["mask"], positions=batch["positions"]
  )
  assert at_BxKxV.shape == (3, 4, mqar.VOCAB_SIZE)
  np.testing.assert_allclose(
    at_BxKxV, np.stack([f[e["positions"]] for f, e in zip(np.asarray(full_BxLxV), examples)]), atol=1e-5
  )
  # The loss: mean cross-entropy over the 12 queries, from the full logits by hand.
  log_p = np.asarray(jax.nn.log_softmax(full_BxLxV))
  expected = -np.mean([log_p[i, q, y[q]] for i, y in enumerate(targets) for q in np.flatnonzero(y)])
  sums = OBJECTIVES["lm"].loss_sums(at_BxKxV, batch, jnp.ones(3))
  assert float(sums["count"]) == 12 and float(sums["loss"]) / 12 == pytest.approx(expected, rel=1e-5)


def test_mqar_generation_is_seeded_and_prepared_splits_are_disjoint(data_dir):
  a, b, c = (mqar.generate(50, seq_len=64, num_kv=4, seed=s)[0] for s in (3, 3, 4))
  assert (a == b).all() and not (a == c).all()
  config = _config("mqar", "tiny", data_dir, max_len=64)
  pipeline.prepare(config)
  rows = {}
  for split, size in (("train", 2000), ("validation", 256), ("test", 256)):
    source = pipeline.source(config, split)
    assert len(source) == size
    rows[split] = {np.asarray(source[i]["tokens"]).tobytes() for i in range(len(source))}
  assert not rows["train"] & rows["validation"] and not rows["train"] & rows["test"]
  assert not rows["validation"] & rows["test"]


# -------------------------------------------------------------------------------------- pipeline mechanics
def _config(task, variant, data_dir, **model):
  from configs import quickstart  # pylint: disable=g-import-not-at-top

  config = quickstart.get_config("smoke")
  config.data.update(task=task, variant=variant, data_dir=data_dir, batch_size=16)
  config.model.update(**model)
  return config


def test_global_batches_are_the_same_on_any_number_of_processes_and_epochs_do_not_overlap(smoke_config):
  config = smoke_config()
  pipeline.prepare(config)
  train_source, eval_source = pipeline.source(config, "train"), pipeline.source(config, "eval")
  row_key = lambda tokens: tokens.tobytes()  # ListOps expressions are distinct, and so are their token rows
  everything = {
    row_key(pipeline.Encode("listops", 48, False)(train_source[i])["tokens"]) for i in range(len(train_source))
  }
  one = pipeline.train_iterator(config, train_source)
  two = [pipeline.train_iterator(config, train_source, process_index=p, process_count=2) for p in (0, 1)]
  epoch = len(train_source) // config.data.batch_size  # whole global batches in the first epoch
  rows = []
  for _ in range(epoch + 8):  # into the second epoch
    whole, halves = next(one), [next(it) for it in two]
    assert all(h["tokens"].shape == (config.data.batch_size // 2, 48) for h in halves)
    for k in whole:  # process p holds rows p·B/2 … (p+1)·B/2 − 1 of the one-process batch
      np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), whole[k])
    rows += [row_key(t) for t in whole["tokens"]]
  first_epoch = rows[: len(train_source)]
  assert len(set(first_epoch)) == len(first_epoch) and set(first_epoch) == everything
  eval_rows, counts = [], []
  for p in range(2):
    batches = list(pipeline.eval_batches(config, eval_source, process_index=p, process_count=2))
    counts.append(len(batches))
    eval_rows += [row_key(t) for b in batches for t, w in zip(b["tokens"], b["weight"]) if w]
  assert counts[0] == counts[1] and len(eval_rows) == len(set(eval_rows)) == len(eval_source)
  # config.data.eval_examples: the split's first 37 examples, each once, over two processes as over one.
  first = {row_key(pipeline.Encode("listops", 48, False)(eval_source[i])["tokens"]) for i in range(37)}
  subset = [
    row_key(t)
    for p in range(2)
    for b in pipeline.eval_batches(config, eval_source, process_index=p, process_count=2, examples=37)
    for t, w in zip(b["tokens"], b["weight"])
    if w
  ]
  assert len(subset) == 37 and set(subset) == first


def test_the_data_position_is_the_step(smoke_config):
  config = smoke_config()
  pipeline.prepare(config)
  source = pipeline.source(config, "train")
  it = pipeline.train_iterator(config, source)
  for _ in range(70):  # past the first epoch of 31 batches: the position must hold the epoch too
    next(it)
  want = [next(it) for _ in range(3)]
  for count in (1, 2):  # resumed on one process, or on two
    resumed = [
      pipeline.train_iterator(config, source, start_step=70, process_index=p, process_count=count) for p in range(count)
    ]
    for w in want:
      got = [next(r) for r in resumed]
      assert all((np.concatenate([g[k] for g in got]) == w[k]).all() for k in w)
  other_seed = config.copy_and_resolve_references()
  other_seed.seed = 1
  assert not (
    next(pipeline.train_iterator(other_seed, source))["tokens"]
    == next(pipeline.train_iterator(config, source))["tokens"]
  ).all()


def test_token_ids_outside_the_vocabulary_are_refused_before_anything_is_written(smoke_config, monkeypatch, tmp_path):
  import dataclasses  # pylint: disable=g-import-not-at-top

  monkeypatch.setitem(TASKS, "listops_small_vocab", dataclasses.replace(TASKS["listops"], vocab_size=5))
  config = smoke_config()
  pipeline.prepare(config)
  config.data.task = "listops_small_vocab"
  with pytest.raises(ValueError, match=r"token id \d+ in its tokens, outside the vocabulary \[0, 5\)"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------ masked LM
def test_mlm_corruption_follows_bert_80_10_10():
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 257, size=(400, 128)).astype(np.int32)
  tokens[:, 5::11] = 257  # SEP, a special token
  mask = np.arange(128)[None, :] < rng.integers(64, 129, size=(400, 1))
  tokens[~mask] = 0
  chosen = masked = randomised = kept = real = 0
  for i in range(400):
    out = mlm.mask_for_mlm(
      {"tokens": tokens[i], "mask": mask[i]},
      np.random.default_rng(i),
      mask_id=258,
      random_ids=(1, 257),
      special_ids=(257,),
    )
    c = out["weights"] > 0
    assert not (c & ~mask[i]).any() and not (c & (tokens[i] == 257)).any()  # never padding, never SEP
    assert (out["targets"][c] == tokens[i][c]).all() and (out["tokens"][~c] == tokens[i][~c]).all()
    candidates = mask[i] & (tokens[i] != 257)
    assert c.sum() == max(1, round(0.15 * candidates.sum()))
    chosen += c.sum()
    real += candidates.sum()
    masked += (out["tokens"][c] == 258).sum()
    changed = c & (out["tokens"] != 258) & (out["tokens"] != tokens[i])
    randomised += changed.sum()
    kept += (c & (out["tokens"] == tokens[i])).sum()
  assert chosen / real == pytest.approx(0.15, abs=0.005)
  assert masked / chosen == pytest.approx(0.8, abs=0.02)
  # a random replacement equals the original 1 time in 256: it then counts as kept
  assert randomised / chosen == pytest.approx(0.1 * 255 / 256, abs=0.015)
  assert kept / chosen == pytest.approx(0.1 + 0.1 / 256, abs=0.015)


def test_mlm_eval_corruption_is_the_same_on_every_pass_and_for_any_process_count(data_dir):
  from configs import mlm_bytes  # pylint: disable=g-import-not-at-top

  config = mlm_bytes.get_config("smoke")
  config.data.data_dir = data_dir
  pipeline.prepare(config)
  source = pipeline.source(config, "eval")
  first, second = (next(pipeline.eval_batches(config, source)) for _ in range(2))
  assert (first["tokens"] == second["tokens"]).all() and first["weights"].sum() > 0
  assert ((first["tokens"] == 258) == (first["weights"] > 0))[first["weights"] > 0].mean() > 0.6
  # Process 1 of 2 holds examples 1, 3, 5, ...: corrupted exactly as in the one-process pass.
  half = next(pipeline.eval_batches(config, source, process_index=1, process_count=2))
  assert (half["tokens"][:4] == first["tokens"][1:8:2]).all()
  # In training, the processes' rows draw their own masks (seeded by the row's place in the stream).
  train_source = pipeline.source(config, "train")
  p0, p1 = (next(pipeline.train_iterator(config, train_source, process_index=p, process_count=2)) for p in (0, 1))
  assert (p0["mask"].all() and p1["mask"].all()) and not (p0["weights"] == p1["weights"]).all()


# ------------------------------------------------------------------------------------------------ images
@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory):
  """Synthetic Fashion-MNIST idx files: 5,300 training and 300 test images whose label is readable from the
  pixels (class c has its top-left pixel at 25·c), so the task is learnable."""
  folder = tmp_path_factory.mktemp("fashion")
  rng = np.random.default_rng(0)
  for prefix, n in (("train", 5_300), ("t10k", 300)):
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    pixels = rng.integers(0, 256, size=(n, 28, 28)).astype(np.uint8)
    pixels[:, 0, 0] = labels * 25
    write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", pixels)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
  return str(folder)


def test_idx_reader_and_fashion_mnist_splits(fashion_dir, tmp_path):
  pixels = images.read_idx(os.path.join(fashion_dir, "train-images-idx3-ubyte.gz"))
  labels = images.read_idx(os.path.join(fashion_dir, "train-labels-idx1-ubyte.gz"))
  assert pixels.shape == (5_300, 28, 28) and labels.shape == (5_300,) and (pixels[:, 0, 0] == labels * 25).all()
  config = _config("fashion_mnist", "full", str(tmp_path), max_len=784)
  config.data.corpus_dir = fashion_dir
  pipeline.prepare(config)
  sizes = {s: len(pipeline.source(config, s)) for s in ("train", "validation", "test")}
  assert sizes == {"train": 300, "validation": 5_000, "test": 300}
  validation = pipeline.source(config, "validation")  # the last 5,000 training images (TFDS stores them shuffled)
  got = {(np.asarray(validation[i]["image"]).tobytes(), int(validation[i]["label"])) for i in range(len(validation))}
  assert got == {(p.tobytes(), int(y)) for p, y in zip(pixels[300:], labels[300:])}
  example = validation[7]
  image = np.asarray(example["image"]).reshape(-1)
  encoded = TASKS["fashion_mnist"].encode(example, 784, False)
  assert (encoded["tokens"] == image).all() and encoded["mask"].all() and encoded["label"] == image[0] // 25
  ar = TASKS["fashion_mnist_ar"].encode(example, 784, False)
  assert ar["tokens"][0] == images.START_ID and (ar["tokens"][1:] == image[:-1]).all()
  assert (ar["targets"] == image).all() and ar["weights"].sum() == 784
  half = TASKS["fashion_mnist_ar_14"].encode(example, 196, False)
  grid_28 = np.asarray(example["image"], np.float64)
  means = [[grid_28[2 * y : 2 * y + 2, 2 * x : 2 * x + 2].mean() for x in range(14)] for y in range(14)]
  expected = np.floor(np.asarray(means) + 0.5).reshape(-1)  # each 2 × 2 block's mean, rounded half up
  assert half["tokens"][0] == images.START_ID and (half["targets"] == expected).all()
  assert (half["tokens"][1:] == expected[:-1]).all() and half["weights"].sum() == 196


def test_downsampling_rounds_half_up_and_refuses_odd_sizes():
  block = np.array([[0, 1], [0, 1]], np.uint8)  # mean 0.5 → 1
  assert images.downsample(block, 2).tolist() == [[1]]
  assert images.downsample(np.array([[255, 255], [255, 254]], np.uint8), 2).tolist() == [[255]]  # 254.75
  assert images.downsample(np.array([[0, 0], [0, 1]], np.uint8), 2).tolist() == [[0]]  # 0.25
  with pytest.raises(ValueError, match="multiples of 2"):
    images.downsample(np.zeros((3, 4), np.uint8), 2)


def test_missing_fashion_mnist_files_say_how_to_get_them(tmp_path):
  config = _config("fashion_mnist", "tiny", str(tmp_path / "tfds"), max_len=784)
  config.data.corpus_dir = str(tmp_path / "empty")
  os.makedirs(config.data.corpus_dir)
  with pytest.raises(ValueError, match="empty is missing or empty; apt-get install dataset-fashion-mnist"):
    pipeline.prepare(config)
  (tmp_path / "empty" / "README").write_text("not the data")
  with pytest.raises(ValueError, match="train-images-idx3-ubyte.gz is missing; apt-get install dataset-fashion-mnist"):
    pipeline.prepare(config)


def test_grey_conversion_follows_tf_rgb_to_grayscale_on_uint8():
  # TF: luma of the [0, 1] floats, then convert_image_dtype back to uint8 = truncate(x * 255.5).
  rgb = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30], [255, 255, 255], [0, 0, 0]]], np.uint8)
  luma = lambda r, g, b: (r * 0.2989 + g * 0.587 + b * 0.114) / 255
  want = [int(luma(*px) * 255.5) for px in rgb[0].tolist()]
  assert want[:4] == [76, 149, 29, 18] and want[4] == 255  # 0.9999 * 255.5 = 255.47: white stays white
  assert images.grey(rgb).tolist() == [want]


# ------------------------------------------------------------------------------------ registered datasets
@pytest.mark.parametrize("variant", ["sst2", "mrpc", "qnli", "mnli"])
def test_glue_examples_encode_as_bytes_with_sep(variant, tmp_path):
  config = _config("glue", variant, str(tmp_path), max_len=256)
  with tfds.testing.mock_data(num_examples=4):
    example = pipeline.source(config, "eval")[0]
  encoded = pipeline.Encode("glue", 256, True)(example)
  fields = [k for k in ("premise", "hypothesis", "question", "sentence1", "sentence2", "sentence") if k in example]
  if variant == "sst2":
    want = [b + 1 for b in example["sentence"].encode()]
  else:
    first, second = {
      "mrpc": ("sentence1", "sentence2"),
      "qnli": ("question", "sentence"),
      "mnli": ("premise", "hypothesis"),
    }[variant]
    assert first in fields and second in fields
    want = [b + 1 for b in example[first].encode()] + [257] + [b + 1 for b in example[second].encode()]  # 257: SEP
  assert encoded["tokens"][: encoded["mask"].sum()].tolist() == want
  assert TASKS["glue"].classes(variant) == (3 if variant == "mnli" else 2)


def test_registered_datasets_say_how_to_build_them_when_absent(tmp_path):
  config = _config("imdb_bytes", "plain_text", str(tmp_path), max_len=128)
  import unittest.mock  # pylint: disable=g-import-not-at-top

  # The download host "answers" (no connection is made), so the download itself runs and fails: TFDS's own error
  # path. The unreachable-host path is tests/test_prepare.py's.
  with (
    unittest.mock.patch(
      "tensorflow_datasets.core.dataset_builder.DatasetBuilder.download_and_prepare",
      side_effect=ConnectionError("no network"),
    ),
    unittest.mock.patch.object(pipeline, "_reachable", return_value=True),
  ):
    with pytest.raises(ValueError, match="tfds build imdb_reviews/plain_text --file_format=array_record"):
      pipeline.prepare(config)


def _blocked_on_a_lock(pid: int) -> bool:
  """Whether process pid waits for a file lock (Linux's /proc/locks marks a waiting request with '->')."""
  with open("/proc/locks") as f:
    return any(line.split()[1] == "->" and int(line.split()[5]) == pid for line in f if len(line.split()) > 5)


@pytest.mark.slow
def test_runs_started_together_prepare_a_dataset_once(tmp_path):
  """The data_dir lock: preparations wait while another process holds it, and two processes preparing the same
  dataset in a fresh data_dir at once (both let go together when the holder releases the lock) both succeed
  (without the lock, the later one fails renaming TFDS's folder)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  from conftest import REPO  # pylint: disable=g-import-not-at-top

  code = (
    "import sys; from configs import quickstart; from efftx.data import pipeline; "
    "c = quickstart.get_config('smoke'); c.data.data_dir = sys.argv[1]; pipeline.prepare(c); print('ok')"
  )
  prepared = tmp_path / "listops" / "tiny" / "1.0.0"
  with open(tmp_path / ".efftx_prepare.lock", "a") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    procs = [
      subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
      )
      for _ in range(2)
    ]
    deadline = time.time() + 120
    for proc in procs:
      while not _blocked_on_a_lock(proc.pid):  # it imports, then asks for the lock this process holds
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "never asked for the lock"
        time.sleep(0.01)
    assert all(proc.poll() is None for proc in procs) and not prepared.exists()
  for proc in procs:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0 and out.strip().endswith("ok"), err
  assert prepared.exists() and sorted(os.listdir(tmp_path / "listops" / "tiny")) == ["1.0.0"]


def test_the_data_readme_lists_every_task_with_its_variants():
  """efftx/data/README.md's task table has a row for each task a config can name (the error for an unknown task
  lists them all), naming its variants (or a range of them, first … last, or the same as another task's); README.md
  names every task."""
  with open(os.path.join(REPO, "efftx", "data", "README.md")) as f:
    rows = {line.split("|")[1].strip(" `"): line.split("|")[4] for line in f if line.startswith("| `")}
  with open(os.path.join(REPO, "README.md")) as f:
    readme = f.read()
  for name, task in TASKS.items():
    assert name in rows, f"efftx/data/README.md's task table has no row for {name}"
    assert f"`{name}`" in readme, f"README.md does not name the task {name}"
    named = [v for v in task.variant_names() if f"`{v}`" in rows[name]]
    assert named == task.variant_names() or "…" in rows[name] and named or "as `" in rows[name], (name, rows[name])


def test_in_memory_splits_give_the_batches_the_files_give(smoke_config):
  """data.in_memory reads and encodes each split once: the training stream (into its second epoch, on one process
  and on two) and the evaluation batches are those read from the files, and a second source shares the copy."""
  config = smoke_config()
  pipeline.prepare(config)
  memory = config.copy_and_resolve_references()
  memory.data.in_memory = True
  for split in ("train", "eval"):
    disk_source, memory_source = pipeline.source(config, split), pipeline.source(memory, split)
    assert isinstance(memory_source, pipeline.InMemory) and memory_source is pipeline.source(memory, split)
    assert len(memory_source) == len(disk_source)
  disk = pipeline.train_iterator(config, pipeline.source(config, "train"))
  from_memory = pipeline.train_iterator(
    memory, pipeline.source(memory, "train"), start_step=30, process_index=1, process_count=2
  )
  for _ in range(30):
    next(disk)
  for _ in range(4):  # steps 30–33: the first epoch's last batches and the second epoch's first
    want, got = next(disk), next(from_memory)
    assert all((got[k] == want[k][len(want[k]) // 2 :]).all() for k in want)
  evals = [list(pipeline.eval_batches(c, pipeline.source(c, "eval"))) for c in (config, memory)]
  assert len(evals[0]) == len(evals[1])
  for want, got in zip(*evals):
    assert all((got[k] == want[k]).all() for k in want)

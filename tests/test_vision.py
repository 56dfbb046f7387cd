"""The vision path: patch embedding against a numpy loop, the grid reaching grid-aware mixers, its checks, and
image classification from configs/vision.py on synthetic Fashion-MNIST files."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from conftest import write_idx
from efftx import config as config_lib
from efftx import model as model_lib
from efftx import trainer
from efftx.errors import UserError
from efftx.objectives import OBJECTIVES
from efftx.perf import bench


def _model(mixer="attention", image_shape=(8, 12, 3), patch=4, pooling="mean", **options):
  config = config_lib.default_config(mixer)
  H, W, C = image_shape
  config.model.update(
    d_model=16, d_ff=32, num_layers=1, max_len=H * W * C, dropout=0.0, patch_size=patch, pooling=pooling
  )
  config_lib.set_where_declared(config.mixer, num_heads=2, **options)
  return model_lib.build_model(config, OBJECTIVES["classify"].head(256, 3, pooling), 256, image_shape)


def test_patch_embedding_equals_a_loop_over_the_patches():
  """Patch (r, c) of a p×p grid cut from the raster-order pixels: its p·p·C values in (row, column, channel)
  order, scaled from 0–255 to [−1, 1], times the patch_embed kernel plus its bias."""
  H, W, C, p = 8, 12, 3, 4
  model = _model(image_shape=(H, W, C), patch=p)
  tokens = np.random.default_rng(0).integers(0, 256, (2, H * W * C))
  variables = compiled(model).init(jax.random.key(0), jnp.asarray(tokens))
  _, state = compiled(model).apply(
    variables, jnp.asarray(tokens), capture_intermediates=True, mutable=["intermediates"]
  )
  got = np.asarray(state["intermediates"]["patch_embed"]["__call__"][0])
  kernel = np.asarray(variables["params"]["patch_embed"]["kernel"])
  bias = np.asarray(variables["params"]["patch_embed"]["bias"])
  image = tokens.reshape(2, H, W, C)
  want = np.zeros((2, (H // p) * (W // p), 16))
  for b in range(2):
    for r in range(H // p):
      for c in range(W // p):
        values = [image[b, r * p + i, c * p + j, ch] / 127.5 - 1 for i in range(p) for j in range(p) for ch in range(C)]
        want[b, r * (W // p) + c] = np.asarray(values) @ kernel + bias
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert variables["params"]["pos_embed"].shape == ((H // p) * (W // p), 16)  # one learned position per patch


def test_the_grid_reaches_grid_aware_mixers_and_max_len_counts_patches():
  conv = _model("aft_conv", patch=4, pooling="cls", kernel_size=3)
  assert conv.make_mixer.keywords["grid"] == (2, 3)
  full = _model("aft_full", patch=4, pooling="cls")
  assert full.make_mixer.keywords["max_len"] == 2 * 3 + 1  # the patches and the [CLS] position
  assert "grid" not in _model("attention").make_mixer.keywords  # attention and FNet mix the patch sequence as usual
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 8 * 12 * 3)))
  for model in (conv, full):
    variables = compiled(model).init(jax.random.key(0), tokens)
    logits = compiled(model).apply(variables, tokens)
    assert logits.shape == (2, 3) and np.isfinite(np.asarray(logits)).all()


@pytest.mark.parametrize(
  "task,patch,max_len,message",
  [
    ("listops", 4, 128, "config.model.patch_size=4: task 'listops' is not an image task"),
    ("fashion_mnist", 5, 784, "config.model.patch_size=5 must divide the 28×28 images of task 'fashion_mnist'"),
    ("fashion_mnist", 4, 700, "config.model.max_len=700: an image of task 'fashion_mnist' is 28×28×1 = 784"),
  ],
)
def test_a_patch_size_that_does_not_fit_the_task_is_refused(task, patch, max_len, message):
  config = config_lib.default_config("attention")
  config.data.task, config.data.variant = task, "tiny"
  config.model.update(patch_size=patch, max_len=max_len)
  with pytest.raises(UserError) as error:
    config_lib.validate(config, 8)
  assert str(error.value).startswith(message)


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory):
  """Synthetic Fashion-MNIST files whose label is a bright 7×7 block at one of ten places of the image."""
  folder = tmp_path_factory.mktemp("fashion_vision")
  rng = np.random.default_rng(0)
  for prefix, n in (("train", 5_300), ("t10k", 300)):
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    pixels = rng.integers(0, 64, size=(n, 28, 28)).astype(np.uint8)
    for i, label in enumerate(labels):
      r, c = divmod(int(label), 4)
      pixels[i, 7 * r : 7 * r + 7, 7 * c : 7 * c + 7] = 255
    write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", pixels)
    write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
  return str(folder)


@pytest.fixture(scope="module")
def fashion_tfds(tmp_path_factory):
  """A TFDS data dir for fashion_dir's files (not the session's: another corpus), prepared on first use and shared
  by the runs below."""
  return str(tmp_path_factory.mktemp("tfds_vision"))


@pytest.mark.parametrize("mixer", ["aft_conv", "fnet+attention*1@top"])
def test_the_vision_config_trains_on_fashion_mnist_patches(mixer, fashion_dir, fashion_tfds, tmp_path):
  from configs import vision  # pylint: disable=g-import-not-at-top
  from efftx import train  # pylint: disable=g-import-not-at-top

  config = vision.get_config(f"smoke,mixer={mixer}")
  config.data.update(data_dir=fashion_tfds, corpus_dir=fashion_dir)
  config.checkpoint_every = config.total_steps  # one checkpoint (saving them is test_train.py's)
  model = trainer.parts(config).model
  assert model.patch_size and model.grid == (28 // config.model.patch_size,) * 2
  metrics = train.train_and_evaluate(config, str(tmp_path))
  assert np.isfinite(metrics["eval_loss"]) and 0.0 <= metrics["eval_accuracy"] <= 1.0


def test_flops_on_the_patch_grid_count_the_two_dimensional_kernel():
  """A depthwise s×s convolution over d + h channels at each of the grid's cells (the [CLS] position convolves
  nothing), three times for the training step, plus 6 × every matmul weight."""
  config = config_lib.default_config("aft_conv")
  config.model.update(d_model=16, d_ff=32, num_layers=2, max_len=8 * 12 * 3, dropout=0.0, patch_size=4, pooling="cls")
  config.mixer.update(num_heads=2, kernel_size=3)
  model = model_lib.build_model(config, OBJECTIVES["classify"].head(256, 3, "cls"), 256, (8, 12, 3))
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 8 * 12 * 3), jnp.int32))["params"]  # sizes
  dense = 6 * sum(
    leaf.size
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    if getattr(path[-1], "key", None) == "kernel"
  )
  cells, positions = 2 * 3, 2 * 3 + 1
  conv = 2 * 3 * 3 * (16 + 2) * cells / positions
  assert bench.flops_per_token(config, params, model.grid) == pytest.approx(dense + 2 * 3 * conv)

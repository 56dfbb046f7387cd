"""The image tasks patch models read (cifar10 in colour, imagenet through DeiT's evaluation transform), their
image_shape, and configs/vision.py: encoders against plain-loop and resize/crop arithmetic written from
torchvision's definitions, TFDS examples under tfds.testing.mock_data, the one-line refusal of an ImageNet that
is not there, and the published DeiT-S settings."""

import socket
import unittest.mock

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import vision
from efftx import config as config_lib
from efftx.data import TASKS
from efftx.data import images
from efftx.data import pipeline
from efftx.errors import UserError

IMAGE_TASKS = ("fashion_mnist", "cifar10_grey", "cifar10", "imagenet")


def _raster(image_HxWxC) -> list[int]:
  """Sub-pixels in raster order, channels interleaved, by plain loops."""
  H, W, C = image_HxWxC.shape
  return [int(image_HxWxC[y, x, c]) for y in range(H) for x in range(W) for c in range(C)]


def _config(task: str, data_dir: str):
  config = config_lib.default_config("attention")
  config.data.update(task=task, variant="default", data_dir=data_dir)
  return config


# --------------------------------------------------------------------------------------------------- cifar10
def test_cifar10_tokens_are_the_rgb_sub_pixels_in_raster_order():
  rng = np.random.default_rng(0)
  image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
  image[0, 0] = (255, 0, 7)  # token 0 is R of the top-left pixel, token 1 its G, token 2 its B
  image[31, 31] = (1, 2, 3)
  out = pipeline.Encode("cifar10", 3072, False)({"image": image, "label": 4})
  assert out["tokens"].tolist() == _raster(image) and out["mask"].all() and out["label"] == 4
  assert out["tokens"][:3].tolist() == [255, 0, 7] and out["tokens"][-3:].tolist() == [1, 2, 3]
  assert out["tokens"][3 * (32 * 5 + 9) + 1] == image[5, 9, 1]  # G of pixel (row 5, column 9)
  # cifar10_grey, the same dataset, keeps its 1,024 grey tokens
  assert TASKS["cifar10_grey"].encode({"image": image, "label": 4}, 1024, False)["tokens"].shape == (1024,)
  with pytest.raises(UserError, match="never cut"):
    pipeline.Encode("cifar10", 3071, False)({"image": image, "label": 4})


def test_cifar10_reads_tfds_examples_with_cifar10_greys_splits(tmp_path):
  task, grey = TASKS["cifar10"], TASKS["cifar10_grey"]
  assert task.tfds_name("default") == grey.tfds_name("default") == "cifar10"
  assert task.split_names("default") == grey.split_names("default") == ("train[:90%]", "train[90%:]")
  assert task.test_split == "test" and task.classes("default") == 10 and task.vocab("default") == 256
  config = _config("cifar10", str(tmp_path))
  with tfds.testing.mock_data(num_examples=3):
    pipeline.prepare(config)
    example = pipeline.source(config, "eval")[1]
  image = np.asarray(example["image"])
  assert image.shape == (32, 32, 3)
  assert pipeline.Encode("cifar10", 3072, False)(example)["tokens"].tolist() == _raster(image)


# -------------------------------------------------------------------------------------------------- imagenet
def _resized_and_crop(h: int, w: int) -> tuple[int, int, int, int]:
  """torchvision's Resize(256) on an h × w image (the shorter side 256, the longer truncated) and CenterCrop(224)
  offsets (Python's round of half the margin), written out from their definitions."""
  if w <= h:
    new_w, new_h = 256, int(256 * h / w)
  else:
    new_h, new_w = 256, int(256 * w / h)
  return new_h, new_w, int(round((new_h - 224) / 2.0)), int(round((new_w - 224) / 2.0))


def test_imagenet_resize_arithmetic_of_the_two_test_shapes():
  assert _resized_and_crop(300, 400) == (256, 341, 16, 58)  # (341 − 224) / 2 = 58.5 rounds to even: 58
  assert _resized_and_crop(400, 300) == (341, 256, 58, 16)
  assert _resized_and_crop(256, 256) == (256, 256, 16, 16)


@pytest.mark.parametrize("h,w", [(300, 400), (400, 300), (47, 17), (256, 256), (224, 224), (1, 1)])
def test_imagenet_crop_is_224_by_224_rgb_and_keeps_a_constant_colour(h, w):
  image = np.empty((h, w, 3), np.uint8)
  image[:] = (10, 200, 30)
  out = images.deit_eval_crop(image)
  assert out.shape == (224, 224, 3) and out.dtype == np.uint8
  assert (out == (10, 200, 30)).all()  # any resampling kernel that sums to one; channel order kept


@pytest.mark.parametrize(
  "h,w,rows,cols",
  [
    (300, 400, (140, 160), (190, 210)),  # at the image's centre
    (400, 300, (190, 210), (140, 160)),
    (300, 400, (100, 140), (120, 180)),  # off centre: where it lands depends on the scale and on the crop
    (400, 300, (240, 300), (70, 110)),
  ],
)
def test_imagenet_crop_is_centred_after_resizing_the_shorter_side_to_256(h, w, rows, cols):
  """A red rectangle on grey lands where the scale 256 / shorter side and the centre crop put it: its centroid (the
  mean of the output's pixel centres weighed by the red above the background) and its mass (the area it covers, ×
  the scale factors) match the arithmetic; a resampling kernel that sums to one and is symmetric keeps both, and
  the background (64) leaves room for bicubic overshoot, so nothing clips."""
  image = np.full((h, w, 3), 64, np.uint8)
  image[rows[0] : rows[1], cols[0] : cols[1], 0] = 192
  out = images.deit_eval_crop(image).astype(np.float64)
  new_h, new_w, top, left = _resized_and_crop(h, w)
  sy, sx = new_h / h, new_w / w
  excess_HxW = out[..., 0] - 64
  assert (out[..., 1:] == 64).all()  # the marker is in the red channel only
  mass = excess_HxW.sum()
  assert mass == pytest.approx(128 * (rows[1] - rows[0]) * sy * (cols[1] - cols[0]) * sx, rel=0.01)
  centre_y = (excess_HxW.sum(1) * (np.arange(224) + 0.5)).sum() / mass  # in output pixels, edges at integers
  centre_x = (excess_HxW.sum(0) * (np.arange(224) + 0.5)).sum() / mass
  assert centre_y == pytest.approx((rows[0] + rows[1]) / 2 * sy - top, abs=0.1)
  assert centre_x == pytest.approx((cols[0] + cols[1]) / 2 * sx - left, abs=0.1)


def _bicubic_1d(row_N: np.ndarray, out_len: int) -> np.ndarray:
  """Antialiased bicubic resampling of one row from its definition: Keys' cubic (a = −0.5), stretched by the
  downscale factor when shrinking, centred on each output pixel's centre mapped back, weights normalised."""

  def keys(x, a=-0.5):
    x = np.abs(x)
    return np.where(x < 1, (a + 2) * x**3 - (a + 3) * x**2 + 1, np.where(x < 2, a * (x**3 - 5 * x**2 + 8 * x - 4), 0))

  scale = len(row_N) / out_len
  stretch = max(scale, 1.0)
  out = []
  for j in range(out_len):
    weights_N = keys((np.arange(len(row_N)) + 0.5 - (j + 0.5) * scale) / stretch)
    out.append((weights_N * row_N).sum() / weights_N.sum())
  return np.clip(np.round(np.array(out)), 0, 255)


@pytest.mark.parametrize("h,w", [(300, 400), (100, 60)])  # shrinking, and growing
def test_imagenet_resize_is_antialiased_bicubic(h, w):
  """DeiT resizes with interpolation=3 (bicubic): on an image whose columns are random and whose rows are all the
  same, the crop's rows are the bicubic resampling of that row (bilinear differs by many levels here)."""
  row_W = np.random.default_rng(2).integers(0, 256, w).astype(np.float64)
  image = np.broadcast_to(row_W[None, :, None], (h, w, 3)).astype(np.uint8)
  new_h, new_w, _, left = _resized_and_crop(h, w)
  out = images.deit_eval_crop(image).astype(np.float64)
  want_224 = _bicubic_1d(row_W, new_w)[left : left + 224]
  assert np.abs(out - want_224[None, :, None]).max() <= 1  # Pillow's fixed-point weights: a level at most


def test_a_centred_marker_lands_at_the_crops_centre():
  image = np.full((300, 400, 3), 64, np.uint8)
  image[140:160, 190:210] = 192  # centred on (150, 200)
  out = images.deit_eval_crop(image)[..., 0].astype(np.float64) - 64
  ys, xs = np.nonzero(out > 64)  # more than half the marker's height above the background
  # 150 · 256/300 − 16 = 112 and 200 · 341/400 − 58 = 112.5: the crop of an odd-width image is half a pixel left
  assert (ys.min() + ys.max() + 1) / 2 == pytest.approx(112, abs=0.5)
  assert (xs.min() + xs.max() + 1) / 2 == pytest.approx(112.5, abs=0.5)


def test_imagenet_tokens_are_the_crop_in_raster_order_under_mocked_tfds(tmp_path):
  task = TASKS["imagenet"]
  assert (task.tfds_name("default"), task.split_names("default"), task.test_split) == (
    "imagenet2012",
    ("train", "validation"),
    None,
  )
  assert task.classes("default") == 1000 == tfds.builder("imagenet2012").info.features["label"].num_classes
  config = _config("imagenet", str(tmp_path))
  with tfds.testing.mock_data(num_examples=2):  # random images of random sizes
    pipeline.prepare(config)
    example = pipeline.source(config, "eval")[0]
  out = pipeline.Encode("imagenet", 224 * 224 * 3, False)(example)
  assert out["tokens"].tolist() == _raster(images.deit_eval_crop(np.asarray(example["image"])))
  assert out["mask"].all() and out["label"] == int(example["label"])


@pytest.mark.parametrize("network", ["refused", "answers"])
def test_an_imagenet_that_is_not_there_is_refused_in_one_line(network, tmp_path, monkeypatch):
  """Unprepared and without its hand-downloaded files: one UserError line naming the dataset and the command,
  whether the download host is unreachable (the probe refuses) or answers (TFDS itself refuses: no manual files)."""
  if network == "refused":
    monkeypatch.setattr(socket, "create_connection", unittest.mock.Mock(side_effect=ConnectionRefusedError()))
  else:
    monkeypatch.setattr(pipeline, "_reachable", lambda *args: True)
  data_dir = str(tmp_path / "tfds")
  with pytest.raises(UserError) as refused:
    pipeline.prepare(_config("imagenet", data_dir))
  message = str(refused.value)
  assert "\n" not in message and "imagenet2012" in message
  assert f"tfds build imagenet2012 --file_format=array_record --data_dir={data_dir}" in message


# --------------------------------------------------------------------------------------------------- shapes
def _an_example(task: str) -> dict:
  rng = np.random.default_rng(1)
  image = {"fashion_mnist": (28, 28), "imagenet": (375, 500, 3)}.get(task, (32, 32, 3))
  return {"image": rng.integers(0, 256, image, dtype=np.uint8), "label": 3}


@pytest.mark.parametrize("task", IMAGE_TASKS)
def test_image_shape_is_the_number_of_tokens_an_example_holds(task):
  H, W, C = TASKS[task].image_shape
  out = pipeline.Encode(task, H * W * C, False)(_an_example(task))
  assert out["tokens"].shape == (H * W * C,) and out["mask"].all()  # exactly H·W·C tokens, no padding
  assert 0 <= out["tokens"].min() and out["tokens"].max() < 256
  with pytest.raises(UserError):
    pipeline.Encode(task, H * W * C - 1, False)(_an_example(task))


def test_only_pixel_classification_tasks_have_an_image_shape():
  assert {name for name, task in TASKS.items() if task.image_shape} == set(IMAGE_TASKS)
  assert TASKS["fashion_mnist_ar"].image_shape is None and TASKS["cifar10_ar"].image_shape is None  # start token
  assert [TASKS[t].image_shape for t in IMAGE_TASKS] == [(28, 28, 1), (32, 32, 1), (32, 32, 3), (224, 224, 3)]


# --------------------------------------------------------------------------------------------- the config
@pytest.mark.parametrize("data", ["fashion_mnist", "cifar10", "imagenet"])
@pytest.mark.parametrize("mixer", ["attention", "fnet", "aft_conv", "aft_full"])
@pytest.mark.parametrize("smoke", [False, True])
def test_vision_config_builds_with_patches_that_tile_the_image(data, mixer, smoke):
  config = vision.get_config(f"data={data},mixer={mixer}" + (",smoke" if smoke else ""))
  H, W, C = TASKS[config.data.task].image_shape
  p = config.model.patch_size
  assert config.model.mixer == mixer and config.data.task == data
  assert config.model.max_len == H * W * C and p > 0 and H % p == 0 and W % p == 0
  assert H // p == W // p == (4 if smoke else {"fashion_mnist": 7, "cifar10": 8, "imagenet": 14}[data])
  if "num_heads" in config.mixer:
    assert config.model.d_model % config.mixer.num_heads == 0
  if smoke:
    assert (config.model.d_model, config.model.num_layers, config.total_steps) == (32, 2, 4)


def test_the_smoke_variant_is_fashion_mnist_tiny_in_7_by_7_patches():
  config = vision.get_config("smoke")
  assert (config.data.task, config.data.variant, config.model.patch_size) == ("fashion_mnist", "tiny", 7)


def test_fashion_mnist_is_a_small_vit():
  config = vision.get_config("mixer=aft_conv")
  m = config.model
  assert (m.d_model, m.num_layers, m.d_ff, m.pooling, m.dropout) == (128, 4, 256, "mean", 0.1)
  assert dict(config.mixer) == {"num_heads": 4, "kernel_size": 3}
  assert (
    config.data.batch_size,
    config.optim.learning_rate,
    config.optim.warmup_steps,
    config.optim.weight_decay,
    config.total_steps,
  ) == (64, 1e-3, 200, 0.05, 3_000)
  assert vision.get_config("mixer=aft_local").mixer.window == 8  # reaches the patch a row (7) above and below


def test_imagenet_is_deit_small_and_aft_conv_has_384_heads():
  """DeiT-S (deit/models.py, deit/main.py) and the AFT paper's ImageNet AFT-conv (384 heads, k = 15, d' = 128)."""
  config = vision.get_config("data=imagenet,mixer=attention")
  m, o = config.model, config.optim
  assert (m.patch_size, m.d_model, m.num_layers, m.d_ff, m.pooling, m.dropout, m.norm_eps) == (
    16,
    384,
    12,
    1536,
    "cls",
    0.0,
    1e-6,
  )
  assert config.mixer.num_heads == 6 and m.max_len == 150_528
  assert (config.data.batch_size, o.learning_rate, o.weight_decay) == (1024, 5e-4 * 1024 / 512, 0.05)
  steps_per_epoch = 1_281_167 / 1024
  assert config.total_steps == int(300 * steps_per_epoch) == 375_341
  assert o.warmup_steps == int(5 * steps_per_epoch) == 6_255
  assert dict(vision.get_config("data=imagenet,mixer=aft_conv").mixer) == {"num_heads": 384, "kernel_size": 15}
  assert vision.get_config("data=imagenet,mixer=aft_full").mixer.aft_bias_dim == 128
  hybrid = vision.get_config("data=imagenet,mixer=aft_conv*2+attention").mixer  # a layer pattern: one section each
  assert (hybrid.aft_conv.num_heads, hybrid.aft_conv.kernel_size, hybrid.attention.num_heads) == (384, 15, 6)


def test_an_unknown_data_argument_is_refused():
  with pytest.raises(UserError, match="data=mnist: choose fashion_mnist, cifar10 or imagenet"):
    vision.get_config("data=mnist")

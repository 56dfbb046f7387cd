"""Images as pixel sequences: LRA-style classification, classification through patches (ViT), and autoregressive
pixel modelling (bits per dim).

Fashion-MNIST is read from its idx .gz files (Debian's `dataset-fashion-mnist` puts them in
/usr/share/datasets/fashion-mnist; any folder holding the four files works, as config.data.corpus_dir) by a local
TFDS builder: train = the first 55,000 training images, validation = the last 5,000, test = the 10,000 test
images. CIFAR-10 comes from the registered TFDS dataset (`tfds build cifar10 --file_format=array_record`), and
ImageNet-1k from TFDS's imagenet2012, whose two tar files must be downloaded by hand first (see `encode_imagenet`).

Encodings (every pixel is a token, raster order, values 0–255; images have no padding):
  - classify: grey pixels, vocab 256 — LRA's Image task (CIFAR-10 converted to grey, 1,024 tokens;
    Fashion-MNIST is grey already, 784 tokens);
  - classify_rgb: the sub-pixels as they are, (height, width, channel) raster order with R, G, B interleaved
    (token 3·(W·y + x) + c is channel c of pixel (y, x)), vocab 256 — CIFAR-10: 32·32·3 = 3,072 tokens; ImageNet
    after `deit_eval_crop`: 224·224·3 = 150,528 tokens. A model that cuts them into patches (ViT) reshapes the
    tokens to the task's image_shape (efftx.data.Task);
  - autoregressive: a start token (256, vocab 257) then the pixels, each predicting the next; CIFAR-10 keeps its
    RGB channels interleaved (32·32·3 = 3,072 tokens, the AFT/Image-Transformer protocol). Report bits per dim:
    the mean negative log2-likelihood per sub-pixel;
  - autoregressive at half resolution: each 2 × 2 block of pixels averaged (rounded half up to an integer 0–255),
    then as above — Fashion-MNIST at 14 × 14, 196 tokens: a density-estimation task a CPU trains to convergence.
"""

from __future__ import annotations

import dataclasses
import gzip
import os

import numpy as np
from PIL import Image
import tensorflow_datasets as tfds

from efftx.data.sequence import pad_to
from efftx.errors import UserError

PIXEL_VOCAB = 256
START_ID = 256
AR_VOCAB = 257
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {
  "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
  "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_MNIST_VALIDATION = 5_000
_IDX_UBYTE = 0x08
IMAGENET_RESIZE = 256  # DeiT's evaluation transform: the shorter side before the crop (int(224 / 0.875))
IMAGENET_CROP = 224  # ... and the centre crop's side: images of 224 × 224 × 3


def read_idx(path: str) -> np.ndarray:
  """An idx file (the MNIST format: magic 0 0 <type> <ndim>, big-endian int32 dims, then the data), gzipped."""
  try:
    with gzip.open(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError) as e:  # not gzip, or cut short
    raise UserError(f"{path} is not a gzipped idx file ({type(e).__name__}: {e})") from None
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise UserError(f"{path} is not an idx file (bad magic number)")
  if data[2] != _IDX_UBYTE:
    raise UserError(f"{path}: idx type 0x{data[2]:02x} is not unsigned bytes")
  ndim = data[3]
  shape = tuple(int(d) for d in np.frombuffer(data, ">i4", count=ndim, offset=4))
  body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
  if body.size != int(np.prod(shape)):
    raise UserError(f"{path}: header says {shape} ({int(np.prod(shape))} bytes), file holds {body.size}")
  return body.reshape(shape)


def grey(image_HxWxC: np.ndarray) -> np.ndarray:
  """LRA's grey pixels: tf.image.rgb_to_grayscale on uint8 — luma 0.2989 R + 0.5870 G + 0.1140 B of the pixels
  scaled to [0, 1], converted back by tf.image.convert_image_dtype (× 255.5, then cut to an integer)."""
  if image_HxWxC.ndim == 2:
    return image_HxWxC
  rgb = image_HxWxC.astype(np.float32) * np.float32(1 / 255)  # as TF computes it, in float32
  luma = rgb[..., 0] * 0.2989 + rgb[..., 1] * 0.5870 + rgb[..., 2] * 0.1140
  return np.floor(luma * np.float32(255.5)).clip(0, 255).astype(np.uint8)


def encode_classify(example: dict, max_len: int) -> dict[str, np.ndarray]:
  pixels = grey(np.asarray(example["image"])).reshape(-1)
  tokens_L, mask_L = pad_to(pixels, max_len, truncate=None, what="an image")
  return {"tokens": tokens_L, "mask": mask_L, "label": np.int32(example["label"])}


def encode_classify_rgb(example: dict, max_len: int) -> dict[str, np.ndarray]:
  pixels = np.asarray(example["image"]).reshape(-1)  # (h, w, c) raster order, channels interleaved
  tokens_L, mask_L = pad_to(pixels, max_len, truncate=None, what="an image")
  return {"tokens": tokens_L, "mask": mask_L, "label": np.int32(example["label"])}


def deit_eval_crop(image_HxWx3: np.ndarray) -> np.ndarray:
  """DeiT's evaluation transform on uint8 RGB pixels: a bicubic resize (Pillow's, antialiased when shrinking)
  that makes the shorter side 256 and the longer int(256 · longer / shorter), then the centre 224 × 224 crop, from
  row round((h' − 224) / 2) and column round((w' − 224) / 2) of the resized h' × w' image. This is what
  torchvision's Resize(256, interpolation=3) and CenterCrop(224) compute on a PIL image (deit/datasets.py:
  build_transform). Bicubic, not bilinear, because DeiT's is; its JPEGs are decoded by PIL, TFDS's by OpenCV
  where that is installed (else PIL), which can differ by a level here and there."""
  if image_HxWx3.ndim != 3 or image_HxWx3.shape[2] != 3:
    raise UserError(f"an ImageNet image of shape {image_HxWx3.shape} is not height × width × 3 (RGB)")
  h, w = image_HxWx3.shape[:2]
  longer = int(IMAGENET_RESIZE * max(h, w) / min(h, w))  # float, then truncated: torchvision's arithmetic
  new_h, new_w = (IMAGENET_RESIZE, longer) if h <= w else (longer, IMAGENET_RESIZE)
  resized = np.asarray(
    Image.fromarray(np.asarray(image_HxWx3, np.uint8)).resize((new_w, new_h), Image.Resampling.BICUBIC)
  )
  top, left = int(round((new_h - IMAGENET_CROP) / 2)), int(round((new_w - IMAGENET_CROP) / 2))
  return resized[top : top + IMAGENET_CROP, left : left + IMAGENET_CROP]


def encode_imagenet(example: dict, max_len: int) -> dict[str, np.ndarray]:
  """An ImageNet example as 224 × 224 × 3 = 150,528 RGB sub-pixel tokens (`deit_eval_crop`, then raster order).

  Every split gets the same deterministic centre crop. DeiT's training augmentations — random-resized crop,
  horizontal flip, RandAugment, mixup and cutmix, random erasing, repeated augmentation — are not implemented, so a
  DeiT recipe trained on these examples sees each training image the same way every epoch. The tokens are the
  crop's integer values 0–255: DeiT's normalisation by ImageNet's channel means (0.485, 0.456, 0.406) and standard
  deviations (0.229, 0.224, 0.225) of the pixels scaled to [0, 1] is left to the model.
  """
  return encode_classify_rgb(
    {"image": deit_eval_crop(np.asarray(example["image"])), "label": example["label"]}, max_len
  )


def encode_autoregressive(example: dict, max_len: int) -> dict[str, np.ndarray]:
  pixels = np.asarray(example["image"]).reshape(-1).astype(np.int32)  # (h, w, c) raster order
  tokens_L, mask_L = pad_to(np.concatenate([[START_ID], pixels[:-1]]), max_len, truncate=None, what="an image")
  targets_L, _ = pad_to(pixels, max_len, truncate=None, what="an image")
  return {"tokens": tokens_L, "mask": mask_L, "targets": targets_L, "weights": mask_L.astype(np.float32)}


def downsample(image_HxW: np.ndarray, factor: int) -> np.ndarray:
  """The mean of each factor × factor block of a grey uint8 image, rounded half up: (H/f, W/f) uint8. H and W must
  be multiples of factor."""
  image_HxW = np.asarray(image_HxW)
  h, w = image_HxW.shape[:2]
  if image_HxW.ndim != 2 or h % factor or w % factor:
    raise UserError(
      f"cannot downsample an image of shape {image_HxW.shape} by {factor}: a grey image whose sides "
      f"are multiples of {factor} is needed"
    )
  blocks = image_HxW.astype(np.int64).reshape(h // factor, factor, w // factor, factor).sum(axis=(1, 3))
  n = factor * factor
  return ((2 * blocks + n) // (2 * n)).astype(np.uint8)  # floor(sum / n + 1/2) in integers


def encode_autoregressive_half(example: dict, max_len: int) -> dict[str, np.ndarray]:
  """encode_autoregressive of the image at half resolution (`downsample` by 2)."""
  return encode_autoregressive({**example, "image": downsample(np.asarray(example["image"]), 2)}, max_len)


@dataclasses.dataclass
class FashionMnistConfig(tfds.core.BuilderConfig):
  max_examples: tuple[int | None, int | None, int | None] = (None, None, None)  # train, validation, test


class FashionMnistIdx(tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST from local idx files; prepare with file_format="array_record", read with tfds.data_source."""

  name = "fashion_mnist_idx"
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
    FashionMnistConfig(name="full", description="55k/5k/10k, from the idx files."),
    FashionMnistConfig(
      name="tiny", description="The first 1k/200/200 of full's splits, for smoke runs.", max_examples=(1_000, 200, 200)
    ),
  ]
  DEFAULT_MANUAL_DIR = FASHION_MNIST_DIR  # where Debian's package puts the files; config.data.corpus_dir overrides
  MANUAL_DIR_VARIANTS = ("full", "tiny")
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    f"apt-get install dataset-fashion-mnist (files in {FASHION_MNIST_DIR}), or put "
    "the four idx .gz files in a folder given as config.data.corpus_dir"
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          "image": tfds.features.Tensor(shape=(28, 28), dtype=np.uint8),
          "label": tfds.features.ClassLabel(num_classes=10),
        }
      ),
      homepage="https://github.com/zalandoresearch/fashion-mnist",
    )

  def _split_generators(self, dl_manager):
    root = os.fspath(dl_manager.manual_dir)
    arrays = {}
    for split, (images_file, labels_file) in FASHION_MNIST_FILES.items():
      paths = [os.path.join(root, images_file), os.path.join(root, labels_file)]
      for path in paths:
        if not os.path.exists(path):
          raise UserError(f"Fashion-MNIST: {path} is missing; {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
      images, labels = read_idx(paths[0]), read_idx(paths[1])
      if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
        raise UserError(f"Fashion-MNIST in {root}: images {images.shape} and labels {labels.shape} do not match")
      arrays[split] = (images, labels)
    images, labels = arrays["train"]
    if len(images) <= FASHION_MNIST_VALIDATION:
      raise UserError(
        f"Fashion-MNIST in {root}: {len(images)} training images, need more than "
        f"{FASHION_MNIST_VALIDATION} (the validation split)"
      )
    cut = len(images) - FASHION_MNIST_VALIDATION
    splits = {"train": (images[:cut], labels[:cut]), "validation": (images[cut:], labels[cut:]), "test": arrays["test"]}
    limits = self.builder_config.max_examples
    return {
      split: self._generate_examples(x[:limit], y[:limit]) for (split, (x, y)), limit in zip(splits.items(), limits)
    }

  def _generate_examples(self, images, labels):
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {"image": image, "label": int(label)}

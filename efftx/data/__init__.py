"""Tasks: a TFDS dataset (prepared as array_record), its vocabulary, labels or targets, and its encoder.

`TASKS[config.data.task]` names the task; `config.data.variant` picks the dataset's builder config (ListOps
"small", MQAR "256x16", GLUE "sst2", ...). A task's dataset is either a builder of this package, generated or
read from local files, or a dataset registered in TFDS that a user builds once with
`tfds build <name> --file_format=array_record` (it downloads) — here those are tested under
`tfds.testing.mock_data`. The grain pipeline that reads them is `efftx.data.pipeline`.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import importlib

import numpy as np

from efftx.data import byte_text
from efftx.data import images
from efftx.data import listops
from efftx.data import mqar
from efftx.data import sequence
from efftx.data import tokenizer as tokenizer_lib
from efftx.errors import UserError


@dataclasses.dataclass(frozen=True)
class Task:
  # A builder class of this package, or the name of a registered TFDS dataset ("{variant}" is replaced).
  dataset: type | str
  vocab_size: int | dict[str, int]  # token ids are in [0, vocab_size) (per variant, if a dict)
  num_classes: int | dict[str, int]  # classes of "classify" tasks (per variant, if a dict); 0 otherwise
  # its own objective, a key of efftx.objectives.OBJECTIVES: "classify" (one label per sequence) or "lm" (a
  # target per position: the next token, or the task's own targets); config.data.objective may replace it
  objective: str
  # (raw TFDS example, max_len, truncate) -> {"tokens", "mask"} and {"label"} or {"targets", "weights"}
  encode: Callable[[dict, int, bool], dict[str, np.ndarray]]
  variants: tuple[str, ...] = ()  # registered datasets: the accepted variants (local builders list their own)
  # TFDS split names (slices allowed) for training and evaluation; a dict gives them per variant
  splits: tuple[str, str] | dict[str, tuple[str, str]] = ("train", "validation")
  test_split: str | None = "test"  # the held-out split a paper reports (efftx.evaluate --split=test); None: none
  mask_id: int | None = None  # the [MASK] token: the task's text can be masked-LM pre-training data
  random_ids: tuple[int, int] = (0, 0)  # masked-LM: replacement tokens are drawn from [low, high)
  special_ids: tuple[int, ...] = ()  # masked-LM: never chosen (e.g. SEP)
  # LM tasks, for sampling: text -> token ids, and token ids -> text
  tokenize: Callable[[bytes], np.ndarray] | None = None
  detokenize: Callable[[np.ndarray], str] | None = None
  token_unit: str | None = None  # next-token LM metrics are bits per <token_unit>
  max_len: int | None = None  # the longest sequence an example holds, if the task has such a limit
  module: str | None = None  # a TFDS module to import before building a registered dataset
  # images whose tokens are their pixels: (height, width, channels), the tokens in raster order (channels
  # interleaved: token (W·y + x)·C + c is channel c of pixel (y, x)), H·W·C of them; None for other tasks
  image_shape: tuple[int, int, int] | None = None
  # text classification tasks: (raw TFDS example) -> (text, second text of a pair or None), what a checkpoint's
  # tokenizer encodes in place of bytes (config.data.tokenizer; `resolve`)
  text: Callable[[dict], tuple[str, str | None]] | None = None
  # tasks that score a few positions per example (MQAR's queries; their batches carry "positions"): how many, per
  # variant; 0: targets at every position
  scored_positions: int | dict[str, int] = 0

  @property
  def local(self) -> bool:
    return not isinstance(self.dataset, str)

  def variant_names(self) -> list[str]:
    return [c.name for c in self.dataset.BUILDER_CONFIGS] if self.local else list(self.variants)

  def tfds_name(self, variant: str) -> str:
    if self.local:
      return f"{self.dataset.name}/{variant}"
    if self.module:
      importlib.import_module(self.module)
    return self.dataset.format(variant=variant)

  def split_names(self, variant: str) -> tuple[str, str]:
    return self.splits[variant] if isinstance(self.splits, dict) else self.splits

  def classes(self, variant: str) -> int:
    return self.num_classes[variant] if isinstance(self.num_classes, dict) else self.num_classes

  def scored(self, variant: str) -> int:
    return self.scored_positions[variant] if isinstance(self.scored_positions, dict) else self.scored_positions

  def vocab(self, variant: str) -> int:
    return self.vocab_size[variant] if isinstance(self.vocab_size, dict) else self.vocab_size


# ------------------------------------------------------------------------------------------------ encoders
def _listops(example, max_len, truncate):
  tokens_L, mask_L = sequence.pad_to(listops.tokenize(example["source"]), max_len, truncate, "a ListOps example")
  return {"tokens": tokens_L, "mask": mask_L, "label": np.int32(example["label"])}


def _listops_alphanumeric(example, max_len, truncate):
  tokens_L, mask_L = sequence.pad_to(
    listops.tokenize_alphanumeric(example["source"]), max_len, truncate, "a ListOps example"
  )
  return {"tokens": tokens_L, "mask": mask_L, "label": np.int32(example["label"])}


def _byte_lm(example, max_len, truncate):
  del truncate  # a training sequence is the first max_len bytes of its record, by design
  record = np.asarray(example["bytes"]).tobytes()[:max_len]
  return sequence.next_token(*sequence.pad_to(byte_text.tokenize(record), max_len, False, "a record"))


def _mqar(example, max_len, truncate):
  del truncate  # never: a cut example loses queries
  return mqar.encode(example, max_len)


def _text_classify(example, max_len, truncate):
  tokens_L, mask_L = sequence.pad_to(byte_text.tokenize(example["text"]), max_len, truncate, "a text")
  return {"tokens": tokens_L, "mask": mask_L, "label": np.int32(example["label"])}


# GLUE's text fields: a pair joined by SEP (the first pair the example has), or one sentence.
_GLUE_PAIRS = (
  ("sentence1", "sentence2"),
  ("question1", "question2"),
  ("premise", "hypothesis"),
  ("question", "sentence"),
)
_GLUE_VARIANTS = ("cola", "sst2", "mrpc", "qqp", "mnli", "qnli", "rte", "wnli")
# Training examples per GLUE task (TFDS glue/*, train split): the fine-tuning configs count epochs with them.
GLUE_TRAIN_EXAMPLES = {
  "cola": 8_551,
  "sst2": 67_349,
  "mrpc": 3_668,
  "qqp": 363_846,
  "mnli": 392_702,
  "qnli": 104_743,
  "rte": 2_490,
  "wnli": 635,
}


def _glue_text(example):
  pair = next((p for p in _GLUE_PAIRS if p[0] in example and p[1] in example), None)
  return (example[pair[0]], example[pair[1]]) if pair else (example["sentence"], None)


def _label(example):
  label = int(example["label"])
  if label < 0:
    raise UserError("GLUE test splits have no labels (label -1): evaluate on a validation split")
  return np.int32(label)


def _glue(example, max_len, truncate):
  first, second = _glue_text(example)
  ids = byte_text.tokenize_pair(first, second) if second is not None else byte_text.tokenize(first)
  tokens_L, mask_L = sequence.pad_to(ids, max_len, truncate, "a GLUE example")
  return {"tokens": tokens_L, "mask": mask_L, "label": _label(example)}


def _tokenized(example, max_len, truncate, *, text, tokenizer: tokenizer_lib.Tokenizer):
  """A text example through a checkpoint's tokenizer: [CLS] a [SEP] (b [SEP]) with token types, padded with the
  tokenizer's pad id; cut longest first when config.data.truncate, else refused when too long."""
  first, second = text(example)
  ids_N, types_N = tokenizer.encode(first, second, max_len if truncate else None)
  tokens_L, mask_L = sequence.pad_to(ids_N, max_len, truncate, "a text", pad_id=tokenizer.pad_id)
  types_L, _ = sequence.pad_to(types_N, max_len, truncate, "a text")
  return {"tokens": tokens_L, "mask": mask_L, "token_types": types_L, "label": _label(example)}


def _pixels_classify(example, max_len, truncate):
  del truncate  # an image is never cut
  return images.encode_classify(example, max_len)


def _pixels_classify_rgb(example, max_len, truncate):
  del truncate
  return images.encode_classify_rgb(example, max_len)


def _imagenet(example, max_len, truncate):
  del truncate
  return images.encode_imagenet(example, max_len)


def _pixels_autoregressive(example, max_len, truncate):
  del truncate
  return images.encode_autoregressive(example, max_len)


def _pixels_autoregressive_half(example, max_len, truncate):
  del truncate
  return images.encode_autoregressive_half(example, max_len)


_BYTE_MLM = {"mask_id": byte_text.MASK_ID, "random_ids": (1, 257), "special_ids": (byte_text.SEP_ID,)}

TASKS = {
  "listops": Task(
    listops.ListOps,
    vocab_size=len(listops.VOCAB),
    num_classes=listops.NUM_CLASSES,
    objective="classify",
    encode=_listops,
  ),
  # The same data as LRA's published numbers saw it: LRA's tokenizer dropped the brackets
  # (google-research/long-range-arena#14).
  "listops_alphanumeric": Task(
    listops.ListOps,
    vocab_size=len(listops.VOCAB),
    num_classes=listops.NUM_CLASSES,
    objective="classify",
    encode=_listops_alphanumeric,
  ),
  "mqar": Task(
    mqar.Mqar,
    vocab_size={c.name: c.vocab_size for c in mqar.Mqar.BUILDER_CONFIGS},
    num_classes=0,
    objective="lm",
    encode=_mqar,
    scored_positions={c.name: c.num_kv for c in mqar.Mqar.BUILDER_CONFIGS},
  ),
  "bytes": Task(
    byte_text.ByteText,
    vocab_size=byte_text.VOCAB_SIZE,
    num_classes=0,
    objective="lm",
    encode=_byte_lm,
    tokenize=byte_text.tokenize,
    detokenize=byte_text.decode_tokens,
    token_unit="byte",
    max_len=byte_text.RECORD_LEN,
    **_BYTE_MLM,
  ),
  "fashion_mnist": Task(
    images.FashionMnistIdx,
    vocab_size=images.PIXEL_VOCAB,
    num_classes=10,
    objective="classify",
    encode=_pixels_classify,
    image_shape=(28, 28, 1),
  ),
  "fashion_mnist_ar": Task(
    images.FashionMnistIdx,
    vocab_size=images.AR_VOCAB,
    num_classes=0,
    objective="lm",
    encode=_pixels_autoregressive,
    token_unit="dim",
  ),
  # The same at 14 × 14 (2 × 2 blocks averaged): 196 tokens, a density-estimation task trained to convergence
  # on a CPU.
  "fashion_mnist_ar_14": Task(
    images.FashionMnistIdx,
    vocab_size=images.AR_VOCAB,
    num_classes=0,
    objective="lm",
    encode=_pixels_autoregressive_half,
    token_unit="dim",
  ),
  # LRA Text: IMDb reviews as bytes, cut at max_len (LRA: 1,000 in its configs, 4K in the paper); LRA
  # evaluates on the test split (IMDb has no validation split).
  "imdb_bytes": Task(
    "imdb_reviews/{variant}",
    vocab_size=byte_text.VOCAB_SIZE,
    num_classes=2,
    objective="classify",
    encode=_text_classify,
    variants=("plain_text",),
    splits=("train", "test"),
    text=lambda example: (example["text"], None),
    **_BYTE_MLM,
  ),
  # LRA Image: CIFAR-10 in grey, 1,024 tokens; LRA trains on train[:90%] and validates on train[90%:].
  "cifar10_grey": Task(
    "cifar10",
    vocab_size=images.PIXEL_VOCAB,
    num_classes=10,
    objective="classify",
    encode=_pixels_classify,
    variants=("default",),
    splits=("train[:90%]", "train[90%:]"),
    image_shape=(32, 32, 1),
  ),
  # CIFAR-10 in colour for patch models (ViT): RGB sub-pixels interleaved, 3,072 tokens; cifar10_grey's splits.
  "cifar10": Task(
    "cifar10",
    vocab_size=images.PIXEL_VOCAB,
    num_classes=10,
    objective="classify",
    encode=_pixels_classify_rgb,
    variants=("default",),
    splits=("train[:90%]", "train[90%:]"),
    image_shape=(32, 32, 3),
  ),
  # ImageNet-1k (ILSVRC 2012) through DeiT's evaluation transform on every split: 224·224·3 = 150,528 tokens (no
  # training augmentation: efftx.data.images.encode_imagenet). Its two tar files are downloaded by hand into
  # <data_dir>/downloads/manual (TFDS's manual_dir); papers report the validation split (no public test labels).
  "imagenet": Task(
    "imagenet2012",
    vocab_size=images.PIXEL_VOCAB,
    num_classes=1000,
    objective="classify",
    encode=_imagenet,
    variants=("default",),
    splits=("train", "validation"),
    test_split=None,
    image_shape=(images.IMAGENET_CROP, images.IMAGENET_CROP, 3),
  ),
  # AFT's CIFAR-10 density estimation: RGB sub-pixels, 3,072 tokens, bits per dim on the test split.
  "cifar10_ar": Task(
    "cifar10",
    vocab_size=images.AR_VOCAB,
    num_classes=0,
    objective="lm",
    encode=_pixels_autoregressive,
    variants=("default",),
    splits=("train", "test"),
    token_unit="dim",
  ),
  # FNet's GLUE fine-tuning, byte-level (FNet itself uses a SentencePiece vocabulary); MNLI validates on
  # validation_matched. STS-B (regression) is not included.
  "glue": Task(
    "glue/{variant}",
    vocab_size=byte_text.VOCAB_SIZE,
    num_classes={v: 3 if v == "mnli" else 2 for v in _GLUE_VARIANTS},
    objective="classify",
    encode=_glue,
    variants=_GLUE_VARIANTS,
    splits={
      "mnli": ("train", "validation_matched"),
      **{v: ("train", "validation") for v in _GLUE_VARIANTS if v != "mnli"},
    },
    module="tensorflow_datasets.text.glue",
    test_split=None,
    text=_glue_text,
    **_BYTE_MLM,
  ),
}


def task_of(config) -> Task:
  """The run's task: TASKS[config.data.task], encoding its text with config.data.tokenizer when one is named, over
  config.data.vocab_size embedding rows when that is set."""
  return resolve(config.data.task, config.data.tokenizer, config.data.vocab_size)


@functools.lru_cache(maxsize=16)
def resolve(name: str, tokenizer: str = "", vocab_size: int = 0) -> Task:
  """TASKS[name] with its text encoded by the tokenizer at `tokenizer` ("": the task's own encoding), and
  vocab_size embedding rows (0: the vocabulary's own size). Raises UserError for a task with no text."""
  task = TASKS[name]
  if tokenizer:
    if task.text is None:
      raise UserError(
        f"config.data.tokenizer is set, but task '{name}' has no text to tokenize; text tasks: "
        f"{', '.join(n for n, t in TASKS.items() if t.text)}"
      )
    tok = tokenizer_lib.load(tokenizer)
    mlm = {"mask_id": tok.mask_id, "random_ids": (0, tok.vocab_size), "special_ids": tok.special_ids}
    task = dataclasses.replace(
      task, vocab_size=tok.vocab_size, **mlm, encode=functools.partial(_tokenized, text=task.text, tokenizer=tok)
    )
  if vocab_size:
    own = max(task.vocab_size.values()) if isinstance(task.vocab_size, dict) else task.vocab_size
    if vocab_size < own:
      raise UserError(
        f"config.data.vocab_size={vocab_size} is smaller than the vocabulary of task '{name}' ({own} tokens)"
      )
    task = dataclasses.replace(task, vocab_size=vocab_size)
  return task

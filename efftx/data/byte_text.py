"""Byte-level language modelling over local text (the enwik8 protocol, on text every machine has).

The corpus is one byte string: the files of a folder, sorted by path and concatenated. It is split by byte
offset into contiguous train / validation / test parts (90 / 5 / 5 %, enwik8's 90M/5M/5M scaled to the corpus)
and each part is cut into non-overlapping records of RECORD_LEN bytes. A training sequence is the first max_len
bytes of a record (max_len ≤ RECORD_LEN). Report bits per byte.

The byte vocabulary, shared by every byte-level text task (LM, LRA text, GLUE), so that a model pre-trained on
one fine-tunes on another: 0 padding, byte b → b + 1, SEP_ID between the two texts of a pair, MASK_ID for
masked-LM pre-training.

Builder configs: "stdlib" — the Python standard library's .py sources of the running interpreter (~31 MB,
present on every machine); "files" — every file under the folder given as config.data.corpus_dir (e.g. Debian's
dict-gcide text, or enwik8 unzipped: a file is a file). Prepare a different folder into a different data_dir.
"""

from __future__ import annotations

import os
import sysconfig

import numpy as np
import tensorflow_datasets as tfds

from efftx.errors import UserError

RECORD_LEN = 1024
SEP_ID = 257
MASK_ID = 258
VOCAB_SIZE = 259
SPLITS = (("train", 0.90), ("validation", 0.05), ("test", 0.05))


def stdlib_dir() -> str:
  return sysconfig.get_paths()["stdlib"]


def corpus_files(root: str, suffix: str = "") -> list[str]:
  """Files under root, sorted, skipping installed packages and caches."""
  paths = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in ("site-packages", "dist-packages", "__pycache__"))
    paths += [os.path.join(folder, f) for f in sorted(files) if f.endswith(suffix)]
  return paths


def split_records(corpus: bytes) -> dict[str, np.ndarray]:
  """{split: uint8[num_records, RECORD_LEN]} cut from contiguous byte ranges of the corpus."""
  out, start = {}, 0
  for i, (split, fraction) in enumerate(SPLITS):
    end = len(corpus) if i == len(SPLITS) - 1 else start + int(len(corpus) * fraction)
    part = np.frombuffer(corpus[start:end], np.uint8)
    n = len(part) // RECORD_LEN
    out[split] = part[: n * RECORD_LEN].reshape(n, RECORD_LEN)
    start = end
  return out


def tokenize(text: bytes | str) -> np.ndarray:
  if isinstance(text, str):
    text = text.encode("utf-8")
  return np.frombuffer(text, np.uint8).astype(np.int32) + 1


def tokenize_pair(first: bytes | str, second: bytes | str) -> np.ndarray:
  """`first SEP second`, the input of a sentence-pair task."""
  return np.concatenate([tokenize(first), [SEP_ID], tokenize(second)]).astype(np.int32)


def decode_tokens(tokens: np.ndarray) -> str:
  return bytes(int(t) - 1 for t in tokens if 0 < t <= 256).decode("utf-8", errors="replace")


class ByteText(tfds.core.GeneratorBasedBuilder):
  """Byte-level text from local files; prepare with file_format="array_record" and read with tfds.data_source."""

  name = "byte_text"
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
    tfds.core.BuilderConfig(name="stdlib", description="The Python standard library's .py sources."),
    tfds.core.BuilderConfig(name="files", description="Every file under the manual dir (config.data.corpus_dir)."),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = "give a folder of text files as config.data.corpus_dir"
  MANUAL_DIR_VARIANTS = ("files",)  # the variants that read config.data.corpus_dir

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict({"bytes": tfds.features.Tensor(shape=(RECORD_LEN,), dtype=np.uint8)}),
    )

  def _split_generators(self, dl_manager):
    if self.builder_config.name == "stdlib":
      paths = corpus_files(stdlib_dir(), ".py")
    else:
      root = dl_manager.manual_dir
      if not root or not os.path.isdir(root):
        raise UserError(f"byte_text/files: config.data.corpus_dir='{root}' is not a folder")
      paths = corpus_files(os.fspath(root))
    corpus = b"".join(open(p, "rb").read() for p in paths)
    if len(corpus) < 20 * RECORD_LEN:
      raise UserError(
        f"byte_text: the corpus has {len(corpus)} bytes in {len(paths)} files; it needs at least "
        f"{20 * RECORD_LEN} (a {RECORD_LEN}-byte record in each of validation and test)"
      )
    return {split: self._generate_examples(records) for split, records in split_records(corpus).items()}

  def _generate_examples(self, records_NxR):
    for i, record in enumerate(records_NxR):
      yield i, {"bytes": record}

"""MQAR — multi-query associative recall (Zoology, Arora et al., ICLR 2024), generated as Zoology generates it
(zoology/data/multiquery_ar.py `multiquery_ar`, seeds from zoology/data/utils.py `prepare_data`).

An example of length L with kv pairs: the first 2·kv tokens are `k1 v1 … k_kv v_kv` (keys distinct, from
[1, V/2); values distinct, from [V/2, V)). The rest holds each key once more as a query, at an even offset of
the query region chosen without replacement with probability ∝ a·i^(a−1) (a = 0.01 favours near slots); every
other slot is 0, a blank token (Figure 2's setting, random_non_queries=False). As in Zoology, the answers are
labels only, never inputs: the target at a query position is its key's value, every other position is ignored.
Accuracy is the fraction of queries answered.

The draws are Zoology's, in its order (numpy's legacy RandomState): with the same seed an example is the one
Zoology trains on, bit for bit. Zoology's data seed (DataConfig.seed, 123) draws one seed for its training set
and one for its test set; here the train split is Zoology's training set, the validation split its test set (the
set Figure 2 reports and stops early on), and the test split a third set from the next test seed, for judging
a study's choices on data they were not chosen on.

Builder configs "LxKV": Figure 2's settings 64x4, 128x8, 256x16, 512x64 (vocabulary 8192; 100k train, 3k
validation, 3k test); "64x4_v256", the task of Zoology's own first example (zoology/experiments/examples/basic.py:
vocabulary 256, length 64, 4 pairs, 10k train and 1k test examples; here also 1k test); "tiny" (64x4, 2k/256/256)
for tests.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow_datasets as tfds
import tqdm

from efftx.data.sequence import pad_to
from efftx.errors import UserError

VOCAB_SIZE = 8192
POWER_A = 0.01
DATA_SEED = 123  # Zoology's DataConfig.seed
MAX_SEED = 2**32  # zoology/data/utils.py prepare_data


def split_seeds(data_seed: int = DATA_SEED) -> dict[str, int]:
  """Zoology's per-segment seeds: np.random.seed(data_seed), one training seed from [0, 2³¹), then test seeds from
  [2³¹, 2³²) — its test set's for validation, the next one for test."""
  rs = np.random.RandomState(data_seed)
  train = rs.randint(0, MAX_SEED // 2, size=1)
  validation, test = rs.randint(MAX_SEED // 2, MAX_SEED, size=2)
  return {"train": int(train[0]), "validation": int(validation), "test": int(test)}


def generate(
  num_examples: int, *, seq_len: int, num_kv: int, seed: int, vocab_size: int = VOCAB_SIZE, power_a: float = POWER_A
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_NxL, targets_NxL) int32; targets are 0 wherever the position is not a query. The draws are Zoology's:
  every example's keys, then every example's values, then every example's query slots, from RandomState(seed)."""
  if seq_len % 2 or 4 * num_kv > seq_len:
    raise UserError(f"MQAR needs an even length and 4·kv ≤ length, not length {seq_len}, kv {num_kv}")
  if num_kv >= vocab_size // 2 or vocab_size <= seq_len:
    raise UserError(
      f"MQAR: {num_kv} distinct keys must fit in the key range [1, {vocab_size // 2}), and the vocabulary "
      f"{vocab_size} must exceed the length {seq_len}"
    )
  rs = np.random.RandomState(seed)
  context = 2 * num_kv
  slots = (seq_len - context) // 2  # query slots: even offsets of the query region
  p = power_a * np.arange(1, slots + 1) ** (power_a - 1)
  p = p / p.sum()
  key_choices = np.arange(1, vocab_size // 2)
  value_choices = np.arange(vocab_size // 2, vocab_size)
  progress = tqdm.tqdm(total=3 * num_examples, desc="MQAR: generating", unit="draw", disable=None, leave=False)

  def draw(choices, **kwargs) -> np.ndarray:
    out = np.empty((num_examples, num_kv), np.int64)
    for n in range(num_examples):  # one call per example, as np.apply_along_axis makes them
      out[n] = rs.choice(choices, replace=False, size=num_kv, **kwargs)
      progress.update()
    return out

  with progress:
    keys_NxK = draw(key_choices)
    values_NxK = draw(value_choices)
    offsets_NxK = context + 2 * draw(np.arange(slots), p=p)
  tokens_NxL = np.zeros((num_examples, seq_len), np.int32)
  targets_NxL = np.zeros((num_examples, seq_len), np.int32)
  rows = np.arange(num_examples)[:, None]
  tokens_NxL[:, 0:context:2] = keys_NxK
  tokens_NxL[:, 1:context:2] = values_NxK
  tokens_NxL[rows, offsets_NxK] = keys_NxK
  targets_NxL[rows, offsets_NxK] = values_NxK
  return tokens_NxL, targets_NxL


def encode(example: dict, max_len: int) -> dict[str, np.ndarray]:
  """Never truncated: a cut example would lose queries. The loss looks at the kv query positions alone, so the
  example names them ("positions", K = kv) with their targets and weights (length K): the model computes logits
  there only (B×K×8192 instead of B×L×8192)."""
  tokens_L, mask_L = pad_to(example["tokens"], max_len, truncate=None, what="an MQAR example")
  targets = np.asarray(example["targets"], np.int32)
  positions_K = np.flatnonzero(targets).astype(np.int32)
  return {
    "tokens": tokens_L,
    "mask": mask_L,
    "positions": positions_K,
    "targets": targets[positions_K],
    "weights": np.ones(len(positions_K), np.float32),
  }


@dataclasses.dataclass
class MqarConfig(tfds.core.BuilderConfig):
  seq_len: int = 64
  num_kv: int = 4
  num_train: int = 100_000
  num_validation: int = 3_000
  num_test: int = 3_000
  data_seed: int = DATA_SEED
  vocab_size: int = VOCAB_SIZE


def _setting(seq_len: int, num_kv: int, vocab_size: int = VOCAB_SIZE, **sizes) -> MqarConfig:
  return MqarConfig(
    name=f"{seq_len}x{num_kv}" + (f"_v{vocab_size}" if vocab_size != VOCAB_SIZE else ""),
    description=f"length {seq_len}, {num_kv} key-value pairs, vocabulary {vocab_size}",
    seq_len=seq_len,
    num_kv=num_kv,
    vocab_size=vocab_size,
    **sizes,
  )


class Mqar(tfds.core.GeneratorBasedBuilder):
  """MQAR generated locally; prepare with file_format="array_record" and read with tfds.data_source."""

  name = "mqar"
  VERSION = tfds.core.Version("2.0.0")
  RELEASE_NOTES = {  # noqa: RUF012
    "2.0.0": "Zoology's draws and seeds, bit for bit; 512x64 (Figure 2) replaces 512x32 and 1024x64.",
    "1.0.0": "Zoology's distribution from numpy's Generator, one seed per split.",
  }
  BUILDER_CONFIGS = [
    _setting(64, 4),
    _setting(128, 8),
    _setting(256, 16),
    _setting(512, 64),
    _setting(64, 4, vocab_size=256, num_train=10_000, num_validation=1_000, num_test=1_000),
    MqarConfig(
      name="tiny", description="64x4, 2k/256/256, for tests", num_train=2_000, num_validation=256, num_test=256
    ),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    L = self.builder_config.seq_len
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          "tokens": tfds.features.Tensor(shape=(L,), dtype=np.int16),
          "targets": tfds.features.Tensor(shape=(L,), dtype=np.int16),
        }
      ),
      homepage="https://github.com/HazyResearch/zoology",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # generated
    c = self.builder_config
    sizes = {"train": c.num_train, "validation": c.num_validation, "test": c.num_test}
    seeds = split_seeds(c.data_seed)
    return {
      split: self._generate_examples(
        *generate(size, seq_len=c.seq_len, num_kv=c.num_kv, seed=seeds[split], vocab_size=c.vocab_size)
      )
      for split, size in sizes.items()
    }

  def _generate_examples(self, tokens_NxL, targets_NxL):
    for i, (tokens, targets) in enumerate(zip(tokens_NxL, targets_NxL)):
      yield i, {"tokens": tokens.astype(np.int16), "targets": targets.astype(np.int16)}

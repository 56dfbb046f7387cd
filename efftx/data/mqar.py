"""MQAR — multi-query associative recall (Zoology, Arora et al., 2023), generated as Zoology's multiquery_ar
(zoology/data/associative_recall.py) generates it.

An example of length L with kv pairs: the first 2·kv tokens are `k1 v1 … k_kv v_kv` (keys distinct, from
[1, V/2); values distinct, from [V/2, V)). The rest holds each key once more as a query, at an even offset of
the query region chosen without replacement with probability ∝ a·i^(a−1) (a = 0.01 favours near slots); every
other slot is 0, a blank token (Zoology's Figure-2 setting, random_non_queries=False). As in Zoology's
generator, the answers are labels only, never inputs: the target at a query position is its key's value, every
other position is ignored (weight 0). Accuracy is the fraction of queries answered.

Builder configs "LxKV": Zoology's Figure-2 settings 64x4, 128x8, 256x16 (vocabulary 8192; 100k train, 3k
validation, 3k test) and longer ones 512x32, 1024x64 (same kv/L ratio); "64x4_v256", the task of Zoology's own
first example (zoology/experiments/examples/basic.py: vocabulary 256, length 64, 4 pairs, 10k train and 1k
test examples; here also 1k validation), the setting a CPU can train attention to solve; "tiny" (64x4, 2k/256/256)
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


def generate(
  num_examples: int, *, seq_len: int, num_kv: int, seed: int, vocab_size: int = VOCAB_SIZE, power_a: float = POWER_A
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_NxL, targets_NxL) int32; targets are 0 wherever the position is not a query."""
  if seq_len % 2 or 4 * num_kv > seq_len:
    raise UserError(f"MQAR needs an even length and 4·kv ≤ length, not length {seq_len}, kv {num_kv}")
  if num_kv >= vocab_size // 2:
    raise UserError(f"MQAR: {num_kv} distinct keys do not fit in the key range [1, {vocab_size // 2})")
  rng = np.random.default_rng(seed)
  context = 2 * num_kv
  slots = (seq_len - context) // 2  # query slots: even offsets of the query region
  p = power_a * np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1)
  p /= p.sum()
  tokens_NxL = np.zeros((num_examples, seq_len), np.int32)
  targets_NxL = np.zeros((num_examples, seq_len), np.int32)
  rows = np.arange(num_examples)[:, None]
  keys_NxK = np.empty((num_examples, num_kv), np.int32)
  values_NxK = np.empty((num_examples, num_kv), np.int32)
  offsets_NxK = np.empty((num_examples, num_kv), np.int64)
  for n in tqdm.trange(num_examples, desc="MQAR: generating", unit="ex", disable=None, leave=False):
    keys_NxK[n] = rng.choice(np.arange(1, vocab_size // 2), size=num_kv, replace=False)
    values_NxK[n] = rng.choice(np.arange(vocab_size // 2, vocab_size), size=num_kv, replace=False)
    offsets_NxK[n] = context + 2 * rng.choice(slots, size=num_kv, replace=False, p=p)
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
  seed: int = 0
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
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
    _setting(64, 4),
    _setting(128, 8),
    _setting(256, 16),
    _setting(512, 32),
    _setting(1024, 64),
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
    # One seed per split: examples are random, so the splits share no structure (collisions are negligible).
    return {
      split: self._generate_examples(
        *generate(size, seq_len=c.seq_len, num_kv=c.num_kv, seed=c.seed + i, vocab_size=c.vocab_size)
      )
      for i, (split, size) in enumerate(sizes.items())
    }

  def _generate_examples(self, tokens_NxL, targets_NxL):
    for i, (tokens, targets) in enumerate(zip(tokens_NxL, targets_NxL)):
      yield i, {"tokens": tokens.astype(np.int16), "targets": targets.astype(np.int16)}

"""ListOps (Long Range Arena): nested list operations, 10-way classification.

The generator follows LRA's data script (lra_benchmarks/data/listops.py): a random tree of `[MIN`, `[MAX`,
`[MED`, `[SM` operators over digits, closed by `]`; length counts operators, `]` and digits; trees are kept when
`min_length < length < max_length`, duplicates are dropped, and the splits are cut from one deduplicated pool, so
no expression appears in two splits. The label is the value of the tree.

The TFDS builder stores each example as its source string (`"[MAX 2 9 [MIN 4 7 ] 0 ]"`) and its label; the
input pipeline tokenises: `tokenize` as LRA's data files are written (whitespace-split, one id per token), or
`tokenize_alphanumeric` as LRA's own input pipeline read them (task "listops_alphanumeric").
"""

from __future__ import annotations

import dataclasses
import random
import statistics

import numpy as np
import tensorflow_datasets as tfds
import tqdm

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
DIGITS = tuple(str(d) for d in range(10))
END = "]"
PAD_ID = 0
# id 0 is padding; the 15 real tokens follow.
VOCAB = ("<pad>",) + DIGITS + OPERATORS + (END,)
TOKEN_IDS = {token: i for i, token in enumerate(VOCAB)}
NUM_CLASSES = 10
VALUE_P = 0.25  # below max depth, a node is an operator with probability 0.25, a digit otherwise


def _apply(op: str, values: list[int]) -> int:
  if op == "[MIN":
    return min(values)
  if op == "[MAX":
    return max(values)
  if op == "[MED":
    return int(statistics.median(values))  # halves truncate, as LRA's int(np.median)
  return sum(values) % 10  # [SM


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple[list[str], int]:
  """One random tree as (tokens, value); the draws follow LRA's generate_tree."""
  r = rng.random() if depth < max_depth else 1.0
  if r > VALUE_P:
    digit = rng.choice(DIGITS)
    return [digit], int(digit)
  num_args = rng.randint(2, max_args)  # inclusive, as Python's random.randint
  tokens, values = [], []
  for _ in range(num_args):
    sub_tokens, sub_value = _tree(rng, depth + 1, max_depth, max_args)
    tokens += sub_tokens
    values.append(sub_value)
  op = rng.choice(OPERATORS)
  return [op] + tokens + [END], _apply(op, values)


def generate(
  num_examples: int,
  *,
  seed: int,
  min_length: int,
  max_length: int,
  max_depth: int = 10,
  max_args: int = 10,
) -> list[tuple[str, int]]:
  """`num_examples` distinct (source, label) pairs with min_length < length < max_length, in draw order."""
  rng = random.Random(seed)
  seen: set[str] = set()
  examples = []
  bar = tqdm.tqdm(total=num_examples, desc="ListOps: generating", unit="ex", disable=None, leave=False)
  while len(examples) < num_examples:
    tokens, value = _tree(rng, 1, max_depth, max_args)
    if not min_length < len(tokens) < max_length:
      continue
    source = " ".join(tokens)
    if source in seen:
      continue
    seen.add(source)
    examples.append((source, value))
    bar.update()
  bar.close()
  return examples


def tokenize(source: str | bytes) -> np.ndarray:
  """Whitespace-split, one id per token: the tokens LRA's data files hold."""
  if isinstance(source, bytes):
    source = source.decode()
  return np.array([TOKEN_IDS[t] for t in source.split()], np.int32)


def tokenize_alphanumeric(source: str | bytes) -> np.ndarray:
  """The tokenisation LRA's published numbers were trained with (google-research/long-range-arena#14): its input
  pipeline's tokenizer kept alphanumeric runs only, so `[MAX` became the operator `MAX` and every closing `]`
  vanished — the tree's structure is then ambiguous. Operators keep their ids (`MAX` ↦ the id of `[MAX`); `]`
  never appears."""
  if isinstance(source, bytes):
    source = source.decode()
  words = ("".join(c for c in token if c.isalnum()) for token in source.split())
  return np.array([TOKEN_IDS[_OPERATOR_BY_NAME.get(w, w)] for w in words if w], np.int32)


_OPERATOR_BY_NAME = {op.lstrip("["): op for op in OPERATORS}


@dataclasses.dataclass
class ListOpsConfig(tfds.core.BuilderConfig):
  """A ListOps variant: split sizes and the open interval of lengths kept."""

  num_train: int = 96_000
  num_validation: int = 2_000
  num_test: int = 2_000
  min_length: int = 500
  max_length: int = 2_000
  max_depth: int = 10
  max_args: int = 10
  seed: int = 0


class ListOps(tfds.core.GeneratorBasedBuilder):
  """ListOps generated locally; prepare with file_format="array_record" and read with tfds.data_source."""

  name = "listops"
  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [
    # LRA's ListOps: 96K/2K/2K, 500 < length < 2000. ~1.3M draws; about a minute of plain Python.
    ListOpsConfig(name="full", description="LRA ListOps: 96K/2K/2K, 500 < length < 2000."),
    # Short expressions for CPU runs: the quickstart trains on this in minutes.
    ListOpsConfig(
      name="small",
      description="20K/1K/1K, 10 < length < 128.",
      num_train=20_000,
      num_validation=1_000,
      num_test=1_000,
      min_length=10,
      max_length=128,
    ),
    # For tests: under a second to prepare. Trees of depth ≤ 6 (LRA's 10 draws mostly trees far over 48 tokens,
    # each drawn whole before it is rejected): generated 7× faster, the same mean length and spread of labels.
    ListOpsConfig(
      name="tiny",
      description="1K/200/200, 5 < length < 48, depth ≤ 6.",
      num_train=1_000,
      num_validation=200,
      num_test=200,
      min_length=5,
      max_length=48,
      max_depth=6,
    ),
  ]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=__doc__,
      features=tfds.features.FeaturesDict(
        {
          "source": tfds.features.Text(),
          "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
        }
      ),
      homepage="https://github.com/google-research/long-range-arena",
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download: the data is generated
    c = self.builder_config
    sizes = {"train": c.num_train, "validation": c.num_validation, "test": c.num_test}
    pool = generate(
      sum(sizes.values()),
      seed=c.seed,
      min_length=c.min_length,
      max_length=c.max_length,
      max_depth=c.max_depth,
      max_args=c.max_args,
    )
    splits, start = {}, 0
    for split, size in sizes.items():
      splits[split] = self._generate_examples(pool[start : start + size])
      start += size
    return splits

  def _generate_examples(self, examples):
    for i, (source, label) in enumerate(examples):
      yield i, {"source": source, "label": label}

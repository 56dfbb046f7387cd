"""The ListOps generator and TFDS builder, checked by an independent evaluator."""

import collections

import numpy as np
import pytest

from efftx.data import TASKS
from efftx.data import listops


def _evaluate(tokens: list[str]) -> int:
  """A stack evaluator written from the task's definition, independent of the generator's recursion."""
  stack = [[]]
  for token in tokens:
    if token.startswith("["):
      stack.append([token])
    elif token == "]":
      op, *args = stack.pop()
      assert 2 <= len(args) <= 10, (op, args)
      value = {"[MIN": min(args), "[MAX": max(args), "[MED": int(np.median(args)), "[SM": sum(args) % 10}[op]
      stack[-1].append(value)
    else:
      stack[-1].append(int(token))
  assert len(stack) == 1 and len(stack[0]) == 1
  return stack[0][0]


def _depth(tokens: list[str]) -> int:
  depth = deepest = 1
  for token in tokens:
    depth += token.startswith("[")
    deepest = max(deepest, depth)
    depth -= token == "]"
  return deepest


def test_generated_examples_follow_the_spec():
  examples = listops.generate(300, seed=0, min_length=20, max_length=200)
  assert len({s for s, _ in examples}) == 300  # no duplicates
  for source, label in examples:
    tokens = source.split()
    assert 20 < len(tokens) < 200
    assert set(tokens) <= set(listops.VOCAB[1:])
    assert _evaluate(tokens) == label
    assert _depth(tokens) <= 10


def test_generator_is_deterministic_by_seed():
  a = listops.generate(50, seed=3, min_length=10, max_length=100)
  assert a == listops.generate(50, seed=3, min_length=10, max_length=100)
  assert a != listops.generate(50, seed=4, min_length=10, max_length=100)


def test_lra_length_range_and_label_spread():
  examples = listops.generate(200, seed=0, min_length=500, max_length=2000)
  lengths = [len(s.split()) for s, _ in examples]
  assert min(lengths) > 500 and max(lengths) < 2000
  assert len(collections.Counter(label for _, label in examples)) == 10


def test_encode_pads_and_refuses_too_long_unless_truncating():
  encode = TASKS["listops"].encode
  example = encode({"source": b"[MAX 2 9 [MIN 4 7 ] 0 ]", "label": 9}, 12, False)
  ids, mask = example["tokens"], example["mask"]
  assert [listops.VOCAB[i] for i in ids[:9]] == "[MAX 2 9 [MIN 4 7 ] 0 ]".split() and example["label"] == 9
  assert mask.tolist() == [True] * 9 + [False] * 3 and ids[9:].tolist() == [0, 0, 0]
  with pytest.raises(ValueError, match="max_len=5"):
    encode({"source": b"[MAX 2 9 [MIN 4 7 ] 0 ]", "label": 9}, 5, False)
  cut = encode({"source": b"[MAX 2 9 [MIN 4 7 ] 0 ]", "label": 9}, 5, True)
  assert cut["mask"].all() and cut["tokens"].tolist() == ids[:5].tolist()


def test_prepared_tiny_builder_has_disjoint_correct_splits(smoke_config):
  from efftx.data import pipeline  # pylint: disable=g-import-not-at-top

  config = smoke_config()
  pipeline.prepare(config)
  tiny = next(c for c in listops.ListOps.BUILDER_CONFIGS if c.name == "tiny")
  seen = {}
  for split, size in (("train", tiny.num_train), ("validation", tiny.num_validation), ("test", tiny.num_test)):
    source = pipeline.source(config, split)
    assert len(source) == size
    rows = [source[i] for i in range(len(source))]
    seen[split] = {r["source"].decode() for r in rows}
    assert len(seen[split]) == size
    for r in rows:
      tokens = r["source"].decode().split()
      assert tiny.min_length < len(tokens) < tiny.max_length
      assert _evaluate(tokens) == r["label"]
  assert not seen["train"] & seen["validation"] and not seen["train"] & seen["test"]
  assert not seen["validation"] & seen["test"]


def test_alphanumeric_tokenisation_is_what_lra_trained_on():
  """LRA issue #14: the published pipeline's tokenizer split on non-alphanumerics, so brackets vanished. The
  reference here is that rule as a regular expression over the raw source."""
  import re  # pylint: disable=g-import-not-at-top

  source = "[MAX 2 [MIN 9 4 ] [SM 1 [MED 3 8 5 ] ] 0 ]"
  want = re.findall(r"[A-Za-z0-9]+", source)
  got = [listops.VOCAB[i].lstrip("[") for i in listops.tokenize_alphanumeric(source)]
  assert got == want == ["MAX", "2", "MIN", "9", "4", "SM", "1", "MED", "3", "8", "5", "0"]
  assert listops.TOKEN_IDS["]"] not in listops.tokenize_alphanumeric(source)
  # The task encodes the same examples with it; the default task keeps the brackets.
  example = {"source": source, "label": 9}
  short = TASKS["listops_alphanumeric"].encode(example, 16, False)
  full = TASKS["listops"].encode(example, 16, False)
  assert short["mask"].sum() == 12 and full["mask"].sum() == 16 and short["label"] == full["label"] == 9

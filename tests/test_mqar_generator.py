"""efftx's MQAR generator against a port of Zoology's (zoology/data/multiquery_ar.py `multiquery_ar` and the seeds
of zoology/data/utils.py `prepare_data`), written from that code: the same calls to numpy's legacy global
generator, in its order, on its tiled arrays."""

import numpy as np
import pytest

from efftx.data import mqar


def zoology_multiquery_ar(vocab_size, num_examples, input_seq_len, seed, power_a=0.01, num_kv_pairs=8):
  """Zoology's generator with num_passes=1 and random_non_queries=False: (inputs, labels), labels -100 where not
  scored."""
  assert input_seq_len % 2 == 0 and vocab_size > input_seq_len
  assert num_kv_pairs * 4 <= input_seq_len
  np.random.seed(seed)
  context_size = num_kv_pairs * 2
  key_vocab_size = vocab_size // 2
  key_choices = np.arange(1, key_vocab_size)
  value_choices = np.arange(key_vocab_size, vocab_size)
  keys_unshuffled = np.tile(key_choices, (num_examples, 1))
  keys = np.apply_along_axis(np.random.choice, 1, keys_unshuffled, replace=False, size=num_kv_pairs)
  values_unshuffled = np.tile(value_choices, (num_examples, 1))
  values = np.apply_along_axis(np.random.choice, 1, values_unshuffled, replace=False, size=num_kv_pairs)
  kvs = np.zeros((num_examples, context_size), dtype=np.int64)
  kvs[:, 0::2] = keys
  kvs[:, 1::2] = values
  space = (input_seq_len - context_size) // 2
  p = power_a * np.arange(1, space + 1) ** (power_a - 1)
  p = p / p.sum()
  x = np.stack([np.arange(space, dtype=int)] * num_examples)
  gaps = np.apply_along_axis(np.random.choice, axis=1, arr=x, replace=False, p=p, size=num_kv_pairs)
  queries = np.zeros((num_examples, input_seq_len - context_size + 1), dtype=np.int64)
  np.put_along_axis(queries, (gaps * 2), values=keys, axis=1)
  examples = np.concatenate([kvs, queries], axis=1)
  labels = np.full((num_examples, input_seq_len + 1), -100, dtype=np.int64)
  np.put_along_axis(labels, (gaps * 2) + context_size + 1, values=values, axis=1)
  return examples[:, :-1], labels[:, 1:]


def zoology_seeds(seed=123):
  """prepare_data's seeds for one training and (here) two test segments."""
  np.random.seed(seed)
  train = np.random.randint(0, 2**32 // 2, size=1)
  test = np.random.randint(2**32 // 2, 2**32, size=2)
  return int(train[0]), [int(t) for t in test]


@pytest.mark.parametrize("vocab,L,kv", [(8192, 64, 4), (8192, 128, 8), (256, 64, 4), (70, 68, 17)])
def test_examples_are_zoologys_bit_for_bit(vocab, L, kv):
  seed = 2991312382
  tokens, targets = mqar.generate(40, seq_len=L, num_kv=kv, seed=seed, vocab_size=vocab)
  inputs, labels = zoology_multiquery_ar(vocab, 40, L, seed, num_kv_pairs=kv)
  np.testing.assert_array_equal(tokens, inputs)
  np.testing.assert_array_equal(targets, np.where(labels == -100, 0, labels))


def test_split_seeds_are_zoologys_training_and_test_seeds():
  train, (test, next_test) = zoology_seeds(123)
  assert mqar.split_seeds(123) == {"train": train, "validation": test, "test": next_test}
  assert len({train, test, next_test}) == 3


def test_the_properties_a_reader_can_check():
  """Keys in [1, V/2) and values in [V/2, V), distinct within an example; queries at even offsets after the
  context, each key once; filler 0; the scored positions are the queries, answered by their key's value; and the
  query slots follow p ∝ a·i^(a−1) (a = 0.01): the nearest slot is the likeliest, the farthest the least likely."""
  V, L, kv, N = 8192, 64, 4, 3000
  tokens, targets = mqar.generate(N, seq_len=L, num_kv=kv, seed=1, vocab_size=V)
  keys, values = tokens[:, 0 : 2 * kv : 2], tokens[:, 1 : 2 * kv : 2]
  assert keys.min() >= 1 and keys.max() < V // 2 and values.min() >= V // 2 and values.max() < V
  assert all(len(set(k)) == kv and len(set(v)) == kv for k, v in zip(keys, values))
  rest, rest_targets = tokens[:, 2 * kv :], targets[:, 2 * kv :]
  scored = rest_targets != 0
  assert scored.sum(1).tolist() == [kv] * N
  assert not scored[:, 1::2].any()  # even offsets only
  assert np.all(rest[~scored] == 0)  # filler 0 wherever nothing is asked
  assert np.all(targets[:, : 2 * kv] == 0)  # the context is never scored
  for n in range(0, N, 97):
    answer = dict(zip(keys[n], values[n]))
    assert sorted(rest[n][scored[n]]) == sorted(keys[n])
    assert all(answer[k] == t for k, t in zip(rest[n][scored[n]], rest_targets[n][scored[n]]))
  slots = (L - 2 * kv) // 2
  counts = scored[:, ::2].sum(0)
  p = 0.01 * np.arange(1, slots + 1) ** (0.01 - 1)
  p /= p.sum()
  assert counts[0] == counts.max() and counts[-1] < counts[0] / 4
  assert np.all(np.diff(p) < 0)


def test_encode_scores_only_the_query_positions():
  tokens, targets = mqar.generate(3, seq_len=16, num_kv=2, seed=0, vocab_size=64)
  for t, y in zip(tokens, targets):
    row = mqar.encode({"tokens": t, "targets": y}, 16)
    np.testing.assert_array_equal(row["positions"], np.flatnonzero(y))
    np.testing.assert_array_equal(row["targets"], y[y != 0])
    assert row["weights"].tolist() == [1.0, 1.0]

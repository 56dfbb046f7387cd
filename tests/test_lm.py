"""Causal language modelling: the byte corpus, the next-token loss, training, and sampling through the caches."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
from efftx import sample
from efftx import train
from efftx import trainer
from efftx.data import TASKS
from efftx.data import byte_text
from efftx.data import sequence
from efftx.objectives import OBJECTIVES


def test_byte_records_are_contiguous_disjoint_slices_of_the_corpus():
  corpus = bytes(np.random.default_rng(0).integers(0, 256, size=50 * byte_text.RECORD_LEN + 123, dtype=np.uint8))
  splits = byte_text.split_records(corpus)
  assert [len(splits[s]) for s in ("train", "validation", "test")] == [45, 2, 2]
  offset = 0
  for split, fraction in byte_text.SPLITS:
    records = splits[split]
    assert records.tobytes() == corpus[offset : offset + records.size]  # in order, no gap inside a split
    offset += int(len(corpus) * fraction)


def test_tokens_round_trip_and_next_token_targets():
  example = TASKS["bytes"].encode({"bytes": np.frombuffer("héllo!!".encode(), np.uint8)}, 8, False)
  tokens, mask = example["tokens"], example["mask"]
  assert tokens[0] == ord("h") + 1 and mask.sum() == 8 and byte_text.decode_tokens(tokens) == "héllo!!"[:7]
  assert example["targets"][:7].tolist() == tokens[1:].tolist() and example["weights"].tolist() == [1.0] * 7 + [0.0]
  short = TASKS["bytes"].encode({"bytes": np.frombuffer(b"hi", np.uint8)}, 4, False)
  assert short["tokens"].tolist() == [ord("h") + 1, ord("i") + 1, 0, 0] and short["weights"].tolist() == [1, 0, 0, 0]


def test_lm_loss_is_next_token_cross_entropy_on_real_tokens():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
  tokens = rng.integers(1, 7, size=(2, 5)).astype(np.int32)
  mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  batch = {k: np.stack([sequence.next_token(t, m)[k] for t, m in zip(tokens, mask)]) for k in ("targets", "weights")}
  sums = OBJECTIVES["lm"].loss_sums(jnp.asarray(logits), batch, jnp.ones(2))
  want, count = 0.0, 0
  for b in range(2):
    for t in range(4):
      if mask[b, t + 1]:
        log_probs = logits[b, t] - np.log(np.exp(logits[b, t]).sum())
        want -= log_probs[tokens[b, t + 1]]
        count += 1
  assert float(sums["count"]) == count == 6
  np.testing.assert_allclose(float(sums["loss"]), want, rtol=1e-5)


@pytest.fixture(scope="module")
def trained_lm(tmp_path_factory, data_dir):
  from configs import lm_bytes  # pylint: disable=g-import-not-at-top

  config = lm_bytes.get_config("mixer=aft_simple,smoke")
  config.data.data_dir = data_dir
  config.total_steps, config.eval_every, config.log_every = 80, 80, 80
  config.optim.update(warmup_steps=10, learning_rate=3e-3)
  workdir = str(tmp_path_factory.mktemp("lm"))
  result = train.train_and_evaluate(config, workdir)
  return workdir, result


@pytest.mark.xdist_group("trained_lm")  # one worker trains the module fixture, not both
def test_a_causal_lm_trains_and_reports_bits_per_byte(trained_lm):
  _, result = trained_lm
  assert result["eval_bits_per_byte"] < 5.0, result  # 8 bits is a uniform guess over bytes


@pytest.mark.xdist_group("trained_lm")  # one worker trains the module fixture, not both
def test_greedy_sampling_through_the_caches_matches_the_full_forward_pass(trained_lm):
  workdir, _ = trained_lm
  config, params = sample.load(workdir)
  prompt = TASKS["bytes"].tokenize(b"import json")
  tokens = sample.generate(config, params, prompt, 12, temperature=0.0, top_k=0, rng=jax.random.key(0))
  assert len(tokens) == len(prompt) + 12 and tokens[: len(prompt)].tolist() == prompt.tolist()
  # One causal forward pass over the result: the logits at t - 1 see tokens < t only, so each greedy choice is
  # their argmax (padding, id 0, is never sampled).
  logits = trainer.parts(config).model.apply({"params": params}, jnp.asarray(tokens[None]))
  greedy = np.asarray(jnp.argmax(logits[0, :, 1:], axis=-1)) + 1
  np.testing.assert_array_equal(tokens[len(prompt) :], greedy[len(prompt) - 1 : -1])


@pytest.mark.slow
@pytest.mark.xdist_group("trained_lm")  # one worker trains the module fixture, not both
def test_sample_command(trained_lm):
  workdir, _ = trained_lm
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "efftx.sample",
      f"--workdir={workdir}",
      "--prompt=def ",
      "--length=20",
      "--temperature=0.8",
      "--top_k=10",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.startswith("def ")
  bad = subprocess.run(
    [sys.executable, "-m", "efftx.sample", f"--workdir={os.path.dirname(workdir)}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert bad.returncode != 0 and "Traceback" not in bad.stderr and "config.json" in bad.stderr

"""Causal language modelling: the byte corpus, the next-token loss, training, and sampling through the caches."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import compiled
from conftest import run_in_process
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
  """lm_bytes' smoke model (AFT-simple) trained 30 steps at a high learning rate, checkpointed once at the end."""
  from configs import lm_bytes  # pylint: disable=g-import-not-at-top

  config = lm_bytes.get_config("mixer=aft_simple,smoke")
  config.data.data_dir = data_dir
  config.total_steps = config.eval_every = config.log_every = config.checkpoint_every = 30
  config.optim.update(warmup_steps=5, learning_rate=1e-2)
  workdir = str(tmp_path_factory.mktemp("lm"))
  result = train.train_and_evaluate(config, workdir)
  return workdir, result


@pytest.mark.xdist_group("trained_lm")  # one worker trains the module fixture, not both
def test_a_causal_lm_trains_and_reports_bits_per_byte(trained_lm):
  """Bits per byte well below a uniform guess's 8, and equal to the loss (nats per byte) over ln 2."""
  _, result = trained_lm
  assert result["eval_bits_per_byte"] < 5.0, result  # 8 bits is a uniform guess over bytes
  assert result["eval_bits_per_byte"] == pytest.approx(result["eval_loss"] / np.log(2), rel=1e-5)
  assert result["bits_per_byte"] == pytest.approx(result["loss"] / np.log(2), rel=1e-5)


@pytest.mark.xdist_group("trained_lm")  # one worker trains the module fixture, not both
def test_greedy_sampling_through_the_caches_matches_the_full_forward_pass(trained_lm):
  workdir, _ = trained_lm
  config, params, step = sample.load(workdir)
  assert step == 30
  prompt = TASKS["bytes"].tokenize(b"import json")
  tokens = sample.generate(config, params, prompt, 12, temperature=0.0, top_k=0, rng=jax.random.key(0))
  assert len(tokens) == len(prompt) + 12 and tokens[: len(prompt)].tolist() == prompt.tolist()
  # One causal forward pass over the result: the logits at t - 1 see tokens < t only, so each greedy choice is
  # their argmax (padding, id 0, is never sampled).
  logits = compiled(trainer.parts(config).model).apply({"params": params}, jnp.asarray(tokens[None]))
  greedy = np.asarray(jnp.argmax(logits[0, :, 1:], axis=-1)) + 1
  np.testing.assert_array_equal(tokens[len(prompt) :], greedy[len(prompt) - 1 : -1])


@pytest.mark.xdist_group("trained_lm")  # one worker trains the module fixture, not both
def test_sample_command(trained_lm):
  """`python -m efftx.sample` through its __main__ block in this process (its flags, temperature and top-k): the
  prompt and its continuation on stdout, the step it sampled from on stderr; --checkpoint picks the step (one line
  where there is none); a folder without a run is one line naming config.json (real processes'
  exit codes: test_cli.py)."""
  workdir, _ = trained_lm
  # 4 + 19 = 23 positions, as in the greedy test above: the same decoding cache, whose (eager) init is then reused.
  code, out, err = run_in_process(
    "efftx.sample", [f"--workdir={workdir}", "--prompt=def ", "--length=19", "--temperature=0.8", "--top_k=10"]
  )
  assert code == 0, err
  assert out.startswith("def ") and len(out) > len("def \n")
  assert f"efftx.sample: {workdir} at step 30" in err  # which checkpoint it sampled
  code, _, err = run_in_process("efftx.sample", [f"--workdir={workdir}", "--prompt=def ", "--checkpoint=5"])
  assert code == 2 and err.strip().splitlines()[-1].endswith("has no checkpoint at step 5 (its checkpoints: 30)"), err
  code, _, err = run_in_process("efftx.sample", [f"--workdir={os.path.dirname(workdir)}"])
  assert code != 0 and "Traceback" not in err and "config.json" in err

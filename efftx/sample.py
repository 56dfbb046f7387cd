"""Sample text from a trained causal language model, one token at a time through the mixers' decoding caches.

    python -m efftx.sample --workdir=/tmp/efftx/lm --prompt="def " --length=200 [--temperature=0.8 --top_k=40]
        [--checkpoint=STEP]

Reads workdir/config.json and the checkpoint's parameters (default: the latest), says on stderr which step it
samples from, and prints the prompt and its continuation.
"""

from __future__ import annotations

import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from efftx import checkpoints
from efftx import cli
from efftx import distributed
from efftx import run_files
from efftx import trainer
from efftx.errors import UserError


def _define_flags() -> None:
  """Command-line flags, defined only when run as a program (so that this module imports cleanly)."""
  global _WORKDIR, _CHECKPOINT, _PROMPT, _LENGTH, _TEMPERATURE, _TOP_K, _SEED
  _WORKDIR = flags.DEFINE_string("workdir", None, "A training run's --workdir (a causal LM).")
  _CHECKPOINT = flags.DEFINE_integer("checkpoint", None, "The checkpoint's step (default: the latest).")
  _PROMPT = flags.DEFINE_string("prompt", "", "Text to continue (at least one character).")
  _LENGTH = flags.DEFINE_integer("length", 200, "Tokens to generate.")
  _TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Softmax temperature; 0 picks the most likely token.")
  _TOP_K = flags.DEFINE_integer("top_k", 0, "Sample among the k most likely tokens only (0: all).")
  _SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
  distributed.define_flags()  # on a pod every process runs this command; each samples the same text


def load(workdir: str, step: int | None = None) -> tuple[ml_collections.ConfigDict, dict, int]:
  """The run's config, and the parameters of its checkpoint at `step` (default: the latest) and that step."""
  config, params, step = checkpoints.restore_params(workdir, step)
  parts = trainer.parts(config)
  if not parts.objective.next_token or parts.task.tokenize is None:
    raise UserError(f"{workdir} trained task '{config.data.task}', not a text language model: nothing to sample")
  return config, params, step


def generate(
  config: ml_collections.ConfigDict,
  params,
  prompt_P: np.ndarray,
  length: int,
  temperature: float,
  top_k: int,
  rng: jax.Array,
) -> np.ndarray:
  """prompt_P followed by `length` sampled tokens (len(prompt_P) + length ≤ config.model.max_len)."""
  if not len(prompt_P):
    raise UserError("give a --prompt of at least one token: the model was trained to continue text")
  model = trainer.parts(config).model
  total = len(prompt_P) + length
  if total > config.model.max_len:
    raise UserError(f"prompt ({len(prompt_P)}) + length ({length}) exceeds the model's max_len={config.model.max_len}")
  # Compiled once rather than op by op (an eager init compiles each of its ~170 primitives on its own).
  init = jax.jit(lambda tokens_1xT: model.init(jax.random.key(0), tokens_1xT, decode=True)["cache"])
  cache = init(jnp.zeros((1, total), jnp.int32))

  @jax.jit
  def step(cache, token_1x1, rng):
    logits_1x1xV, mutated = model.apply({"params": params, "cache": cache}, token_1x1, decode=True, mutable=["cache"])
    logits_V = logits_1x1xV[0, 0]
    logits_V = logits_V.at[0].set(-jnp.inf)  # never padding
    if top_k:
      logits_V = jnp.where(logits_V < jax.lax.top_k(logits_V, top_k)[0][-1], -jnp.inf, logits_V)
    if temperature == 0:
      return mutated["cache"], jnp.argmax(logits_V)
    return mutated["cache"], jax.random.categorical(rng, logits_V / temperature)

  out = [int(t) for t in prompt_P]
  for t in range(total - 1):  # feed position t, sample position t + 1 once past the prompt
    cache, next_token = step(cache, jnp.array([[out[t]]], jnp.int32), jax.random.fold_in(rng, t))
    if t >= len(prompt_P) - 1:
      out.append(int(next_token))
  return np.array(out)


def main(argv):
  cli.start_program("efftx.sample", argv, _WORKDIR.value, "a causal LM training run's")
  with cli.one_line_errors("efftx.sample"):
    distributed.initialize_from_flags()
    config, params, step = load(_WORKDIR.value, _CHECKPOINT.value)
    if jax.process_index() == 0:
      print(f"efftx.sample: {run_files.run_folder(_WORKDIR.value)} at step {step}", file=sys.stderr, flush=True)
    task = trainer.parts(config).task
    prompt_P = task.tokenize(_PROMPT.value.encode())
    tokens = generate(
      config, params, prompt_P, _LENGTH.value, _TEMPERATURE.value, _TOP_K.value, jax.random.key(_SEED.value)
    )
  if jax.process_index() == 0:
    sys.stdout.write(task.detokenize(tokens) + "\n")


if __name__ == "__main__":
  _define_flags()
  app.run(main)

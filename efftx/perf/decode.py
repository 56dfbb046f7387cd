"""Decoding speed by position: tokens/s of one decoding step through a causal LM's mixer caches at position p.

    python -m efftx.bench --mode=decode --mixers=attention,mamba2,mamba,gla,gated_deltanet,retnet,rg_lru \
        --positions=100,1000,4000

A recurrent mixer carries a state of fixed size, so its step costs the same at every position; attention's step
reads a key and value per earlier position, so its cost grows with p. This measures that, with efftx's own decoding
path (efftx.sample.generate's: `model.init(key, tokens_BxT, decode=True)` makes the cache for T positions, then
`model.apply({"params": ..., "cache": cache}, token_Bx1, decode=True, mutable=["cache"])` per token, jitted, the
cache not donated).

The model is the peer shape (efftx.perf.step.peer_shape: d 256, 4 layers, 4 heads, FF 1024, vocab 256, learned
positions), causal, float32, on JAX's default device, with random parameters. At position p the cache is made for
p + 1 positions (what generating p + 1 tokens allocates; efftx's attention attends over its whole cache buffer,
masked past the index, so its step's cost is set by the buffer's length) and its position counters (every integer
leaf of the cache: attention's index, the model's learned-position index, retnet's rotary count) are set to p; the
buffers keep their zeros, which cost the same as real keys and states. The same step, from that cache, is then timed
repeatedly (each call's updated cache dropped): tokens/s = batch / mean seconds per call, after one warm-up call.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp

from efftx import model as model_lib
from efftx import objectives
from efftx.errors import UserError
from efftx.mixers import MIXERS
from efftx.perf import step as step_lib


def _model(mixer: str, length: int, overrides: dict | None = None):
  config = step_lib.peer_shape(mixer, length)
  config.model.causal = True
  for key, value in (overrides or {}).items():
    section = config.model if key in config.model else config.mixer
    section[key] = value
  return model_lib.build_model(config, objectives.OBJECTIVES["lm"].head(256, 0), 256)


def decode_tokens_per_sec(
  mixer: str,
  positions: tuple[int, ...] = (100, 1000, 4000),
  batch: int = 1,
  min_seconds: float = 1.0,
  overrides: dict | None = None,
) -> dict[int, float]:
  """{p: tokens/s of one decoding step at position p} for `mixer` at the peer shape (overrides: config.model
  fields or the mixer's options, e.g. {"d_model": 32, "num_layers": 1}); min_seconds 0 runs each step once (two
  calls: the warm-up and one timed)."""
  if mixer not in MIXERS:
    raise UserError(f"'{mixer}' is not a mixer; choose from: {', '.join(MIXERS)}")
  if not MIXERS[mixer].can_decode:
    raise UserError(f"mixer '{mixer}' does not decode (no cache); decoding mixers: {', '.join(decoding_mixers())}")
  if any(p < 0 for p in positions):
    raise UserError(f"positions must be >= 0, got {positions}")
  out = {}
  for p in positions:
    model = _model(mixer, p + 1, overrides)
    tokens_BxT = jnp.zeros((batch, p + 1), jnp.int32)
    variables = jax.jit(lambda t, model=model: model.init(jax.random.key(0), t, decode=True))(tokens_BxT)
    params, cache = variables["params"], variables["cache"]
    # Every integer leaf counts the positions done: at p, p of them.
    cache = jax.tree.map(lambda x: jnp.full_like(x, p) if jnp.issubdtype(x.dtype, jnp.integer) else x, cache)
    step = jax.jit(
      lambda params, cache, token, model=model: model.apply(
        {"params": params, "cache": cache}, token, decode=True, mutable=["cache"]
      )
    )
    token_Bx1 = jnp.ones((batch, 1), jnp.int32)
    jax.block_until_ready(step(params, cache, token_Bx1))  # compiles
    calls, start = 0, time.perf_counter()
    while calls < 1 or time.perf_counter() - start < min_seconds:
      jax.block_until_ready(step(params, cache, token_Bx1))
      calls += 1
    out[p] = batch * calls / (time.perf_counter() - start)
  return out


def decoding_mixers() -> list[str]:
  """The mixers that decode with a cache (MixerSpec.can_decode)."""
  return [name for name, spec in MIXERS.items() if spec.can_decode]

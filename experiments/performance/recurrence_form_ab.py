"""The matrix-state recurrence's training form, A/B: efftx.mixers.recurrence.chunked_gated_recurrence (chunks of
matmuls, a jax.lax.scan over chunks) against the same recurrence one position at a time (gated_recurrence_step in
a jax.lax.scan over positions), forward and backward of Σ y·w, float32, scalar (per head) or vector (per key)
decays. Both are compiled in one process and timed in alternating rounds; prints the median of the paired ratios.

    python experiments/performance/recurrence_form_ab.py --rounds=5
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from efftx.mixers import recurrence


def _inputs(B, L, H, K, V, vector, seed=0):
  rng = np.random.default_rng(seed)
  q, k = (jnp.asarray(rng.normal(size=(B, L, H, K)) / np.sqrt(K), jnp.float32) for _ in range(2))
  v = jnp.asarray(rng.normal(size=(B, L, H, V)), jnp.float32)
  g = -jnp.asarray(rng.uniform(0.0, 0.1, size=(B, L, H, K) if vector else (B, L, H)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(B, L, H, V)), jnp.float32)
  return q, k, v, g, w


def chunked(q, k, v, g, w, chunk=64):
  return (recurrence.chunked_gated_recurrence(q, k, v, g, chunk=chunk)[0] * w).sum()


def stepped(q, k, v, g, w):
  B, _, H, K = k.shape
  state = jnp.zeros((B, H, K, v.shape[-1]), jnp.float32)

  def step(state, xs):
    y, state = recurrence.gated_recurrence_step(state, *xs)
    return state, y

  _, y_LxBxHxV = jax.lax.scan(step, state, tuple(jnp.moveaxis(a, 1, 0) for a in (q, k, v, g)))
  return (jnp.moveaxis(y_LxBxHxV, 0, 1) * w).sum()


def _time(fn, args, min_seconds=1.0):
  jax.block_until_ready(fn(*args))
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < min_seconds:
    jax.block_until_ready(fn(*args))
    n += 1
  return (time.perf_counter() - start) / n


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=5)
  a = parser.parse_args()
  shapes = [
    (4, 256, 4, 64, 64, False),
    (4, 2048, 4, 64, 64, False),
    (4, 256, 4, 64, 64, True),
    (4, 2048, 4, 64, 64, True),
  ]
  print(f"jax {jax.__version__}, {jax.device_count()} devices; ms per forward + backward, median of {a.rounds} rounds")
  for B, L, H, K, V, vector in shapes:
    args = _inputs(B, L, H, K, V, vector)
    fns = {name: jax.jit(jax.grad(f, argnums=(0, 1, 2, 3))) for name, f in (("chunked", chunked), ("stepped", stepped))}
    times = {name: [] for name in fns}
    for _ in range(a.rounds):
      for name, fn in fns.items():
        times[name].append(_time(fn, args))
    ratio = statistics.median(s / c for s, c in zip(times["stepped"], times["chunked"]))
    print(
      f"B{B} L{L} H{H} K{K} V{V} {'vector' if vector else 'scalar'} decay: chunked "
      f"{1e3 * statistics.median(times['chunked']):.1f} ms, stepped {1e3 * statistics.median(times['stepped']):.1f} ms,"
      f" stepped ÷ chunked {ratio:.2f}"
    )


if __name__ == "__main__":
  main()

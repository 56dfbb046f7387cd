"""The diagonal recurrence's forms (efftx/mixers/diagonal.py) timed against each other, forward and backward, at
Mamba's shapes (B×L×E×N, float32): every form compiled in one process, then timed in alternating rounds
(efftx.perf.ab.alternate); the median ms a call and each form's median paired ratio to the first.

    python experiments/performance/diagonal_scan_ab.py --shapes=4x256x64x16,4x2048x256x16 --rounds=7

"autodiff:" forms are differentiated by JAX through the form itself (no custom backward pass).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from efftx.mixers import diagonal
from efftx.perf.ab import alternate

FORMS = {
  "sequential": dict(impl="sequential"),
  "associative": dict(impl="associative"),
  "chunked-16": dict(impl="chunked", chunk=16),
  "chunked-64": dict(impl="chunked", chunk=64),
  "autodiff:sequential": None,
  "autodiff:associative": None,
}


def _loss(form: str, a, b, g):
  if form.startswith("autodiff:"):
    impl = form.split(":")[1]
    h = diagonal._run(impl, 0, a.swapaxes(0, 1), b.swapaxes(0, 1)).swapaxes(0, 1)  # pylint: disable=protected-access
  else:
    h = diagonal.scan(a, b, **FORMS[form])
  return jnp.sum(h * g)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--shapes", default="4x256x64x16,4x256x256x16,4x2048x64x16,4x2048x256x16")
  parser.add_argument("--forms", default=",".join(FORMS))
  parser.add_argument("--rounds", type=int, default=7)
  args = parser.parse_args()
  forms = args.forms.split(",")
  rows = []
  for shape in args.shapes.split(","):
    dims = tuple(int(s) for s in shape.split("x"))
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.uniform(0.5, 1.0, dims), jnp.float32)
    b = jnp.asarray(rng.normal(size=dims), jnp.float32)
    g = jnp.asarray(rng.normal(size=dims), jnp.float32)
    runs = {}
    for form in forms:
      fn = jax.jit(jax.value_and_grad(functools.partial(_loss, form), argnums=(0, 1)))
      jax.block_until_ready(fn(a, b, g))

      def run(steps, fn=fn):
        start = time.perf_counter()
        for _ in range(steps):
          jax.block_until_ready(fn(a, b, g))
        return (time.perf_counter() - start) / steps

      runs[form] = run
    times = alternate(runs, args.rounds + 1)
    row = {"shape": shape}
    for form in forms:
      row[form] = {
        "median_ms": round(1e3 * statistics.median(t[form] for t in times), 2),
        "vs_first": round(statistics.median(t[forms[0]] / t[form] for t in times), 3),
      }
    rows.append(row)
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
  main()

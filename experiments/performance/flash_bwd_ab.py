"""Flash attention's backward pass with dK and dV accumulated transposed (attention._transposed_key_grads, the CPU
default for more than one query block) against the plain layout, in one process: both training steps of a
peer-shape model compiled first, then timed in alternation (factories.alternate), so the machine's drift cancels.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 PJRT_NPROC=4 \
        python experiments/peers/flash_bwd_ab.py 4096 attention 8     # length, factory name, rounds
    python experiments/peers/flash_bwd_ab.py 256 kernel 8              # the kernel alone (attention._flash)

"kernel" times jit(grad) of attention._flash alone on one device: 8192 tokens of random queries, keys and values
in 4 heads of 64, blocks of 256, so the gate (more than one block) can be overridden at any length.
"""
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position
from efftx.mixers import attention  # pylint: disable=g-import-not-at-top,wrong-import-position


def _kernel(length: int):
  """(compiled, args) of jit(grad) of attention._flash; its third output a scalar, as factories.alternate reads."""
  q, k, v, do = (jax.random.normal(jax.random.key(i), (max(1, 8192 // length), length, 4, 64)) for i in range(4))
  mask = jnp.ones(q.shape[:2], bool)
  loss = lambda q, k, v: jnp.sum(attention._flash(q, k, v, mask, False, 256) * do)  # pylint: disable=protected-access

  def grads(q, k, v):
    dq, dk, dv = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
    return dq, dk, jnp.sum(dv)

  return jax.jit(grads).lower(q, k, v).compile(), (q, k, v)


def main(length: int, name: str, rounds: int) -> None:
  gate = attention._transposed_key_grads  # pylint: disable=protected-access
  runs = {}
  # "kernel" forces the transposed form (the default gates it to more than one block); a model uses the default.
  transposed = (lambda P, C: jax.default_backend() == "cpu") if name == "kernel" else gate
  for label, choice in (("dK dV as dS^T Q", lambda P, C: False), ("transposed", transposed)):
    attention._transposed_key_grads = choice  # read while the step is traced and compiled, just below
    if name == "kernel":
      runs[label] = _kernel(length)
    else:
      runs[label] = factories.compiled_step(name, length)
  attention._transposed_key_grads = gate
  ms = factories.alternate(runs, rounds)
  before, after = ms.values()
  print(f"{name} {length}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items())
        + f"; speed-up {before / after:.3f}x")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)

"""Flash attention's backward pass with dK and dV accumulated transposed (attention._transposed_key_grads, the CPU
default for more than one query block) against the plain layout, in one process: both training steps of a
peer-shape model compiled first, then timed in alternation (factories.alternate), so the machine's drift cancels.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 PJRT_NPROC=4 \
        python experiments/peers/flash_bwd_ab.py 4096 attention 8     # length, factory name, rounds
"""
import pathlib
import sys

import jax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position
from efftx.mixers import attention  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(length: int, name: str, rounds: int) -> None:
  gate = attention._transposed_key_grads  # pylint: disable=protected-access
  runs = {}
  for label, transposed in (("dK dV as dS^T Q", lambda P, C: False), ("transposed (default)", gate)):
    attention._transposed_key_grads = transposed  # read while the step is traced and compiled, just below
    step, params, opt, ids, labels = factories.harness_step(name, length)
    runs[label] = (jax.jit(step).lower(params, opt, ids, labels).compile(), (params, opt, ids, labels))
  attention._transposed_key_grads = gate
  ms = factories.alternate(runs, rounds)
  before, after = ms.values()
  print(f"{name} {length}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items())
        + f"; speed-up {before / after:.3f}x")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)

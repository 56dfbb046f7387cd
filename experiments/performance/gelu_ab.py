"""Exact GELU's implementations timed in one process: both training steps of a peer-shape model compiled first,
then timed in alternation (factories.alternate), so the machine's drift over minutes cancels.

    python experiments/peers/gelu_ab.py 1024 identity             # model.gelu_erf against nn.gelu(approximate=False)
    PJRT_NPROC=4 XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        python experiments/peers/gelu_ab.py 1024 identity shared   # its backward's barrier against none

Arguments: length, a factories.py name, and what to compare against model.gelu_erf: "flax" (nn.gelu's autodiff,
the default) or "shared" (gelu_erf's backward pass without its optimization barrier, so that XLA shares
erf(x/√2) with the forward pass instead of recomputing it).
"""
import pathlib
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position
from efftx import model  # pylint: disable=g-import-not-at-top,wrong-import-position


@jax.custom_vjp
def _gelu_erf_shared(x):
  return model.gelu_erf(x)


def _shared_fwd(x):
  return model.gelu_erf(x), x


def _shared_bwd(x, g):  # model._gelu_erf_bwd before the barrier
  x32 = x.astype(jnp.float32)
  cdf = 0.5 + 0.5 * jax.lax.erf(x32 * np.float32(np.sqrt(0.5)))
  pdf = np.float32(1 / np.sqrt(2 * np.pi)) * jnp.exp(-0.5 * x32 * x32)
  return ((g.astype(jnp.float32) * (cdf + x32 * pdf)).astype(x.dtype),)


_gelu_erf_shared.defvjp(_shared_fwd, _shared_bwd)
OTHERS = {"flax": lambda x: nn.gelu(x, approximate=False), "shared": _gelu_erf_shared}


def main(length: int, name: str, other: str, rounds: int = 8) -> None:
  runs = {}
  for label, activation in (("gelu_erf", model.gelu_erf), (other, OTHERS[other])):
    model.ACTIVATIONS["gelu"] = activation  # read while the step is traced and compiled, just below
    runs[label] = factories.compiled_step(name, length)
  model.ACTIVATIONS["gelu"] = model.gelu_erf
  ms = factories.alternate(runs, rounds)
  print(f"{name} {length}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items())
        + f"; gelu_erf {ms[other] / ms['gelu_erf']:.3f}x faster")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "flax")

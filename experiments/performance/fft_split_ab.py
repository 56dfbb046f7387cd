"""FNet's FFT on each device's share of the batch (efftx.mixers.fourier._per_example) against the FFT as XLA's
partitioner places it by itself (the whole batch gathered onto every device), in one process: the peer-shape
training step of the data-parallel `fnet` factory compiled both ways, then timed in alternation.

    python experiments/peers/fft_split_ab.py 1024     # length; one device per core, as efftx.train sets up

2-core Intel Xeon, 2026-12-01 (medians of 7 alternated steps): 826 vs 896 ms at 1024 (1.085x), 837 vs 902 ms at
256 (1.078x), 834 vs 895 ms at 4096 (1.072x).
"""
import pathlib
import sys

import jax

from efftx import sharding
from efftx.mixers import fourier

sharding.use_cpu_cores()  # as efftx.train sets up the CPU (before anything touches a device)
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position


def compiled(length: int, impls: dict):
  saved = dict(fourier._IMPLS)  # pylint: disable=protected-access
  fourier._IMPLS.update(impls)  # pylint: disable=protected-access
  try:
    return factories.compiled_step("fnet", length)
  finally:
    fourier._IMPLS.update(saved)  # pylint: disable=protected-access


def main(length: int, rounds: int = 8) -> None:
  unsplit = {"rfft": fourier._rfft, "fft": fourier._fft}  # pylint: disable=protected-access
  runs = {"per device": compiled(length, {}), "gathered": compiled(length, unsplit)}
  ms = factories.alternate(runs, rounds)
  print(f"fnet {length} ({jax.device_count()} devices): " + ", ".join(f"{k} {v:.0f} ms" for k, v in ms.items())
        + f"; speed-up {ms['gathered'] / ms['per device']:.3f}")


if __name__ == "__main__":
  main(int(sys.argv[1]))

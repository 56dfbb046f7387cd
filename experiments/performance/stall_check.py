"""Does the data-parallel step on a CPU stall? The peer harness's training step of a data-parallel factory, set up
as efftx.train sets up a CPU (efftx.sharding.use_cpu_cores: one device per core, XLA's CPU client two threads a
device), its parameters on one device as the harness passes them, called `steps` times.

    python experiments/peers/stall_check.py 4096 fnet                 # efftx's set-up: "12 steps, no stall"
    PJRT_NPROC=2 python experiments/peers/stall_check.py 4096 fnet    # one client thread a device, XLA's default

On the 2-core Intel Xeon (AVX-512) of 2026-12-01 the second command stalled at an all-gather in 3 of 4 runs (XLA
aborts the process after 40 s: "Termination timeout for all gather"), the first in none of 3. Counting the other
in-process scripts run that day: fnet at 4096 stalled in 7 of 8 runs with 2 client threads, other models, lengths
and XLA options in 3 of 25 (among them 2 runs of this script calling the jitted step instead of the compiled one,
which did not stall); with 4 threads none of 13 runs stalled. The stall depends on timing. An AMD EPYC of the
same size ran the full peer benchmark with 2 threads without one.
"""
import pathlib
import sys
import time

import jax

from efftx import sharding

sharding.use_cpu_cores()  # as efftx.train sets up the CPU (before anything touches a device)
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(length: int, name: str, steps: int = 12) -> None:
  step, args = factories.compiled_step(name, length)  # as the in-process A/B scripts compile it
  start = time.perf_counter()
  for _ in range(steps):
    float(step(*args)[2])
  print(f"{name} {length} on {jax.device_count()} devices: {steps} steps, no stall "
        f"({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2])

"""The training step of a config, compiled as efftx.train compiles it, timed on a random batch (efftx.perf.step):
the median of 5 rounds of 3 steps, after 2 warm-up steps. For variants that efftx.ab cannot run in one process
(XLA flags, which apply to the whole process), run this once per variant, back to back, on a quiet machine.

    XLA_FLAGS=--xla_force_host_platform_device_count=2 python experiments/zoology_fig2/step_time.py \\
        configs/zoology_fig2.py:mixer=attention,L=64,d_model=64 devices=2 [path=value ...]
"""

import statistics
import sys

from efftx.perf import step as step_lib

if __name__ == "__main__":
  overrides = dict(a.split("=", 1) for a in sys.argv[2:])
  run, info = step_lib.prepare(dict(config=sys.argv[1], mixer="", length=0, tokens=0, set=overrides, compiler={}))
  run(2)
  times = [run(3) for _ in range(5)]
  print(f"median {statistics.median(times) * 1000:.1f} ms a step on {info['devices']} device(s)")

"""Where a training step's time goes: a jax.profiler trace of one peer-shape model's step (the harness's loss and
AdamW), summed per XLA kernel kind (ynn_fusion: the matmuls; the *_fusion kinds: elementwise passes).

    python experiments/peers/profile_step.py identity_one_device 1024   # factory name, length (8192 tokens a step)

Profile the one-device factories: with a step split over 2 CPU devices (the data-parallel factories under
XLA_FLAGS=--xla_force_host_platform_device_count=2) the traced run aborted here, one device waiting 40 s at an
all-gather for the other.
"""
import collections
import glob
import gzip
import json
import pathlib
import re
import sys
import tempfile

import jax

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position

def main(name: str, length: int, steps: int = 3) -> None:
  step, params, opt, ids, labels = factories.harness_step(name, length)
  step = jax.jit(step)

  for _ in range(2):
    params, opt, loss = step(params, opt, ids, labels)
    loss.block_until_ready()
  folder = tempfile.mkdtemp(prefix="efftx-profile-")
  with jax.profiler.trace(folder, create_perfetto_trace=True):
    for _ in range(steps):
      params, opt, loss = step(params, opt, ids, labels)
      loss.block_until_ready()
  trace = json.load(gzip.open(sorted(glob.glob(folder + "/**/*.json.gz", recursive=True))[-1]))
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  by_kind = collections.Counter()
  wall = 0.0
  for e in events:
    if e.get("ph") != "X" or "dur" not in e:
      continue
    if e["name"] == "ThunkExecutor::Execute (wait for completion)":
      wall += e["dur"] / 1e3 / steps
    elif not (e["name"].startswith(("ThunkExecutor", "$")) or "Await" in e["name"]):
      by_kind[re.sub(r"\.\d+$", "", e["name"])] += e["dur"] / 1e3 / steps
  print(f"{name}, length {length}: step {wall:.0f} ms wall, {sum(by_kind.values()):.0f} ms in kernels (ms per step):")
  for kind, ms in by_kind.most_common(20):
    print(f"{ms:9.1f}  {kind}")


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))

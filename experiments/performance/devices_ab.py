"""One XLA device per core against JAX's one device for the whole CPU, in one process: the same peer-shape training
step (the harness's loss and AdamW) compiled twice — on one device, and laid out as efftx.train lays it out over
every device (efftx.sharding: the batch split over make_mesh, parameters replicated) — then timed in alternation,
so the machine's drift over minutes cancels.

    python experiments/peers/devices_ab.py 1024 fnet_one_device     # length, a one-device factory's name
"""
import pathlib
import sys

import jax

from efftx import sharding

sharding.use_cpu_cores()  # one device per core, as efftx.train sets up (before anything touches a device)
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position


def main(length: int, name: str, rounds: int = 8) -> None:
  step, params, opt_state, ids, labels = factories.harness_step(name, length)

  def compiled_on(devices):
    mesh = sharding.make_mesh(devices=devices)
    args = (jax.device_put(params, sharding.replicated(mesh)), jax.device_put(opt_state, sharding.replicated(mesh)),
            jax.device_put(ids, sharding.batch(mesh)), jax.device_put(labels, sharding.batch(mesh)))
    return jax.jit(step).lower(*args).compile(), args

  runs = {"1 device": compiled_on(jax.devices()[:1]), f"{jax.device_count()} devices": compiled_on(jax.devices())}
  ms = factories.alternate(runs, rounds)
  one, many = ms.values()
  print(f"{name} {length}: " + ", ".join(f"{label} {v:.0f} ms" for label, v in ms.items())
        + f"; speed-up {one / many:.3f}")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2])

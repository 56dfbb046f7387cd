"""How a run lays its arrays out on the devices: the mesh, and the one rule for parameters and optimizer state.

The mesh has two axes, ("data", "fsdp"), over every device of every process: config.mesh.fsdp devices along
"fsdp", the rest along "data". The batch is split over both. Parameters and AdamW's state are split along "fsdp"
(fully-sharded data parallelism, ZeRO-3): each device holds 1/fsdp of them, and XLA gathers a layer's parameters
where the step needs them and reduce-scatters their gradients. fsdp = 1 is plain data parallelism.

The rule is by shape, as big_vision's fsdp rule is, not a table of names: an array is split along its largest
dimension that the fsdp axis divides, so every mixer, every head and any parameter added later is covered with
nothing to maintain. Arrays under MIN_SHARDED elements (biases, norm scales, small embeddings) stay whole on every
device: gathering them would cost more than they save. AdamW's moments have their parameters' shapes, so they are
laid out like them. The rule knows one name: the reversible stack's "layers", whose leading axis its scan walks
layer by layer — that axis is never split (splitting it would gather every layer at once).
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

MIN_SHARDED = 4096  # elements; smaller arrays are replicated
STACKED = "layers"  # a parameter path through this name has a leading layer axis (efftx.reversible)


def cpu_device_count(cores: int, batch_size: int | None = None) -> int:
  """How many XLA devices a single-process CPU run gets: one per core, as many as the batch splits into."""
  return math.gcd(cores, batch_size) if batch_size else cores


def use_cpu_cores(batch_size: int | None = None) -> None:
  """Makes a single-process run's CPU one XLA device per core (cpu_device_count), where JAX's default is one
  device for the whole CPU; call before anything touches a device. The batch is then split over the cores as
  it is over the chips of a pod, each core running its share of the step, which is faster than one device for
  the whole CPU (experiments/performance/DECISIONS.md: one-device-per-core). Nothing changes where the user chose
  a device count (XLA_FLAGS' --xla_force_host_platform_device_count, jax_num_cpu_devices), in a multi-process
  run, or once the backends are up. On a GPU or TPU host the CPU devices go unused.

  With n > 1 devices it also gives XLA's CPU client 2n threads (PJRT_NPROC, unless PJRT_NPROC or NPROC is set)
  where it would have max(cores, n): with one thread per device a data-parallel step can stall at an all-gather
  until XLA aborts the process (experiments/performance/DECISIONS.md: two-client-threads-per-device)."""
  if (
    "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    or jax.config.jax_num_cpu_devices != -1
    or jax.distributed.is_initialized()
  ):
    return
  devices = cpu_device_count(_cores(), batch_size)
  try:
    jax.config.update("jax_num_cpu_devices", devices)
  except RuntimeError:  # the backends are up (JAX refuses the change): keep their devices
    return
  if devices > 1 and not {"PJRT_NPROC", "NPROC"} & os.environ.keys():
    os.environ["PJRT_NPROC"] = str(2 * devices)  # read when the CPU client starts


def _cores() -> int:
  """The cores this process may run on."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def step_compiler_options(batch_size: int, mesh: jax.sharding.Mesh) -> dict[str, str]:
  """XLA options for a step whose batch of `batch_size` examples is split over `mesh`'s devices: on a CPU where each
  device gets a single example, YNNPACK fusions of single dots only, so that XLA, not YNNPACK, does the reductions,
  which YNNPACK runs slowly over a leading dimension of 1
  (experiments/performance/DECISIONS.md: ynnpack-dots-only-at-one-example-per-device). Elsewhere: no options."""
  if jax.default_backend() != "cpu" or batch_size > mesh.size:
    return {}
  return {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def make_mesh(fsdp: int = 1, devices=None) -> jax.sharding.Mesh:
  """("data", "fsdp") over `devices` (default: every device of every process), fsdp devices along "fsdp"."""
  devices = jax.devices() if devices is None else devices
  # Auto axes: XLA propagates the shardings (jax.make_mesh defaults to Explicit sharding-in-types).
  return jax.make_mesh(
    (len(devices) // fsdp, fsdp), ("data", "fsdp"), devices=devices, axis_types=(jax.sharding.AxisType.Auto,) * 2
  )


def batch(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Examples split over every device (both axes)."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def spec(path: tuple, shape: tuple[int, ...], fsdp: int) -> P:
  """The rule: the PartitionSpec of an array at `path` (a jax tree path) with `shape`."""
  if fsdp == 1 or int(np.prod(shape, dtype=np.int64)) < MIN_SHARDED:
    return P()
  names = [str(getattr(k, "key", getattr(k, "name", k))) for k in path]
  first = 1 if STACKED in names else 0
  dims = [d for d in range(first, len(shape)) if shape[d] % fsdp == 0]
  if not dims:
    return P()
  largest = max(dims, key=lambda d: (shape[d], d))  # ties: the later dimension
  return P(*["fsdp" if d == largest else None for d in range(len(shape))])


def shardings(mesh: jax.sharding.Mesh, tree: Any) -> Any:
  """NamedShardings for every array of `tree` (arrays or jax.ShapeDtypeStructs: parameters, a TrainState)."""
  fsdp = mesh.shape["fsdp"]
  return jax.tree_util.tree_map_with_path(lambda path, x: NamedSharding(mesh, spec(path, x.shape, fsdp)), tree)


def bytes_on_first_device(tree: Any) -> int:
  """Bytes of `tree`'s arrays held by the first device (from the arrays' addressable shards)."""
  device = jax.local_devices()[0]
  return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards if s.device == device)

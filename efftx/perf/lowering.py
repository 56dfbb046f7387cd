"""Check, from any machine, that a run's steps lower for a TPU and a GPU: the steps efftx.train builds,
lowered for them.

    python -m efftx.lowering --config=configs/lra_listops.py:mixer=fnet --platforms=tpu,cuda
    python -m efftx.lowering --config=configs/lm_bytes.py:mixer=aft_local --config.model.reversible=true

Traces for each platform (efftx.platform.lowering_for: the mixers' "auto" paths are that platform's) and lowers
to its StableHLO (jax.jit(...).trace(...).lower(lowering_platforms=...), what jax.export does before it
serializes), without running or compiling anything and without the hardware, the training step exactly as efftx.train
jits it (model, objective, AdamW, the state's fsdp layout and the batch's split over a (data, fsdp) mesh of this
machine's devices, under that mesh), and for a causal model whose mixers all decode the one-token decoding step
efftx.sample runs, for each platform. Prints, per step and platform, the kernels beyond XLA's own code that the
lowered program calls (efftx.platform.KERNELS: a Pallas TPU kernel, cuDNN attention, an FFT) and the size of its
StableHLO; a step that does not lower stops with the platform, the step and JAX's error. On a CPU, fake devices
give the mesh its shape: XLA_FLAGS=--xla_force_host_platform_device_count=8 (config.mesh.fsdp must divide them).
What lowers may still fail to compile or run out of memory on the chip: this catches what cannot lower at all (an
operation or kernel the platform lacks, a sharding the partitioner refuses) before a pod is booked.
"""

from __future__ import annotations

import dataclasses
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags

from efftx import cli
from efftx import config as config_lib
from efftx import patterns
from efftx import platform as platform_lib
from efftx import sharding
from efftx import train
from efftx import trainer
from efftx.errors import UserError
from efftx.mixers import MIXERS

PLATFORMS = ("tpu", "cuda")
LOWERING_PLATFORMS = ("tpu", "cuda", "rocm", "cpu")  # jax.export's names of the platforms a step can lower for


@dataclasses.dataclass(frozen=True)
class Lowered:
  step: str  # "train" or "decode"
  platform: str  # as jax.export names it: "tpu", "cuda", "rocm", "cpu"
  kernels: dict[str, int]  # efftx.platform.kernels of its StableHLO
  stablehlo_chars: int
  expected: dict[str, str | None] = dataclasses.field(default_factory=dict)  # train.expected_kernels (train step)

  def describe(self) -> str:
    """One line: the size of the lowered program, the kernels it calls, and each mixer's expected path, naming
    the expected kernels the lowered text does not show: JAX places those on the device itself
    (jax.nn.dot_product_attention picks cuDNN where it finds the GPU; the per-device FFT is lowered inside
    custom_partitioning only when the step compiles)."""
    line = (
      f"{self.step:<7}{self.platform:<6} lowers: {self.stablehlo_chars / 1e3:,.0f}K chars of StableHLO; kernels "
      + (", ".join(f"{k} ×{n}" for k, n in self.kernels.items()) or "none beyond XLA's")
    )
    if self.expected:
      line += "; expected " + ", ".join(f"{name} → {kernel or 'XLA'}" for name, kernel in self.expected.items())
    unseen = sorted({k for k in self.expected.values() if k and k not in self.kernels})
    if unseen:
      line += (
        f" ({', '.join(unseen)}: not in the program lowered here; JAX places it when the step is built on "
        f"{self.platform} itself)"
      )
    return line


class LoweringError(UserError):
  """A step that does not lower for a platform."""


def _batch_spec(config: ml_collections.ConfigDict, parts: trainer.Parts) -> dict[str, jax.ShapeDtypeStruct]:
  """The shapes and dtypes of one global batch of the run's task and objective (what its pipeline yields)."""
  B, L = config.data.batch_size, config.model.max_len
  spec = {"tokens": jax.ShapeDtypeStruct((B, L), jnp.int32), "mask": jax.ShapeDtypeStruct((B, L), jnp.bool_)}
  per_key = {"label": ((B,), jnp.int32), "targets": ((B, L), jnp.int32), "weights": ((B, L), jnp.float32)}
  for key in parts.objective.batch_keys:
    spec[key] = jax.ShapeDtypeStruct(*per_key[key])
  return spec


def lower_steps(config: ml_collections.ConfigDict, platforms=PLATFORMS, devices=None) -> list[Lowered]:
  """Lowers the run's training step (and, for a causal model whose mixers all decode, its decoding step) for each
  platform, traced for that platform (efftx.platform.lowering_for: the mixers' "auto" paths are the platform's;
  a trace that asked for no platform is lowered for every one); raises LoweringError naming the step and platform
  that do not lower. Not serialized: efftx's FFT runs per device through custom_partitioning, whose partitioner is
  a Python callback that jax.export cannot write (and whose body, each device's FFT, is lowered only when the step
  is compiled)."""
  devices = devices or jax.devices()
  config_lib.validate(config, len(devices))
  mesh = sharding.make_mesh(config.mesh.fsdp, devices=devices)
  names = patterns.layer_mixers(config.model.mixer, config.model.num_layers)
  decodes = config.model.causal and all(MIXERS[name].can_decode for name in names)
  out = []
  for step in ("train", "decode") if decodes else ("train",):
    shared = None  # a trace that chose no path by platform: lowered for each platform as it is
    for platform in platforms:
      try:
        with platform_lib.lowering_for(platform) as target, jax.set_mesh(mesh):
          traced = shared
          if traced is None:
            fn, args = _train_step(config, mesh) if step == "train" else _decode_step(config)
            traced = fn.trace(*args)
            shared = None if target.consulted else traced
          lowered = traced.lower(lowering_platforms=(platform,))
      except Exception as e:  # pylint: disable=broad-except  # whatever tracing or lowering raised, named
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LoweringError(
          f"{config.model.mixer}: the {step} step does not lower for {platform}: {type(e).__name__}: {message}"
        ) from e
      text = lowered.as_text()
      expected = train.expected_kernels(config, platform_lib.PLATFORM_NAMES[platform]) if step == "train" else {}
      out.append(Lowered(step, platform, platform_lib.kernels(text), len(text), expected))
  return out


def _train_step(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh):
  """(a fresh jit of the training step as efftx.train builds it, its abstract state and batch, laid out)."""
  parts = trainer.parts(config)
  tx, schedule = trainer.make_optimizer(config)
  init_key, dropout_key = jax.random.split(jax.random.key(config.seed))
  abstract_state = jax.eval_shape(lambda: trainer.create_state(parts.model, tx, init_key))
  state_sharding = sharding.shardings(mesh, abstract_state)
  place = lambda tree, shardings: jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )
  batch = _batch_spec(config, parts)
  return (
    train.build_train_step(config, mesh, parts, tx, schedule, dropout_key, state_sharding),
    (place(abstract_state, state_sharding), place(batch, jax.tree.map(lambda _: sharding.batch(mesh), batch))),
  )


def _unlocked(config: ml_collections.ConfigDict, **model_fields) -> ml_collections.ConfigDict:
  """A copy of config with config.model fields replaced."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.model.update(model_fields)
  return config


def _decode_step(config: ml_collections.ConfigDict):
  """(a fresh jit of (params, cache, token_1x1) → (logits, cache): one position through the decoding caches, as
  efftx.sample runs it, and its abstract arguments). Decoding runs without the reversible stack (efftx.sample
  refuses it): a model trained reversibly decodes with the same layers unstacked."""
  model = trainer.parts(_unlocked(config, reversible=False)).model
  variables = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, model.max_len), jnp.int32), decode=True)
  )

  def decode(params, cache, token_1x1):
    logits, mutated = model.apply({"params": params, "cache": cache}, token_1x1, decode=True, mutable=["cache"])
    return logits, mutated["cache"]

  return jax.jit(decode), (variables["params"], variables["cache"], jax.ShapeDtypeStruct((1, 1), jnp.int32))


_PLATFORMS = None
_CONFIG = None


def main(argv: list[str]) -> None:
  del argv
  cli.quiet_library_logs()
  unknown = [p for p in _PLATFORMS.value if p not in LOWERING_PLATFORMS]
  if unknown:
    cli.exit_with(
      "efftx.lowering", f"--platforms: '{unknown[0]}' is not a platform; choose from {', '.join(LOWERING_PLATFORMS)}"
    )
  with cli.one_line_errors("efftx.lowering"):
    for row in lower_steps(_CONFIG.value, _PLATFORMS.value):
      print(row.describe())


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", None, "Config file[:argument string].", lock_config=True)
  _PLATFORMS = flags.DEFINE_list("platforms", list(PLATFORMS), "Platforms to lower for (jax.export's names).")
  flags.mark_flag_as_required("config")
  sys.exit(app.run(main))

"""The platform a model is traced for, and the kernels a compiled program calls there.

`target_platform()` is what the mixers' "auto" paths are chosen for: this process's backend, or the platform
`lowering_for` names while a step is lowered for another one (efftx.lowering). `kernels(text)` counts the calls of
KERNELS (cuDNN attention, Pallas kernels, the FFT) in a compiled or exported program's text; efftx.train logs them.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re

import jax

_TARGET_PLATFORM = contextvars.ContextVar("efftx_target_platform", default=None)
PLATFORM_NAMES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}  # → jax.default_backend()'s


@dataclasses.dataclass
class Target:
  """What `lowering_for` traces for: the platform, and whether anything traced asked for it (target_platform())."""

  platform: str
  consulted: bool = False


def target_platform() -> str:
  """The platform the mixers' "auto" paths are chosen for, while a model is traced: this process's backend
  (jax.default_backend(): "cpu", "gpu" or "tpu"), or the one `lowering_for` names."""
  target = _TARGET_PLATFORM.get()
  if target is None:
    return jax.default_backend()
  target.consulted = True
  return target.platform


@contextlib.contextmanager
def lowering_for(platform: str):
  """Within it, models are traced for `platform` ("cpu", "tpu", "gpu", or jax.export's "cuda", "rocm"): "auto"
  takes that platform's paths, and Pallas TPU kernels compile as Mosaic kernels only for "tpu". For lowering a step
  for another platform than this process's (efftx.lowering); trace a fresh jit inside it (jit caches traces by
  function and shapes, not by this setting). Yields the Target: a trace that did not consult it is the same for
  every platform."""
  if platform not in PLATFORM_NAMES:
    raise ValueError(f"platform '{platform}': choose from {', '.join(PLATFORM_NAMES)}")
  target = Target(PLATFORM_NAMES[platform])
  token = _TARGET_PLATFORM.set(target)
  try:
    yield target
  finally:
    _TARGET_PLATFORM.reset(token)


# Kernels a compiled program calls beyond XLA's own fusions, as they appear in the compiled HLO text
# (Compiled.as_text()) or in the exported StableHLO (jax.export's mlir_module()).
KERNELS = {
  "cuDNN fused attention": re.compile(r"__cudnn\$fmha"),
  "Pallas TPU kernel": re.compile(r"\btpu_custom_call\b"),
  "Pallas GPU kernel": re.compile(r"__gpu\$xla\.gpu\.triton"),
  "FFT": re.compile(r"(?:\bfft\(|stablehlo\.fft\b)"),
}


def kernels(program_text: str) -> dict[str, int]:
  """How many calls of each of KERNELS a compiled or exported program's text holds (those it holds at all)."""
  found = {name: len(pattern.findall(program_text)) for name, pattern in KERNELS.items()}
  return {name: n for name, n in found.items() if n}

"""Every mixer's steps lower for a TPU and a GPU from this CPU (efftx.lowering: the training step as efftx.train
jits it, on a data × fsdp mesh of the 8 fake devices, plain and reversible; the decoding step where the mixers
decode), with the kernels each platform's "auto" paths promise, and a step that cannot lower is reported."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import causal_settings_to_check
from efftx import config as config_lib
from efftx import platform
from efftx import train
from efftx.mixers import MIXERS
from efftx.mixers import fourier
from efftx.perf import lowering


def _config(mixer: str, causal: bool, num_layers: int = 1, dropout: float = 0.0, **model):
  """A small model (tracing and lowering cost grows with layers and blocks, what lowers does not): 32 positions
  in blocks of 8 where a mixer works in blocks, so that every blocked path still loops over several. The blocks'
  dropout (random bits, the same on every platform and outside the mixer) only where a test asks for it."""
  config = config_lib.default_config(mixer)
  config.model.update(d_model=32, num_layers=num_layers, d_ff=64, max_len=32, causal=causal, dropout=dropout, **model)
  config_lib.set_where_declared(
    config.mixer, num_heads=2, window=8, block_size=8, lsh_chunk=8, attention_chunk=8, chunk=8
  )
  config.data.batch_size, config.mesh.fsdp = 8, 2
  if causal:
    config.data.update(task="bytes", variant="stdlib", objective="lm")
  return config


# The reversible stack runs the mixer's own operations, recomputed in the backward pass: lowered for these mixers
# (attention: the one whose lowered program it changes, splash's kernel once more), the plain stack for the others.
REVERSIBLE_KINDS = ("attention",)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_every_mixers_steps_lower_for_tpu_and_cuda(mixer):
  """Bidirectional with the plain stack (for a mixer bidirectional by reversal, only the representative:
  conftest.causal_settings_to_check); causal (where the mixer can be) with the plain stack, or the reversible
  one for REVERSIBLE_KINDS, and its decoding step where the mixer decodes. Attention's "auto" calls the splash
  kernel on TPU (forward, dq, dkv; the reversible stack's recomputed forward pass once more), nothing else calls a
  Pallas kernel."""
  assert set(REVERSIBLE_KINDS) <= set(MIXERS) and all(MIXERS[m].can_be_causal for m in REVERSIBLE_KINDS)
  splash_calls = {False: 3, True: 4}  # by reversible
  for causal in causal_settings_to_check(mixer):
    reversible = causal and mixer in REVERSIBLE_KINDS
    rows = lowering.lower_steps(_config(mixer, causal=causal, reversible=reversible))
    steps = ["train"] + (["decode"] if causal and MIXERS[mixer].can_decode else [])
    assert [(r.step, r.platform) for r in rows] == [(s, p) for s in steps for p in ("tpu", "cuda")]
    for row in rows:
      assert row.stablehlo_chars > 1000
      tpu_train_attention = mixer == "attention" and row.step == "train" and row.platform == "tpu"
      assert row.kernels.get("Pallas TPU kernel", 0) == (splash_calls[reversible] if tpu_train_attention else 0)


def test_a_hybrid_in_bfloat16_lowers_with_splash_in_its_attention_layers_only():
  config = _config("fnet+attention*1@top", causal=False, num_layers=2, dtype="bfloat16", dropout=0.1)
  tpu, cuda = lowering.lower_steps(config)
  assert tpu.kernels == {"Pallas TPU kernel": 3} and not cuda.kernels


BROKEN = {  # an operation that has no lowering for one platform
  # a nonsymmetric eigendecomposition: CPU and GPU only
  "tpu": lambda y: y + 0 * jnp.linalg.eig(jax.lax.stop_gradient(y[0, :2, :2]).astype(jnp.float32))[0].real.sum(),
  # a platform-dependent choice written for CPU and TPU only
  "cuda": lambda y: jax.lax.platform_dependent(y, cpu=lambda y: y, tpu=lambda y: 2 * y),
}


@pytest.mark.parametrize("platform", sorted(BROKEN))
def test_a_step_that_cannot_lower_for_a_platform_is_reported(monkeypatch, platform):
  """aft_simple broken on purpose: its output passes through an operation that `platform` cannot lower."""
  module = MIXERS["aft_simple"].module
  original = module.__call__
  monkeypatch.setattr(
    module, "__call__", lambda self, x, *args, **kwargs: BROKEN[platform](original(self, x, *args, **kwargs))
  )
  config = _config("aft_simple", causal=False)
  other = {"tpu": "cuda", "cuda": "tpu"}[platform]
  assert [r.platform for r in lowering.lower_steps(config, platforms=("cpu", other))] == ["cpu", other]
  with pytest.raises(
    lowering.LoweringError, match=f"aft_simple: the train step does not lower for {platform}: NotImplementedError"
  ):
    lowering.lower_steps(config)


def test_a_step_is_traced_once_for_both_platforms_unless_a_path_was_chosen_by_platform(monkeypatch):
  """ff_only's step asks for no platform: traced once, lowered twice. fnet's "auto" asks (DFT matmuls on a TPU, an
  FFT on a GPU; the FFT's per-device body put in place so that the lowered text shows it): traced per platform."""
  traces = []
  real = lowering._train_step  # pylint: disable=protected-access
  monkeypatch.setattr(lowering, "_train_step", lambda *args: traces.append(args) or real(*args))
  monkeypatch.setitem(fourier._IMPLS, "rfft", fourier._rfft)  # pylint: disable=protected-access
  assert len(lowering.lower_steps(_config("ff_only", causal=False))) == 2 and len(traces) == 1
  rows = {r.platform: r for r in lowering.lower_steps(_config("fnet", causal=False))}
  assert len(traces) == 3
  assert "FFT" not in rows["tpu"].kernels and rows["cuda"].kernels.get("FFT", 0) > 0


def _lower(fn, x, target):
  """fn traced for target (a fresh function: jit caches traces by function, not by lowering_for) and lowered."""
  with platform.lowering_for(target):
    return jax.jit(lambda x: fn(x)).trace(x).lower(lowering_platforms=(target,)).as_text()  # pylint: disable=unnecessary-lambda


def test_fnet_auto_is_dft_matmuls_on_tpu_up_to_the_papers_crossover_and_fft_elsewhere(monkeypatch):
  """The FFT runs per device through custom_partitioning, whose body is lowered only when the step is compiled;
  here it is replaced by the body itself so that the lowered program shows which transform each platform gets."""
  assert fourier.TPU_MATMUL_MAX_LEN == 4096  # the paper's crossover; lowered below at a small one (DFT matrices
  monkeypatch.setattr(fourier, "TPU_MATMUL_MAX_LEN", 16)  # of 4096² entries are 64 MiB of program constants)
  monkeypatch.setitem(fourier._IMPLS, "rfft", fourier._rfft)  # pylint: disable=protected-access
  fnet = lambda L: (lambda x: MIXERS["fnet"](causal=False).apply({}, x), jnp.zeros((2, L, 8)))
  fn, x = fnet(16)
  assert not platform.kernels(_lower(fn, x, "tpu")) and "dot_general" in _lower(fn, x, "tpu")
  assert "FFT" in platform.kernels(_lower(fn, x, "cuda")) and "dot_general" not in _lower(fn, x, "cuda")
  assert "FFT" in platform.kernels(_lower(fn, x, "cpu"))
  fn, x = fnet(24)
  assert "FFT" in platform.kernels(_lower(fn, x, "tpu")) and "dot_general" not in _lower(fn, x, "tpu")


@pytest.mark.parametrize("target", ["tpu", "cuda"])
def test_fnets_per_device_transforms_lower_for_accelerators(target):
  """What custom_partitioning lowers at compile time, each device's FFT, lowers for the platform."""
  x = jnp.zeros((2, 16, 8))
  for transform in (fourier._fft, fourier._rfft):  # pylint: disable=protected-access
    assert "FFT" in platform.kernels(_lower(transform, x, target))
    np.testing.assert_allclose(transform(x + 1.0)[0, 0, 0], 16 * 8)


def test_the_training_log_names_the_kernels_and_warns_when_an_expected_one_is_missing(caplog):
  """efftx.train.report_kernels on compiled programs' text: a bfloat16 attention model on a GPU expects cuDNN's
  fused attention; the program that calls it passes, one that fell back to XLA's attention is warned about."""
  from efftx import train  # pylint: disable=import-outside-toplevel

  caplog.set_level(logging.INFO, logger="absl")
  config = _config("fnet+attention*1@top", causal=False, dtype="bfloat16")
  with_cudnn = 'custom-call(%a), custom_call_target="__cudnn$fmhaSoftmax"\n %f = fft(%x), fft_type=FFT'
  assert train.report_kernels(config, with_cudnn, "gpu") == []
  assert "cuDNN fused attention ×1, FFT ×1" in caplog.text and "attention → cuDNN fused attention" in caplog.text
  warnings = train.report_kernels(config, " %f = fft(%x), fft_type=FFT", "gpu")
  assert warnings == [
    "attention: expected cuDNN fused attention on gpu, but the compiled step does not call it (XLA's code runs instead)"
  ]
  assert train.report_kernels(config, "", "tpu") == [
    "attention: expected Pallas TPU kernel on tpu, but the compiled step does not call it (XLA's code runs instead)"
  ]
  # float32 on a GPU expects no kernel for attention (flash: XLA's code), and the FFT for FNet.
  config.model.dtype = "float32"
  assert train.report_kernels(config, "", "gpu") == [
    "fnet: expected FFT on gpu, but the compiled step does not call it (XLA's code runs instead)"
  ]
  # Attention dropout: the chunked (or plain) path, nothing expected of attention.
  config.mixer.attention.attention_dropout = 0.1
  assert train.report_kernels(config, "fft(", "tpu") == []


def test_a_row_names_the_expected_kernels_the_lowered_text_cannot_show_and_a_platform_typo_is_a_flag_error():
  """efftx.lowering's line: the kernels found, each mixer's expected path on the platform, and the expected
  kernels missing from the lowered text named as placed on the device itself (cuDNN attention, FNet's per-device
  FFT), not silently "none"; an unknown --platforms entry is one line and exit 2, before anything is lowered."""
  from conftest import run_in_process  # pylint: disable=g-import-not-at-top

  config = _config("fnet", False)
  assert train.expected_kernels(config, "gpu") == {"fnet": "FFT"}
  row = lowering.Lowered("train", "cuda", {}, 274_000, {"fnet": "FFT"})
  assert row.describe() == (
    "train  cuda   lowers: 274K chars of StableHLO; kernels none beyond XLA's; expected fnet → FFT (FFT: not in "
    "the program lowered here; JAX places it when the step is built on cuda itself)"
  )
  seen = lowering.Lowered("train", "tpu", {"Pallas TPU kernel": 3}, 372_000, {"attention": "Pallas TPU kernel"})
  assert seen.describe().endswith("kernels Pallas TPU kernel ×3; expected attention → Pallas TPU kernel")
  code, _, stderr = run_in_process("efftx.lowering", ["--config=configs/quickstart.py:smoke", "--platforms=tpu,metal"])
  assert code == 2 and stderr.strip().splitlines() == [
    "efftx.lowering: error: --platforms: 'metal' is not a platform; choose from tpu, cuda, rocm, cpu"
  ], stderr

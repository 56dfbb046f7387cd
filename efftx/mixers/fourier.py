"""FNet's Fourier mixing: y = Re(FFT2(x)) over (sequence, hidden), no parameters (Lee-Thorp et al., 2021)."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
from jax.experimental.custom_partitioning import custom_partitioning
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.spec import MixerSpec
from efftx.platform import target_platform

FOURIER_IMPLS = ("fft", "rfft", "matmul", "auto")


def _fft(x_BxLxD: jax.Array) -> jax.Array:
  return jnp.fft.fft2(x_BxLxD, axes=(-2, -1)).real


def _rfft(x_BxLxD: jax.Array) -> jax.Array:
  """Re(FFT2(x)) from rfft2 by Hermitian symmetry: for real x, X[k1, k2] = conj(X[-k1, -k2])."""
  D = x_BxLxD.shape[-1]
  half_BxLxH = jnp.fft.rfft2(x_BxLxD, axes=(-2, -1)).real  # columns k2 = 0 … D//2
  # Columns k2 = D//2+1 … D-1 are Re X[-k1 mod L, D-k2]: rows reversed around 0, columns D//2 … 1 reversed.
  mirrored_BxLxH = jnp.roll(half_BxLxH[:, ::-1], 1, axis=1)
  return jnp.concatenate([half_BxLxH, mirrored_BxLxH[:, :, 1 : D - D // 2][:, :, ::-1]], axis=-1)


def _per_example(mix):
  """`mix` (B×L×D → B×L×D, a linear map of each example that is its own adjoint, as Re(FFT2) is: Re(F_L x F_D) =
  C_L x C_D − S_L x S_D with symmetric C and S) on each device's share of the batch, differentiated as itself.

  Without this XLA's SPMD partitioner gathers the whole batch onto every device before an FFT, in the forward and
  the backward pass alike, so under data parallelism each device would transform the global batch. Here the FFT
  runs on the device's rows only, whatever else the partitioner makes of the operand's sharding
  (experiments/performance/DECISIONS.md: fnet-fft-per-device). Forward-mode autodiff (jax.jvp, jacfwd) does not
  apply to it (a custom_vjp); nothing in efftx uses it.
  """

  def batch_only(mesh, arg_shapes):
    spec = arg_shapes[0].sharding.spec
    return NamedSharding(mesh, P(spec[0] if len(spec) else None))

  def partition(mesh, arg_shapes, result_shape):
    del result_shape
    sharding = batch_only(mesh, arg_shapes)
    return mesh, mix, sharding, (sharding,)

  split = custom_partitioning(mix)
  split.def_partition(
    partition,
    infer_sharding_from_operands=lambda mesh, shapes, _: batch_only(mesh, shapes),
    sharding_rule="b l d -> b l d",
    need_replication_factors=("l", "d"),
  )

  @jax.custom_batching.custom_vmap  # custom_partitioning has no batching rule: vmap folds its axis into B
  def batched(x_BxLxD):
    return split(x_BxLxD)

  @batched.def_vmap
  def _(axis_size, in_batched, x_NxBxLxD):
    del axis_size
    if not in_batched[0]:
      return split(x_NxBxLxD), False
    return split(x_NxBxLxD.reshape((-1,) + x_NxBxLxD.shape[2:])).reshape(x_NxBxLxD.shape), True

  @jax.custom_vjp
  def self_adjoint(x_BxLxD):
    return batched(x_BxLxD)

  self_adjoint.defvjp(lambda x_BxLxD: (batched(x_BxLxD), None), lambda _, g_BxLxD: (batched(g_BxLxD),))
  return self_adjoint


@functools.lru_cache(maxsize=32)
def _dft_cos_sin(n: int) -> tuple[np.ndarray, np.ndarray]:
  angle = 2 * np.pi * np.outer(np.arange(n), np.arange(n)) / n
  return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def _matmul(x_BxLxD: jax.Array) -> jax.Array:
  """Re(F_L x F_D) with F = C - iS: C_L x C_D - S_L x S_D, four real matmuls (FNet's TPU path)."""
  _, L, D = x_BxLxD.shape
  cos_LxL, sin_LxL = _dft_cos_sin(L)
  cos_DxD, sin_DxD = _dft_cos_sin(D)
  mm = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  return mm("bld,de->ble", mm("kl,bld->bkd", cos_LxL, x_BxLxD), cos_DxD) - mm(
    "bld,de->ble", mm("kl,bld->bkd", sin_LxL, x_BxLxD), sin_DxD
  )


TPU_MATMUL_MAX_LEN = 4096  # the FNet paper's crossover on TPU: DFT matmuls up to here, FFT beyond


def _auto(x_BxLxD: jax.Array) -> jax.Array:
  """Picks the path for the platform the model is traced for (efftx.platform.target_platform(): this process's
  backend, or the one efftx.lowering lowers for): on a TPU up to L = TPU_MATMUL_MAX_LEN the DFT as four matmuls (the
  FNet paper's choice: MXU matmuls, slow FFTs on TPU), FFT beyond; elsewhere the FFT as rfft — on a GPU cuFFT (the
  paper's GPU path), on a CPU the fastest of the three (`python -m efftx.bench --mode=fourier` times them;
  experiments/performance/DECISIONS.md: fnet-rfft-on-cpu). The TPU and GPU choices follow the paper and are not
  measured here."""
  if target_platform() == "tpu" and x_BxLxD.shape[1] <= TPU_MATMUL_MAX_LEN:
    return _matmul(x_BxLxD)
  return _IMPLS["rfft"](x_BxLxD)


_IMPLS = {"fft": _per_example(_fft), "rfft": _per_example(_rfft), "matmul": _matmul, "auto": _auto}


class FNet(nn.Module):
  """Fourier token mixing.

  FNet has no causal form (every output mixes every position), so `causal=True` raises UserError.

  Padding (`padding`): the DFT has no notion of a mask. "zero" (default) sets padded positions to zero before
  mixing: outputs at real positions then do not depend on what the padded positions hold, but they do depend on
  the padded length L (the DFT's size). "mix" is the published code's behaviour (google-research f_net, HF
  FNet): the padded positions are mixed in as they are, so every real output depends on the padding's contents
  (pad embeddings, position embeddings at padded positions) and on how much padding there is — a model trained
  that way must be evaluated with the same padding.

  `fourier_impl`: "fft" (complex FFT, real part), "rfft" (real FFT + Hermitian symmetry), "matmul" (real DFT
  matrices), "auto" (per backend and length). All compute in float32: not every backend has a bfloat16 FFT.
  """

  causal: bool = False
  fourier_impl: str = "auto"
  padding: str = "zero"

  def __post_init__(self):
    if self.causal:  # SPEC refuses it with a config-level message; this guards direct construction
      raise UserError("mixer 'fnet' cannot be causal: its 2-D DFT mixes every position with every other")
    super().__post_init__()

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic, decode  # no parameters, no dropout; never causal, so never decoding (see __post_init__)
    if mask is not None and self.padding == "zero":
      x_BxLxD = jnp.where(mask[:, :, None], x_BxLxD, 0)
    y_BxLxD = _IMPLS[self.fourier_impl](x_BxLxD.astype(jnp.float32))
    return y_BxLxD.astype(x_BxLxD.dtype)


def _flops(options, L: int, d: int, causal: bool) -> float:
  """FFT paths: one complex 2-D FFT of L·d points, 5·L·d·log2(L·d) per sequence (FNet's convention, and that of
  the PyTorch comparison in experiments/performance; "rfft" does about half of it). "matmul" (and "auto" on TPU
  up to 4096): four real matmuls, two L×L by L×d and two L×d by d×d."""
  del causal
  impl = options["fourier_impl"]
  if impl == "matmul" or (impl == "auto" and target_platform() == "tpu" and L <= TPU_MATMUL_MAX_LEN):
    return 4 * L * d + 4 * d * d
  return 5 * d * np.log2(L * d)


def _kernel(options, L: int, dtype, platform: str, dropout_active: bool) -> str | None:
  del dtype, dropout_active
  impl = options["fourier_impl"]
  if impl == "matmul" or (impl == "auto" and platform == "tpu" and L <= TPU_MATMUL_MAX_LEN):
    return None
  return "FFT"


SPEC = MixerSpec(
  FNet,
  "Re(FFT2(x)), no parameters; O(Ld log Ld)",
  can_be_causal=False,
  flops=_flops,
  train_factor=2.0,
  kernel=_kernel,
  options={
    "fourier_impl": Field(
      "how Re(FFT2) is computed: fft, rfft (Hermitian symmetry), matmul (DFT matrices), auto (per backend and length)",
      choices=FOURIER_IMPLS,
    ),
    "padding": Field(
      "zero: padded positions are zeroed before the DFT; mix: mixed in as they are (the published FNet code)",
      choices=("zero", "mix"),
    ),
  },
)

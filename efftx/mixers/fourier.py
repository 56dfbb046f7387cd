"""FNet's Fourier mixing: y = Re(FFT2(x)) over (sequence, hidden), no parameters (Lee-Thorp et al., 2021)."""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
from jax.experimental.custom_partitioning import custom_partitioning
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np

from efftx.errors import UserError
from efftx.mixers.spec import MixerSpec, Option

FOURIER_IMPLS = ("fft", "rfft", "matmul", "auto")


def _fft(x_BxLxD: jax.Array) -> jax.Array:
  return jnp.fft.fft2(x_BxLxD, axes=(-2, -1)).real


def _rfft(x_BxLxD: jax.Array) -> jax.Array:
  """Re(FFT2(x)) from rfft2 by Hermitian symmetry: for real x, X[k1, k2] = conj(X[-k1, -k2])."""
  D = x_BxLxD.shape[-1]
  half_BxLxH = jnp.fft.rfft2(x_BxLxD, axes=(-2, -1)).real  # columns k2 = 0 … D//2
  # Columns k2 = D//2+1 … D-1 are Re X[-k1 mod L, D-k2]: rows reversed around 0, columns D//2 … 1 reversed.
  mirrored_BxLxH = jnp.roll(half_BxLxH[:, ::-1], 1, axis=1)
  return jnp.concatenate([half_BxLxH, mirrored_BxLxH[:, :, 1:D - D // 2][:, :, ::-1]], axis=-1)


def _per_example(mix):
  """`mix` (B×L×D → B×L×D, a linear map of each example that is its own adjoint, as Re(FFT2) is: Re(F_L x F_D) =
  C_L x C_D − S_L x S_D with symmetric C and S) on each device's share of the batch, differentiated as itself.

  Without this XLA's partitioner (jax 0.10.2) gathers the whole batch onto every device before an FFT, in the
  forward and the backward pass alike, so under data parallelism each device transformed the global batch (the
  compiled step: an all-gather before each fft, whose operand had the global batch). Here the FFT runs on the
  device's rows only, whatever else the partitioner makes of the operand's sharding. Forward-mode autodiff
  (jax.jvp, jacfwd) does not apply to it (a custom_vjp); nothing in efftx uses it.
  """
  def batch_only(mesh, arg_shapes):
    spec = arg_shapes[0].sharding.spec
    return NamedSharding(mesh, P(spec[0] if len(spec) else None))

  def partition(mesh, arg_shapes, result_shape):
    del result_shape
    sharding = batch_only(mesh, arg_shapes)
    return mesh, mix, sharding, (sharding,)

  split = custom_partitioning(mix)
  split.def_partition(partition, infer_sharding_from_operands=lambda mesh, shapes, _: batch_only(mesh, shapes),
                      sharding_rule="b l d -> b l d", need_replication_factors=("l", "d"))

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
  return (mm("bld,de->ble", mm("kl,bld->bkd", cos_LxL, x_BxLxD), cos_DxD)
          - mm("bld,de->ble", mm("kl,bld->bkd", sin_LxL, x_BxLxD), sin_DxD))


def _auto(x_BxLxD: jax.Array) -> jax.Array:
  """Picks the path by backend and length.

  CPU, measured (`python -m efftx.bench --mode=fourier`: 2 cores, D=256, 8192 tokens, jit of forward+backward,
  ms per call, 2026-11-29):
      L        128   256   512  1024  2048  4096
      fft     28.9  24.1  29.0  34.8  29.4  38.5
      rfft    14.3  14.5  17.4  16.6  16.0  13.9
      matmul  30.7  40.4  50.2  86.4 148.7 273.2
  so rfft at every length; again after the backward pass became the forward map (_per_example), on a 2-core
  Intel Xeon, 2026-12-01: L 256 / 1024 / 4096 fft 40.1 / 37.3 / 36.5, rfft 13.7 / 13.3 / 13.2, matmul 46.7 / 89.9 /
  298.2. TPU: the FNet paper finds the DFT-as-matmul faster up to L≈4096 (MXU matmuls, slow
  FFTs); GPU: cuFFT, so rfft. The TPU and GPU choices follow the paper and are not measured here.
  """
  if jax.default_backend() == "tpu" and x_BxLxD.shape[1] <= 4096:
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
  def __call__(self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True,
               decode: bool = False) -> jax.Array:
    del deterministic, decode  # no parameters, no dropout; never causal, so never decoding (see __post_init__)
    if mask is not None and self.padding == "zero":
      x_BxLxD = jnp.where(mask[:, :, None], x_BxLxD, 0)
    y_BxLxD = _IMPLS[self.fourier_impl](x_BxLxD.astype(jnp.float32))
    return y_BxLxD.astype(x_BxLxD.dtype)


def _flops(options, L: int, d: int, causal: bool) -> float:
  """FFT paths: one complex 2-D FFT of L·d points, 5·L·d·log2(L·d) per sequence (FNet's and the peer benchmark's
  convention; "rfft" does about half of it). "matmul" (and "auto" on TPU up to 4096): four real matmuls, two
  L×L by L×d and two L×d by d×d."""
  del causal
  impl = options["fourier_impl"]
  if impl == "matmul" or (impl == "auto" and jax.default_backend() == "tpu" and L <= 4096):
    return 4 * L * d + 4 * d * d
  return 5 * d * np.log2(L * d)


SPEC = MixerSpec(
    FNet, "Re(FFT2(x)), no parameters; O(Ld log Ld)", can_be_causal=False, flops=_flops, train_factor=2.0,
    options={"fourier_impl": Option("how Re(FFT2) is computed: fft, rfft (Hermitian symmetry), matmul (DFT "
                                    "matrices), auto (per backend and length)", choices=FOURIER_IMPLS),
             "padding": Option("zero: padded positions are zeroed before the DFT; mix: mixed in as they are "
                               "(the published FNet code)", choices=("zero", "mix"))})

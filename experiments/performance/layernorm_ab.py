"""A LayerNorm with a hand-written backward pass against flax's nn.LayerNorm (autodiff) in the peer model's training
step: both steps compiled in one process, then timed in alternation (factories.alternate). Tried on a 2-core Xeon
on 2026-12-01 and not adopted (README.md, Performance notes: 1.01-1.04x for the identity and fnet models, 0.97-1.01x
for attention).

    PJRT_NPROC=4 XLA_FLAGS=--xla_force_host_platform_device_count=2 \\
        python experiments/peers/layernorm_ab.py 1024 identity 30     # length, a factories.py name, rounds

What it tries: XLA:CPU fed nn.LayerNorm's backward reductions to YNNPACK fusions and wrote the scale, 1/σ and their
product out at full B×L×D size as their operands (`profile_step.py identity_one_device 1024 --kernels 60`). Here
the backward pass takes its two row sums as products with the scale vector and recomputes x̂ from the row
statistics behind an optimization barrier. The same function as nn.LayerNorm (statistics in float32, variance as
E[x²] − E[x]²); the script checks that the two steps give the same loss and the same AdamW first moments (0.1 × the
gradients, after one step).
"""
import functools
import pathlib
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import factories  # pylint: disable=g-import-not-at-top,wrong-import-position


def _stats(x, eps):
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, -1)
  return mean, jax.lax.rsqrt(jnp.maximum(jnp.mean(x32 * x32, -1) - mean * mean, 0.0) + eps)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def layer_norm(x, scale, bias, eps, dtype):
  return _fwd(x, scale, bias, eps, dtype)[0]


def _fwd(x, scale, bias, eps, dtype):
  mean, rstd = _stats(x, eps)
  y = ((x.astype(jnp.float32) - mean[..., None]) * rstd[..., None] * scale + bias).astype(dtype)
  return y, (x, mean, rstd, scale)


def _bwd(eps, dtype, residuals, g):
  """dx = rstd·(g·s − mean_d(g·s) − x̂·mean_d(g·s·x̂)), dscale = Σ g·x̂, dbias = Σ g."""
  del eps, dtype
  x, mean, rstd = jax.lax.optimization_barrier(residuals[:3])
  scale = residuals[3]
  g32 = g.astype(jnp.float32)
  xhat = (x.astype(jnp.float32) - mean[..., None]) * rstd[..., None]
  gx = g32 * xhat
  sum_gs, sum_gsx = jnp.einsum("...d,d->...", g32, scale), jnp.einsum("...d,d->...", gx, scale)
  dx = rstd[..., None] * (g32 * scale - (sum_gs[..., None] + xhat * sum_gsx[..., None]) / x.shape[-1])
  rows = tuple(range(x.ndim - 1))
  return dx.astype(x.dtype), gx.sum(rows), g32.sum(rows)


layer_norm.defvjp(_fwd, _bwd)


class LayerNorm(nn.Module):
  """nn.LayerNorm's parameters and function (as efftx.model calls it: epsilon, dtype) with the backward above."""
  epsilon: float = 1e-6
  dtype: object = None

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],), jnp.float32)
    return layer_norm(x, scale, bias, self.epsilon, jnp.dtype(self.dtype or x.dtype))


def main(length: int, name: str, rounds: int = 30) -> None:
  runs, flax_layer_norm = {}, nn.LayerNorm
  for label, layer_norm_class in (("written out", LayerNorm), ("flax", flax_layer_norm)):
    nn.LayerNorm = layer_norm_class  # efftx.model reads nn.LayerNorm while the step is traced, just below
    runs[label] = factories.compiled_step(name, length)
  nn.LayerNorm = flax_layer_norm
  (_, opt_state, loss), (_, flax_opt_state, flax_loss) = (compiled(*args) for compiled, args in runs.values())
  np.testing.assert_allclose(loss, flax_loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-7), opt_state, flax_opt_state)
  ms = factories.alternate(runs, rounds, base="flax")
  print(f"{name} {length}, {rounds} rounds: written out {ms['written out']:.0f} ms, flax {ms['flax']:.0f} ms; "
        f"{ms['written out/flax']:.3f}x faster (median of the rounds' ratios)")


if __name__ == "__main__":
  main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 30)

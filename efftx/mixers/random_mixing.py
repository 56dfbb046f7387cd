"""FNet's "Random" baseline (Lee-Thorp et al., 2021): the product of `linear_mixing`,

    y[b, n, k] = Σ_{i, j} W_seq[n, i] x[b, i, j] W_hidden[j, k],

with FIXED random matrices: W_seq (max_len × max_len, W_seq[:L, :L] for L positions) and W_hidden (D × D) drawn
from lecun normal — a normal truncated at two standard deviations and rescaled to variance 1/fan_in
(flax.linen.initializers.lecun_normal), as google-research f_net `layers.py` RandomTransform draws them.

How they stay fixed: they are not variables at all. Each forward pass draws them again from
key = fold_in(jax.random.key(random_seed), crc32(module path)), at trace time (jax.ensure_compile_time_eval), so
they enter the compiled program as constants. This is the published scheme — RandomTransform draws its matrices
in `setup` from a key split per layer from the model's `random_seed` (0 by default), never storing them — and it
is "not trained" exactly, with nothing outside this file:
  - no parameter exists, so there is no gradient, no optimizer state and no weight decay for them (as "params"
    behind stop_gradient they would have zero gradients but sit in the optimizer, and be decayed if named
    "kernel"; in another variable collection they would be dropped, since efftx keeps only "params");
  - a checkpoint restores them by construction: the same seed, path and shapes give the same draws (under the
    same jax.random implementation; `jax_threefry_partitionable` changing its default would change them);
  - the module's path gives each layer its own matrices (the published code splits the key per layer); the layers
    of a reversible stack share one path, and so one pair of matrices.
`random_seed` is an option (config.mixer.random_seed), not the run's seed: runs that differ only in their seed
keep the same mixing, and a fine-tuned model mixes as its pre-trained one did.

Cost of the scheme: max_len² + D² float32 constants per layer in the compiled program, drawn once per compilation.

Padding (`padding`) and causality: as `linear_mixing` (efftx/mixers/linear_mixing.py) — "zero" (default) zeroes
padded positions first, "mix" is the published behaviour; causal masks W_seq to its lower triangle; no decoding.
"""

from __future__ import annotations

import zlib

import flax.linen as nn
import jax

from efftx.fields import Field
from efftx.mixers.linear_mixing import PADDING
from efftx.mixers.linear_mixing import check_call
from efftx.mixers.linear_mixing import flops
from efftx.mixers.linear_mixing import seq_hidden_product
from efftx.mixers.spec import MixerSpec


class RandomMixing(nn.Module):
  """y = W_seq[:L, :L] x W_hidden with fixed lecun-normal matrices from `random_seed` (see the module docstring)."""

  causal: bool = False
  max_len: int = 512  # positions W_seq covers
  padding: str = "zero"  # "zero" or "mix" (the published code)
  random_seed: int = 0  # seed of the fixed matrices (with the module's path)

  def matrices(self, d_model: int) -> tuple[jax.Array, jax.Array]:
    """(W_seq max_len × max_len, W_hidden d_model × d_model), float32 constants: lecun normal from
    fold_in(key(random_seed), crc32(module path)), split into one key for each."""
    with jax.ensure_compile_time_eval():
      path_hash = zlib.crc32("/".join(self.scope.path).encode())
      seq_key, hidden_key = jax.random.split(jax.random.fold_in(jax.random.key(self.random_seed), path_hash))
      init = nn.initializers.lecun_normal()
      return init(seq_key, (self.max_len, self.max_len)), init(hidden_key, (d_model, d_model))

  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    _, L, D = x_BxLxD.shape
    check_call("random", L, self.max_len, decode)
    w_seq_MxM, w_hidden_DxD = self.matrices(D)
    return seq_hidden_product(x_BxLxD, w_seq_MxM, w_hidden_DxD, mask, self.causal, self.padding)


SPEC = MixerSpec(
  RandomMixing,
  "fixed random mixing W_seq x W_hidden (FNet's Random), no parameters; O(L²d + Ld²)",
  flops=flops,
  train_factor=2.0,  # the matrices are constants: the backward pass is the same two matmuls on g
  options={
    "padding": PADDING,
    "random_seed": Field("seed of the fixed random matrices (each layer draws its own from it)"),
  },
)

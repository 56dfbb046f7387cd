"""FNet's "Linear" baseline (Lee-Thorp et al., 2021): learned dense mixing along the sequence and the hidden axis,

    y[b, n, k] = Σ_{i, j} W_seq[n, i] x[b, i, j] W_hidden[j, k],

W_seq ∈ R^{max_len×max_len} and W_hidden ∈ R^{D×D}, both parameters drawn from N(0, 0.02²) — google-research
f_net `layers.py` LinearTransform (there "seq_kernel" and "hidden_kernel", W_seq sized by the input length, which
the published pipeline always pads to max_seq_length). A sequence of L < max_len positions uses W_seq[:L, :L].

The product, its padding and its causal form are shared with `random` (efftx/mixers/random_mixing.py), which applies
the same product with fixed random matrices.

Padding (`padding`, as in fnet, efftx/mixers/fourier.py): the published code ignores the mask. "zero" (default) sets
padded positions to zero before mixing; outputs at real positions then depend neither on what the padded positions
hold nor on how many there are (the real rows and columns of W_seq[:L, :L] are the same for every L ≥ them, unlike
the DFT's). "mix" is the published behaviour: padded positions are mixed in as they are. Either way the outputs at
padded positions are not zero (they mix the real ones); the model ignores them.

Causal: W_seq is masked to its lower triangle (i ≤ n) before the product, so y_n sees x_0 … x_n. Not in the
published code, which is bidirectional only. No decoding cache is implemented (it would keep x·W_hidden of every
past position, as attention keeps K and V): `decode=True` raises.

The matrices are named w_seq and w_hidden, not "kernel": they are not Dense weights, so `model.initialize`'s init_std
does not redraw them, `efftx.bench` counts them through this spec's `flops` rather than as 6 FLOPs per weight, and
efftx's AdamW (which decays only "kernel" and "embedding" leaves) does not decay them — the published optimizer
decayed every parameter.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from efftx.errors import UserError
from efftx.fields import Field
from efftx.mixers.spec import MixerSpec

PADDING = Field(
  "zero: padded positions are zeroed before mixing; mix: mixed in as they are (the published FNet code)",
  choices=("zero", "mix"),
)


def check_call(name: str, L: int, max_len: int, decode: bool) -> None:
  """The refusals `linear_mixing` and `random` share: a sequence longer than W_seq, and decoding."""
  if decode:
    raise UserError(
      f"mixer '{name}' cannot decode one position at a time (no cache of x·W_hidden); run the whole causal forward pass"
    )
  if L > max_len:
    raise UserError(f"{name}: sequence length {L} exceeds max_len={max_len} (W_seq is max_len × max_len)")


def seq_hidden_product(
  x_BxLxD: jax.Array,
  w_seq_MxM: jax.Array,
  w_hidden_DxD: jax.Array,
  mask_BxL: jax.Array | None,
  causal: bool,
  padding: str,
) -> jax.Array:
  """Σ_{i,j} W_seq[n, i] x[b, i, j] W_hidden[j, k] with W_seq[:L, :L] (lower triangle if causal), padded positions
  zeroed first if padding == "zero"; two matmuls in x's dtype (as nn.Dense computes), x's shape and dtype out."""
  L = x_BxLxD.shape[1]
  if mask_BxL is not None and padding == "zero":
    x_BxLxD = jnp.where(mask_BxL[:, :, None], x_BxLxD, 0)
  w_seq_LxL = w_seq_MxM[:L, :L]
  if causal:
    w_seq_LxL = jnp.tril(w_seq_LxL)
  h_BxLxD = jnp.einsum("bij,jk->bik", x_BxLxD, w_hidden_DxD.astype(x_BxLxD.dtype))
  return jnp.einsum("ni,bik->bnk", w_seq_LxL.astype(x_BxLxD.dtype), h_BxLxD)


class LinearMixing(nn.Module):
  """y = W_seq[:L, :L] x W_hidden with both matrices learned (see the module docstring)."""

  causal: bool = False
  max_len: int = 512  # positions W_seq covers
  padding: str = "zero"  # "zero" or "mix" (the published code)

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del deterministic  # no dropout inside the mixer
    _, L, D = x_BxLxD.shape
    check_call("linear_mixing", L, self.max_len, decode)
    init = nn.initializers.normal(0.02)
    w_seq_MxM = self.param("w_seq", init, (self.max_len, self.max_len))
    w_hidden_DxD = self.param("w_hidden", init, (D, D))
    return seq_hidden_product(x_BxLxD, w_seq_MxM, w_hidden_DxD, mask, self.causal, self.padding)


def flops(options, L: int, d: int, causal: bool) -> float:
  """Per token: W_seq[:L, :L] (L×L) by x W_hidden (L×d), 2·L·d; x (L×d) by W_hidden (d×d), 2·d·d. Causal the
  same: the triangle is masked, not cut."""
  del options, causal
  return 2 * L * d + 2 * d * d


SPEC = MixerSpec(
  LinearMixing,
  "learned mixing W_seq x W_hidden (FNet's Linear), max_len² + d² parameters; O(L²d + Ld²)",
  flops=flops,
  train_factor=3.0,
  options={"padding": PADDING},
  decayed=("w_seq", "w_hidden"),
)

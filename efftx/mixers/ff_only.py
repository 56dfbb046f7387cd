"""FNet's "FF-only" baseline (Lee-Thorp et al., 2021): no token mixing — the mixing sublayer returns its input, so a
post-LN block computes LN(x + x) and then the feed-forward, a pre-LN block x + LN(x) (google-research f_net
`layers.py` IdentityTransform). No parameters, no cost.

Padding needs nothing: each output is its own position's input, so real outputs never see padded ones, mask or not.
Causal by construction, and it decodes one position at a time as the identity; in decoding it keeps only the shared
position counter (efftx/mixers/cache.py), so that `init(..., decode=True)` makes a "cache" as every decoding mixer
does, and decoding a bidirectional module is refused as for the others.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from efftx.mixers import cache
from efftx.mixers.spec import MixerSpec


class FFOnly(nn.Module):
  """The identity as a mixer."""

  causal: bool = False

  @nn.compact
  def __call__(
    self, x_BxLxD: jax.Array, mask: jax.Array | None = None, deterministic: bool = True, decode: bool = False
  ) -> jax.Array:
    del mask, deterministic  # nothing crosses positions; no dropout
    if decode:
      cache.append(self)  # counts positions; raises unless causal
    return x_BxLxD


def _flops(options, L: int, d: int, causal: bool) -> float:
  """No matmul."""
  del options, L, d, causal
  return 0.0


SPEC = MixerSpec(
  FFOnly,
  "no token mixing: the identity (FNet's FF-only); no parameters, no cost",
  can_decode=True,
  options={},
  flops=_flops,
)

"""Token mixers behind one interface. `MIXERS[name]` is the mixer's `MixerSpec` (efftx/mixers/spec.py).

Every mixer is a `flax.linen.Module` (`MIXERS[name].module`) that
  - declares its options (hyperparameters with defaults, meanings and allowed values), whether it can be
    causal, and whether it decodes, in a `SPEC` at the end of its file;
  - is built as `MIXERS[name](causal=..., **options)` (which checks the options first) and applied as
    `y_BxLxD = module.apply(variables, x_BxLxD, mask=mask_BxL_or_None, deterministic=...)`, returning the input's
    shape and dtype; `mask` is True at real tokens, False at padding.

A run's mixer options are `config.mixer` (filled from the declared defaults for `config.model.mixer`).
Adding a mixer: its file (module + SPEC) and one line below. `python -m efftx.mixers` prints the table of
mixers, capabilities and options that efftx/mixers/README.md shows.
"""

from efftx.mixers import aft
from efftx.mixers import aft_conv
from efftx.mixers import attention
from efftx.mixers import base_conv
from efftx.mixers import block_local
from efftx.mixers import ff_only
from efftx.mixers import fourier
from efftx.mixers import gated_deltanet
from efftx.mixers import gla
from efftx.mixers import h3
from efftx.mixers import hyena
from efftx.mixers import linear
from efftx.mixers import linear_mixing
from efftx.mixers import local
from efftx.mixers import lsh
from efftx.mixers import mamba
from efftx.mixers import mamba2
from efftx.mixers import random_mixing
from efftx.mixers import retnet
from efftx.mixers import rg_lru
from efftx.mixers import rwkv
from efftx.mixers.spec import REGISTRY
from efftx.mixers.spec import MixerSpec

MIXERS: dict[str, MixerSpec] = REGISTRY  # one dict: spec.py reads names from it
MIXERS.update(
  {
    "attention": attention.SPEC,
    "fnet": fourier.SPEC,
    "linear_mixing": linear_mixing.SPEC,
    "random": random_mixing.SPEC,
    "ff_only": ff_only.SPEC,
    "aft_full": aft.SPEC_FULL,
    "aft_simple": aft.SPEC_SIMPLE,
    "aft_local": aft.SPEC_LOCAL,
    "aft_conv": aft_conv.SPEC,
    "local": local.SPEC,
    "block_local": block_local.SPEC,
    "linear": linear.SPEC,
    "lsh": lsh.SPEC,
    "hyena": hyena.SPEC,
    "rwkv": rwkv.SPEC,
    "base_conv": base_conv.SPEC,
    "base_conv_long": base_conv.SPEC_LONG,
    "h3": h3.SPEC,
    "gated_deltanet": gated_deltanet.SPEC,
    "retnet": retnet.SPEC,
    "mamba2": mamba2.SPEC,
    "gla": gla.SPEC,
    "mamba": mamba.SPEC,
    "rg_lru": rg_lru.SPEC,
  }
)

"""Token mixers behind one interface.

`MIXERS[name]` is a `flax.linen.Module` class. Every mixer:
  - is constructible from keyword hyperparameters that all have defaults, plus `causal: bool`
    (a mixer that cannot be causal raises ValueError on `causal=True`);
  - is applied as `y_BxLxD = module.apply(variables, x_BxLxD, mask=mask_BxL_or_None, deterministic=...)`,
    returning the input's shape and dtype; `mask` is True at real tokens, False at padding.

`efftx.model.build_model` fills a mixer's hyperparameters from the `config.model` fields of the same names
(e.g. `num_heads`, `causal`), so a new mixer's options are new `config.model` fields.
"""
from efftx.mixers.aft import AFTConv, AFTFull, AFTLocal, AFTSimple
from efftx.mixers.attention import Attention
from efftx.mixers.fourier import FNet
from efftx.mixers.linear import LinearAttention
from efftx.mixers.local import LocalAttention
from efftx.mixers.lsh import LSHAttention

MIXERS = {
    "attention": Attention,
    "fnet": FNet,
    "aft_full": AFTFull,
    "aft_simple": AFTSimple,
    "aft_local": AFTLocal,
    "aft_conv": AFTConv,
    "local": LocalAttention,
    "linear": LinearAttention,
    "lsh": LSHAttention,
}

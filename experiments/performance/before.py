"""The two code paths issue 14 replaced, for a before/after run in the same harness (peers.py --extra
before-attention=before:attention ...): attention's old "auto" (plain up to one chunk of 256 positions, "chunked"
above) and flax's nn.gelu(approximate=False) with its autodiff backward pass in place of model.gelu_erf. Patches
efftx.model.ACTIVATIONS in the harness's subprocess (each model runs in its own); everything else is today's code,
on one device (the layout of the run that published these rows).
"""
import flax.linen as nn

import factories
from efftx import model

model.ACTIVATIONS["gelu"] = lambda x: nn.gelu(x, approximate=False)

identity = factories.identity_one_device
fnet = factories.fnet_one_device


def attention(cfg: dict, seq: int) -> nn.Module:
  return factories._factory("attention", data_parallel=False, attention_impl="chunked" if seq > 256 else "plain")(cfg, seq)  # pylint: disable=protected-access


attention.mixer_flops_per_token = factories.attention.mixer_flops_per_token

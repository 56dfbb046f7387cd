"""What recomputing costs in FLOPs at the study's shapes: XLA's cost analysis of one reversible layer's compiled
gradient, recomputing (efftx.reversible.reversible_forward) against storing (the same couplings by plain
autodiff), in units of the layer's forward pass. XLA counts a scanned loop's body once whatever its trip count, so
a stack of two layers (a loop) counts one layer's forward and backward work (with one layer the scan is no loop,
and the first layer's rebuilt input, which nothing needs, is dropped: half a forward pass less).

    python experiments/reversible/flops.py > experiments/reversible/flops.json
"""

import json
import sys

import jax
import jax.numpy as jnp

from efftx import config as config_lib
from efftx import model as model_lib
from efftx import reversible
from efftx import trainer

D, FF, HEADS, TOKENS = 512, 2048, 8, 2048  # experiments/reversible/sweep.py, scale cpu


def layer_flops(length: int) -> dict:
  config = config_lib.default_config("attention")
  config.model.update(d_model=D, d_ff=FF, max_len=length, causal=False)
  config.mixer.update(num_heads=HEADS, attention_impl="plain")  # no loop: XLA counts every FLOP
  make_mixer = trainer.parts(config).model.make_mixer
  stack = reversible.ReversibleStack(
    make_f=lambda: model_lib.MixingSublayer(make_mixer, 0.0, parent=None),
    make_g=lambda: model_lib.FeedForwardSublayer(FF, 0.0, 0, parent=None),
    num_layers=2,
  )
  x = jnp.zeros((TOKENS // length, length, D), jnp.float32)
  mask = jnp.ones(x.shape[:2], bool)
  layers = jax.eval_shape(lambda: stack.init(jax.random.key(0), x, mask, True)["params"]["layers"])
  f, g = stack._apply_fns(deterministic=True)  # pylint: disable=protected-access
  key = jax.random.key(0)

  def outputs(forward):
    return lambda p, x: sum(y.sum() for y in forward(f, g, p, x, x, mask, key))

  def flops(fn):
    return jax.jit(fn).lower(layers, x).compile().cost_analysis()["flops"]

  forward = flops(outputs(reversible.coupling_forward))
  stored = flops(jax.grad(outputs(reversible.coupling_forward), argnums=(0, 1)))
  recomputed = flops(jax.grad(outputs(reversible.reversible_forward), argnums=(0, 1)))
  return {
    "length": length,
    "batch": TOKENS // length,
    "forward_gflop": forward / 1e9,
    "gradient_stored_gflop": stored / 1e9,
    "gradient_recomputed_gflop": recomputed / 1e9,
    "extra_in_forward_passes": (recomputed - stored) / forward,
    "recomputed_over_stored": recomputed / stored,
  }


if __name__ == "__main__":
  rows = [layer_flops(length) for length in (256, 1024)]
  json.dump({"jax": jax.__version__, "device": jax.devices()[0].device_kind, "rows": rows}, sys.stdout, indent=1)
  print()

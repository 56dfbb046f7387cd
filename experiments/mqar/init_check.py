"""Does attention learn MQAR 64x4_v256 with GPT-2's initialisation but not with flax's? An independent check.

    python experiments/mqar/init_check.py --init=0.02     # every weight matrix N(0, 0.02²) (GPT-2, Zoology)
    python experiments/mqar/init_check.py --init=lecun    # N(0, 1/fan-in): flax's default for dense kernels

A two-layer causal softmax-attention Transformer written here in plain JAX (no efftx model code: learned token and
position embeddings N(0, 0.02²), pre-LN blocks of one attention head and a GELU MLP of width 2·d, final LN,
logits at the query positions), trained on efftx's MQAR batches of configs/mqar.py:setting=64x4_v256 (width 64,
batch 32, AdamW lr 1e-3 with 312 warmup steps and cosine decay, weight decay 0.1, clipping at 1.0). Prints the
validation query accuracy every 300 steps. experiments/mqar/README.md has what it printed.
"""

import runpy

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

from efftx.data import pipeline

_INIT = flags.DEFINE_string("init", "0.02", "'lecun', or the std of every weight matrix")
_STEPS = flags.DEFINE_integer("steps", 1500, "training steps")
_D = 64


def init_params(key, vocab, length, init):
  keys = iter(jax.random.split(key, 32))
  normal = lambda *shape, std=0.02: std * jax.random.normal(next(keys), shape)
  dense = lambda fan_in, fan_out: normal(fan_in, fan_out, std=fan_in**-0.5 if init == "lecun" else float(init))
  layer = lambda: {
    "ln1": jnp.ones(_D),
    "q": dense(_D, _D),
    "k": dense(_D, _D),
    "v": dense(_D, _D),
    "o": dense(_D, _D),
    "ln2": jnp.ones(_D),
    "up": dense(_D, 2 * _D),
    "down": dense(2 * _D, _D),
  }
  return {
    "embed": normal(vocab, _D),
    "pos": normal(length, _D),
    "layers": [layer(), layer()],
    "final": jnp.ones(_D),
    "head": dense(_D, vocab),
  }


def layer_norm(x, gain):
  return gain * (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)


def logits_at_queries(params, tokens_BxL, positions_BxK):
  L = tokens_BxL.shape[1]
  x_BxLxD = params["embed"][tokens_BxL] + params["pos"][:L]
  causal_LxL = jnp.tril(jnp.ones((L, L), bool))
  for p in params["layers"]:
    h = layer_norm(x_BxLxD, p["ln1"])
    scores_BxLxL = jnp.einsum("bqd,bkd->bqk", h @ p["q"], h @ p["k"]) / np.sqrt(_D)
    probs_BxLxL = jax.nn.softmax(jnp.where(causal_LxL, scores_BxLxL, -1e30), axis=-1)
    x_BxLxD = x_BxLxD + jnp.einsum("bqk,bkd->bqd", probs_BxLxL, h @ p["v"]) @ p["o"]
    x_BxLxD = x_BxLxD + jax.nn.gelu(layer_norm(x_BxLxD, p["ln2"]) @ p["up"]) @ p["down"]
  x_BxKxD = jnp.take_along_axis(layer_norm(x_BxLxD, params["final"]), positions_BxK[..., None], axis=1)
  return x_BxKxD @ params["head"]


def main(argv):
  del argv
  config = runpy.run_path("configs/mqar.py")["get_config"]("setting=64x4_v256")
  train_batches = pipeline.train_iterator(config, pipeline.source(config, "train"))
  val_batches = list(pipeline.eval_batches(config, pipeline.source(config, "eval")))
  params = init_params(jax.random.key(0), 256, config.model.max_len, _INIT.value)
  tx = optax.chain(
    optax.clip_by_global_norm(1.0),
    optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 312, _STEPS.value), weight_decay=0.1),
  )
  opt_state = tx.init(params)

  def loss(params, batch):
    logits_BxKxV = logits_at_queries(params, batch["tokens"], batch["positions"])
    return optax.softmax_cross_entropy_with_integer_labels(logits_BxKxV, batch["targets"]).mean()

  @jax.jit
  def step(params, opt_state, batch):
    grads = jax.grad(loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  @jax.jit
  def correct(params, batch):  # (right answers, answers) over real rows only
    right_BxK = logits_at_queries(params, batch["tokens"], batch["positions"]).argmax(-1) == batch["targets"]
    return (right_BxK * batch["weight"][:, None]).sum(), batch["weight"].sum() * right_BxK.shape[1]

  for i in range(1, _STEPS.value + 1):
    params, opt_state = step(params, opt_state, next(train_batches))
    if i % 300 == 0:
      right, total = np.sum([jax.device_get(correct(params, b)) for b in val_batches], axis=0)
      print(f"init {_INIT.value} step {i}: validation query accuracy {right / total:.4f}", flush=True)


if __name__ == "__main__":
  app.run(main)

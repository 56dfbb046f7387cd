"""efftx models for the peer benchmark (../shared/bench/peers.py --extra NAME=factories:<mixer>).

`factory(cfg, seq)` builds the peers' model through efftx's own builder (efftx.bench.lm_model →
efftx.model.build_model): d, layers, heads, FF and vocabulary from the harness's `cfg`, dropout 0, and the peers'
block: post-LN (BERT's and HF FNet's layout: the embeddings normalised, a LayerNorm after each residual sum),
exact-erf GELU, LayerNorm epsilon 1e-12, FNet with its embedding projection. Logits at every position.
`factory.mixer_flops_per_token(cfg, seq)` is the mixer's own count (MixerSpec.flops) for the harness's MFU.

Differences from the peers, precisely: HF BERT adds a token-type embedding (one type: a constant vector) that
efftx does not; HF's position embeddings cover max(512, seq) positions, efftx's exactly seq; everything else
(parameters, FLOPs, the loss and AdamW the harness builds) is the same. `identity` is fnet's model with the mixer
replaced by y = x and without FNet's embedding projection (so it has exactly the layers every model shares): the
step without any mixing, for profiling the shared machinery.

How the step runs: the harness jits its own step around the module. `fnet`, `attention`, ... split the batch over
every local device, as efftx.train does (the ids constrained to efftx.sharding.batch over efftx.sharding.make_mesh;
XLA then runs the step data-parallel, the gradients summed over the devices); with the harness run under
XLA_FLAGS=--xla_force_host_platform_device_count=<cores> that is one device per core, what efftx.train and
efftx.evaluate set up on a CPU by themselves (efftx.sharding.use_cpu_cores). The `*_one_device` factories leave the
batch on the default device: the same model as one XLA device using the CPU's threads, JAX's default.
"""
import math
import statistics
import time

import flax.linen as nn
import jax
import optax

from efftx import bench
from efftx import config as config_lib
from efftx import sharding
from efftx.mixers import MIXERS


class _DataParallel(nn.Module):
  """`model` (its parameters unchanged in name and value) with the batch split over the local devices."""
  model: nn.Module

  def setup(self):
    nn.share_scope(self, self.model)

  def __call__(self, ids_BxL):
    devices = jax.local_devices()[:math.gcd(ids_BxL.shape[0], jax.local_device_count())]
    return self.model(jax.lax.with_sharding_constraint(ids_BxL, sharding.batch(sharding.make_mesh(devices=devices))))


def _config(mixer: str, cfg: dict, seq: int, **mixer_options):
  config = config_lib.default_config(mixer)
  config.model.update(d_model=cfg["d"], num_layers=cfg["layers"], d_ff=cfg["ff"], max_len=seq, dropout=0.0,
                      block_layout="post_ln", activation="gelu", norm_eps=1e-12, embed_projection=mixer == "fnet")
  config_lib.set_where_declared(config.mixer, num_heads=cfg["heads"], **mixer_options)
  return config


def _factory(mixer: str, data_parallel: bool = True, **mixer_options):
  def factory(cfg: dict, seq: int) -> nn.Module:
    model = bench.lm_model(_config(mixer, cfg, seq, **mixer_options), cfg["vocab"])
    return _DataParallel(model) if data_parallel else model

  def mixer_flops_per_token(cfg: dict, seq: int) -> float:
    config = _config(mixer, cfg, seq, **mixer_options)
    return cfg["layers"] * MIXERS[mixer].train_flops(dict(config.mixer), seq, cfg["d"], False)

  factory.mixer_flops_per_token = mixer_flops_per_token
  factory.__name__ = mixer if data_parallel else f"{mixer}_one_device"
  return factory


fnet = _factory("fnet")
attention = _factory("attention")
aft_simple = _factory("aft_simple")
aft_local = _factory("aft_local")
linear = _factory("linear")
fnet_one_device = _factory("fnet", data_parallel=False)
attention_one_device = _factory("attention", data_parallel=False)


class _Identity(nn.Module):
  causal: bool = False

  def __call__(self, x_BxLxD, mask=None, deterministic=True):
    del mask, deterministic
    return x_BxLxD


def identity_one_device(cfg: dict, seq: int) -> nn.Module:
  return fnet_one_device(cfg, seq).clone(make_mixer=lambda name: _Identity(name=name), embed_projection=False)


def identity(cfg: dict, seq: int) -> nn.Module:
  return _DataParallel(identity_one_device(cfg, seq))


identity.mixer_flops_per_token = identity_one_device.mixer_flops_per_token = lambda cfg, seq: 0.0


CFG = dict(d=256, layers=4, heads=4, ff=1024, vocab=256, tokens=8192, lr=1e-4)  # peers.py's shape


def harness_step(name: str, length: int):
  """What peers.py times, for the in-process scripts here: (step, params, opt_state, ids, labels) for factory
  `name` at `length` (CFG["tokens"] random tokens a step), step(params, opt_state, ids, labels) → (params,
  opt_state, loss) being the harness's loss (softmax cross-entropy at every position) and AdamW update."""
  batch = CFG["tokens"] // length
  ids = jax.random.randint(jax.random.key(0), (batch, length), 0, CFG["vocab"])
  labels = jax.random.randint(jax.random.key(1), (batch, length), 0, CFG["vocab"])
  model = globals()[name](CFG, length)
  params = model.init(jax.random.key(2), ids)["params"]
  tx = optax.adamw(CFG["lr"])

  def step(params, opt_state, ids, labels):
    loss_fn = lambda p: optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, ids),
                                                                        labels).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step, params, tx.init(params), ids, labels


def compiled_step(name: str, length: int, compiler_options: dict | None = None):
  """(compiled step, its arguments) of harness_step(name, length): what the in-process A/B scripts time. Whatever
  the step reads while it is traced (a monkeypatched module attribute) is fixed here."""
  step, params, opt_state, ids, labels = harness_step(name, length)
  args = (params, opt_state, ids, labels)
  return jax.jit(step).lower(*args).compile(compiler_options), args


def alternate(runs: dict, rounds: int = 8, base: str | None = None) -> dict:
  """Median ms per call of each compiled step in `runs` ({label: (compiled, args)}), called in turn `rounds` times so
  the machine's drift over minutes cancels; the first round warms up and is left out. The step's third output (the
  loss) is read back, so each call is timed to its end; every other round runs them in reverse order, so that no
  label always follows the same one. With `base` (a label) also "<label>/<base>": the median over the rounds of
  base's time over label's in the same round (how many times faster; paired, so robust to a step that ran
  0.75-1.35x its neighbours' time, as they did on a 2-core Xeon)."""
  times = {label: [] for label in runs}
  for i in range(rounds):
    for label, (compiled, args) in (list(runs.items()) if i % 2 == 0 else list(runs.items())[::-1]):
      start = time.perf_counter()
      float(compiled(*args)[2])
      times[label].append(time.perf_counter() - start)
  out = {label: 1e3 * statistics.median(t[1:]) for label, t in times.items()}
  if base is not None:
    out.update({f"{label}/{base}": statistics.median(b / t for b, t in zip(times[base][1:], times[label][1:]))
                for label in runs if label != base})
  return out

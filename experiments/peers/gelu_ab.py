"""Exact GELU, model.gelu_erf against flax's nn.gelu(approximate=False), in one process: both training steps of
a peer-shape model compiled first, then timed in alternation, so the machine's drift over minutes cancels.

    python experiments/peers/gelu_ab.py 1024 identity      # length, factory name
"""
import sys, time, statistics, jax, optax, flax.linen as nn
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
import factories
from efftx import model as M
cfg = dict(d=256, layers=4, heads=4, ff=1024, vocab=256, tokens=8192, lr=1e-4)
S = int(sys.argv[1]); B = 8192 // S; name = sys.argv[2]
ids = jax.random.randint(jax.random.key(0), (B, S), 0, 256); labels = jax.random.randint(jax.random.key(1), (B, S), 0, 256)
def make():
  model = getattr(factories, name)(cfg, S)
  params = model.init(jax.random.key(2), ids)["params"]; tx = optax.adamw(1e-4); opt = tx.init(params)
  def loss_fn(p): return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, ids), labels).mean()
  def step(p, o):
    l, g = jax.value_and_grad(loss_fn)(p); u, o = tx.update(g, o, p); return optax.apply_updates(p, u), o, l
  c = jax.jit(step).lower(params, opt).compile()
  return c, params, opt
A = make()
M.ACTIVATIONS["gelu"] = lambda x: nn.gelu(x, approximate=False)
Bm = make()
def run(c, p, o):
  t = time.perf_counter(); p2, o2, l = c(p, o); float(l); return time.perf_counter() - t
ta, tb = [], []
for r in range(8):
  ta.append(run(*A)); tb.append(run(*Bm))
print(f"{name} {S}: gelu_erf median {1e3*statistics.median(ta[1:]):.0f} ms, nn.gelu median {1e3*statistics.median(tb[1:]):.0f} ms, ratio {statistics.median(tb[1:])/statistics.median(ta[1:]):.3f}")

"""The mixers' FLOP counts (MixerSpec.flops, used for MFU by efftx.bench) against the matmuls of their programs.

The reference walks the jaxpr of a mixer's forward pass and adds 2·M·N·K for every dot_general, the same for
every convolution, 5·N·log2 N for every FFT (the stated convention), multiplying a scan's body by its length; a
while loop (unknown trip count) fails the test. Two batch sizes are traced and differenced, so per-sequence work
shared by the batch (position-bias tables) cancels; the projections (the mixer's Dense kernels) are subtracted.
What is left must equal the spec's formula, which is written from the mixer's algorithm, at lengths that are and
are not multiples of the block sizes.
"""

import math

import jax
from jax.extend import core as jax_core
import jax.numpy as jnp
import numpy as np
import pytest

from efftx.mixers import MIXERS

D = 256


def _matmul_flops(jaxpr) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    out_size = np.prod(eqn.outvars[0].aval.shape)
    if name == "dot_general":
      (lhs_contracting, _), _ = eqn.params["dimension_numbers"]
      lhs_shape = eqn.invars[0].aval.shape
      total += 2 * out_size * np.prod([lhs_shape[i] for i in lhs_contracting])
    elif name == "conv_general_dilated":
      rhs_shape, rhs_spec = eqn.invars[1].aval.shape, eqn.params["dimension_numbers"].rhs_spec
      total += 2 * out_size * np.prod([rhs_shape[i] for i in rhs_spec[1:]])  # input features × window
    elif name == "fft":
      n = np.prod(eqn.params["fft_lengths"])
      shape = eqn.invars[0].aval.shape
      total += 5 * np.prod(shape[: len(shape) - len(eqn.params["fft_lengths"])]) * n * math.log2(n)
    elif name in ("while", "cond"):
      raise AssertionError(f"a {name}: its trip count or branch is unknown to this count")
    repeat = eqn.params["length"] if name == "scan" else 1
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(sub, jax_core.ClosedJaxpr):
          total += repeat * _matmul_flops(sub.jaxpr)
        elif isinstance(sub, jax_core.Jaxpr):
          total += repeat * _matmul_flops(sub)
  return total


def _traced_flops_per_token(name: str, L: int, causal: bool, options: dict) -> float:
  module = MIXERS[name](causal=causal, max_len=L, **options)
  flops = []
  for batch in (2, 4):
    x_BxLxD = jnp.ones((batch, L, D))
    variables = jax.eval_shape(module.init, jax.random.key(0), x_BxLxD)
    flops.append(_matmul_flops(jax.make_jaxpr(lambda v, x: module.apply(v, x))(variables, x_BxLxD).jaxpr))
  direction = lambda path: path[1].key in ("forward", "backward")  # ByReversal's two causal modules
  projections = sum(
    leaf.size
    for path, leaf in jax.tree_util.tree_leaves_with_path(variables)
    if len(path) == 3 + direction(path) and path[-1].key == "kernel"
  )  # params/<Dense>/kernel, or params/<direction>/<Dense>/kernel
  return (flops[1] - flops[0]) / (2 * L) - 2 * projections


CASES = [
  ("attention", {"attention_impl": "plain"}),
  ("attention", {"attention_impl": "chunked", "attention_chunk": 128}),
  ("attention", {"attention_impl": "flash", "attention_chunk": 128}),
  ("attention", {"attention_impl": "auto", "attention_chunk": 128}),
  ("fnet", {"fourier_impl": "fft"}),
  ("fnet", {"fourier_impl": "rfft"}),
  ("fnet", {"fourier_impl": "matmul"}),
  ("linear_mixing", {}),
  ("random", {}),
  ("ff_only", {}),
  ("aft_full", {"causal_sums": "stable"}),  # the count is the stable path's (auto branches at run time)
  ("aft_simple", {}),
  ("aft_local", {"window": 32, "causal_sums": "stable"}),
  ("aft_local", {"window": 20, "causal_sums": "stable"}),
  ("aft_conv", {"kernel_size": 7}),
  ("local", {"window": 24}),
  ("block_local", {"block_size": 50}),
  ("linear", {"chunk": 128}),
  ("lsh", {}),
  ("lsh", {"lsh_buckets": 1, "lsh_lookback": "across_rounds"}),
  ("hyena", {}),
  ("hyena", {"order": 3}),
  ("rwkv", {}),
  ("mamba", {}),
  ("mamba", {"expand": 1, "d_state": 4, "dt_rank": 3}),
  ("rg_lru", {"num_heads": 4}),
]


def test_every_declared_count_is_checked_here():
  """MixerSpec.flops is optional (MFU then reads "n/a"), but a count a mixer declares has a case above."""
  assert {name for name, _ in CASES} == {name for name, spec in MIXERS.items() if spec.flops is not None}


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}-{'-'.join(map(str, o.values()))}" for n, o in CASES])
def test_flops_equal_the_traced_matmuls(name, options):
  spec = MIXERS[name]
  options = {"num_heads": 4, **options} if "num_heads" in spec.options else options
  for causal in spec.causal_settings:
    for L in (256, 300):
      traced = _traced_flops_per_token(name, L, causal, options)
      counted = spec.forward_flops(options, L, D, causal)
      assert counted == pytest.approx(traced, rel=1e-9, abs=1e-6), (causal, L, counted, traced)


def test_quadratic_counts_grow_with_length_and_linear_ones_do_not():
  """Per token: ×8 from 512 to 4096 for attention and AFT-full, unchanged for linear and local attention; FNet's
  training count is 2 × its forward (a constant DFT), the others' 3 ×."""
  grows = {
    n: MIXERS[n].forward_flops({}, 4096, D, False) / MIXERS[n].forward_flops({}, 512, D, False)
    for n in ("attention", "aft_full", "linear", "local")
  }
  assert grows["attention"] == pytest.approx(8) and grows["aft_full"] == pytest.approx(8)
  assert grows["linear"] == pytest.approx(1) and grows["local"] == pytest.approx(1)
  assert MIXERS["fnet"].train_flops({}, 512, D, False) == 2 * MIXERS["fnet"].forward_flops({}, 512, D, False)
  assert MIXERS["linear"].train_flops({}, 512, D, False) == 3 * MIXERS["linear"].forward_flops({}, 512, D, False)


def test_bench_flops_per_token_is_the_dense_matmuls_plus_the_mixing():
  """efftx.perf.bench.flops_per_token of the peer shape (d 256, 4 layers, FF 1024, vocab 256), written out by hand:
  per layer Q, K, V and output projections (4·d²) and the feed-forward (2·d·FF), the head d·vocab; 6 FLOPs per
  weight per token (forward and backward), plus 3 × layers × the mixing (attention: 4·L·d forward)."""
  from efftx import config as config_lib  # pylint: disable=g-import-not-at-top
  from efftx.perf import bench  # pylint: disable=g-import-not-at-top

  d, ff, layers, vocab, L = 256, 1024, 4, 256, 512
  config = config_lib.default_config("attention")
  config.model.update(d_model=d, d_ff=ff, num_layers=layers, max_len=L)
  config.mixer.attention_impl = "plain"
  params = jax.eval_shape(lambda: bench.lm_model(config, vocab).init(jax.random.key(0), jnp.zeros((1, L), int)))
  weights = layers * (4 * d * d + 2 * d * ff) + d * vocab
  assert bench.flops_per_token(config, params["params"]) == 6 * weights + 3 * layers * 4 * L * d


@pytest.mark.slow
def test_bench_times_the_step_split_over_the_devices_as_train_does(tmp_path):
  """`python -m efftx.bench` (mixers mode) splits each step's batch over as many devices as divide it, as
  efftx.train does, and measures the MFU peak on those devices; --nodata_parallel runs on one. Per device, the
  split step's compiled activations are then a share of the one-device step's. Run in this process
  (conftest.run_in_process: the module's flags and main), on the suite's 8 devices: batches of 4 and 2 take 4 and
  2 of them."""
  import json  # pylint: disable=g-import-not-at-top

  from conftest import run_in_process  # pylint: disable=g-import-not-at-top

  assert jax.device_count() == 8
  rows = {}
  for flag, lengths in (("--data_parallel", "256,512"), ("--nodata_parallel", "256")):
    out = tmp_path / f"{flag}.json"
    args = ["--mixers=fnet", f"--lengths={lengths}", "--tokens=1024", "--seconds=0.2", f"--json={out}", flag]
    args += ["--set=d_model=64,d_ff=128,num_layers=1", "--peak_matmul=256"]  # the split is the point, not the size
    code, stdout, stderr = run_in_process("efftx.bench", args)
    assert code == 0, stdout + stderr
    rows[flag] = json.loads(out.read_text())["rows"]
  split, one = rows["--data_parallel"], rows["--nodata_parallel"]
  assert [r["devices"] for r in split] == [4, 2] and [r["devices"] for r in one] == [1]  # batch 4, then 2
  for s in split:
    assert s["tokens_per_sec"] > 0 and 0 < s["mfu"] and s["peak_gflops"] > 0
  assert split[0]["temp_mib"] < 0.75 * one[0]["temp_mib"]  # 4 devices, a quarter of the batch each


def test_a_mixer_without_a_count_builds_and_shows_its_mfu_as_not_available(monkeypatch):
  """MixerSpec.flops is optional: a spec without it checks and builds its module, its counts are None, so is
  efftx.bench.flops_per_token of a model using it, and the MFU tables say "n/a" instead of failing."""
  import dataclasses  # pylint: disable=g-import-not-at-top

  from efftx import config as config_lib  # pylint: disable=g-import-not-at-top
  from efftx.perf import bench  # pylint: disable=g-import-not-at-top
  from efftx.perf import gpu_bench  # pylint: disable=g-import-not-at-top
  from efftx.perf import peers  # pylint: disable=g-import-not-at-top

  spec = dataclasses.replace(MIXERS["linear"], flops=None)
  monkeypatch.setitem(MIXERS, "linear", spec)
  assert spec.forward_flops({}, 64, D, False) is None and spec.train_flops({}, 64, D, True) is None
  x_BxLxD = jnp.ones((1, 8, 16))
  module = spec(causal=True, d_model=16, num_heads=2)
  assert module.apply(module.init(jax.random.key(0), x_BxLxD), x_BxLxD).shape == x_BxLxD.shape
  config = config_lib.default_config("linear")
  config.model.update(d_model=16, d_ff=32, max_len=8)
  params = jax.eval_shape(lambda: bench.lm_model(config).init(jax.random.key(0), jnp.zeros((1, 8), int)))
  assert bench.flops_per_token(config, params["params"]) is None
  row = dict(
    model="efftx-linear",
    seq=64,
    status="ok",
    batch=1,
    median_step_s=0.01,
    flops_per_token=None,
    step_times_s=[0.01],
    peak_mib=None,
    first_loss=1.0,
  )
  gpu_bench.derive([row], {"jax": dict(matmul_tflops=1.0)})
  assert row["mfu"] is None
  run = dict(
    meta=dict(dry_run=False, shape=gpu_bench.SHAPES["gpu"], steps=1, warmup=0, matmul_n=8, versions={}),
    peaks={},
    rows=[row],
  )
  text = gpu_bench.markdown(run)
  assert "## MFU %\n\n| length | efftx-linear |\n|---:|---:|\n| 64 | n/a |" in text
  assert "| efftx-linear | 64 | 1 | 10.00 | n/a |" in text  # GFLOP/token
  row = dict(
    peer="efftx-linear",
    seq=64,
    batch=1,
    devices=1,
    tokens_per_s=6400.0,
    median_step_s=0.01,
    compile_s=None,
    peak_rss_mib=1.0,
    flops_per_token=None,
    mfu=None,
    foreign_cpu_frac=None,
  )
  assert "| 1 | n/a | n/a | - |" in peers._table([row], ["efftx-linear"], None, "")  # GFLOP/token, MFU %

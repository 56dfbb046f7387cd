"""Benchmarks: what each mixer costs, as numbers.

    python -m efftx.bench                                   # every mixer, lengths 256…4096: tokens/s and memory
    python -m efftx.bench --mixers=attention,aft_simple --lengths=1024,4096 --json=/tmp/bench.json
    python -m efftx.bench --mode=fourier                    # FNet's fft / rfft / matmul paths, ms per call
    python -m efftx.bench --mode=attention                  # attention's plain / chunked / flash / fused paths, ms
    python -m efftx.bench --mode=reversible --plot=mem.png  # memory vs depth, plain / reversible / chunked FF
    python -m efftx.bench --mode=pipeline --data_dir=DIR    # input pipeline examples/s vs the train step's
    python -m efftx.bench --mode=sharding                   # per-device bytes, data parallel vs fsdp (~99M params)
    python -m efftx.bench --mode=decode --mixers=attention,mamba2 --positions=100,1000,4000  # decoding tokens/s

The fourier and attention tables are what the "auto" choices in efftx/mixers/fourier.py and attention.py rest on.
"mixers" mode times the full training step (forward, backward, AdamW) of the model at the shape of the PyTorch
comparison in experiments/performance (d=256, 4 layers, 4 heads, FF 1024, vocab 256, 8192 tokens a step,
batch = 8192 // length, a per-token head) as efftx.train runs it: the batch split over every device (on a CPU one
device per core, efftx.sharding.use_cpu_cores; as many as divide the batch), parameters replicated;
--nodata_parallel runs it on one device (JAX's default on a CPU: one XLA device for the whole CPU). It reports
the compiled step's memory per device from XLA's memory_analysis(): temp (activations and scratch) + argument
bytes. Compiled sizes are deterministic; timings are ratios within one run, on one machine.
Each row also gives the step's FLOPs per token (`flops_per_token`: the dense matmuls and the mixer's own count,
MixerSpec.flops) and its MFU: achieved FLOP/s over the matmul peak of the same devices, measured once per device
count before its first row is printed (a jitted 2048³ matmul in the run's dtype on each device at once, as that
comparison measures it in float32; --peak_matmul sets its size).
"pipeline" mode reads each task through the real grain pipeline (config.data.read_threads) and times, at the
quickstart model size (attention, width 64, 2 layers, batch 32): the pipeline alone, the train step alone on one
cached batch, and the two together as train.py runs them; "loop/step" near 1 means the pipeline is not the
bottleneck.
"sharding" mode compiles the train step of a ~99M-parameter model (attention, d=768, 14 layers, 12 heads, FF 3072,
length 512, one sequence per device) for every device, once with data = N and once with fsdp = N, and reports per
device: the parameter and AdamW bytes each holds (from the shardings the rule in efftx/sharding.py gives) and the
compiled step's memory_analysis(). On a CPU, fake devices do: XLA_FLAGS=--xla_force_host_platform_device_count=8.
"decode" mode times one decoding step (efftx.sample's: a token through the mixers' caches) at each of --positions,
batch --decode_batch, at the peer shape, causal, --dtype, for every mixer of --mixers that decodes (the others are
skipped); efftx.perf.decode says how. A recurrent mixer's tokens/s is flat in the position, attention's falls.
"""

from __future__ import annotations

import json
import math
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from efftx import checkpoints
from efftx import config as config_lib
from efftx import model as model_lib
from efftx import objectives
from efftx import patterns
from efftx import run_files
from efftx import sharding
from efftx import trainer
from efftx.data import TASKS
from efftx.errors import UserError
from efftx.mixers import MIXERS
from efftx.perf import step as step_lib

_MODE = flags.DEFINE_enum(
  "mode",
  "mixers",
  ["mixers", "fourier", "attention", "reversible", "pipeline", "sharding", "decode"],
  "What to measure.",
)
_MIXERS = flags.DEFINE_list("mixers", list(MIXERS), "Mixers to measure (keys of efftx.mixers.MIXERS).")
_LENGTHS = flags.DEFINE_list("lengths", ["256", "1024", "4096"], "Sequence lengths.")
_TOKENS = flags.DEFINE_integer("tokens", 8192, "Tokens per step (batch = tokens // length).")
_CAUSAL = flags.DEFINE_bool(
  "causal", False, "Causal mixers (FNet is skipped); without it the causal-only ones (mamba, rg_lru, ...) are."
)
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_SECONDS = flags.DEFINE_float(
  "seconds", 3.0, "Minimum timed seconds per row (after one warm-up step); 0: compile only (memory), mixers mode."
)
_OVERRIDES = flags.DEFINE_list(
  "set",
  [],
  "Overrides for every row: config.model fields, or mixer options (applied to the mixers that declare "
  "them, e.g. attention_impl=plain), e.g. dtype=bfloat16.",
)
_JSON = flags.DEFINE_string("json", None, "Also write the rows as JSON here.")
_DATA_PARALLEL = flags.DEFINE_bool(
  "data_parallel",
  True,
  "mixers mode: split each step's batch over the devices as efftx.train does (on a CPU one "
  "device per core); false: one device.",
)
_PEAK_MATMUL = flags.DEFINE_integer(
  "peak_matmul", 2048, "mixers mode: n of the n×n by n×n matmul whose rate is the MFU denominator."
)
_DEPTHS = flags.DEFINE_list("depths", ["2", "8", "24", "48"], "reversible mode: numbers of layers.")
_PLOT = flags.DEFINE_string("plot", None, "reversible mode: write the memory-vs-depth plot (PNG) here.")
_TASKS = flags.DEFINE_list(
  "tasks",
  [
    "listops:small:128",
    "mqar:64x4:64",
    "bytes:stdlib:256",
    "bytes/mlm:stdlib:256",
    "fashion_mnist:full:784",
    "fashion_mnist_ar:full:784",
  ],
  "pipeline mode: task[/objective]:variant:max_len (prepared in --data_dir on first use).",
)
_DATA_DIR = flags.DEFINE_string("data_dir", "", "pipeline mode: the TFDS data dir ('' = ~/tensorflow_datasets).")
_POSITIONS = flags.DEFINE_list("positions", ["100", "1000", "4000"], "decode mode: positions of the timed token.")
_DECODE_BATCH = flags.DEFINE_integer("decode_batch", 1, "decode mode: sequences decoded at once.")
_TIME_DEPTHS = flags.DEFINE_list(
  "time_depths", ["2", "8", "24"], "reversible mode: depths whose steps are also timed (all are compiled)."
)


def _model_config(mixer: str, length: int) -> ml_collections.ConfigDict:
  config = step_lib.peer_shape(mixer, length)
  config.model.update(causal=_CAUSAL.value, dtype=_DTYPE.value)
  for item in _OVERRIDES.value:
    key, value = item.split("=", 1)
    sections = (
      [config.model]
      if key in config.model
      else [
        s
        for s in ([config.mixer] if len(patterns.mixer_names(config.model.mixer)) == 1 else config.mixer.values())
        if key in s
      ]
    )
    if not sections:
      if not any(key in s.options for s in MIXERS.values()):
        raise UserError(f"--set {key}: neither a config.model field nor an option of any mixer")
      continue  # an option of other mixers: this row's mixer is measured without it
    for section in sections:  # with a layer pattern, every mixer of it that has the option
      section[key] = type(section[key])(value) if not isinstance(section[key], bool) else value == "true"
  return config


def lm_model(config: ml_collections.ConfigDict, vocab_size: int = 256) -> model_lib.Transformer:
  """config's model with a next-token head at every position (the peers' shape), through the users' builder."""
  return model_lib.build_model(config, objectives.OBJECTIVES["lm"].head(vocab_size, 0), vocab_size)


def flops_per_token(config: ml_collections.ConfigDict, params, grid: tuple[int, int] | None = None) -> float | None:
  """Training FLOPs per token, forward and backward: 6 × every matmul weight (the Dense kernels, head included;
  embeddings are lookups; AFT-conv's H×S kernel, also named "kernel", adds a negligible 6·H·S), plus layers × the
  mixer's mixing (MixerSpec.train_flops: 3 × forward, FNet's 2 ×), summed over the layers' mixers.
  Recomputation (remat, reversible layers, chunked and flash attention's backward passes) is not counted, as usual
  for MFU. With grid (an image's patches: model.grid), per position the mixers see: the grid's cells and a [CLS]
  position if pooled. None where a layer's
  mixer declares no count (MixerSpec.flops None): its MFU is "n/a"."""
  matmul_weights = sum(
    leaf.size
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
    if getattr(path[-1], "key", None) == "kernel"
  )
  m = config.model
  options = patterns.sections(m.mixer, config.mixer)
  length = grid[0] * grid[1] + (m.pooling == "cls") if grid else m.max_len
  mixing = [
    MIXERS[name].train_flops(options[name], length, m.d_model, m.causal, grid)
    for name in patterns.layer_mixers(m.mixer, m.num_layers)
  ]
  return None if None in mixing else 6 * matmul_weights + sum(mixing)


def matmul_peak_gflops(dtype: str = "float32", n: int = 2048, min_seconds: float = 1.0, devices=None) -> float:
  """GFLOP/s of jitted n×n by n×n matmuls in `dtype`, one on each of `devices` at once (default: the default
  device alone): the MFU denominator."""
  devices = devices or jax.devices()[:1]
  in_rows = jax.sharding.NamedSharding(sharding.make_mesh(devices=devices), jax.sharding.PartitionSpec(("data",)))
  a, b = (jax.device_put(jax.random.normal(jax.random.key(i), (len(devices), n, n), dtype), in_rows) for i in (0, 1))
  matmul = jax.jit(jnp.matmul)
  return len(devices) * 2 * n**3 / _seconds_per_call(lambda: matmul(a, b), min_seconds) / 1e9


def step_devices(batch: int) -> list:
  """The devices a step of `batch` sequences is split over: with --data_parallel the first gcd(batch, device
  count) devices, else the default device alone."""
  return jax.devices()[: math.gcd(batch, jax.device_count())] if _DATA_PARALLEL.value else jax.devices()[:1]


def measure_step(config: ml_collections.ConfigDict, batch: int, min_seconds: float, devices=None) -> dict[str, float]:
  """Compiled memory (per device; param_mib: the parameters' bytes, what one gradient copy holds) and tokens/s
  (unless min_seconds is 0) of one jitted training step with per-token
  logits: efftx's own train step (trainer.make_train_step) on a per-position objective with every position
  weighted, the batch split over `devices` (default: the default device) as efftx.train splits it, parameters and
  optimizer state replicated, compiled with efftx.train's options (sharding.step_compiler_options)."""
  model = lm_model(config)
  tx, schedule = trainer.make_optimizer(config)
  L = config.model.max_len
  mesh = sharding.make_mesh(devices=devices or jax.devices()[:1])
  tokens_BxL = jax.random.randint(jax.random.key(1), (batch, L), 0, 256)
  batch_arrays = jax.device_put(
    {
      "tokens": tokens_BxL,
      "mask": jnp.ones((batch, L), bool),
      "targets": tokens_BxL,
      "weights": jnp.ones((batch, L), jnp.float32),
    },
    sharding.batch(mesh),
  )
  # One program, not op by op (each op of an eager init compiles on its own).
  state = jax.jit(lambda: trainer.create_state(model, tx, jax.random.key(0)), out_shardings=sharding.replicated(mesh))()
  step = trainer.make_train_step(model, objectives.OBJECTIVES["lm"], tx, schedule, jax.random.key(2))
  compiled = (
    jax.jit(
      step,
      donate_argnums=0,
      out_shardings=sharding.replicated(mesh),
      compiler_options=sharding.step_compiler_options(batch, mesh),
    )
    .lower(state, batch_arrays)
    .compile()
  )
  memory = compiled.memory_analysis()
  flops = flops_per_token(config, state.params)
  out = {
    "temp_mib": memory.temp_size_in_bytes / 2**20,
    "argument_mib": memory.argument_size_in_bytes / 2**20,
    "memory_mib": (memory.temp_size_in_bytes + memory.argument_size_in_bytes) / 2**20,
    "gflop_per_token": None if flops is None else flops / 1e9,
    "devices": len(mesh.devices.flat),
    "param_mib": sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)) / 2**20,
  }
  if not min_seconds:
    return out
  holder = {"state": state}

  def one_step():
    holder["state"], metrics = compiled(holder["state"], batch_arrays)
    return metrics

  seconds = _seconds_per_call(one_step, min_seconds)
  return {"tokens_per_sec": batch * L / seconds, "step_ms": 1e3 * seconds, **out}


def _seconds_per_call(fn, min_seconds: float) -> float:
  """Mean wall time of fn() after one warm-up call, over at least min_seconds and two calls."""
  jax.block_until_ready(fn())
  calls, start = 0, time.perf_counter()
  while time.perf_counter() - start < min_seconds or calls < 2:
    jax.block_until_ready(fn())
    calls += 1
  return (time.perf_counter() - start) / calls


def _mixers_table() -> list[dict]:
  rows = []
  lengths = [int(x) for x in _LENGTHS.value]
  peaks = {}  # number of devices → their matmul peak, GFLOP/s
  print(
    f"backend {jax.default_backend()}, {jax.device_count()} device(s), {_TOKENS.value} tokens/step split over "
    f"{'as many as divide the batch' if _DATA_PARALLEL.value else 'one'}, d=256, 4 layers, dtype {_DTYPE.value}, "
    f"causal={_CAUSAL.value}"
    + (f"; set {','.join(_OVERRIDES.value)}" if _OVERRIDES.value else "")
    + (f"; MFU against the {_PEAK_MATMUL.value}³ matmul peak of the row's devices" if _SECONDS.value else "")
  )
  print(
    f"{'mixer':<12}{'length':>8}{'devices':>8}{'tokens/s':>11}{'step ms':>10}{'GFLOP/tok':>10}{'MFU %':>7}"
    f"{'temp MiB':>10}{'temp+arg MiB':>14}"
  )
  for mixer in _MIXERS.value:
    if mixer not in MIXERS:
      raise app.UsageError(f"--mixers: '{mixer}' is not a mixer; choose from: {', '.join(MIXERS)}")
    if _CAUSAL.value and not MIXERS[mixer].can_be_causal:
      continue
    if not _CAUSAL.value and not MIXERS[mixer].can_be_bidirectional:  # mamba, rg_lru, rwkv, ...: --causal times them
      print(f"{mixer:<12}(causal only: skipped; --causal times it)", flush=True)
      continue
    for length in lengths:
      config = _model_config(mixer, length)
      batch = max(1, _TOKENS.value // length)
      devices = step_devices(batch)
      row = {"mixer": mixer, "length": length, **measure_step(config, batch, _SECONDS.value, devices)}
      if _SECONDS.value:
        if len(devices) not in peaks:
          peaks[len(devices)] = matmul_peak_gflops(_DTYPE.value, _PEAK_MATMUL.value, devices=devices)
          print(
            f"{_DTYPE.value} matmul peak of {len(devices)} device(s): {peaks[len(devices)]:.0f} GFLOP/s", flush=True
          )
        peak = peaks[len(devices)]
        row.update(
          peak_gflops=peak,
          mfu=None if row["gflop_per_token"] is None else row["tokens_per_sec"] * row["gflop_per_token"] / peak,
        )
      rows.append(row)
      timed = f"{row['tokens_per_sec']:>11.0f}{row['step_ms']:>10.1f}" if "step_ms" in row else f"{'-':>11}{'-':>10}"
      mfu = f"{'-':>7}" if "mfu" not in row else f"{'n/a':>7}" if row["mfu"] is None else f"{100 * row['mfu']:>7.1f}"
      gflop = f"{'n/a':>10}" if row["gflop_per_token"] is None else f"{row['gflop_per_token']:>10.4f}"
      print(
        f"{mixer:<12}{length:>8}{len(devices):>8}{timed}{gflop}{mfu}{row['temp_mib']:>10.1f}{row['memory_mib']:>14.1f}",
        flush=True,
      )
  return rows


def _paths_table(mixer: str, option: str, impls: tuple[str, ...], **options) -> list[dict]:
  """ms per call of jit(forward + backward) of one mixer (width 256, --tokens a call) by path and length."""
  rows = []
  print(
    f"backend {jax.default_backend()}: {mixer} {options or ''}, D=256, {_TOKENS.value} tokens, "
    "jit(forward+backward), ms"
  )
  print(f"{'length':>8}" + "".join(f"{impl:>10}" for impl in impls))
  for length in [int(x) for x in _LENGTHS.value]:
    x_BxLxD = jax.random.normal(jax.random.key(0), (max(1, _TOKENS.value // length), length, 256))
    row = {"length": length}
    for impl in impls:
      module = MIXERS[mixer](**options, **{option: impl})
      variables = module.init(jax.random.key(1), x_BxLxD[:1])
      grad = jax.jit(jax.grad(lambda v, x: (module.apply(v, x) ** 2).sum(), argnums=(0, 1)))
      row[impl] = 1e3 * _seconds_per_call(lambda: grad(variables, x_BxLxD), _SECONDS.value / 3)
    rows.append(row)
    print(f"{length:>8}" + "".join(f"{row[impl]:>10.1f}" for impl in impls), flush=True)
  return rows


def _fourier_table() -> list[dict]:
  return _paths_table("fnet", "fourier_impl", ("fft", "rfft", "matmul"))


def _attention_table() -> list[dict]:
  return _paths_table("attention", "attention_impl", ("plain", "chunked", "flash", "fused"), num_heads=4)


def _reversible_table() -> list[dict]:
  """Memory and speed against depth: plain residual blocks, reversible couplings, each with and without the
  chunked feed-forward. Model: width 128, 4 heads, FF 512, --tokens a step; the mixer named by --mixers if it
  names one, else attention."""
  mixer = _MIXERS.value[0] if len(_MIXERS.value) == 1 else "attention"
  variants = {
    "plain": (False, 0),
    "reversible": (True, 0),
    "plain+ff_chunk": (False, 128),
    "reversible+ff_chunk": (True, 128),
  }
  depths = [int(d) for d in _DEPTHS.value]
  timed = {int(d) for d in _TIME_DEPTHS.value}
  print(
    f"backend {jax.default_backend()}: {mixer}, width 128, FF 512, {_TOKENS.value} tokens/step; temp MiB "
    f"(compiled), tokens/s at depths {sorted(timed)}"
  )
  print(f"{'variant':<22}{'length':>7}{'depth':>6}{'temp MiB':>10}{'tokens/s':>10}")
  rows = []
  for length in [int(x) for x in _LENGTHS.value]:
    for variant, (rev, chunk) in variants.items():
      for depth in depths:
        config = _model_config(mixer, length)
        config.model.update(
          d_model=128,
          d_ff=512,
          num_layers=depth,
          reversible=rev,
          ff_chunk_size=chunk if length % max(chunk, 1) == 0 else 0,
        )
        row = {
          "variant": variant,
          "length": length,
          "depth": depth,
          **measure_step(config, max(1, _TOKENS.value // length), _SECONDS.value if depth in timed else 0),
        }
        rows.append(row)
        tokens = f"{row['tokens_per_sec']:.0f}" if "tokens_per_sec" in row else "-"
        print(f"{variant:<22}{length:>7}{depth:>6}{row['temp_mib']:>10.1f}{tokens:>10}", flush=True)
  if _PLOT.value:
    _plot_memory(rows, mixer, _PLOT.value)
  return rows + _reconstruction_rows(mixer, max(depths))


def _reconstruction_rows(mixer: str, max_depth: int) -> list[dict]:
  """max |x_rebuilt − x| after rebuilding a stack's input from its outputs, by depth and dtype (random init,
  residual streams in the compute dtype, length 256, 4 sequences)."""
  from efftx import reversible  # pylint: disable=g-import-not-at-top

  config = _model_config(mixer, 256)
  config.model.d_model = 128
  make_mixer = lm_model(config).make_mixer
  stack = reversible.ReversibleStack(
    make_f=lambda: model_lib.MixingSublayer(make_mixer, 0.0, parent=None),
    make_g=lambda: model_lib.FeedForwardSublayer(512, 0.0, 0, parent=None),
    num_layers=max_depth,
  )
  x = jax.random.normal(jax.random.key(0), (4, 256, 128))
  mask = jnp.ones((4, 256), bool)
  layers = jax.jit(lambda: stack.init(jax.random.key(1), x, mask, True)["params"]["layers"])()
  f, g = stack._apply_fns(deterministic=True)  # pylint: disable=protected-access
  rows = []
  print(f"reconstruction error max|x_rebuilt - x| (inputs ~N(0, 1)), {mixer}, width 128, by depth:")
  for dtype in ("float32", "bfloat16"):
    errors = jax.jit(lambda layers, x: reversible.reconstruction_errors(f, g, layers, x, mask, jax.random.key(0)))(
      layers, x.astype(dtype)
    )
    shown = [d for d in (1, 2, 4, 8, 16, 24, 32, 48) if d <= max_depth]
    print(f"  {dtype:<9}" + "  ".join(f"{d}: {float(errors[d - 1]):.2e}" for d in shown))
    rows += [{"dtype": dtype, "depth": d, "reconstruction_error": float(errors[d - 1])} for d in shown]
  return rows


def _plot_memory(rows: list[dict], mixer: str, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  lengths = sorted({r["length"] for r in rows})
  fig, axes = plt.subplots(1, len(lengths), figsize=(5.5 * len(lengths), 4), squeeze=False)
  for ax, length in zip(axes[0], lengths):
    for variant in dict.fromkeys(r["variant"] for r in rows):
      points = [(r["depth"], r["temp_mib"]) for r in rows if r["variant"] == variant and r["length"] == length]
      ax.plot(*zip(*points), marker="o", label=variant)
    ax.set(title=f"{mixer}, length {length}", xlabel="layers", ylabel="compiled temp memory (MiB)")
    ax.grid(alpha=0.3)
    ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"plot: {path}")


def _pipeline_table() -> list[dict]:
  from efftx.data import pipeline  # pylint: disable=g-import-not-at-top

  rows = []
  print(
    f"backend {jax.default_backend()}, {jax.device_count()} device(s); quickstart model (attention, d=64, "
    "2 layers), batch 32; examples/s"
  )
  print(f"{'task':<22}{'variant':>9}{'len':>6}{'pipeline':>10}{'step':>9}{'loop':>9}{'pipe/step':>11}{'loop/step':>11}")
  for spec in _TASKS.value:
    name, variant, length = spec.split(":")
    task, _, objective = name.partition("/")
    config = config_lib.default_config("attention")
    config.data.update(task=task, variant=variant, objective=objective, data_dir=_DATA_DIR.value, batch_size=32)
    own = objectives.OBJECTIVES[objective or TASKS[task].objective]
    config.model.update(d_model=64, num_layers=2, d_ff=256, max_len=int(length), causal=own.next_token)
    config_lib.validate(config, jax.device_count())
    pipeline.prepare(config)
    batches = pipeline.train_iterator(config, pipeline.source(config, "train"))
    for _ in range(16):  # past grain's start-up and its prefetch buffer
      next(batches)
    pipeline_seconds = _seconds_per_call(lambda: next(batches), _SECONDS.value)

    parts = trainer.parts(config)
    tx, schedule = trainer.make_optimizer(config)
    holder = {"state": jax.jit(lambda: trainer.create_state(parts.model, tx, jax.random.key(0)))()}
    step = jax.jit(
      trainer.make_train_step(parts.model, parts.objective, tx, schedule, jax.random.key(0)), donate_argnums=0
    )
    cached = jax.device_put(next(batches))

    def run_step(batch):
      holder["state"], metrics = step(holder["state"], batch)
      return metrics

    step_seconds = _seconds_per_call(lambda: run_step(cached), _SECONDS.value)
    loop_seconds = _seconds_per_call(lambda: run_step(next(batches)), _SECONDS.value)
    row = {
      "task": name,
      "variant": variant,
      "length": int(length),
      "pipeline_examples_per_sec": 32 / pipeline_seconds,
      "step_examples_per_sec": 32 / step_seconds,
      "loop_examples_per_sec": 32 / loop_seconds,
    }
    rows.append(row)
    print(
      f"{name:<22}{variant:>9}{length:>6}{row['pipeline_examples_per_sec']:>10.0f}"
      f"{row['step_examples_per_sec']:>9.0f}{row['loop_examples_per_sec']:>9.0f}"
      f"{step_seconds / pipeline_seconds:>11.1f}{step_seconds / loop_seconds:>11.2f}",
      flush=True,
    )
  return rows


def _sharding_table() -> list[dict]:
  from efftx import sharding  # pylint: disable=g-import-not-at-top

  config = config_lib.default_config("attention")
  config.model.update(d_model=768, num_layers=14, d_ff=3072, max_len=512, dropout=0.1)
  config.mixer.num_heads = 12
  n = jax.device_count()
  parts = trainer.parts(config)
  tx, schedule = trainer.make_optimizer(config)
  abstract = jax.eval_shape(lambda: trainer.create_state(parts.model, tx, jax.random.key(0)))
  num_params = sum(x.size for x in jax.tree.leaves(abstract.params))
  print(
    f"backend {jax.default_backend()}, {n} devices; attention, d=768, 14 layers, FF 3072, length 512, "
    f"{num_params / 1e6:.1f}M parameters, batch {n} (one sequence per device); MiB per device"
  )
  print(f"{'mesh':<16}{'params':>9}{'AdamW':>9}{'arguments':>11}{'temp':>9}{'outputs':>9}")
  rows = []
  for fsdp in (1, n):
    mesh = sharding.make_mesh(fsdp)
    layout = sharding.shardings(mesh, abstract)
    per_device = lambda tree, lay: sum(
      int(np.prod(sh.shard_shape(x.shape))) * x.dtype.itemsize
      for x, sh in zip(jax.tree.leaves(tree), jax.tree.leaves(lay))
    )
    state = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), abstract, layout)
    batch = {
      "tokens": jax.ShapeDtypeStruct((n, 512), jnp.int32, sharding=sharding.batch(mesh)),
      "mask": jax.ShapeDtypeStruct((n, 512), jnp.bool_, sharding=sharding.batch(mesh)),
      "label": jax.ShapeDtypeStruct((n,), jnp.int32, sharding=sharding.batch(mesh)),
    }
    step = jax.jit(
      trainer.make_train_step(parts.model, parts.objective, tx, schedule, jax.random.key(0)),
      in_shardings=(layout, sharding.batch(mesh)),
      out_shardings=(layout, sharding.replicated(mesh)),
      donate_argnums=0,
    )
    memory = step.lower(state, batch).compile().memory_analysis()
    mib = 2**20
    row = {
      "data": n // fsdp,
      "fsdp": fsdp,
      "params_bytes": per_device(abstract.params, layout.params),
      "adamw_bytes": per_device(abstract.opt_state, layout.opt_state),
      "argument_bytes": memory.argument_size_in_bytes,
      "temp_bytes": memory.temp_size_in_bytes,
      "output_bytes": memory.output_size_in_bytes,
      "num_params": num_params,
    }
    rows.append(row)
    print(
      f"{f'data {n // fsdp} × fsdp {fsdp}':<16}{row['params_bytes'] / mib:>9.1f}{row['adamw_bytes'] / mib:>9.1f}"
      f"{row['argument_bytes'] / mib:>11.1f}{row['temp_bytes'] / mib:>9.1f}{row['output_bytes'] / mib:>9.1f}",
      flush=True,
    )
  return rows


def _decode_table() -> list[dict]:
  """Tokens/s of one decoding step by position, per mixer that decodes (efftx.perf.decode)."""
  from efftx.perf import decode  # pylint: disable=g-import-not-at-top

  positions = [int(x) for x in _POSITIONS.value]
  print(
    f"backend {jax.default_backend()}: one decoding step (batch {_DECODE_BATCH.value}, d=256, 4 layers, causal, "
    f"{_DTYPE.value}), tokens/s at each position; last/first: the ratio of the last position's to the first's"
  )
  print(f"{'mixer':<16}" + "".join(f"{p:>11}" for p in positions) + f"{'last/first':>12}")
  rows = []
  for mixer in _MIXERS.value:
    if mixer not in MIXERS:
      raise app.UsageError(f"--mixers: '{mixer}' is not a mixer; choose from: {', '.join(MIXERS)}")
    if not MIXERS[mixer].can_decode:
      print(f"{mixer:<16}(does not decode: skipped)")
      continue
    rate = decode.decode_tokens_per_sec(
      mixer, tuple(positions), _DECODE_BATCH.value, _SECONDS.value / len(positions), {"dtype": _DTYPE.value}
    )
    rows.append({"mixer": mixer, "batch": _DECODE_BATCH.value, "tokens_per_sec": {str(p): rate[p] for p in positions}})
    print(
      f"{mixer:<16}"
      + "".join(f"{rate[p]:>11.1f}" for p in positions)
      + f"{rate[positions[-1]] / rate[positions[0]]:>12.2f}",
      flush=True,
    )
  return rows


def main(argv):
  del argv
  if _MODE.value == "mixers" and _DATA_PARALLEL.value:
    sharding.use_cpu_cores()  # on a CPU: one device per core, as efftx.train sets up
  if _JSON.value:  # its folder before the measurement, not after
    run_files.run_folder(_JSON.value).parent.mkdir(parents=True, exist_ok=True)
  rows = {
    "mixers": _mixers_table,
    "fourier": _fourier_table,
    "attention": _attention_table,
    "reversible": _reversible_table,
    "pipeline": _pipeline_table,
    "sharding": _sharding_table,
    "decode": _decode_table,
  }[_MODE.value]()
  if _JSON.value:  # whole or not at all: efftx.sweep takes the file's existence as "measured"
    checkpoints.write_whole(
      run_files.run_folder(_JSON.value),
      json.dumps({"backend": jax.default_backend(), "mode": _MODE.value, "rows": rows}, indent=1),
    )


if __name__ == "__main__":
  app.run(main)

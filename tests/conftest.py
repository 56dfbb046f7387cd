"""Tests run on 8 fake CPU devices (set before JAX is imported), like a small pod."""

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
# LLVM's optimisation of the generated CPU code off: the tests' programs are small and run a few times, so compiling
# them is most of the suite (experiments/performance/DECISIONS.md: tests-llvm-opt-level-0). XLA's own
# HLO passes still run — the algebraic rewrite that once made causal AFT nan under jit shows with it too — and LLVM
# keeps floating point semantics at every level (no fast math).
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
# XLA's older (elemental) emitters for fusions: the same operations and floating point semantics, compiled in about
# two thirds of the time (experiments/performance/DECISIONS.md: tests-cpu-legacy-fusion-emitters).
if "xla_cpu_use_fusion_emitters" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_cpu_use_fusion_emitters=false"
# One LLVM module per program: XLA:CPU splits a program's code into parts compiled on a thread pool, which at -O0
# and the tests' sizes costs more than it gains (experiments/performance/DECISIONS.md: tests-one-codegen-module).
# The same generated functions, only not split.
if "xla_cpu_parallel_codegen_split_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_cpu_parallel_codegen_split_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _session_folder(variable: str, prefix: str) -> str | None:
  """A new temporary folder named in os.environ[variable] for this session and the processes it starts, unless
  the variable is set already (a pytest worker, or the user's choice): its path to remove at the end, else None."""
  if variable in os.environ:
    return None
  import tempfile  # pylint: disable=g-import-not-at-top

  os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
  return os.environ[variable]


# XLA's compiled programs are cached on disk for the session, shared with the processes the tests start: dozens
# of real runs compile the same smoke model (~6 of the ~10 s one takes), and in-process tests rebuild it too.
_XLA_CACHE = _session_folder("JAX_COMPILATION_CACHE_DIR", "efftx-tests-xla-cache-")
if _XLA_CACHE:
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# One TFDS data dir for the session, shared by the pytest workers and the processes they start: each dataset is
# prepared once (the data_dir lock makes workers that ask for it together wait for the one preparing it).
_DATA_DIR = _session_folder("EFFTX_TESTS_DATA_DIR", "efftx-tests-tfds-")

import gc  # noqa: E402

import pytest  # noqa: E402  (after the XLA flags above, which must be set before JAX is imported)

# Python's cyclic garbage collector less often: tracing and lowering make millions of short-lived objects, and with
# JAX's caches growing through the session each full collection walks a larger heap (6 % of test_mixers.py's time
# at Python's default thresholds of 700, 10, 10; experiments/performance/DECISIONS.md: tests-gc-thresholds).
# Reference counting still frees every object that is not in a cycle at once.
gc.set_threshold(10_000, 20, 20)


def pytest_collection_finish(session):  # pylint: disable=unused-argument
  """What the imports and the collection made lives to the end: out of the collector's reach (gc.freeze)."""
  gc.collect()
  gc.freeze()


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  import shutil  # pylint: disable=g-import-not-at-top

  for folder in (_XLA_CACHE, _DATA_DIR):
    if folder:
      shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(items):
  """The tests that start processes (marked slow, the longest) first: with two workers, a long one then does not
  start last on one worker while the other has nothing left to run."""
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def data_dir() -> str:
  """A TFDS data dir shared by the session's tests and workers; datasets are prepared into it on first use."""
  return os.environ["EFFTX_TESTS_DATA_DIR"]


@pytest.fixture
def smoke_config(data_dir):
  """The quickstart's smoke config (ListOps "tiny", a 32-wide model) on the session's data dir."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top

  def make(arg: str = "smoke"):
    config = quickstart.get_config(arg)
    config.data.data_dir = data_dir
    return config

  return make


# Mixers bidirectional by reversal run causal=False as their causal module both ways (efftx.mixers.spec.ByReversal):
# what that adds (both directions, padding anywhere ignored) does not depend on the mixer and is tested once
# (tests/test_modern_block.py), so the per-mixer tests check such a mixer causally, and one representative both ways.
REVERSAL_REPRESENTATIVE = "retnet"


def causal_settings_to_check(name: str) -> tuple[bool, ...]:
  """The causal settings a per-mixer test runs: the spec's, but only causal=True for a mixer bidirectional by
  reversal other than REVERSAL_REPRESENTATIVE."""
  from efftx.mixers import MIXERS  # pylint: disable=g-import-not-at-top

  spec = MIXERS[name]
  return (True,) if spec.bidirectional_by_reversal and name != REVERSAL_REPRESENTATIVE else spec.causal_settings


def mixer_config(mixer: str, **fields):
  """default_config(mixer) with `fields` set: config.model fields by name, and mixer options (window, num_heads,
  ...) for the mixers that declare them — so one call serves every mixer in a parametrized test."""
  from efftx import config as config_lib  # pylint: disable=g-import-not-at-top

  config = config_lib.default_config(mixer)
  config.model.update({k: v for k, v in fields.items() if k in config.model})
  config_lib.set_where_declared(config.mixer, **{k: v for k, v in fields.items() if k not in config.model})
  return config


def lm_model(config, vocab_size: int = 16):
  """config's model with a per-position LM head, built by the users' builder."""
  from efftx import model as model_lib  # pylint: disable=g-import-not-at-top
  from efftx.objectives import OBJECTIVES  # pylint: disable=g-import-not-at-top

  return model_lib.build_model(config, OBJECTIVES["lm"].head(vocab_size, 0), vocab_size)


def padded_inputs(B: int, L: int, D: int, second_length: int, seed: int = 0):
  """(x_BxLxD ~ N(0, 1) float32, mask_BxL): the second sequence holds second_length real positions, the rest is
  padding at the end."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  x_BxLxD = rng.normal(size=(B, L, D)).astype(np.float32)
  mask_BxL = np.ones((B, L), bool)
  mask_BxL[1, second_length:] = False
  return x_BxLxD, mask_BxL


def summation_atol(n_terms: int, scale: float, dtype="float32") -> float:
  """The absolute difference allowed between two float computations of the same sums that add their terms in
  different orders (chunked vs whole, blocked vs plain, 8 devices' all-reduce vs 1, XLA's fusions on one CPU vs
  another): n_terms · eps(dtype) · scale.

  Each addition rounds by at most eps/2 of a partial sum, and a partial sum is at most Σ|t_i|; so any order of a
  sum of n terms lies within (n − 1)·(eps/2)·Σ|t_i| of the exact sum, and two orders within (n − 1)·eps·Σ|t_i| of
  each other (typically ~√n·eps·Σ|t_i|, the roundings being random; exactly equal only by construction). eps is
  2^-23 ≈ 1.19e-7 for float32, 2^-7 ≈ 7.8e-3 for bfloat16. So a test states what it sums:
  - n_terms: the terms per sum; through a chain of reductions (a matmul over D, then one over the d_ff hidden
    units, then the gradient's sum over the B·L rows) the roundings add to first order, so their lengths add.
  - scale: Σ|t_i| of the largest sum (n · max|t_i| bounds it). Where the entries sum alike terms, the largest
    |entry| of the reference stands for it: an entry near zero is then a sum that cancelled, held to the
    rounding of its terms' size rather than of its own.
  A relative error in the computation (a 1% wrong gradient) exceeds this while 1% > n_terms · eps, i.e. for
  float32 up to ~80,000 terms.
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  return n_terms * float(jnp.finfo(jnp.dtype(dtype)).eps) * float(scale)


def assert_close_sums(
  actual, expected, *, n_terms: int, scale: float | None = None, rtol: float = 0.0, dtype="float32", err_msg: str = ""
):
  """np.testing.assert_allclose(actual, expected) within summation_atol(n_terms, scale, dtype), scale defaulting
  to the largest |entry| of expected; rtol is on top, for entries whose terms are larger than the reference's
  largest (rarely needed)."""
  import numpy as np  # pylint: disable=g-import-not-at-top

  actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
  if scale is None:
    scale = float(np.abs(expected).max()) if expected.size else 0.0
  np.testing.assert_allclose(actual, expected, rtol=rtol, atol=summation_atol(n_terms, scale, dtype), err_msg=err_msg)


def assert_close_gradients(got, want, *, n_terms: int):
  """assert_close_sums on each leaf of two gradient pytrees, at the size of the leaf's largest entry. A leaf whose
  entries all lie below the rounding of the largest leaf's (a gradient that is zero in exact arithmetic, such as
  a bias a softmax does not see) is rounding noise of terms at that overall size and is compared at it."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  got, want = jax.tree.leaves(got), jax.tree.leaves(want)
  assert len(got) == len(want)
  overall = max(float(np.abs(b).max()) for b in want)
  for i, (a, b) in enumerate(zip(got, want)):
    scale = float(np.abs(b).max())
    assert_close_sums(
      a, b, n_terms=n_terms, scale=scale if scale > summation_atol(n_terms, overall) else overall, err_msg=f"leaf {i}"
    )


def metrics_rows(workdir) -> list[dict]:
  """The rows of a run's metrics.jsonl."""
  import json  # pylint: disable=g-import-not-at-top

  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def logged_step(workdir) -> int:
  """The last step in a running run's metrics.jsonl (0 before there is one, or while a line is half written)."""
  try:
    return max((r["step"] for r in metrics_rows(workdir)), default=0)
  except (OSError, ValueError):
    return 0


def snapshot(path):
  """Every file under path with its size and modification time (None: path does not exist)."""
  if not os.path.exists(path):
    return None
  if not os.path.isdir(path):
    return os.stat(path).st_mtime_ns
  return {
    os.path.join(d, f): (os.stat(os.path.join(d, f)).st_size, os.stat(os.path.join(d, f)).st_mtime_ns)
    for d, _, files in os.walk(path)
    for f in files
  }


def free_port() -> int:
  """A TCP port on the loopback interface that nothing listens on (for jax.distributed's coordinator)."""
  import socket  # pylint: disable=g-import-not-at-top

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def xla_flags(devices: int | None) -> str:
  """The session's XLA_FLAGS (the compile settings above) for a process the test starts, with `devices` fake CPU
  devices, or none forced (XLA's default) if None."""
  flags = [f for f in os.environ["XLA_FLAGS"].split() if "xla_force_host_platform_device_count" not in f]
  return " ".join(flags + ([f"--xla_force_host_platform_device_count={devices}"] if devices else []))


def run_in_process(module: str, args: list[str]) -> tuple[int, str, str]:
  """`python -m MODULE ARGS` from the checkout's root, run in this process the way python -m runs it (the module's
  __main__ block: its flags, absl's app.run, the same parsing and error handling), without starting an interpreter
  and importing JAX again: (exit code, stdout, stderr as the program printed them). The flags its modules defined
  are removed afterwards, so that the next run defines them anew. Where the process itself is the property (signals,
  what reaches the file descriptors, a fresh interpreter's defaults), tests start a real one."""
  import contextlib  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  import logging  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  import warnings  # pylint: disable=g-import-not-at-top

  from absl import app  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

  app.define_help_flags()  # app.run defines them on its first call only: keep them among the flags kept
  # Flags an efftx module defined when a test imported it: set aside while the module runs as __main__ and defines
  # them again (absl refuses a second definition), put back afterwards.
  imported = [
    (module, flag)
    for module, module_flags in flags.FLAGS.flags_by_module_dict().items()
    if module.startswith("efftx.")
    for flag in module_flags
  ]
  for _, flag in imported:
    if flag.name in flags.FLAGS:
      delattr(flags.FLAGS, flag.name)
  absl_logging.use_absl_handler()  # as app.run's first call does, resetting the log levels, before they are saved
  levels = [(logger, logger.level) for logger in (logging.root, logging.getLogger("absl"))]
  defined, argv, cwd, modules = set(flags.FLAGS), sys.argv, os.getcwd(), set(sys.modules)
  out, err = io.StringIO(), io.StringIO()
  try:
    os.chdir(REPO)
    sys.argv = [module] + list(args)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
      warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)  # runpy: efftx is imported
      warnings.filterwarnings("ignore", "the load_module", DeprecationWarning)  # ml_collections' config loading
      try:
        runpy.run_module(module, run_name="__main__")
        code = 0
      except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
  finally:
    sys.argv = argv
    os.chdir(cwd)
    # The program's own flags go (the next run defines them anew; they are keyed by its name or path, not by an
    # imported module); a module's, defined on its first import during the run (grain's, on reading a dataset),
    # stay: the module is imported now and would not define them again.
    library = {
      flag.name
      for defining, module_flags in flags.FLAGS.flags_by_module_dict().items()
      if defining in sys.modules and defining not in modules  # a module imported during the run, and kept
      for flag in module_flags
    }
    for name in set(flags.FLAGS) - defined - library:
      if name in flags.FLAGS:
        delattr(flags.FLAGS, name)
    for module, flag in imported:
      if flag.name not in flags.FLAGS:
        flags.FLAGS[flag.name] = flag
      flags.FLAGS.register_flag_by_module(module, flag)
    flags.FLAGS.unparse_flags()
    for logger, level in levels:  # as they were (unparsing --verbosity sets them), for caplog.set_level
      logger.setLevel(level)
  return code, out.getvalue(), err.getvalue()


class compiled:  # pylint: disable=invalid-name
  """A flax module whose init and apply run under jax.jit, as the training step runs them, not op by op.

  Eager execution compiles every primitive on its own (~30 ms each; one causal AFT-local forward pass is ~240 of
  them) and skips XLA's whole-program rewrites — one of which made a compiled causal AFT-full forward pass nan
  where the eager one was right. Keyword bools, strings, callables and lists of strings (deterministic, decode,
  mutable, method) and positional bools are passed as static values; arrays, keys, dicts of them and None are
  traced. The jitted function is kept per (module, method, static values, platform traced for), so that an equal
  module called again (every test builds its own, many alike) reuses the trace and the compiled program; a module
  that does not hash (a field holding a list or array) is traced anew each call. A test that patches what a module
  calls at trace time should not use it (the patched trace would be kept, or an unpatched one reused).
  """

  def __init__(self, module):
    self.module = module

  def init(self, *args, **kwargs):
    return _jit_call(self.module.init, args, kwargs)

  def apply(self, *args, **kwargs):
    return _jit_call(self.module.apply, args, kwargs)


_JITTED = {}  # (module, method name, len(args), static args, static kwargs, platform) → the jitted call


def _jit_call(fn, args, kwargs):
  import jax  # pylint: disable=g-import-not-at-top

  from efftx import platform  # pylint: disable=g-import-not-at-top

  is_static = lambda v: (
    isinstance(v, (bool, str))
    or callable(v)
    or isinstance(v, (list, tuple))
    and all(isinstance(s, str) for s in v)
    and v
  )
  static_kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items() if is_static(v)}
  traced_kwargs = {k: v for k, v in kwargs.items() if k not in static_kwargs}
  static_args = {i: a for i, a in enumerate(args) if isinstance(a, bool)}
  traced_args = [a for i, a in enumerate(args) if i not in static_args]

  def call(traced_args, traced_kwargs):
    it = iter(traced_args)
    return fn(
      *[static_args[i] if i in static_args else next(it) for i in range(len(args))], **static_kwargs, **traced_kwargs
    )

  key = (
    fn.__self__,
    fn.__name__,
    len(args),
    tuple(static_args.items()),
    tuple(sorted(static_kwargs.items())),
    platform.target_platform(),
  )
  try:
    jitted = _JITTED.get(key)
  except TypeError:  # something in the key does not hash: no reuse
    return jax.jit(call)(traced_args, traced_kwargs)
  if jitted is None:
    jitted = _JITTED[key] = jax.jit(call)
  return jitted(traced_args, traced_kwargs)


def write_idx(path, array):
  """An idx file (the MNIST format) written from the format's definition, independent of images.read_idx."""
  import gzip  # pylint: disable=g-import-not-at-top
  import struct  # pylint: disable=g-import-not-at-top

  header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + b"".join(struct.pack(">i", d) for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype("uint8").tobytes())


def assert_decodes_like_forward(model, tokens_BxL, atol: float = 1e-4):
  """Token-by-token decoding with the cache gives the causal forward pass's logits at every position."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  variables = compiled(model).init(jax.random.key(0), tokens_BxL)
  full = np.asarray(compiled(model).apply(variables, tokens_BxL))
  cache = compiled(model).init(jax.random.key(0), tokens_BxL, decode=True)["cache"]
  step = jax.jit(lambda cache, token: model.apply({**variables, "cache": cache}, token, decode=True, mutable=["cache"]))
  for t in range(tokens_BxL.shape[1]):
    logits, mutated = step(cache, tokens_BxL[:, t : t + 1])
    cache = mutated["cache"]
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, t], rtol=atol, atol=atol)


def assert_finite_grads_and_bfloat16_close(module, params, x_f32):
  """In one program: the gradients of module's output sum (parameters and input) are finite, and the output for
  the input rounded to bfloat16 is bfloat16 and within 0.05 of the float32 output's largest value (a few of
  bfloat16's 2⁻⁸ roundings of the projections' inputs, weights and results)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  x16 = jnp.asarray(x_f32, jnp.bfloat16)

  @jax.jit
  def run(params, x32, x16):
    y32, vjp = jax.vjp(lambda p, x: module.apply({"params": p}, x), params, x32)
    return vjp(jnp.ones_like(y32)), module.apply({"params": params}, x16), y32

  grads, y16, y32 = run(params, np.asarray(x16, np.float32), x16)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  assert y16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y16, np.float32), y32, atol=0.05 * np.abs(y32).max())


def assert_gradients_match_central_differences(
  module, params, x, mask, outputs64, checks, x_entries, *, g_seed: int, atol: float, rtol: float = 1e-4, h=1e-6
):
  """∂ Σ y·g / ∂ (the parameters at `checks`, (path, index) pairs, and x at `x_entries`, (b, t, c) triples) of
  module's compiled output under mask, g normal at the real positions and 0 at padding, against central differences
  of outputs64(params64, x64): a float64 reference's outputs, one array per sequence at its real positions. Padded
  inputs get no gradient."""
  import functools  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  g = np.random.default_rng(g_seed).normal(size=x.shape) * mask[..., None]

  @jax.jit
  def grads(p, x):
    return jax.grad(lambda p, x: jnp.sum(module.apply({"params": p}, x, mask=mask) * g), argnums=(0, 1))(p, x)

  got_p, got_x = grads(params, x)
  loss64 = lambda p, x: sum((y * g[b][mask[b]]).sum() for b, y in enumerate(outputs64(p, x)))
  p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  at = lambda tree, path: functools.reduce(lambda n, k: n[k], path, tree)
  for path, index in checks:
    up, down = (jax.tree.map(np.copy, p64) for _ in range(2))
    at(up, path)[index] += h
    at(down, path)[index] -= h
    want = (loss64(up, x) - loss64(down, x)) / (2 * h)
    np.testing.assert_allclose(at(got_p, path)[index], want, rtol=rtol, atol=atol, err_msg=f"{path}{index}")
  for b, t, c in x_entries:
    up, down = np.array(x, np.float64), np.array(x, np.float64)
    up[b, t, c] += h
    down[b, t, c] -= h
    want = (loss64(p64, up) - loss64(p64, down)) / (2 * h)
    np.testing.assert_allclose(got_x[b, t, c], want, rtol=rtol, atol=atol, err_msg=f"x[{b}, {t}, {c}]")
  assert np.all(np.asarray(got_x)[~mask] == 0)

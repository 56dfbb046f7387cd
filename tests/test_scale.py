"""Scale-out on 8 fake devices: the fsdp axis (parameters and optimizer state split), and resuming a checkpoint
on another number of devices or another data/fsdp split."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

from conftest import REPO
from conftest import assert_close_gradients
from conftest import assert_close_sums
from conftest import free_port
from conftest import logged_step
from conftest import metrics_rows
from conftest import mixer_config
from conftest import summation_atol
from conftest import xla_flags
from efftx import checkpoints
from efftx import config as config_lib
from efftx import evaluate
from efftx import sharding
from efftx import train
from efftx import trainer
from efftx.mixers import MIXERS


def test_the_rule_splits_the_largest_divisible_dimension_and_never_a_layer_axis():
  key = lambda *names: tuple(jax.tree_util.DictKey(n) for n in names)
  assert sharding.spec(key("block_0", "ff", "up", "kernel"), (64, 256), 8) == jax.sharding.PartitionSpec(None, "fsdp")
  assert sharding.spec(key("embed", "embedding"), (4096, 64), 8) == jax.sharding.PartitionSpec("fsdp", None)
  assert sharding.spec(key("final_norm", "scale"), (64,), 8) == jax.sharding.PartitionSpec()  # small: replicated
  assert sharding.spec(key("classifier", "kernel"), (4096, 10), 8) == jax.sharding.PartitionSpec("fsdp", None)
  assert sharding.spec(key("x"), (3, 5, 4099), 8) == jax.sharding.PartitionSpec()  # nothing divisible
  assert sharding.spec(key("x"), (64, 256), 1) == jax.sharding.PartitionSpec()  # no fsdp axis
  # The reversible stack's stacked parameters: the layer axis (here the largest) is never split.
  assert sharding.spec(
    key("reversible", "layers", "G", "ff", "up", "kernel"), (512, 64, 128), 8
  ) == jax.sharding.PartitionSpec(None, None, "fsdp")


def _metric_terms(config, batch_size: int) -> tuple[int, int]:
  """The terms summed into one step's loss and gradient norm, for summation_atol: the loss is a mean over the B·L
  tokens of a chain of sums (per layer the LayerNorms and projections over d, the feed-forward over d_ff, the
  mixing over L, the head over d); the gradient norm takes that chain forward and backward and then a sum of
  squares over each parameter, the largest of which (the feed-forward's or the attention projections' kernel)
  bounds it."""
  m = config.model
  chain = m.num_layers * (3 * m.d_model + m.d_ff + m.max_len) + m.d_model
  largest = max(m.d_model * m.d_ff, 3 * m.d_model * m.d_model)
  return batch_size * m.max_len + chain, batch_size * m.max_len + 2 * chain + largest


def _assert_metrics_close(got, want, config, batch_size):
  """[loss, grad_norm] rows of two layouts of the same steps, equal up to the order of their sums."""
  n_loss, n_norm = _metric_terms(config, batch_size)
  got, want = np.asarray(got), np.asarray(want)
  assert_close_sums(got[:, 0], want[:, 0], n_terms=n_loss, err_msg="loss")
  assert_close_sums(got[:, 1], want[:, 1], n_terms=n_norm, err_msg="grad_norm")


def _initial_state(config):
  """config's initial train state (seed 0), on the host: one compiled init for every layout a test compares."""
  parts = trainer.parts(config)
  tx, _ = trainer.make_optimizer(config)
  return jax.device_get(jax.jit(lambda: trainer.create_state(parts.model, tx, jax.random.key(0)))())


def _steps(config, fsdp, initial, num_steps=1, batch_size=16, compiler_options=None):
  """([loss, grad_norm] per step, final state) of num_steps train steps on one fixed batch from the initial state
  (_initial_state), laid out with this fsdp."""
  parts = trainer.parts(config)
  tx, schedule = trainer.make_optimizer(config)
  mesh = sharding.make_mesh(fsdp)
  state = jax.device_put(initial, sharding.shardings(mesh, initial))
  state_sharding = jax.tree.map(lambda x: x.sharding, state)
  step = jax.jit(
    trainer.make_train_step(parts.model, parts.objective, tx, schedule, jax.random.key(1)),
    in_shardings=(state_sharding, sharding.batch(mesh)),
    out_shardings=(state_sharding, sharding.replicated(mesh)),
    compiler_options=compiler_options,
  )
  rng = np.random.default_rng(0)
  L, B = config.model.max_len, batch_size
  batch = {
    "tokens": rng.integers(1, 16, (B, L)).astype(np.int32),
    "mask": np.ones((B, L), bool),
    "label": rng.integers(0, 10, (B,)).astype(np.int32),
  }
  out = []
  for _ in range(num_steps):
    state, metrics = step(state, jax.device_put(batch, sharding.batch(mesh)))
    out.append([float(metrics["loss"]), float(metrics["grad_norm"])])
  return out, state


# One mixer for each way the fsdp rule splits a mixer's parameters and each kind of computation the partitioner
# meets around them (the rest repeat one of these: local and linear attention's projections are attention's,
# aft_simple and aft_local's are aft_full's, random and ff_only split nothing as fnet):
SHARDED_KINDS = {
  "attention": "a D × 3 × H × K projection split on D, scores over all keys",
  "block_local": "the same projection, blocks reshaped out of the sequence",
  "lsh": "a shared-QK projection, positions sorted and gathered by hash",
  "aft_full": "four D × D projections split, a position-pair bias kept whole",
  "aft_conv": "D × D projections split, a per-head convolution over the sequence",
  "linear_mixing": "a D × D hidden matrix split, a sequence matrix kept whole",
  "fnet": "no parameters: its per-device FFT (custom_partitioning) on a mesh that splits the others",
  "mamba": "an E × D output projection split on E (its input side), a selective scan over positions (lax.scan), "
  "bidirectional by reversal",
}
# The causal-only mixers' own kinds, in a model of their own (fnet cannot be causal, they cannot be bidirectional).
CAUSAL_SHARDED_KINDS = {
  "h3": "SSM parameters (B, C: D × N and D × N × 2) split, kernels made from them and applied through an FFT",
}


def test_the_sharded_mixers_stand_for_every_mixer():
  """Each mixer left out of the test below splits only parameters that one in it splits too: the same kind of leaf
  (a kernel, ...), of the same rank, along the same axis."""
  assert set(SHARDED_KINDS) | set(CAUSAL_SHARDED_KINDS) <= set(MIXERS)
  split = {}
  for mixer in MIXERS:
    config = mixer_config(mixer, d_model=64, d_ff=128, num_layers=1, max_len=32, num_heads=4, lsh_chunk=8)
    model = trainer.parts(config).model
    params = jax.eval_shape(model.init, jax.random.key(0), jax.ShapeDtypeStruct((1, 32), np.int32))["params"]
    split[mixer] = {
      (jax.tree_util.keystr(path[-1:]), x.ndim, tuple(sharding.spec(path, x.shape, 8)))
      for path, x in jax.tree_util.tree_leaves_with_path(params["block_0"]["mixing"])
      if sharding.spec(path, x.shape, 8) != jax.sharding.PartitionSpec()
    }
  kinds = {**SHARDED_KINDS, **CAUSAL_SHARDED_KINDS}
  covered = set().union(*(split[m] for m in kinds))
  for mixer in set(MIXERS) - set(kinds):
    assert split[mixer] <= covered, (mixer, split[mixer] - covered)


def _first_moments(state) -> list:
  """AdamW's first moments (mu) in a train state, one per parameter."""
  return [
    leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(state.opt_state)
    if any(getattr(k, "name", None) == "mu" for k in path)
  ]


# SHARDED_KINDS in two models of half the layers each: two programs compile in 0.81-0.92 of one twice their size.
_KIND_MODELS = {
  "kinds_1": list(SHARDED_KINDS)[: len(SHARDED_KINDS) // 2],
  "kinds_2": list(SHARDED_KINDS)[len(SHARDED_KINDS) // 2 :],
  "causal_kinds": list(CAUSAL_SHARDED_KINDS),
}


@pytest.mark.parametrize("model", ["kinds_1", "kinds_2", "reversible", "causal_kinds"])
def test_mixers_train_the_same_with_sharded_parameters(model):
  """A train step at fsdp 8 equals one at fsdp 1 (data 8): loss, gradient norm and updated parameters. "kinds_1",
  "kinds_2": models whose layers are the SHARDED_KINDS mixers, one each (a layer pattern), half of them each, their
  split parameters in one program; "causal_kinds": the same of CAUSAL_SHARDED_KINDS; "reversible": a reversible
  attention stack (a leading layer axis the rule never splits), with dropout (its masks drawn again in the
  recomputed forward pass). Dropout under other layouts is the quickstart model's (below, and test_train.py); the
  mixers' own models leave it out (its random bits were a third of their compile time)."""
  reversible = model == "reversible"
  kinds = _KIND_MODELS.get(model, [])
  mixer = "attention" if reversible else "+".join(kinds)
  num_layers = 1 if reversible else len(kinds)
  config = mixer_config(
    mixer,
    d_model=64,
    d_ff=128,
    num_layers=num_layers,
    max_len=32,
    num_heads=4,
    dropout=0.1 if reversible else 0.0,
    reversible=reversible,
    lsh_chunk=8,
  )
  config.optim.warmup_steps = 0
  initial = _initial_state(config)
  (metrics_1, state_1), (metrics_8, state_8) = _steps(config, 1, initial), _steps(config, 8, initial)
  _assert_metrics_close(metrics_8, metrics_1, config, batch_size=16)
  # Parameters after the update to within one update (learning rate 1e-3): Adam's first step moves each
  # parameter by ±lr whatever its gradient's size, so where a gradient is ~0 another summation order can flip it.
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2.5e-3),
    jax.device_get(state_8.params),
    jax.device_get(state_1.params),
  )
  # The gradients too (AdamW's first moments after one step: 0.1 × the clipped gradients), each leaf to the order of
  # its sums: per layer the forward pass's (the LayerNorms and projections over d, the feed-forward over d_ff, the
  # scores over K and the L keys or positions mixed), the backward pass's the same again, then the weight
  # gradients' sum over the B·L rows. A 1% change in one layer's gradients fails it, where the loss and gradient
  # norm, sums over every layer, may not show it.
  d, d_ff, L, K = 64, 128, 32, 16
  assert_close_gradients(
    _first_moments(jax.device_get(state_8)),
    _first_moments(jax.device_get(state_1)),
    n_terms=2 * num_layers * (8 * d + d_ff + K + 3 * L) + 16 * L,
  )
  split = {
    jax.tree_util.keystr(path[:2])
    for path, x in jax.tree_util.tree_leaves_with_path(state_8.params)
    if not x.sharding.is_fully_replicated
  }
  if reversible:
    assert "['reversible']['layers']" in split, split
  else:  # every layer's mixer but fnet's (which has no parameters) has a split parameter
    mixing = {
      kind
      for i, kind in enumerate(kinds)
      if any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(state_8.params[f"block_{i}"]["mixing"]))
    }
    assert mixing == set(kinds) - {"fnet"}, mixing


def test_one_example_per_device_compiles_with_ynnpack_for_the_matmuls_only_and_trains_the_same():
  """sharding.step_compiler_options: on a CPU with one example a device (here 8 on 8), YNNPACK's reduction fusions
  off (they ran 15-20x slower on arrays with a leading dimension of 1); with more, no options. Kernels change,
  results do not: the loss, gradient norm and gradients (AdamW's first moments after one step, 0.1 × the clipped
  gradients: the updated parameters themselves differ by about ±lr whatever the gradient) equal the default
  compilation's, for a model of an AFT-simple layer (sums over the sequence) and an attention layer (matmuls)."""
  mesh = sharding.make_mesh()
  options = sharding.step_compiler_options(8, mesh)
  assert options == {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
  assert sharding.step_compiler_options(16, mesh) == {}
  # They do what they say on this jaxlib: a per-device [1, 512, 64] sum over the sequence of a product is a YNNPACK
  # fusion by default and XLA's own reduction with them.
  x = jax.device_put(np.ones((8, 512, 64), np.float32), sharding.batch(mesh))
  lowered = jax.jit(lambda x: (x * x).sum(axis=1)).lower(x)
  assert "__ynn_fusion" in lowered.compile().as_text()
  assert "__ynn_fusion" not in lowered.compile(options).as_text()
  num_layers = 2
  config = mixer_config("aft_simple+attention", d_model=64, d_ff=128, num_layers=num_layers, max_len=64, num_heads=4)
  config.optim.warmup_steps = 0
  initial = _initial_state(config)
  (metrics, state), (metrics_opt, state_opt) = (
    _steps(config, 1, initial, batch_size=8, compiler_options=o) for o in (None, options)
  )
  _assert_metrics_close(metrics_opt, metrics, config, batch_size=8)
  moments, moments_opt = _first_moments(jax.device_get(state)), _first_moments(jax.device_get(state_opt))
  assert len(moments) == len(jax.tree.leaves(state.params))
  # Equal up to the order of the sums, which the fusions change: the forward pass's (the LayerNorms' statistics, the
  # projections and the feed-forward over d and d_ff, the scores over K, the L keys' normalizer and weighted sum,
  # the pooling over L, the head over d), the backward pass's the same again, then the weight gradients' sum over
  # the B·L rows (some parameters' gradients are zero up to rounding, ~1e-11). A 1% change in a gradient fails it.
  d, d_ff, L, K = 64, 128, 64, 16
  assert_close_gradients(moments_opt, moments, n_terms=2 * num_layers * (8 * d + d_ff + K + 3 * L) + 8 * L)


def _assert_rows_close(got, want, config, first_step=1):
  """metrics.jsonl rows of two layouts of one run (devices, processes, fsdp), equal up to the order of each step's
  sums (one step's bound: the runs are compared from where their parameters are equal or nearly so)."""
  n_loss, n_norm = _metric_terms(config, config.data.batch_size)
  got, want = [r for r in got if r["step"] >= first_step], [r for r in want if r["step"] >= first_step]
  assert [r["step"] for r in got] == [r["step"] for r in want] and got
  for g, w in zip(got, want):
    for key, n in (("loss", n_loss), ("grad_norm", n_norm), ("eval_loss", n_loss)):
      if key in w:
        assert g[key] == pytest.approx(w[key], abs=summation_atol(n, w[key])), (g["step"], key)


def _max_parameter_difference(workdir, other, step) -> float:
  """max |a − b| over the parameters of two runs' checkpoints at `step` (parameters are O(0.001–1)), leaving out
  attention's key bias: a softmax over keys does not see it, so its gradient is 0 in exact arithmetic and its
  values are rounding noise that Adam's m/√v scales up to ±learning rate per step."""
  _, got, _ = checkpoints.restore_params(str(workdir), step)
  _, want, _ = checkpoints.restore_params(str(other), step)
  diffs = []
  for (path, a), b in zip(
    jax.tree_util.tree_flatten_with_path(jax.device_get(got))[0], jax.tree.leaves(jax.device_get(want))
  ):
    d = np.abs(np.asarray(a) - np.asarray(b))
    if [getattr(k, "key", None) for k in path][-2:] == ["qkv", "bias"]:
      d = np.delete(d, 1, axis=0)  # (q, k, v) × heads × head width: drop k
    diffs.append(float(d.max()))
  return max(diffs)


# The schedule of the module's runs: T steps logged every 3, evaluated and checkpointed every 6. Under the
# quickstart's 100 warmup steps the learning-rate schedule does not depend on total_steps, so a run of fewer steps
# is the straight run's beginning.
T = 18
STRAIGHT = {"total_steps": T, "log_every": 3, "eval_every": 6, "checkpoint_every": 6, "keep_checkpoints": 3}


def _quickstart_size(data_dir, **fields):
  """The quickstart's model (width 64, FF 256) on the smoke data, on STRAIGHT's schedule."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top

  config = quickstart.get_config("smoke")
  config.data.data_dir = data_dir
  config.model.update(d_model=64, d_ff=256)
  config.update({**STRAIGHT, **fields})
  return config


@pytest.fixture(scope="module")
def straight(data_dir, tmp_path_factory):
  """(config, workdir) of the uninterrupted run of STRAIGHT on 8 devices (data 8), the reference of the module's
  other layouts, resumed and multi-process runs; tests copy it before changing it."""
  config = _quickstart_size(data_dir)
  workdir = tmp_path_factory.mktemp("straight")
  train.train_and_evaluate(config, str(workdir))
  assert _checkpoint_steps(workdir) == [6, 12, 18]
  return config, workdir


def _checkpoint_steps(workdir) -> list[int]:
  return sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit())


@pytest.mark.xdist_group("scale_straight")
def test_fsdp_8_equals_data_8_with_an_eighth_of_the_state_per_device(straight, tmp_path):
  """The first 6 steps at fsdp 8 log what the straight run (data 8) logged; each device holds an eighth of the
  parameters and AdamW state but the arrays too small to split."""
  config, straight = straight
  config = config.copy_and_resolve_references()
  config.update(total_steps=6)
  config.mesh.fsdp = 8
  train.train_and_evaluate(config, str(tmp_path / "fsdp8"))
  first_6 = [r for r in metrics_rows(straight) if r["step"] <= 6]
  assert any("eval_loss" in r for r in first_6)
  _assert_rows_close(metrics_rows(tmp_path / "fsdp8"), first_6, config)

  initial = _initial_state(config)
  held = {}
  for fsdp in (1, 8):
    state = jax.device_put(initial, sharding.shardings(sharding.make_mesh(fsdp), initial))
    held[fsdp] = (sharding.bytes_on_first_device(state.params), sharding.bytes_on_first_device(state.opt_state))
  total = sum(x.nbytes for x in jax.tree.leaves(state.params))
  # Arrays under MIN_SHARDED elements stay whole on every device (here: embeddings of a 48-position, 20-token
  # model, biases, norms); everything else is split 8 ways.
  small = [
    sum(x.nbytes for x in jax.tree.leaves(tree) if x.size < sharding.MIN_SHARDED)
    for tree in (state.params, state.opt_state)
  ]
  print(
    f"bytes on device 0: parameters {held[1][0]} (data = 8) vs {held[8][0]} (fsdp = 8, "
    f"{held[8][0] / held[1][0]:.3f}), AdamW state {held[1][1]} vs {held[8][1]} ({held[8][1] / held[1][1]:.3f}); "
    f"arrays kept whole: {small[0]} + {small[1]} bytes"
  )
  assert held[1][0] == total
  for data_8, fsdp_8, whole in zip(held[1], held[8], small):
    assert fsdp_8 == pytest.approx((data_8 - whole) / 8 + whole, rel=0.01)


@pytest.mark.slow
@pytest.mark.xdist_group("scale_straight")
def test_a_checkpoint_of_8_devices_resumes_on_4_devices_split_another_way(straight, tmp_path):
  """The straight run's checkpoint at step 12 (8 devices, data 8: parameters whole on each), resumed on 4 devices
  (another process: JAX fixes its device count at start-up) split data 2 × fsdp 2 (parameters and AdamW state
  split in two): the same rows and final parameters as the straight run."""
  config, straight = straight
  workdir = tmp_path / "on_4"
  shutil.copytree(straight, workdir)
  shutil.rmtree(workdir / "checkpoints" / str(T))
  proc = subprocess.run(
    _train_command(workdir, config, **{"mesh.fsdp": 2}),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env={**os.environ, "XLA_FLAGS": xla_flags(4)},
  )
  assert proc.returncode == 0, proc.stderr
  assert "4 devices (data 2 × fsdp 2)" in proc.stderr and "at step 12" in proc.stderr
  _assert_rows_close(metrics_rows(workdir), metrics_rows(straight), config, first_step=13)
  diff = _max_parameter_difference(workdir, straight, T)
  print(f"final parameters differ from the uninterrupted 8-device run's by at most {diff:.2e}")
  assert diff < 1e-5


@pytest.mark.slow
def test_a_cpu_run_gets_one_device_per_core_unless_the_user_chose(smoke_config, tmp_path):
  """efftx.train without a device count in XLA_FLAGS: one CPU device per core, as many as the batch splits into
  (batch 6: gcd(cores, 6)), and PJRT_NPROC (XLA's CPU-client threads) twice that unless set; with the count
  given, or after the backends are up (a later call asking for 1 device), use_cpu_cores changes nothing and raises
  nothing."""
  config = smoke_config()
  config.total_steps = 2
  env = {**os.environ, "XLA_FLAGS": xla_flags(None)}
  # The run logs its devices before it compiles the step: it is stopped there (the line is the property).
  proc = subprocess.Popen(
    _train_command(tmp_path / "run", config, **{"data.batch_size": 6}),
    cwd=REPO,
    stderr=subprocess.PIPE,
    stdout=subprocess.DEVNULL,
    text=True,
    env=env,
  )
  watchdog = threading.Timer(300, proc.kill)  # a run that hangs ends the wait (its stderr closes)
  watchdog.start()
  log = []
  while not (log and "devices (data" in log[-1]) and (not log or log[-1]):
    log.append(proc.stderr.readline())
  watchdog.cancel()
  proc.kill()
  proc.communicate(timeout=60)
  n = math.gcd(len(os.sched_getaffinity(0)), 6)
  assert f"{n} devices (data {n} × fsdp 1)" in log[-1], "".join(log)
  check = (
    "import jax, os; from efftx import sharding; sharding.use_cpu_cores(8); a = jax.device_count(); "
    "sharding.use_cpu_cores(1); print(a, jax.device_count(), os.environ.get('PJRT_NPROC'))"
  )
  env = {k: v for k, v in env.items() if k not in ("PJRT_NPROC", "NPROC")}
  chosen = subprocess.run(
    [sys.executable, "-c", check],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env={**env, "XLA_FLAGS": xla_flags(3)},
  )
  assert chosen.stdout.split() == ["3", "3", "None"], chosen.stderr
  default = subprocess.run(
    [sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120, env=env
  )
  cores = math.gcd(len(os.sched_getaffinity(0)), 8)
  threads = str(2 * cores) if cores > 1 else "None"  # XLA's CPU client: two threads a device (see use_cpu_cores)
  assert default.stdout.split() == [str(cores), str(cores), threads], default.stderr
  own = subprocess.run(
    [sys.executable, "-c", check], cwd=REPO, capture_output=True, text=True, timeout=120, env={**env, "PJRT_NPROC": "3"}
  )
  assert own.stdout.split() == [str(cores), str(cores), "3"], own.stderr


def test_fsdp_must_divide_the_devices(smoke_config):
  config = smoke_config()
  config.mesh.fsdp = 3
  with pytest.raises(ValueError, match="config.mesh.fsdp=3 must divide the 8 devices"):
    config_lib.validate(config, 8)


def _train_command(workdir, config, **overrides):
  """efftx.train on the quickstart's smoke data with _quickstart_size's model and config's schedule, as a command."""
  fields = {
    **{name: config[name] for name in STRAIGHT},
    "model.d_model": 64,
    "model.d_ff": 256,
    **overrides,
  }
  return [
    sys.executable,
    "-m",
    "efftx.train",
    "--config=configs/quickstart.py:smoke",
    f"--workdir={workdir}",
    f"--config.data.data_dir={config.data.data_dir}",
  ] + [f"--config.{k}={v}" for k, v in fields.items()]


def _two_processes(command):
  """Two processes × 4 CPU devices of one JAX run (jax.distributed over loopback)."""
  port = free_port()
  env = {**os.environ, "XLA_FLAGS": xla_flags(4)}
  return [
    subprocess.Popen(
      command + [f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]


@pytest.mark.slow
@pytest.mark.xdist_group("scale_straight")
def test_two_processes_equal_one_stop_together_and_resume_on_one(straight, tmp_path):
  """2 real processes × 4 devices against 1 process × 8 devices: the same per-step losses; a SIGTERM to one
  process stops both at the same (log) step with a checkpoint; that checkpoint evaluates the same on two processes
  as on one, and resumes in 1 process × 8 devices to the same end."""
  config, straight = straight
  workdir = tmp_path / "two"
  procs = _two_processes(_train_command(workdir, config))
  deadline = time.time() + 180
  while logged_step(workdir) < 3:
    assert procs[0].poll() is None and time.time() < deadline, procs[0].communicate()[0]
    time.sleep(0.01)
  procs[1].send_signal(signal.SIGTERM)  # only the second process is told
  outs = [p.communicate(timeout=180)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], outs
  stopped = [int(o.split("stopped by signal at step ")[1].split()[0]) for o in outs]
  assert stopped[0] == stopped[1] < T and stopped[0] % 3 == 0, stopped  # at a log boundary
  every = config.checkpoint_every
  assert _checkpoint_steps(workdir) == sorted({*range(every, stopped[0], every), stopped[0]})
  _assert_rows_close(metrics_rows(workdir), [r for r in metrics_rows(straight) if r["step"] <= stopped[0]], config)

  # efftx.evaluate on the two processes (each reading its shard) equals one process on 8 devices (this one).
  procs = _two_processes([sys.executable, "-m", "efftx.evaluate", f"--workdir={workdir}"])
  outs = [p.communicate(timeout=180)[0] for p in procs]
  assert all(p.returncode == 0 for p in procs), outs
  results = [json.loads((workdir / f"eval_validation_{stopped[0]}.json").read_text())]
  evaluate.evaluate(str(workdir))
  results.append(json.loads((workdir / f"eval_validation_{stopped[0]}.json").read_text()))
  assert results[0]["examples"] == results[1]["examples"] == 200
  assert results[0]["accuracy"] == results[1]["accuracy"]
  # Each device runs the same program on its shard; the mean over the 200 examples is reduced across 2 processes
  # or within 1, in another order.
  assert results[0]["loss"] == pytest.approx(results[1]["loss"], abs=summation_atol(200, results[1]["loss"]))

  # The two processes' checkpoint, resumed by one process on 8 devices: the same run as the straight one.
  train.train_and_evaluate(config, str(workdir))
  _assert_rows_close(metrics_rows(workdir), metrics_rows(straight), config)
  diff = _max_parameter_difference(workdir, straight, T)
  print(f"stopped at step {stopped[0]}; final parameters differ by at most {diff:.2e}")
  assert diff < 1e-5

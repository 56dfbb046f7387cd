"""The sharded train step, and whole runs: stop by signal, re-run the same command, continue exactly."""
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np
import pytest

from conftest import REPO
from efftx import train
from efftx.data import pipeline
from efftx.model import build_model


def _setup(config, devices):
  model = build_model(config)
  tx, schedule = train.make_optimizer(config)
  mesh = train.make_mesh(devices)
  params = model.init(jax.random.key(0), jnp.zeros((1, config.model.max_len), jnp.int32))["params"]
  state = train.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  state = jax.device_put(state, NamedSharding(mesh, P()))
  train_step, _ = train.make_steps(model, "classify", tx, schedule, jax.random.key(1))
  step = jax.jit(train_step, out_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P())))
  shard = lambda batch: jax.device_put(batch, NamedSharding(mesh, P("data")))
  return state, step, shard


def _first_batch(config):
  pipeline.prepare(config)
  return next(pipeline.train_iterator(config, pipeline.source(config, "train")))


def test_steps_on_8_devices_reduce_the_loss(smoke_config):
  assert jax.device_count() == 8
  config = smoke_config()
  config.model.dropout = 0.0
  config.total_steps, config.optim.warmup_steps = 40, 2
  state, step, shard = _setup(config, jax.devices())
  batch = shard(_first_batch(config))
  assert len(batch["tokens"].sharding.device_set) == 8
  losses = []
  for _ in range(25):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.5 * losses[0], losses


def test_weight_decay_applies_to_weight_matrices_only(smoke_config):
  config = smoke_config()
  config.optim.update(warmup_steps=0, weight_decay=0.5)
  tx, _ = train.make_optimizer(config)
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((3, 2, 2))}, "norm": {"scale": jnp.ones((2, 2))},
            "embed": {"embedding": jnp.ones((4, 2))}}
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  moved = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
  assert moved == {"dense": {"kernel": True, "bias": False}, "norm": {"scale": False}, "embed": {"embedding": True}}


def test_sharded_and_single_device_steps_agree(smoke_config):
  config = smoke_config()  # dropout on: its masks must not depend on the sharding either
  batch = _first_batch(config)
  results = []
  for devices in (jax.devices(), jax.devices()[:1]):
    state, step, shard = _setup(config, devices)
    for _ in range(3):
      state, metrics = step(state, shard(batch))
    results.append((jax.device_get(state.params), float(metrics["loss"])))
  (params_8, loss_8), (params_1, loss_1) = results
  np.testing.assert_allclose(loss_8, loss_1, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), params_8, params_1)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_stop_by_signal_then_same_command_continues_exactly(smoke_config, tmp_path):
  overrides = {"total_steps": 120, "log_every": 1, "eval_every": 60, "checkpoint_every": 40}
  # The uninterrupted run, in this process.
  config = smoke_config()
  config.update(overrides)
  straight = str(tmp_path / "straight")
  train.train_and_evaluate(config, straight)

  # The same run as a command, stopped by SIGTERM early on, then the same command again.
  workdir = str(tmp_path / "stopped")
  command = [sys.executable, "-m", "efftx.train", "--config=configs/quickstart.py:smoke", f"--workdir={workdir}",
             f"--config.data.data_dir={config.data.data_dir}"] + [f"--config.{k}={v}" for k, v in overrides.items()]
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + 120
  while not (os.path.exists(metrics_path) and os.path.getsize(metrics_path)) and time.time() < deadline:
    time.sleep(0.02)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=120)
  assert proc.returncode == 0, out
  stopped_at = max(r["step"] for r in _rows(workdir))
  assert 1 <= stopped_at < 120, out
  assert f"stopped by signal at step {stopped_at}" in out
  assert sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())[-1] == stopped_at

  again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert again.returncode == 0, again.stderr
  assert f"at step {stopped_at}" in again.stderr  # "resumed from ... at step k"

  resumed, reference = _rows(workdir), _rows(straight)
  assert [r["step"] for r in resumed] == [r["step"] for r in reference]  # every step logged once
  for got, want in zip(resumed, reference):
    for key in ("loss", "accuracy", "grad_norm", "learning_rate", "eval_loss", "eval_accuracy"):
      if key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), (got["step"], key)

  # Once finished, the same command again trains nothing more.
  third = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert third.returncode == 0 and len(_rows(workdir)) == len(resumed)


def test_outputs_land_in_workdir(smoke_config, tmp_path):
  config = smoke_config()
  result = train.train_and_evaluate(config, str(tmp_path))
  assert result["step"] == config.total_steps and 0 <= result["eval_accuracy"] <= 1
  assert json.load(open(tmp_path / "config.json"))["model"]["mixer"] == "attention"
  rows = _rows(tmp_path)
  assert all("step" in r for r in rows) and any("eval_accuracy" in r for r in rows)
  assert any("tokens_per_sec" in r and "steps_per_sec" in r and "learning_rate" in r for r in rows)
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tensorboard"))


def test_resuming_with_another_model_is_refused(smoke_config, tmp_path):
  config = smoke_config()
  train.train_and_evaluate(config, str(tmp_path))
  config.model.d_model = 64
  with pytest.raises(ValueError, match="config.model.d_model=32"):
    train.train_and_evaluate(config, str(tmp_path))


def test_a_workdir_made_before_new_config_fields_still_resumes(smoke_config, tmp_path):
  config = smoke_config()
  saved = json.loads(config.to_json_best_effort())
  del saved["data"]["objective"], saved["data"]["truncate"], saved["init_from"]  # fields added later
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(json.dumps(saved))
  train._check_same_run(config, str(tmp_path))  # pylint: disable=protected-access  # the defaults match
  config.model.mixer = "fnet"
  with pytest.raises(ValueError, match="config.model.mixer='attention', not 'fnet'"):
    train._check_same_run(config, str(tmp_path))  # pylint: disable=protected-access

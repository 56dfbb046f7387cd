"""The sharded train step, and whole runs in this process: outputs, resuming, refusing another model (signals and
kills: test_faults.py)."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from conftest import assert_close_sums
from conftest import lm_model
from conftest import metrics_rows
from conftest import mixer_config
from conftest import run_in_process
from conftest import snapshot
from efftx import checkpoints
from efftx import config as config_lib
from efftx import saved_configs
from efftx import sharding
from efftx import train
from efftx import trainer
from efftx.data import pipeline
from efftx.mixers import MIXERS


def _setup(config, devices):
  parts = trainer.parts(config)
  tx, schedule = trainer.make_optimizer(config)
  mesh = sharding.make_mesh(1, devices)
  # One compiled program (as efftx.train creates its state), not the model's init op by op.
  state = jax.jit(
    lambda: trainer.create_state(parts.model, tx, jax.random.key(0)), out_shardings=NamedSharding(mesh, P())
  )()
  train_step = trainer.make_train_step(parts.model, parts.objective, tx, schedule, jax.random.key(1))
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
  tx, _ = trainer.make_optimizer(config)
  params = {
    "dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((3, 2, 2))},
    "norm": {"scale": jnp.ones((2, 2))},
    "embed": {"embedding": jnp.ones((4, 2))},
    "linear_mixing": {"w_seq": jnp.ones((3, 3)), "w_hidden": jnp.ones((2, 2))},
    "aft": {"bias": {"u": jnp.ones((3, 2))}},
  }
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = jax.jit(tx.update)(zero_grads, tx.init(params), params)  # one program, not an eager op at a time
  moved = jax.tree.map(lambda u: bool(jnp.any(u != 0)), updates)
  assert moved == {
    "dense": {"kernel": True, "bias": False},
    "norm": {"scale": False},
    "embed": {"embedding": True},
    "linear_mixing": {"w_seq": True, "w_hidden": True},
    "aft": {"bias": {"u": False}},
  }


@pytest.mark.parametrize("mixer", MIXERS)
def test_weight_decay_mask_is_the_dense_rule_and_the_mixer_s_declared_matrices(mixer):
  """trainer.decay_mask, from MixerSpec.decayed, picks in every mixer's model what one fixed rule picks: the leaves
  named kernel, embedding, w_seq or w_hidden (linear_mixing), taps (base_conv's convolution) or C (h3's SSMs); and
  each name a mixer declares is one of its parameters."""
  config = mixer_config(mixer, d_model=16, d_ff=32, max_len=16, num_heads=2, reversible=mixer == "attention")
  params = jax.eval_shape(lambda: lm_model(config).init(jax.random.key(0), jnp.zeros((1, 16), jnp.int32)))["params"]
  fixed_rule = jax.tree_util.tree_map_with_path(
    lambda path, _: getattr(path[-1], "key", None) in ("kernel", "embedding", "w_seq", "w_hidden", "taps", "C"), params
  )
  assert trainer.decay_mask(params) == fixed_rule
  names = {getattr(path[-1], "key", None) for path, _ in jax.tree_util.tree_leaves_with_path(params)}
  assert set(MIXERS[mixer].decayed) <= names


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
  # The loss: a mean over the B·L tokens of a chain of sums (per layer the LayerNorms and projections over d, the
  # feed-forward over d_ff, the mixing over L), which 8 devices reduce in another order.
  m = config.model
  n_loss = config.data.batch_size * m.max_len + m.num_layers * (3 * m.d_model + m.d_ff + m.max_len) + m.d_model
  assert_close_sums(loss_8, loss_1, n_terms=n_loss)

  def close(path, a, b):
    if jax.tree_util.keystr(path).endswith("['qkv']['bias']"):
      # The key bias moves every logit of a query's row by the same amount, which softmax ignores: its gradient is
      # 0 up to rounding, and AdamW turns that rounding noise into ±learning-rate steps. Query and value only.
      a, b = a[[0, 2]], b[[0, 2]]
    # AdamW moves a parameter by lr · m/√v: a gradient off by its rounding (~n_loss · eps relative) moves it by
    # ~lr · n_loss · eps per step, far below 1e-6 at these warm-up learning rates.
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))

  jax.tree_util.tree_map_with_path(close, params_8, params_1)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory, data_dir):
  """The quickstart's smoke run trained to step 8 (logged every step, checkpointed at 4 and 8, evaluated at 8):
  (its config, its workdir, its last metrics). Tests that write to it work on a copy."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top

  config = quickstart.get_config("smoke")
  config.data.data_dir = data_dir
  config.update({"total_steps": 8, "log_every": 1, "eval_every": 8, "checkpoint_every": 4})
  workdir = str(tmp_path_factory.mktemp("smoke_run"))
  return config, workdir, train.train_and_evaluate(config, workdir)


@pytest.mark.xdist_group("smoke_run")  # one worker trains the module fixture, not both
def test_outputs_land_in_workdir(smoke_run):
  config, workdir, result = smoke_run
  assert result["step"] == config.total_steps and 0 <= result["eval_accuracy"] <= 1
  assert json.load(open(os.path.join(workdir, "config.json")))["model"]["mixer"] == "attention"
  rows = metrics_rows(workdir)
  assert all("step" in r for r in rows) and any("eval_accuracy" in r for r in rows)
  assert any("tokens_per_sec" in r and "steps_per_sec" in r and "learning_rate" in r for r in rows)
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(os.path.join(workdir, "tensorboard")))


@pytest.mark.xdist_group("smoke_run")  # one worker trains the module fixture, not both
def test_resuming_with_another_model_is_refused(smoke_run, tmp_path):
  config, workdir, _ = smoke_run
  shutil.copytree(workdir, tmp_path / "run")
  config = config.copy_and_resolve_references()
  config.model.d_model = 64
  with pytest.raises(ValueError, match="config.model.d_model 32 → 64"):
    train.train_and_evaluate(config, str(tmp_path / "run"))


def test_a_workdir_made_before_new_config_fields_still_resumes(smoke_config, tmp_path):
  config = smoke_config()
  saved = json.loads(config.to_json_best_effort())
  del saved["data"]["objective"], saved["data"]["truncate"], saved["init_from"]  # fields added later
  (tmp_path / "checkpoints").mkdir()
  (tmp_path / "config.json").write_text(json.dumps(saved))
  assert checkpoints.check_resume(config, str(tmp_path)) == {}  # the defaults match
  config.model.d_model = 48
  with pytest.raises(ValueError, match="config.model.d_model 32 → 48"):
    checkpoints.check_resume(config, str(tmp_path))


# config.model as efftx wrote it before mixers declared their options (commit cc99d64): every mixer's options flat.
_OLD_FLAT_MODEL = {
  "mixer": "attention",
  "d_model": 32,
  "num_heads": 4,
  "num_layers": 2,
  "d_ff": 64,
  "max_len": 48,
  "dropout": 0.1,
  "attention_dropout": 0.0,
  "dtype": "float32",
  "causal": False,
  "reversible": False,
  "ff_chunk_size": 0,
  "attention_impl": "auto",
  "attention_chunk": 256,
  "window": 32,
  "aft_bias_dim": 64,
  "aft_factorized": True,
  "kernel_size": 7,
  "lsh_buckets": 8,
  "lsh_hashes": 2,
  "lsh_chunk": 64,
  "lsh_seed": 0,
  "fourier_impl": "auto",
}


@pytest.mark.parametrize(
  "mixer,changes,want",
  [
    (
      "attention",
      {"num_heads": 2, "attention_dropout": 0.1},
      {"num_heads": 2, "attention_dropout": 0.1, "attention_impl": "auto", "attention_chunk": 256},
    ),
    ("linear", {"attention_chunk": 64}, {"num_heads": 4, "chunk": 64}),  # renamed
    # lsh had no attention dropout then: an old run's setting had no effect, so it converts to 0.
    (
      "lsh",
      {"attention_dropout": 0.1, "lsh_chunk": 16},
      {"num_heads": 4, "lsh_buckets": 8, "lsh_hashes": 2, "lsh_chunk": 16, "lsh_seed": 0, "attention_dropout": 0.0},
    ),
    ("fnet", {"fourier_impl": "rfft", "num_heads": 8}, {"fourier_impl": "rfft"}),
  ],
)
def test_an_old_flat_config_json_converts(mixer, changes, want):
  saved = {"model": {**_OLD_FLAT_MODEL, "mixer": mixer, **changes}, "data": {"task": "listops"}, "seed": 3}
  config = saved_configs.from_saved(saved)
  # The options named in `want` converted as shown; options added since take their defaults.
  assert config.mixer.to_dict() == {**config_lib.mixer_options(mixer).to_dict(), **want}
  assert set(config.model.keys()) == set(config_lib.default_config().model.keys())
  assert config.model.d_model == 32 and config.seed == 3


@pytest.mark.xdist_group("smoke_run")  # one worker trains the module fixture, not both
def test_a_workdir_from_before_mixer_options_resumes_exactly(smoke_run, tmp_path):
  config, straight, _ = smoke_run

  # The same run as the old code would have left it at step 4: its step-4 checkpoint, config.json in the old layout.
  old = tmp_path / "old"
  shutil.copytree(straight, old)
  shutil.rmtree(old / "checkpoints" / "8")
  saved = json.loads((old / "config.json").read_text())
  saved["model"] = {**_OLD_FLAT_MODEL, **saved["model"], **saved.pop("mixer")}
  (old / "config.json").write_text(json.dumps(saved))
  train.train_and_evaluate(config, str(old))
  resumed, reference = metrics_rows(old), metrics_rows(straight)
  assert [r["step"] for r in resumed] == [r["step"] for r in reference]
  # Steps 1–4 were not trained again: their rows are the copied ones, timings included.
  assert [r for r in resumed if r["step"] <= 4] == [r for r in reference if r["step"] <= 4]
  assert any(
    r["step"] > 4 and r["steps_per_sec"] != w["steps_per_sec"]
    for r, w in zip(resumed, reference)
    if "steps_per_sec" in r
  )
  for got, want in zip(resumed, reference):
    for key in ("loss", "eval_loss"):
      if key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-6), (got["step"], key)


def test_the_last_line_says_why_no_metrics_were_logged():
  """train's last line: the final metrics; with none logged, "nothing to do" only for a run already trained, and
  for one a signal stopped before its first logged step (Ctrl-C while compiling), that it stopped."""
  assert train.final_line({"step": 20, "loss": 1.5}, 20) == "step 20: loss=1.5"
  assert train.final_line({"step": 20}, 20) == "step 20: nothing to do (already trained to config.total_steps=20)"
  assert train.final_line({"step": 1}, 20) == (
    "step 1: stopped before its first logged step; re-run the same command to resume"
  )


def _resume_args(config, workdir, *overrides) -> list[str]:
  """efftx.train's command line that resumes smoke_run's copy in workdir, with `overrides`."""
  return [
    "--config=configs/quickstart.py:smoke",
    f"--workdir={workdir}",
    f"--config.data.data_dir={config.data.data_dir}",
    *(f"--config.{k}={config[k]}" for k in ("total_steps", "log_every", "eval_every", "checkpoint_every")),
    *overrides,
  ]


@pytest.mark.xdist_group("smoke_run")  # one worker trains the module fixture, not both
def test_resuming_with_other_settings_is_refused_in_one_line_naming_each(smoke_run, tmp_path):
  """Settings that differ from the run's: exit 2, one line naming each (old → new) and the flag that accepts them;
  the model stays refused with the flag; a mistyped name in the flag is refused; the workdir is left as it was."""
  config, workdir, _ = smoke_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  before = snapshot(run)
  code, _, stderr = run_in_process(
    "efftx.train", _resume_args(config, run, "--config.optim.learning_rate=0.5", "--config.seed=7")
  )
  assert code == 2 and stderr.splitlines() == [
    f"efftx.train: error: {run} holds a run with other settings (config.optim.learning_rate 0.001 → 0.5, "
    "config.seed 0 → 7): to go on with them, re-run with --resume_changes=optim.learning_rate,seed (recorded in "
    "config_history.jsonl with the step they take effect after), or use another --workdir"
  ], stderr
  for overrides, words in [
    (["--config.model.d_ff=128", "--resume_changes=model"], "holds a run of another model or data (config.model.d_ff"),
    (["--resume_changes=optim.lr"], "config.optim has no field 'lr'; its fields: decay_all, grad_clip, learning_rate"),
  ]:
    code, _, stderr = run_in_process("efftx.train", _resume_args(config, run, *overrides))
    lines = stderr.splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0], stderr
  assert snapshot(run) == before


@pytest.mark.xdist_group("smoke_run")  # one worker trains the module fixture, not both
def test_a_change_accepted_on_resume_is_recorded_with_its_step_and_config_json_is_kept(smoke_run, tmp_path):
  """--resume_changes: the run goes on with the new settings from the checkpoint it resumes (step 8); the change
  is a line of config_history.jsonl with that step and the old and new values; config.json is as first written;
  the config in effect has the new values; the same command again records nothing more."""
  config, workdir, _ = smoke_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  first_config = (run / "config.json").read_bytes()
  args = _resume_args(
    config, run, "--config.total_steps=10", "--config.optim.learning_rate=0.5", "--resume_changes=total_steps,optim"
  )
  code, _, stderr = run_in_process("efftx.train", args)
  assert code == 0, stderr
  history = (run / "config_history.jsonl").read_text().splitlines()
  assert [(h["step"], h["changes"]) for h in map(json.loads, history)] == [
    (8, {"optim.learning_rate": [0.001, 0.5], "total_steps": [8, 10]})
  ]
  assert (run / "config.json").read_bytes() == first_config
  in_effect = checkpoints.read_config(run)
  assert (in_effect.optim.learning_rate, in_effect.total_steps, in_effect.seed) == (0.5, 10, 0)
  lr = {r["step"]: r["learning_rate"] for r in metrics_rows(run) if "learning_rate" in r}
  assert sorted(lr) == list(range(1, 11))
  assert lr[9] > 100 * lr[8]  # in the warmup: 500 times the old peak rate, one step further on
  code, _, stderr = run_in_process("efftx.train", args)
  assert code == 0, stderr
  assert (run / "config_history.jsonl").read_text().splitlines() == history

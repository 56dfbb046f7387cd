"""Every config under configs/ builds and validates, and its smoke variant's data fits its training and
evaluation steps; the quickstart trains a step end to end."""

import contextlib
import glob
import os
import re
import runpy

import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import REPO
from conftest import run_in_process
from conftest import write_idx
from efftx import config as config_lib
from efftx import model as model_lib
from efftx import train
from efftx import trainer
from efftx.data import TASKS
from efftx.data import pipeline
from efftx.mixers import MIXERS

CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.py")) if not p.endswith("__init__.py"))


@pytest.fixture(scope="module")
def fashion_dir(tmp_path_factory):
  """Synthetic Fashion-MNIST idx files (over 5,000 training images, which the validation split needs; the tiny
  variant reads 1k/200/200), so that the configs' smoke runs need no dataset package on the machine."""
  folder = tmp_path_factory.mktemp("fashion")
  rng = np.random.default_rng(0)
  for prefix, n in (("train", 5_300), ("t10k", 250)):
    write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, size=(n, 28, 28)))
    write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", rng.integers(0, 10, size=n))
  return str(folder)


def _smoke(path, data_dir, tmp_path, fashion_dir):
  """The config's smoke variant on the session's data (Fashion-MNIST: the synthetic files, prepared in a TFDS dir
  of their own), and the context its data is read in: registered TFDS datasets (IMDb, CIFAR-10, GLUE) cannot be
  downloaded here, so random examples of their features."""
  config = runpy.run_path(path)["get_config"]("smoke")
  config.data.data_dir = data_dir
  if config.data.task.startswith("fashion_mnist"):
    config.data.update(corpus_dir=fashion_dir, data_dir=str(tmp_path / "tfds"))
  mocked = tfds.testing.mock_data(num_examples=24) if not TASKS[config.data.task].local else contextlib.nullcontext()
  return config, mocked


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_config_builds_validates_and_its_data_fits_its_steps(path, data_dir, tmp_path, fashion_dir):
  """Every config: the full size validates; the smoke variant's data prepares and encodes (as efftx.train checks
  it), and its first training and evaluation batches fit the training and evaluation steps as efftx.train builds
  them (traced: shapes and dtypes; END_TO_END's configs train for real), giving a scalar loss and the task's
  metrics."""
  get_config = runpy.run_path(path)["get_config"]
  config_lib.validate(get_config(), jax.device_count())  # the full-size config is valid too
  config, mocked = _smoke(path, data_dir, tmp_path, fashion_dir)
  config_lib.validate(config, jax.device_count())
  with mocked:
    pipeline.prepare(config)
    pipeline.check(config, pipeline.source(config, "train"), pipeline.source(config, "eval"))
    batch = next(pipeline.train_iterator(config, pipeline.source(config, "train")))
    eval_batch = next(pipeline.eval_batches(config, pipeline.source(config, "eval"), examples=config.data.batch_size))
  parts = trainer.parts(config)
  tx, schedule = trainer.make_optimizer(config)
  state = jax.eval_shape(lambda: trainer.create_state(parts.model, tx, jax.random.key(0)))
  step = trainer.make_train_step(parts.model, parts.objective, tx, schedule, jax.random.key(1), parts.task.token_unit)
  new_state, metrics = jax.eval_shape(step, state, batch)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), new_state) == jax.tree.map(lambda x: (x.shape, x.dtype), state)
  assert metrics["loss"].shape == () and metrics["grad_norm"].shape == ()
  sums = jax.eval_shape(trainer.make_eval_step(parts.model, parts.objective), state.params, eval_batch)
  summary = jax.eval_shape(lambda s: parts.objective.summarize(s, parts.task.token_unit, prefix="eval_"), sums)
  assert summary["eval_loss"].shape == ()
  task = TASKS[config.data.task]
  if config.data.objective in ("", "lm") and task.objective == "lm" and task.token_unit:  # bits/byte, bits/dim
    assert f"eval_bits_per_{task.token_unit}" in summary


# Trained end to end, one step through efftx.train: a classification config here. The language-modelling one
# (lm_bytes.py, its smoke variant) trains end to end in tests/test_lm.py's fixture, which also checks its bits per
# byte against its loss; every config's steps are traced on its data above.
END_TO_END = [os.path.join(REPO, "configs", "quickstart.py")]


@pytest.mark.parametrize("path", END_TO_END, ids=os.path.basename)
def test_config_trains_a_step(path, data_dir, tmp_path, fashion_dir):
  config, mocked = _smoke(path, data_dir, tmp_path, fashion_dir)
  config.total_steps = 1
  with mocked:
    result = train.train_and_evaluate(config, str(tmp_path))
  assert result["step"] == 1 and np.isfinite(result["loss"]) and np.isfinite(result["eval_loss"])


def _another_value(field):
  """A valid value of a declared field other than its default."""
  if field.choices is not None:
    return next(c for c in field.choices if c != field.default)
  if isinstance(field.default, bool):
    return not field.default
  return field.default * 2 or (1 if isinstance(field.default, int) else 0.5)


def test_each_model_field_is_declared_once_and_reaches_the_model():
  """config.model, its checks, `python -m efftx.config` and build_model's arguments all come from CONFIG_FIELDS."""
  assert config_lib.default_config("fnet").model.to_dict() == {
    **{name: field.default for name, field in model_lib.CONFIG_FIELDS.items()},
    "mixer": "fnet",
  }
  described = config_lib.describe()
  config = config_lib.default_config("attention")
  for name, field in model_lib.CONFIG_FIELDS.items():
    assert f"  {name} = {field.default!r}" in described and field.help in described
    if name not in ("mixer", "causal", "pooling"):
      config.model[name] = _another_value(field)
  config.model.update(causal=True, pooling="cls")
  model = model_lib.build_model(config, head=lambda x_BxLxD, mask_BxL: x_BxLxD, vocab_size=16, image_shape=(4, 4, 1))
  for name in model_lib.CONFIG_FIELDS:
    if name not in ("mixer", "causal", "pooling"):
      assert getattr(model, name) == config.model[name] != model_lib.CONFIG_FIELDS[name].default, name
  assert model.cls_token and model.make_mixer.keywords["causal"]
  assert model.make_mixer.func is MIXERS["attention"].module


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("reversible,layout", [(False, "pre_ln"), (False, "post_ln"), (True, "pre_ln")])
def test_norm_eps_reaches_every_layer_norm(reversible, layout, norm):
  """Every norm the model builds — the blocks', the reversible stack's branches', the embedding and final norms —
  is of kind config.model.norm (LayerNorm or RMSNorm) and uses config.model.norm_eps."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  config = config_lib.default_config("attention")
  config.model.update(
    d_model=32,
    d_ff=64,
    num_layers=2,
    max_len=16,
    norm_eps=0.25,
    reversible=reversible,
    block_layout=layout,
    norm=norm,
  )
  model = model_lib.build_model(config, head=lambda x_BxLxD, mask_BxL: x_BxLxD, vocab_size=16)
  epsilons = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, (nn.LayerNorm, nn.RMSNorm)):
      assert isinstance(context.module, model_lib.NORMS[norm]), type(context.module)
      epsilons.append(context.module.epsilon)
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 16), jnp.int32))
  assert len(epsilons) >= 2 * config.model.num_layers and set(epsilons) == {0.25}, epsilons


@pytest.mark.parametrize(
  "path,value,message",
  [
    ("model.d_model", 0, "config.model.d_model=0 must be a positive integer"),
    ("model.dropout", 1.0, "config.model.dropout=1.0 must be in [0, 1)"),
    ("model.norm_eps", 0.0, "config.model.norm_eps=0.0 must be in (0, 1)"),
    ("model.init_std", -0.02, "config.model.init_std=-0.02 must be ≥ 0"),
    ("model.block_layout", "post", "config.model.block_layout='post' must be one of pre_ln, post_ln"),
    ("model.mixer", "fnett", "config.model.mixer='fnett': 'fnett' is not a mixer (did you mean 'fnet'?); choose"),
    ("optim.warmup_steps", -1, "config.optim.warmup_steps=-1 must be ≥ 0"),
    ("optim.learning_rate", 0.0, "config.optim.learning_rate=0.0 must be > 0"),
    ("data.task", "listopz", "config.data.task='listopz' must be one of listops, listops_alphanumeric, "),
    ("data.read_threads", -1, "config.data.read_threads=-1 must be ≥ 0"),
    ("mesh.fsdp", 0, "config.mesh.fsdp=0 must be a positive integer"),
    ("eval_every", 0, "config.eval_every=0 must be a positive integer"),
  ],
)
def test_a_field_out_of_its_declared_range_is_refused_in_one_line(path, value, message):
  config = config_lib.default_config()
  *section, name = path.split(".")
  (config[section[0]] if section else config)[name] = value
  with pytest.raises(config_lib.UserError) as error:
    config_lib.validate(config, 8)
  assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_parse_arg():
  args = config_lib.parse_arg("mixer=fnet,smoke", mixer="attention", smoke=False, steps=10)
  assert (args.mixer, args.smoke, args.steps) == ("fnet", True, 10)
  assert config_lib.parse_arg("steps=5,smoke=false", smoke=True, steps=1).to_dict() == {"smoke": False, "steps": 5}
  with pytest.raises(ValueError, match="must be int"):
    config_lib.parse_arg("steps=x", steps=1)
  with pytest.raises(ValueError, match="unknown config argument 'foo'"):
    config_lib.parse_arg("foo", steps=1)


def test_glue_fine_tunes_the_encoder_mlm_bytes_pre_trains():
  glue = runpy.run_path(os.path.join(REPO, "configs", "glue.py"))
  mlm = runpy.run_path(os.path.join(REPO, "configs", "mlm_bytes.py"))
  assert glue["ENCODER"] == mlm["ENCODER"]
  assert glue["NUM_HEADS"] == mlm["NUM_HEADS"]
  a, b = glue["get_config"](), mlm["get_config"]()
  assert all(a.model[k] == b.model[k] for k in ("mixer", "d_model", "num_layers", "d_ff"))
  assert a.mixer.to_dict() == b.mixer.to_dict()


def test_python_m_efftx_config_lists_every_declared_field_and_mixer_option():
  """The listing is the declarations: every section's fields, then every mixer's options, in order, each as
  `name = default  (allowed values)` — the default a config built by default_config holds — and its meaning on the
  next line; --help prints the usage (exit 0); any other argument is a one-line error (exit 2)."""
  want = []
  for section, fields in config_lib.sections().items():
    config = config_lib.default_config()
    holds = config[section] if section else config
    want += [(name, holds[name], field) for name, field in fields.items()]
  for mixer, spec in MIXERS.items():
    holds = config_lib.default_config(mixer).mixer
    want += [(name, holds[name], field) for name, field in spec.options.items()]
  want = [(f"{n} = {v!r}" + (f"  ({f.allowed()})" if f.allowed() else ""), f.help) for n, v, f in want]
  assert {"total_steps", "log_every", "eval_every", "checkpoint_every", "seed"} <= set(config_lib.RUN_FIELDS)
  assert any(line.startswith("warmup_steps = 100") for line, _ in want)

  code, out, err = run_in_process("efftx.config", [])
  assert code == 0, err
  lines = out.splitlines()
  # A field's line is indented 2 (a section's) or 4 (a mixer's option) spaces, its meaning 4 more.
  listed = [
    (line.strip(), lines[i + 1].strip()) for i, line in enumerate(lines) if re.match(r"^ {2}( {2})?\w+ = ", line)
  ]
  assert listed == want
  assert all(f"  {mixer}: {spec.summary}" in out for mixer, spec in MIXERS.items())

  code, out, err = run_in_process("efftx.config", ["--help"])
  assert code == 0 and out.startswith("usage: python -m efftx.config") and not err
  code, out, err = run_in_process("efftx.config", ["--sections=optim"])
  assert code == 2 and not out
  assert (
    err.strip()
    == "efftx.config: error: unexpected arguments: --sections=optim (usage: python -m efftx.config [--help])"
  )


def test_a_schedule_longer_than_the_run_is_one_warning_line():
  """quickstart with --config.total_steps=20: warmup (100 steps) never ends, and the log, eval and checkpoint
  intervals never come before the last step; one line says so, with the learning rate the optimizer's own
  schedule gives the last step. A run its schedule fits gets none."""
  from configs import quickstart  # pylint: disable=g-import-not-at-top

  config = quickstart.get_config()
  assert config_lib.schedule_warning(config) is None
  config.total_steps = 20
  _, schedule = trainer.make_optimizer(config)
  line = config_lib.schedule_warning(config)
  assert line == (
    "config.optim.warmup_steps=100 ≥ config.total_steps=20: the run ends in warmup, its last step at learning rate "
    f"{float(schedule(19)):.2g} of the peak config.optim.learning_rate=0.001; config.log_every=50, "
    "config.eval_every=500, config.checkpoint_every=500 > config.total_steps=20: each fires only at the last step"
  )
  config.update(total_steps=101, log_every=101)  # warmup ends at step 100; the one log row is the last step's
  assert config_lib.schedule_warning(config) == (
    "config.eval_every=500, config.checkpoint_every=500 > config.total_steps=101: each fires only at the last step"
  )

"""Masked-LM pre-training, then fine-tuning from its checkpoint (config.init_from): encoder loaded, head new."""

import flax.traverse_util
import jax
import numpy as np
import pytest
import tensorflow_datasets as tfds

from efftx import checkpoints
from efftx import config as config_lib
from efftx import init_from
from efftx import train
from efftx import trainer


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, data_dir):
  from configs import mlm_bytes  # pylint: disable=g-import-not-at-top

  config = mlm_bytes.get_config("smoke")
  config.data.data_dir = data_dir
  config.total_steps = config.checkpoint_every = 3  # one checkpoint, at the end
  workdir = str(tmp_path_factory.mktemp("mlm"))
  result = train.train_and_evaluate(config, workdir)
  assert np.isfinite(result["eval_loss"]) and "eval_bits_per_byte" not in result  # masked tokens, not bits/byte
  return workdir


def _abstract_params(config):
  return jax.eval_shape(lambda: trainer.init_params(trainer.parts(config).model, jax.random.key(0)))


def _glue_config(data_dir):
  from configs import glue  # pylint: disable=g-import-not-at-top

  config = glue.get_config("smoke")
  config.data.data_dir = data_dir
  return config


@pytest.mark.xdist_group("pretrained")  # one worker pre-trains the module fixture, not both
def test_load_encoder_takes_every_encoder_parameter_and_keeps_new_heads(pretrained, data_dir):
  _, source_params, step = checkpoints.restore_params(pretrained)
  assert step == 3 and "lm_head" in source_params
  config = _glue_config(data_dir)
  config.model.max_len = 32  # fine-tuned shorter than pre-trained (64): the first position embeddings are taken
  parts = trainer.parts(config)
  new = jax.jit(lambda: trainer.init_params(parts.model, jax.random.key(5)))()  # one program, not op by op
  fresh_names = parts.objective.fresh_params
  loaded = flax.traverse_util.flatten_dict(
    init_from.load_encoder(jax.device_get(new), pretrained, fresh_names), sep="/"
  )
  source = flax.traverse_util.flatten_dict(jax.device_get(source_params), sep="/")
  fresh = flax.traverse_util.flatten_dict(jax.device_get(new), sep="/")
  heads = {k for k in loaded if k.split("/")[0] in fresh_names}
  assert heads == {k for k in fresh if k.startswith(("classifier/", "pool_dense/"))}  # MLM head left behind
  for name, value in loaded.items():
    if name in heads:
      np.testing.assert_array_equal(value, fresh[name])
    elif name == "pos_embed":
      assert value.shape == (32, 32) and source[name].shape == (64, 32)
      np.testing.assert_array_equal(value, source[name][:32])
    else:
      np.testing.assert_array_equal(value, source[name])
  # The checkpoint's own step directory works too.
  by_step = init_from.load_encoder(jax.device_get(new), f"{pretrained}/checkpoints/3", fresh_names)
  np.testing.assert_array_equal(by_step["embed"]["embedding"], source["embed/embedding"])


@pytest.mark.xdist_group("pretrained")  # one worker pre-trains the module fixture, not both
def test_fine_tuning_run_starts_from_the_encoder(pretrained, data_dir, tmp_path):
  config = _glue_config(data_dir)
  config.init_from = pretrained
  config.total_steps = 1
  with tfds.testing.mock_data(num_examples=24):
    result = train.train_and_evaluate(config, str(tmp_path / "sst2"))
  assert result["step"] == 1 and np.isfinite(result["eval_loss"])


@pytest.mark.xdist_group("pretrained")  # one worker pre-trains the module fixture, not both
@pytest.mark.parametrize(
  "change,message",
  [
    ({"num_layers": 3}, "has no parameter block_2/.*num_layers=2"),
    ({"num_layers": 1}, "this model has no parameter block_1/.*num_layers=2"),
    ({"mixer": "attention"}, "has no parameter block_0/mixing/mixer/.*mixer=fnet"),  # (config.mixer refilled)
    ({"d_model": 64}, "has shape"),
  ],
)
def test_a_different_encoder_is_refused_clearly(pretrained, data_dir, change, message):
  config = _glue_config(data_dir)
  config.model.update(**change)
  if "mixer" in change:
    config.mixer = config_lib.mixer_options(change["mixer"])
  new = _abstract_params(config)
  with pytest.raises(ValueError, match=message):
    init_from.load_encoder(new, pretrained, ("classifier", "pool_dense"))


def test_init_from_must_be_a_run(data_dir, tmp_path):
  config = _glue_config(data_dir)
  with pytest.raises(ValueError, match="init_from: .* neither a training run's workdir"):
    init_from.load_encoder(_abstract_params(config), data_dir, ("classifier", "pool_dense"))
  config.init_from = data_dir  # refused before the fine-tuning run writes anything
  with tfds.testing.mock_data(num_examples=24):
    with pytest.raises(ValueError, match="neither a training run's workdir"):
      train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()

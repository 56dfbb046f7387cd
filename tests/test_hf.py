"""Hugging Face FNet and BERT checkpoints load into efftx and give HF's outputs (fixtures from
tests/fixtures/make_hf_fixtures.py: tiny random HF models run in torch; these tests need numpy only)."""
import json
import os

import jax
import numpy as np
import pytest

from conftest import REPO
from efftx import config as config_lib
from efftx import hf
from efftx import model as model_lib
from efftx import trainer
from efftx.errors import UserError
from efftx.objectives import OBJECTIVES

FIXTURES = os.path.join(REPO, "tests", "fixtures")


def _encoder(config, params):
  """The users' model builder with the checkpoint's vocabulary and an identity head: the final hidden states,
  HF's last_hidden_state."""
  vocab_size = params["embed"]["embedding"].shape[0]
  return model_lib.build_model(config, lambda x_BxLxD, mask_BxL: x_BxLxD, vocab_size)


@pytest.mark.parametrize("name", ["hf_fnet_tiny", "hf_bert_tiny"])
def test_hf_checkpoint_gives_hf_hidden_states(name):
  folder = os.path.join(FIXTURES, name)
  expected = np.load(os.path.join(folder, "expected.npz"))
  config, params = hf.load(folder)
  config_lib.validate(config, jax.device_count())
  ids, mask = expected["input_ids"].astype(np.int32), expected["attention_mask"].astype(bool)
  got = np.asarray(_encoder(config, params).apply({"params": params}, ids, mask=mask))
  want = expected["last_hidden_state"]
  error = float(np.abs(got - want)[mask].max())
  print(f"{name}: max |efftx - HF| = {error:.2e} over {int(mask.sum())} real positions")
  assert error < 1e-5 * max(1.0, float(np.abs(want).max()))


def test_a_converted_encoder_takes_a_new_head_and_trains():
  """Fine-tuning: the converted parameters are the whole encoder of efftx's model (nothing missing, nothing
  extra); only the objective's head is new."""
  config, params = hf.load(os.path.join(FIXTURES, "hf_bert_tiny"), max_len=16)
  model = model_lib.build_model(config, OBJECTIVES["classify"].head(64, 3), 64)
  fresh = trainer.init_params(model, jax.random.key(0))
  flat = lambda tree: {"/".join(str(k.key) for k in path): v.shape for path, v in
                       jax.tree_util.tree_flatten_with_path(tree)[0]}
  new = flat(fresh)
  head = {k for k in new if k.split("/")[0] in OBJECTIVES["classify"].fresh_params}
  assert head and {k: s for k, s in new.items() if k not in head} == flat(params)


def test_bad_checkpoints_are_refused_clearly(tmp_path):
  with pytest.raises(UserError, match="config.json and model.safetensors"):
    hf.load(str(tmp_path))
  folder = os.path.join(FIXTURES, "hf_fnet_tiny")
  hf_config = json.load(open(os.path.join(folder, "config.json")))
  with pytest.raises(UserError, match="model_type 'gpt2'"):
    hf.convert({**hf_config, "model_type": "gpt2"}, {})
  with pytest.raises(UserError, match="hidden_act 'relu'"):
    hf.convert({**hf_config, "hidden_act": "relu"}, {})
  with pytest.raises(UserError, match="24 position embeddings"):
    hf.load(folder, max_len=64)


def test_settings_that_would_convert_into_another_model_are_refused_in_one_line():
  """Each would otherwise load silently as a different model: relative positions (distance embeddings dropped),
  a decoder (converted bidirectional), a config with fewer or more layers than the weights, a missing tensor."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  folder = os.path.join(FIXTURES, "hf_bert_tiny")
  hf_config = json.load(open(os.path.join(folder, "config.json")))
  weights = load_file(os.path.join(folder, "model.safetensors"))
  for position in ("relative_key", "relative_key_query"):
    with pytest.raises(UserError, match=f"position_embedding_type '{position}'"):
      hf.convert({**hf_config, "position_embedding_type": position}, weights)
  with pytest.raises(UserError, match="is_decoder"):
    hf.convert({**hf_config, "is_decoder": True}, weights)
  with pytest.raises(UserError, match="num_hidden_layers is 1 but the weights hold layers 0, 1"):
    hf.convert({**hf_config, "num_hidden_layers": 1}, weights)
  with pytest.raises(UserError, match="num_hidden_layers is 3 but the weights hold layers 0, 1"):
    hf.convert({**hf_config, "num_hidden_layers": 3}, weights)
  missing = {k: v for k, v in weights.items() if "layer.1.output.dense.bias" not in k}
  with pytest.raises(UserError, match=r"no tensor (bert\.)?encoder\.layer\.1\.output\.dense\.bias"):
    hf.convert(hf_config, missing)


def test_legacy_layernorm_names_load_as_hf_loads_them():
  """A checkpoint whose LayerNorms are named gamma / beta (TF-converted BERT) converts to the same parameters."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  folder = os.path.join(FIXTURES, "hf_bert_tiny")
  hf_config = json.load(open(os.path.join(folder, "config.json")))
  weights = load_file(os.path.join(folder, "model.safetensors"))
  legacy = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
            for k, v in weights.items()}
  assert legacy.keys() != weights.keys()
  _, want = hf.convert(hf_config, weights)
  _, got = hf.convert(hf_config, legacy)
  jax.tree.map(np.testing.assert_array_equal, got, want)

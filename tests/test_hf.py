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

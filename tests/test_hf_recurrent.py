"""Recurrent models and layers against transformers' torch code (fixtures from tests/fixtures/
make_recurrent_fixtures.py; these tests need neither torch nor network): HF Mamba-2 and Mamba checkpoints through
efftx.hf.load give HF's last_hidden_state, and efftx's gated delta rule and Griffin recurrent block give Qwen3-Next's
torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule and RecurrentGemma's recurrent block. Relative
error: max |efftx − HF| / max |HF|, all in float32, bound 1e-5."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
from conftest import compiled
from efftx import config as config_lib
from efftx import hf
from efftx import model as model_lib
from efftx.errors import UserError
from efftx.mixers import gated_deltanet
from efftx.mixers import recurrence
from efftx.mixers import rg_lru

FIXTURES = os.path.join(REPO, "tests", "fixtures")
BOUND = 1e-5


def _relative(got, want) -> float:
  return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("name", ["hf_mamba2_tiny", "hf_mamba_tiny"])
def test_mamba_checkpoints_give_hf_last_hidden_state(name):
  """Mamba2ForCausalLM (names under backbone., an untied lm_head) and MambaModel (no prefix), 2 layers, hidden 32,
  random weights, ids 2 × 21 (mamba2: 4 heads of 16 in 2 groups, chunks of 8): efftx's final hidden states (after
  norm_f) against HF's last_hidden_state run in float32 and in float64. Measured: mamba2 3.0e-7 (float32 run),
  4.0e-7 (float64); mamba 6.8e-7, 3.5e-7."""
  folder = os.path.join(FIXTURES, name)
  expected = np.load(os.path.join(folder, "expected.npz"))
  config, params = hf.load(folder)
  config_lib.validate(config, jax.device_count())
  m = config.model
  assert (m.mixer, m.norm, m.d_ff, m.position_embedding, m.causal, m.norm_eps) == (
    name.split("_")[1],
    "rms",
    0,
    "none",
    True,
    1e-4,
  )
  assert hf.load_config(folder).to_dict() == config.to_dict()
  model = model_lib.build_model(config, lambda x_BxLxD, mask_BxL: x_BxLxD, params["embed"]["embedding"].shape[0])
  got = np.asarray(compiled(model).apply({"params": params}, expected["input_ids"]))
  for run in ("f32", "f64"):
    error = _relative(got, expected[f"last_hidden_state_{run}"])
    print(f"{name}: relative error {error:.2e} against HF's {run} run")
    assert error < BOUND


def test_gated_delta_rule_gives_qwen3_next_functions():
  """q, k, v, g, β and an initial state (B 2, L 21, 2 heads, K 8, V 16; log-decays 0 … −5) through transformers'
  torch_chunk_gated_delta_rule (chunks of 8) and torch_recurrent_gated_delta_rule with use_qk_l2norm_in_kernel
  (q, k L2-normalised, eps 1e-6) and their fixed scale K^−½ on q: efftx's chunked_delta_rule, given q and k
  normalised and scaled the same way (gated_deltanet.l2_normalize), at chunks 8 and 5, outputs and final
  states. Measured ≤ 3.2e-7 (outputs), ≤ 1.8e-7 (states)."""
  d = np.load(os.path.join(FIXTURES, "gated_delta_rule.npz"))
  K = d["q"].shape[-1]
  q = gated_deltanet.l2_normalize(jnp.asarray(d["q"])) * K**-0.5
  k = gated_deltanet.l2_normalize(jnp.asarray(d["k"]))
  for chunk in (8, 5):
    out, state = jax.jit(recurrence.chunked_delta_rule, static_argnames="chunk")(
      q, k, d["v"], d["beta"], d["g"], chunk=chunk, state_BxHxKxV=d["initial_state"]
    )
    for ref in ("chunk", "recurrent"):
      errors = _relative(out, d[f"{ref}_out"]), _relative(state, d[f"{ref}_state"])
      print(f"chunk {chunk} vs torch_{ref}: output {errors[0]:.2e}, state {errors[1]:.2e}")
      assert max(errors) < BOUND


def test_rg_lru_block_gives_recurrent_gemma_block():
  """RecurrentGemmaRecurrentBlock (hidden 32, lru_width 48, 4 heads of the block-diagonal gates, conv width 4;
  softplus(Λ) from ~1e-3, a ≈ 1 where 1 − a² cancels, to ~3) with random weights, mapped onto efftx's RGLRUBlock
  (its RG-LRU core, the branches and the convolution), on x 2 × 21 × 32 from position 0 (the reset): HF's output
  in float32 and float64. Measured 1.4e-7 and 3.6e-7."""
  d = np.load(os.path.join(FIXTURES, "rg_lru_block.npz"))
  p = {name[len("param:") :]: d[name] for name in d.files if name.startswith("param:")}
  dense = lambda name: {"kernel": p[f"{name}.weight"].T, "bias": p[f"{name}.bias"]}  # torch Linear: (out, in)
  params = {
    "linear_y": dense("linear_y"),
    "linear_x": dense("linear_x"),
    "linear_out": dense("linear_out"),
    "conv_1d": {"taps": p["conv_1d.weight"][:, 0, ::-1].T, "bias": p["conv_1d.bias"]},  # taps[0]: this position
    "input_gate": {"kernel": p["rg_lru.input_gate_weight"], "bias": p["rg_lru.input_gate_bias"]},
    "a_gate": {"kernel": p["rg_lru.recurrent_gate_weight"], "bias": p["rg_lru.recurrent_gate_bias"]},
    "a_param": p["rg_lru.recurrent_param"],
  }
  block = rg_lru.RGLRUBlock(num_heads=4, lru_width=48, conv_width=4)
  got = compiled(block).apply({"params": params}, d["x"])
  for run in ("f32", "f64"):
    error = _relative(got, d[f"out_{run}"])
    print(f"rg_lru block: relative error {error:.2e} against HF's {run} run")
    assert error < BOUND


def _checkpoint(name):
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  folder = os.path.join(FIXTURES, name)
  with open(os.path.join(folder, "config.json")) as f:
    return json.load(f), load_file(os.path.join(folder, "model.safetensors"))


@pytest.mark.parametrize(
  "name, change, words",
  [
    ("hf_mamba2_tiny", {"time_step_limit": [0.0, 10.0]}, "time_step_limit"),
    ("hf_mamba2_tiny", {"use_bias": True}, "use_bias"),
    ("hf_mamba2_tiny", {"num_heads": 8}, "num_heads·head_dim"),
    ("hf_mamba2_tiny", {"n_groups": 3}, "n_groups"),
    ("hf_mamba_tiny", {"hidden_act": "gelu"}, "hidden_act"),
    ("hf_mamba_tiny", {"intermediate_size": 96}, "intermediate_size"),
    ("hf_mamba_tiny", {"num_hidden_layers": 3}, "num_hidden_layers"),
  ],
)
def test_unsupported_mamba_configs_stop_with_one_line(name, change, words):
  hf_config, weights = _checkpoint(name)
  with pytest.raises(UserError) as error:
    hf.convert({**hf_config, **change}, weights)
  assert words in str(error.value) and "\n" not in str(error.value)


def test_conv_without_bias_loads_as_zero_bias_and_a_missing_tensor_is_named():
  """use_conv_bias=False is the same function as a zero bias; a tensor the config needs and the weights lack stops
  with its name."""
  hf_config, weights = _checkpoint("hf_mamba_tiny")
  without = {n: w for n, w in weights.items() if not n.endswith("conv1d.bias")}
  _, params = hf.convert({**hf_config, "use_conv_bias": False}, without)
  assert not params["block_1"]["mixing"]["mixer"]["conv1d"]["bias"].any()
  with pytest.raises(UserError, match="layers.0.mixer.conv1d.bias"):
    hf.convert(hf_config, without)

"""Hugging Face FNet and BERT checkpoints as efftx encoders (numpy and safetensors only; no torch).

    config, params = efftx.hf.load("path/to/google-fnet-base")   # a folder with config.json, model.safetensors
    model = efftx.model.build_model(config, head, vocab_size=params["embed"]["embedding"].shape[0])

gives an efftx config (config.model and config.mixer in the published layout: block_layout="post_ln", embedding
LayerNorm, FNet's embedding projection, HF's LayerNorm epsilon and GELU) and the encoder's parameters — every
parameter of efftx's model but the head, which a fine-tuning run creates anew. `convert(hf_config, weights)` does
the same from a config dict and a {name: array} dict (a state dict turned into numpy arrays).

Refused with one line (they would convert into a different model): relative position embeddings, decoders and
cross-attention, a num_hidden_layers other than the layers the weights hold, a missing tensor. Legacy LayerNorm
names (gamma / beta) are read as HF reads them.

Differences that remain, by design:
  - token types: efftx has none; the type-0 embedding is added to every position embedding (what HF computes for
    inputs without token_type_ids);
  - BERT's pooler and the pre-training heads are not converted (efftx heads are its objectives' own);
  - FNet's padding: HF mixes padded positions in, so the converted FNet mixer has padding="mix";
  - the vocabulary is the checkpoint's (e.g. SentencePiece or WordPiece ids): efftx's byte-level tasks do not
    tokenise that way, so feed it ids from the checkpoint's own tokenizer.
Checked against the HF models' outputs in tests/test_hf.py (fixtures made by tests/fixtures/make_hf_fixtures.py).
"""
from __future__ import annotations

import json
import os

import ml_collections
import numpy as np

from efftx import config as config_lib
from efftx.errors import UserError

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
# Old BERT checkpoints (TF-converted) name LayerNorm parameters gamma / beta; HF renames them when it loads.
_LEGACY_NAMES = {".LayerNorm.gamma": ".LayerNorm.weight", ".LayerNorm.beta": ".LayerNorm.bias"}


def _refuse_unsupported(hf_config: dict) -> None:
  """One line for each HF setting that would convert into a different model without a word."""
  position = hf_config.get("position_embedding_type", "absolute")
  if position != "absolute":
    raise UserError(f"position_embedding_type '{position}': efftx converts absolute position embeddings only "
                    "(relative distance embeddings have no efftx counterpart)")
  if hf_config.get("is_decoder") or hf_config.get("add_cross_attention"):
    raise UserError("is_decoder / add_cross_attention: efftx converts bidirectional encoders only (a causal "
                    "BERT would need causal attention and its decoder's cross-attention)")


def _named(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The weights under HF's current names (legacy gamma / beta renamed as HF itself renames them)."""
  out = {}
  for name, value in weights.items():
    for old, new in _LEGACY_NAMES.items():
      if name.endswith(old):
        name = name[:-len(old)] + new
    out[name] = value
  return out


def load(folder: str, max_len: int | None = None) -> tuple[ml_collections.ConfigDict, dict]:
  """(config, encoder parameters) of the HF checkpoint in `folder` (config.json and model.safetensors)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  config_path, weights_path = os.path.join(folder, "config.json"), os.path.join(folder, "model.safetensors")
  if not os.path.exists(config_path) or not os.path.exists(weights_path):
    raise UserError(f"{folder}: an HF checkpoint folder needs config.json and model.safetensors (a "
                    "pytorch_model.bin needs torch to read: save it as safetensors first)")
  with open(config_path) as f:
    return convert(json.load(f), load_file(weights_path), max_len)


def convert(hf_config: dict, weights: dict[str, np.ndarray], max_len: int | None = None
            ) -> tuple[ml_collections.ConfigDict, dict]:
  """(config, encoder parameters) from an HF FNet or BERT config dict and its weights by name."""
  kind = hf_config.get("model_type")
  if kind not in ("fnet", "bert"):
    raise UserError(f"model_type '{kind}': efftx reads fnet and bert checkpoints")
  act = hf_config.get("hidden_act", "gelu")
  if act not in _ACTIVATIONS:
    raise UserError(f"hidden_act '{act}' has no efftx counterpart; efftx has: {', '.join(_ACTIVATIONS)}")
  _refuse_unsupported(hf_config)
  weights = _named(weights)
  # A model class's checkpoint (e.g. FNetForMaskedLM) prefixes the encoder's names with "fnet." / "bert.".
  prefix = next((p for p in (f"{kind}.", "") if f"{p}embeddings.word_embeddings.weight" in weights), None)
  if prefix is None:
    raise UserError(f"no {kind} embeddings in the weights (looked for embeddings.word_embeddings.weight)")

  def w(name: str) -> np.ndarray:
    if prefix + name not in weights:
      raise UserError(f"the checkpoint has no tensor {prefix + name}, which a {kind} encoder of this config needs")
    return np.asarray(weights[prefix + name], np.float32)

  D, F, num_layers = hf_config["hidden_size"], hf_config["intermediate_size"], hf_config["num_hidden_layers"]
  stored = {int(n[len(prefix + "encoder.layer."):].split(".")[0]) for n in weights
            if n.startswith(prefix + "encoder.layer.")}
  if stored != set(range(num_layers)):
    raise UserError(f"num_hidden_layers is {num_layers} but the weights hold layers "
                    f"{', '.join(map(str, sorted(stored))) or 'none'}: a config and weights that do not match")
  positions = hf_config["max_position_embeddings"]
  max_len = max_len or positions
  if max_len > positions:
    raise UserError(f"max_len={max_len}: the checkpoint has {positions} position embeddings")

  config = config_lib.default_config("fnet" if kind == "fnet" else "attention")
  config.model.update(d_model=D, d_ff=F, num_layers=num_layers, max_len=max_len, dropout=0.0, causal=False,
                      block_layout="post_ln", embed_projection=kind == "fnet",
                      norm_eps=float(hf_config.get("layer_norm_eps", 1e-12)), activation=_ACTIVATIONS[act])
  if kind == "fnet":
    config.mixer.update(fourier_impl="fft", padding="mix")
  else:
    config.mixer.update(num_heads=hf_config["num_attention_heads"], attention_impl="plain")

  dense = lambda name: {"kernel": w(f"{name}.weight").T, "bias": w(f"{name}.bias")}  # torch Linear: (out, in)
  norm = lambda name: {"scale": w(f"{name}.weight"), "bias": w(f"{name}.bias")}
  types = w("embeddings.token_type_embeddings.weight")[0] if prefix + "embeddings.token_type_embeddings.weight" \
      in weights else 0.0
  params = {"embed": {"embedding": w("embeddings.word_embeddings.weight")},
            "pos_embed": w("embeddings.position_embeddings.weight")[:max_len] + types,
            "embed_norm": norm("embeddings.LayerNorm")}
  if kind == "fnet":
    params["embed_projection"] = dense("embeddings.projection")
  for i in range(num_layers):
    layer = f"encoder.layer.{i}"
    block = {"feed_forward": {"ff": {"up": dense(f"{layer}.intermediate.dense"),
                                     "down": dense(f"{layer}.output.dense")}},
             "feed_forward_norm": norm(f"{layer}.output.LayerNorm")}
    if kind == "fnet":
      block["mixing_norm"] = norm(f"{layer}.fourier.output.LayerNorm")
    else:
      H = config.mixer.num_heads
      qkv = [dense(f"{layer}.attention.self.{n}") for n in ("query", "key", "value")]
      # HF splits the D outputs into heads as (H, D / H), head-major: efftx's DenseGeneral (D, 3, H, K) layout.
      block["mixing"] = {"mixer": {
          "qkv": {"kernel": np.stack([p["kernel"] for p in qkv], 1).reshape(D, 3, H, D // H),
                  "bias": np.stack([p["bias"] for p in qkv], 0).reshape(3, H, D // H)},
          "out": {"kernel": w(f"{layer}.attention.output.dense.weight").T.reshape(H, D // H, D),
                  "bias": w(f"{layer}.attention.output.dense.bias")}}}
      block["mixing_norm"] = norm(f"{layer}.attention.output.LayerNorm")
    params[f"block_{i}"] = block
  return config, params

"""Hugging Face FNet and BERT checkpoints as efftx encoders, Mamba and Mamba-2 checkpoints as efftx causal models,
and efftx encoders as HF checkpoints (numpy and safetensors only; no torch).

    config, params = efftx.hf.load("path/to/google-fnet-base")   # a folder with config.json, model.safetensors
    model = efftx.model.build_model(config, head, vocab_size=params["embed"]["embedding"].shape[0])
    efftx.hf.export(config, params, "path/to/folder", tokenizer="path/to/google-fnet-base")

`load` gives an efftx config (config.model and config.mixer in the published layout: block_layout="post_ln",
embedding LayerNorm, FNet's embedding projection, token-type embeddings, HF's LayerNorm epsilon, GELU and dropout
rates, pooling="first") and the parameters of every part of efftx's model but the classifier: the embeddings, the
blocks and the checkpoint's pooler (dense + tanh on the first token, what pooling="first" classifies through).
`convert(hf_config, weights)` does the same from a config dict and a {name: array} dict; `load_config(folder)`
gives the config alone, reading only the weights file's header. `--config.init_from=<an HF
folder>` fine-tunes from one (efftx.init_from.load_encoder; configs/glue_hf.py reads the model's settings from
the checkpoint), and config.data.tokenizer=<the folder> encodes text with its tokenizer (efftx/data/tokenizer.py).

What the converter does with each HF config field:
  read:    model_type, hidden_size, num_hidden_layers, num_attention_heads (BERT), intermediate_size, hidden_act,
           max_position_embeddings, type_vocab_size (from the weights' rows), layer_norm_eps, hidden_dropout_prob,
           attention_probs_dropout_prob (BERT), vocab_size (from the weights' rows);
  refused: position_embedding_type other than absolute, is_decoder, add_cross_attention, is_encoder_decoder,
           non-empty pruned_heads, a num_hidden_layers other than the layers the weights hold, a hidden_act with no
           efftx counterpart, a missing tensor;
  ignored: the rest, none of which changes the encoder's function: chunk_size_feed_forward, use_tpu_fourier_
           optimizations and tpu_short_seq_length (the same function computed another way), the dtype (weights are
           read as float32), token ids (pad/bos/eos/sep_token_id: the tokenizer's files give them), initializer_range,
           tie_word_embeddings, a fine-tuned head's num_labels / id2label / label2id / problem_type /
           finetuning_task / classifier_dropout (efftx's classifier is new), and the output, generation and torch
           settings.
Dropout: hidden_dropout_prob becomes config.model.dropout, which efftx applies on both residual branches (FNet's
Fourier branch too) and on the feed-forward hidden layer, where HF and f_net drop the branches' outputs only (and
not FNet's Fourier output): the same model, regularised a little more in fine-tuning.
Legacy LayerNorm names (gamma / beta) are read as HF reads them. FNet's padding: HF mixes padded positions in, so
the converted FNet mixer has padding="mix" (pad with the tokenizer's pad id, as HF's users do).
Checked against the HF models' outputs in tests/test_hf.py (fixtures made by tests/fixtures/make_hf_fixtures.py).

Mamba and Mamba-2 (model_type "mamba" / "mamba2": transformers' MambaModel / Mamba2Model folders, or their
*ForCausalLM with the names under "backbone."; mamba_ssm's "embedding.weight" read as HF renames it) become a causal
stack of pre-norm blocks with mixer mamba / mamba2 and no feed-forward sublayer: token embeddings, no positions
(position_embedding="none"), x + mixer(RMSNorm(x)) per layer (norm="rms", d_ff=0), a final RMSNorm (norm_f) whose
output is HF's last_hidden_state (tests/test_hf_recurrent.py, fixtures by tests/fixtures/make_recurrent_fixtures.py).
config.model.max_len is `load`'s max_len, else RECURRENT_MAX_LEN (the checkpoint stores none). Fields:
  read:    model_type, hidden_size, num_hidden_layers (checked against the weights' layers), vocab_size (the
           weights' rows), layer_norm_epsilon (config.model.norm_eps; mamba2: also config.mixer.norm_eps, the
           gated RMSNorm's), state_size (d_state), conv_kernel (d_conv), expand, time_step_min / time_step_max
           (dt_min / dt_max: initialisation only); mamba: time_step_rank ("auto": ⌈hidden_size/16⌉; dt_rank),
           intermediate_size (must be expand·hidden_size); mamba2: num_heads and head_dim (headdim; num_heads·head_dim
           must be expand·hidden_size), n_groups (ngroups; must divide num_heads), chunk_size (chunk: the same
           function in other chunks), time_step_limit (must be (0, inf)), use_conv_bias (False: zero biases, the same
           function, which fine-tuning then trains);
  refused: hidden_act other than silu, use_bias=True (in_proj / out_proj biases), mamba2's time_step_limit other
           than (0, inf) (efftx does not clamp Δ), the shape inconsistencies above, a missing tensor;
  ignored: residual_in_fp32 (efftx's residual stream is in config.model.dtype: the same in float32; in bfloat16 HF
           keeps it in float32), rescale_prenorm_residual, initializer_range, time_step_floor / time_step_scale /
           time_step_init_scheme (initialisation only), mamba2's time_step_rank (unused by HF's Mamba2 too),
           use_mambapy / use_associative_scan (the same scan computed another way), tie_word_embeddings and
           lm_head.weight (efftx's head is new; config.model.tie_embeddings=True ties an LM head as HF's tied
           Mamba does), token ids, use_cache, the dtype (read as float32). Padding: efftx's mixers zero padded
           positions' inputs and skip them in the recurrence, as HF's attention_mask does (not compared here).
"""

from __future__ import annotations

import json
import os
import shutil

import ml_collections
import numpy as np

from efftx import config as config_lib
from efftx.errors import UserError

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
_EXPORTED_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu"}
# Old BERT checkpoints (TF-converted) name LayerNorm parameters gamma / beta; HF renames them when it loads.
_LEGACY_NAMES = {".LayerNorm.gamma": ".LayerNorm.weight", ".LayerNorm.beta": ".LayerNorm.bias"}
# The config fields that make a converted encoder the checkpoint's function: a run that fine-tunes from a
# checkpoint (init_from) must have the same values.
ARCHITECTURE = {
  "model": (
    "mixer",
    "causal",
    "d_model",
    "num_layers",
    "d_ff",
    "block_layout",
    "embed_projection",
    "norm_eps",
    "activation",
    "norm",
    "position_embedding",
    "type_vocab_size",
    "reversible",
    "patch_size",
  ),
  "mixer": ("num_heads", "padding", "d_state", "d_conv", "expand", "headdim", "ngroups", "dt_rank", "norm_eps"),
}


def _refuse_unsupported(hf_config: dict) -> None:
  """One line for each HF setting that would convert into a different model without a word."""
  position = hf_config.get("position_embedding_type", "absolute")
  if position != "absolute":
    raise UserError(
      f"position_embedding_type '{position}': efftx converts absolute position embeddings only "
      "(relative distance embeddings have no efftx counterpart)"
    )
  if hf_config.get("is_decoder") or hf_config.get("add_cross_attention") or hf_config.get("is_encoder_decoder"):
    raise UserError(
      "is_decoder / add_cross_attention / is_encoder_decoder: efftx converts bidirectional encoders "
      "only (a causal BERT would need causal attention and its decoder's cross-attention)"
    )
  if hf_config.get("pruned_heads"):
    raise UserError(
      f"pruned_heads {hf_config['pruned_heads']}: efftx's attention has num_attention_heads heads in "
      "every layer (a pruned checkpoint's layers have fewer)"
    )


def _named(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """The weights under HF's current names (legacy gamma / beta renamed as HF itself renames them)."""
  out = {}
  for name, value in weights.items():
    for old, new in _LEGACY_NAMES.items():
      if name.endswith(old):
        name = name[: -len(old)] + new
    if name in ("embedding.weight", "backbone.embedding.weight"):  # mamba_ssm's name, which HF's Mamba renames
      name = name.replace("embedding.", "embeddings.")
    out[name] = value
  return out


def is_checkpoint(folder: str) -> bool:
  """Whether `folder` is an HF checkpoint folder (config.json naming a model_type, and model.safetensors), not
  an efftx workdir."""
  config_path = os.path.join(os.fspath(folder), "config.json")
  if not os.path.exists(os.path.join(os.fspath(folder), "model.safetensors")) or not os.path.exists(config_path):
    return False
  with open(config_path) as f:
    return "model_type" in json.load(f)


def _files(folder: str) -> tuple[str, str]:
  config_path, weights_path = os.path.join(folder, "config.json"), os.path.join(folder, "model.safetensors")
  if not os.path.exists(config_path) or not os.path.exists(weights_path):
    raise UserError(
      f"{folder}: an HF checkpoint folder needs config.json and model.safetensors (a "
      "pytorch_model.bin needs torch to read: save it as safetensors first)"
    )
  return config_path, weights_path


def _with_tokenizer(config: ml_collections.ConfigDict, folder: str) -> ml_collections.ConfigDict:
  """Where the folder holds a tokenizer, config.data names it and a text task to fine-tune on (GLUE SST-2, cut to
  max_len), so that the config is valid as it is."""
  from efftx.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

  if tokenizer_lib.find(folder):
    config.data.update(tokenizer=os.path.abspath(folder), task="glue", variant="sst2", truncate=True)
  return config


def load(folder: str, max_len: int | None = None) -> tuple[ml_collections.ConfigDict, dict]:
  """(config, parameters) of the HF checkpoint in `folder` (config.json and model.safetensors); config.data names
  the folder's tokenizer, if it has one (with GLUE SST-2 as its text task)."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top

  config_path, weights_path = _files(folder)
  with open(config_path) as f:
    config, params = convert(json.load(f), load_file(weights_path), max_len)
  return _with_tokenizer(config, folder), params


def load_config(folder: str, max_len: int | None = None) -> ml_collections.ConfigDict:
  """`load`'s config alone, from config.json and the tensors' names and shapes in model.safetensors' header (no
  weights are read)."""
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top

  config_path, weights_path = _files(folder)
  with open(config_path) as f:
    hf_config = json.load(f)
  with safe_open(weights_path, framework="numpy") as weights:
    shapes = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
  return _with_tokenizer(_config(hf_config, _named(shapes), max_len)[0], folder)


def _config(
  hf_config: dict, shapes: dict[str, tuple[int, ...]], max_len: int | None
) -> tuple[ml_collections.ConfigDict, str]:
  """(config, the weights' name prefix) from an HF config and its tensors' shapes by (current) name; raises
  UserError for what would convert into another model."""
  kind = hf_config.get("model_type")
  if kind in _RECURRENT:
    return _recurrent_config(hf_config, shapes, max_len)
  if kind not in ("fnet", "bert"):
    raise UserError(f"model_type '{kind}': efftx reads fnet, bert, mamba and mamba2 checkpoints")
  act = hf_config.get("hidden_act", "gelu")
  if act not in _ACTIVATIONS:
    raise UserError(f"hidden_act '{act}' has no efftx counterpart; efftx has: {', '.join(_ACTIVATIONS)}")
  _refuse_unsupported(hf_config)
  # A model class's checkpoint (e.g. FNetForMaskedLM) prefixes the encoder's names with "fnet." / "bert.".
  prefix = next((p for p in (f"{kind}.", "") if f"{p}embeddings.word_embeddings.weight" in shapes), None)
  if prefix is None:
    raise UserError(f"no {kind} embeddings in the weights (looked for embeddings.word_embeddings.weight)")
  num_layers = hf_config["num_hidden_layers"]
  stored = {
    int(n[len(prefix + "encoder.layer.") :].split(".")[0]) for n in shapes if n.startswith(prefix + "encoder.layer.")
  }
  if stored != set(range(num_layers)):
    raise UserError(
      f"num_hidden_layers is {num_layers} but the weights hold layers "
      f"{', '.join(map(str, sorted(stored))) or 'none'}: a config and weights that do not match"
    )
  positions = hf_config["max_position_embeddings"]
  max_len = max_len or positions
  if max_len > positions:
    raise UserError(f"max_len={max_len}: the checkpoint has {positions} position embeddings")
  types = shapes.get(prefix + "embeddings.token_type_embeddings.weight")
  config = config_lib.default_config("fnet" if kind == "fnet" else "attention")
  config.model.update(
    d_model=hf_config["hidden_size"],
    d_ff=hf_config["intermediate_size"],
    num_layers=num_layers,
    max_len=max_len,
    causal=False,
    dropout=float(hf_config.get("hidden_dropout_prob", 0.1)),
    block_layout="post_ln",
    embed_projection=kind == "fnet",
    norm_eps=float(hf_config.get("layer_norm_eps", 1e-12)),
    activation=_ACTIVATIONS[act],
    type_vocab_size=types[0] if types else 0,
    pooling="first",
  )
  config.data.vocab_size = shapes[prefix + "embeddings.word_embeddings.weight"][0]  # its rows (≥ the tokenizer's)
  if kind == "fnet":
    config.mixer.update(fourier_impl="fft", padding="mix")
  else:
    config.mixer.update(
      num_heads=hf_config["num_attention_heads"],
      attention_impl="plain",
      attention_dropout=float(hf_config.get("attention_probs_dropout_prob", 0.1)),
    )
  return config, prefix


def convert(
  hf_config: dict, weights: dict[str, np.ndarray], max_len: int | None = None
) -> tuple[ml_collections.ConfigDict, dict]:
  """(config, parameters) from an HF FNet or BERT config dict and its weights by name."""
  weights = _named(weights)
  config, prefix = _config(hf_config, {name: np.shape(value) for name, value in weights.items()}, max_len)
  if hf_config["model_type"] in _RECURRENT:
    return config, _recurrent_params(config, weights, prefix, hf_config.get("use_conv_bias", True))
  kind, max_len, num_layers = hf_config["model_type"], config.model.max_len, config.model.num_layers
  D = config.model.d_model

  def w(name: str) -> np.ndarray:
    if prefix + name not in weights:
      raise UserError(f"the checkpoint has no tensor {prefix + name}, which a {kind} encoder of this config needs")
    return np.asarray(weights[prefix + name], np.float32)

  dense = lambda name: {"kernel": w(f"{name}.weight").T, "bias": w(f"{name}.bias")}  # torch Linear: (out, in)
  norm = lambda name: {"scale": w(f"{name}.weight"), "bias": w(f"{name}.bias")}
  params = {
    "embed": {"embedding": w("embeddings.word_embeddings.weight")},
    "pos_embed": w("embeddings.position_embeddings.weight")[:max_len],
    "embed_norm": norm("embeddings.LayerNorm"),
  }
  if config.model.type_vocab_size:
    params["type_embed"] = {"embedding": w("embeddings.token_type_embeddings.weight")}
  if kind == "fnet":
    params["embed_projection"] = dense("embeddings.projection")
  for i in range(num_layers):
    layer = f"encoder.layer.{i}"
    block = {
      "feed_forward": {"ff": {"up": dense(f"{layer}.intermediate.dense"), "down": dense(f"{layer}.output.dense")}},
      "feed_forward_norm": norm(f"{layer}.output.LayerNorm"),
    }
    if kind == "fnet":
      block["mixing_norm"] = norm(f"{layer}.fourier.output.LayerNorm")
    else:
      H = config.mixer.num_heads
      qkv = [dense(f"{layer}.attention.self.{n}") for n in ("query", "key", "value")]
      # HF splits the D outputs into heads as (H, D / H), head-major: efftx's DenseGeneral (D, 3, H, K) layout.
      block["mixing"] = {
        "mixer": {
          "qkv": {
            "kernel": np.stack([p["kernel"] for p in qkv], 1).reshape(D, 3, H, D // H),
            "bias": np.stack([p["bias"] for p in qkv], 0).reshape(3, H, D // H),
          },
          "out": {
            "kernel": w(f"{layer}.attention.output.dense.weight").T.reshape(H, D // H, D),
            "bias": w(f"{layer}.attention.output.dense.bias"),
          },
        }
      }
      block["mixing_norm"] = norm(f"{layer}.attention.output.LayerNorm")
    params[f"block_{i}"] = block
  if prefix + "pooler.dense.weight" in weights:
    params["pooler"] = dense("pooler.dense")
  return config, params


_RECURRENT = ("mamba", "mamba2")
# The sequence length of a recurrent checkpoint's config when `load` is given none: it stores none (no positions);
# the Mamba papers train at 2,048 tokens.
RECURRENT_MAX_LEN = 2048


def _float(value) -> float:
  """A config.json number: transformers 5 writes inf as {"__float__": "Infinity"}, json.dump as Infinity."""
  if isinstance(value, dict) and "__float__" in value:
    value = value["__float__"]
  return float(value)


def _recurrent_config(
  hf_config: dict, shapes: dict[str, tuple[int, ...]], max_len: int | None
) -> tuple[ml_collections.ConfigDict, str]:
  """_config for transformers' MambaModel / Mamba2Model (or their *ForCausalLM, names under "backbone.")."""
  kind = hf_config["model_type"]
  refuse = lambda why: UserError(f"{kind} checkpoint: {why}")
  act = hf_config.get("hidden_act", "silu")
  if act != "silu":
    raise refuse(f"hidden_act '{act}': efftx's {kind} mixer applies SiLU after the convolution")
  if hf_config.get("use_bias", False):
    raise refuse("use_bias=True: efftx's in_proj and out_proj have no biases")
  prefix = next((p for p in ("backbone.", "") if f"{p}embeddings.weight" in shapes), None)
  if prefix is None:
    raise refuse("no embeddings in the weights (looked for [backbone.]embeddings.weight)")
  num_layers = hf_config["num_hidden_layers"]
  stored = {int(n[len(prefix + "layers.") :].split(".")[0]) for n in shapes if n.startswith(prefix + "layers.")}
  if stored != set(range(num_layers)):
    raise refuse(
      f"num_hidden_layers is {num_layers} but the weights hold layers "
      f"{', '.join(map(str, sorted(stored))) or 'none'}: a config and weights that do not match"
    )
  D, expand, eps = (
    hf_config["hidden_size"],
    hf_config.get("expand", 2),
    float(hf_config.get("layer_norm_epsilon", 1e-5)),
  )
  config = config_lib.default_config(kind)
  config.model.update(
    d_model=D,
    d_ff=0,
    num_layers=num_layers,
    max_len=max_len or RECURRENT_MAX_LEN,
    causal=True,
    dropout=0.0,
    block_layout="pre_ln",
    norm="rms",
    norm_eps=eps,
    position_embedding="none",
    embed_projection=False,
    type_vocab_size=0,
  )
  config.data.vocab_size = shapes[prefix + "embeddings.weight"][0]
  mixer = dict(
    d_state=hf_config.get("state_size", 16 if kind == "mamba" else 128),
    d_conv=hf_config.get("conv_kernel", 4),
    expand=expand,
    dt_min=float(hf_config.get("time_step_min", 0.001)),
    dt_max=float(hf_config.get("time_step_max", 0.1)),
  )
  if kind == "mamba":
    E = hf_config.get("intermediate_size", expand * D)
    if E != expand * D:
      raise refuse(f"intermediate_size {E} is not expand·hidden_size = {expand * D} (efftx's inner width)")
    rank = hf_config.get("time_step_rank", "auto")
    mixer["dt_rank"] = -(-D // 16) if rank == "auto" else int(rank)
  else:
    H, P, G = hf_config["num_heads"], hf_config["head_dim"], hf_config.get("n_groups", 1)
    if H * P != expand * D:
      raise refuse(f"num_heads·head_dim = {H}·{P} is not expand·hidden_size = {expand * D}")
    if H % G:
      raise refuse(f"n_groups {G} does not divide num_heads {H}")
    lo, hi = (_float(v) for v in hf_config.get("time_step_limit", (0.0, float("inf"))))
    if (lo, hi) != (0.0, float("inf")):
      raise refuse(f"time_step_limit ({lo}, {hi}): efftx's mamba2 does not clamp Δ (only (0, inf) converts)")
    mixer.update(headdim=P, ngroups=G, chunk=int(hf_config.get("chunk_size", 256)), norm_eps=eps)
  config.mixer.update(mixer)
  return config, prefix


def _recurrent_params(
  config: ml_collections.ConfigDict, weights: dict[str, np.ndarray], prefix: str, conv_bias: bool
) -> dict:
  """efftx's parameters from a Mamba / Mamba-2 checkpoint's weights (torch Linear (out, in) → flax (in, out);
  conv1d (C, 1, W) → (W, C) taps; no conv bias (use_conv_bias=False) → zeros, the same function)."""
  kind = config.model.mixer

  def w(name: str) -> np.ndarray:
    if prefix + name not in weights:
      raise UserError(f"the checkpoint has no tensor {prefix + name}, which a {kind} model of this config needs")
    return np.asarray(weights[prefix + name], np.float32)

  params = {"embed": {"embedding": w("embeddings.weight")}, "final_norm": {"scale": w("norm_f.weight")}}
  for i in range(config.model.num_layers):
    m = f"layers.{i}.mixer"
    conv_WxC = w(f"{m}.conv1d.weight")[:, 0, :].T  # conv_WxC[j] weighs the input W − 1 − j positions back
    bias_C = w(f"{m}.conv1d.bias") if conv_bias else np.zeros(conv_WxC.shape[1:], np.float32)
    mixer = {
      "in_proj": {"kernel": w(f"{m}.in_proj.weight").T},
      "A_log": w(f"{m}.A_log"),
      "D": w(f"{m}.D"),
      "out_proj": {"kernel": w(f"{m}.out_proj.weight").T},
    }
    if kind == "mamba":
      mixer.update(
        conv1d={"taps": conv_WxC[::-1].copy(), "bias": bias_C},  # taps[0]: the current position
        x_proj={"kernel": w(f"{m}.x_proj.weight").T},
        dt_proj={"kernel": w(f"{m}.dt_proj.weight").T, "bias": w(f"{m}.dt_proj.bias")},
      )
    else:
      mixer.update(
        conv1d={"kernel": conv_WxC, "bias": bias_C},
        dt_bias=w(f"{m}.dt_bias"),
        norm=w(f"{m}.norm.weight"),
      )
    params[f"block_{i}"] = {"mixing": {"norm": {"scale": w(f"layers.{i}.norm.weight")}, "mixer": mixer}}
  return params


def mismatches(config: ml_collections.ConfigDict, checkpoint_config: ml_collections.ConfigDict) -> list[str]:
  """The ARCHITECTURE fields where a run's config differs from a converted checkpoint's ("config.model.norm_eps=
  1e-12 (this run: 1e-06)"), empty when the run's encoder is the checkpoint's function."""
  out = []
  for section, names in ARCHITECTURE.items():
    for name in names:
      if name in checkpoint_config[section] and config[section].get(name) != checkpoint_config[section][name]:
        out.append(
          f"config.{section}.{name}={checkpoint_config[section][name]!r} (this run: {config[section].get(name)!r})"
        )
  return out


def _exportable(config: ml_collections.ConfigDict) -> str:
  """The HF model_type an efftx encoder converts to ("bert" or "fnet"); UserError naming the setting if none."""
  m, kind = config.model, {"attention": "bert", "fnet": "fnet"}.get(config.model.mixer)
  problems = [
    (kind is None, f"mixer '{m.mixer}': HF has BERT (attention) and FNet (fnet) encoders"),
    (m.block_layout != "post_ln", "block_layout='pre_ln': HF's BERT and FNet are post-LN"),
    (m.causal, "causal=True: HF's BERT and FNet encoders are bidirectional"),
    (m.reversible, "reversible=True: HF has no reversible BERT or FNet"),
    (not m.d_ff, "d_ff=0: HF's blocks have a feed-forward sublayer"),
    (m.patch_size > 0, "patch_size > 0: HF's BERT and FNet embed tokens"),
    (m.norm != "layer", f"norm='{m.norm}': HF's BERT and FNet use LayerNorm"),
    (m.activation not in _EXPORTED_ACTIVATIONS, f"activation='{m.activation}': HF's BERT and FNet use GELU"),
    (m.position_embedding != "learned", "position_embedding: HF's BERT and FNet learn absolute positions"),
    (m.pooling == "cls", "pooling='cls': a learned [CLS] vector has no HF counterpart (pooling='first' does)"),
    (
      m.embed_projection != (kind == "fnet"),
      "embed_projection: HF's FNet has the embedding projection and BERT has none",
    ),
    (
      kind == "fnet" and config.mixer.get("padding") != "mix",
      "FNet padding='zero': HF's FNet mixes padded positions in (padding='mix')",
    ),
  ]
  for bad, why in problems:
    if bad:
      raise UserError(f"cannot export to Hugging Face: {why}")
  return kind


def export(config: ml_collections.ConfigDict, params: dict, folder: str, tokenizer: str = "") -> None:
  """Writes an efftx encoder (config, parameters) as an HF checkpoint folder: config.json and model.safetensors
  under HF's names (BertModel / FNetModel; `load` reads it back to the same parameters), with the tokenizer's
  files copied in when `tokenizer` names a folder. Without token types the type embedding is written as zeros
  (HF adds one); without a pooler (pooling other than "first") none is written and transformers initialises its
  own, which last_hidden_state does not use. `tokenizer`: a folder (its tokenizer files are copied) or one
  tokenizer file (it and its folder's settings are copied)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  kind = _exportable(config)
  m = config.model
  D = m.d_model
  f32 = lambda x: np.ascontiguousarray(np.asarray(x, np.float32))
  out = {}

  def dense(name, p):
    out[f"{name}.weight"], out[f"{name}.bias"] = f32(np.asarray(p["kernel"]).T), f32(p["bias"])

  def norm(name, p):
    out[f"{name}.weight"], out[f"{name}.bias"] = f32(p["scale"]), f32(p["bias"])

  out["embeddings.word_embeddings.weight"] = f32(params["embed"]["embedding"])
  out["embeddings.position_embeddings.weight"] = f32(params["pos_embed"])
  types = params["type_embed"]["embedding"] if m.type_vocab_size else np.zeros((2, D), np.float32)
  out["embeddings.token_type_embeddings.weight"] = f32(types)
  norm("embeddings.LayerNorm", params["embed_norm"])
  if kind == "fnet":
    dense("embeddings.projection", params["embed_projection"])
  for i in range(m.num_layers):
    block, layer = params[f"block_{i}"], f"encoder.layer.{i}"
    dense(f"{layer}.intermediate.dense", block["feed_forward"]["ff"]["up"])
    dense(f"{layer}.output.dense", block["feed_forward"]["ff"]["down"])
    norm(f"{layer}.output.LayerNorm", block["feed_forward_norm"])
    if kind == "fnet":
      norm(f"{layer}.fourier.output.LayerNorm", block["mixing_norm"])
      continue
    mixer = block["mixing"]["mixer"]
    qkv_kernel, qkv_bias = np.asarray(mixer["qkv"]["kernel"]), np.asarray(mixer["qkv"]["bias"])
    for j, name in enumerate(("query", "key", "value")):
      out[f"{layer}.attention.self.{name}.weight"] = f32(qkv_kernel[:, j].reshape(D, D).T)
      out[f"{layer}.attention.self.{name}.bias"] = f32(qkv_bias[j].reshape(D))
    out[f"{layer}.attention.output.dense.weight"] = f32(np.asarray(mixer["out"]["kernel"]).reshape(D, D).T)
    out[f"{layer}.attention.output.dense.bias"] = f32(mixer["out"]["bias"])
    norm(f"{layer}.attention.output.LayerNorm", block["mixing_norm"])
  if "pooler" in params:
    dense("pooler.dense", params["pooler"])

  tok = None
  if tokenizer:
    from efftx.data import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

    tok = tokenizer_lib.load(tokenizer)
  hf_config = {
    "architectures": ["BertModel" if kind == "bert" else "FNetModel"],
    "model_type": kind,
    "vocab_size": int(out["embeddings.word_embeddings.weight"].shape[0]),
    "hidden_size": D,
    "num_hidden_layers": m.num_layers,
    "intermediate_size": m.d_ff,
    "hidden_act": _EXPORTED_ACTIVATIONS[m.activation],
    "hidden_dropout_prob": m.dropout,
    "max_position_embeddings": int(out["embeddings.position_embeddings.weight"].shape[0]),
    "type_vocab_size": int(types.shape[0]),
    "layer_norm_eps": m.norm_eps,
    "initializer_range": 0.02,
    "pad_token_id": tok.pad_id if tok else (0 if kind == "bert" else 3),
  }
  if kind == "bert":
    hf_config.update(
      num_attention_heads=config.mixer.num_heads,
      position_embedding_type="absolute",
      attention_probs_dropout_prob=config.mixer.attention_dropout,
    )
  else:
    hf_config.update(use_tpu_fourier_optimizations=False, tpu_short_seq_length=512)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2, sort_keys=True)
  save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
  if tok:
    for path in tokenizer_lib.files(tokenizer):
      if os.path.abspath(os.path.dirname(path)) != os.path.abspath(folder):
        shutil.copy(path, folder)

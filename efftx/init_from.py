"""Fine-tuning's start (config.init_from): a new model's parameters with the encoder of another run, or of a Hugging
Face checkpoint (efftx.hf), and the head left new."""

from __future__ import annotations

import os

from absl import logging
import flax.traverse_util
import jax
import ml_collections
import numpy as np

from efftx import checkpoints
from efftx import hf
from efftx import trainer
from efftx.data import tokenizer as tokenizer_lib
from efftx.errors import UserError


def _check_hf_source(config: ml_collections.ConfigDict, checkpoint: ml_collections.ConfigDict, path) -> None:
  """Raises UserError where a run that fine-tunes from an HF checkpoint would compute another function of its
  weights: a different architecture, a learned [CLS] vector, or text encoded other than by its tokenizer."""
  different = hf.mismatches(config, checkpoint)
  if different:
    raise UserError(
      f"config.init_from={path}: the checkpoint has {', '.join(different)}; set them, or start from "
      "configs/glue_hf.py:hf=<folder>, which reads them from the checkpoint"
    )
  if config.model.pooling == "cls":
    raise UserError(
      f"config.init_from={path}: pooling='cls' adds a learned [CLS] vector an HF checkpoint does not "
      "have; its tokenizer's [CLS] is the first token: pooling='first'"
    )
  if checkpoint.data.tokenizer and not (
    config.data.tokenizer and tokenizer_lib.same(config.data.tokenizer, checkpoint.data.tokenizer)
  ):
    raise UserError(
      f"config.init_from={path}: the checkpoint's embeddings are its tokenizer's ids, but this run "
      + (f"encodes text with another tokenizer ({config.data.tokenizer})" if config.data.tokenizer else "encodes bytes")
      + f": set config.data.tokenizer={checkpoint.data.tokenizer}"
    )


def load_encoder(
  params: dict,
  path: str,
  fresh: tuple[str, ...],
  optional: tuple[str, ...] = (),
  config: ml_collections.ConfigDict | None = None,
) -> dict:
  """`params` with every parameter but the head's (top-level names in `fresh`: the objective's fresh_params)
  replaced by the run's at `path` (see efftx.checkpoints.restore_params), or by an HF checkpoint's when `path` is
  an HF folder (efftx.hf: config.json and model.safetensors). Head parameters named in `optional` (the objective's
  optional_params: a checkpoint's pooler) are loaded where the source has them and stay new where it has not.

  The encoders must match (mixer, widths, layers; for an HF checkpoint, every field of efftx.hf.ARCHITECTURE of
  `config`); position embeddings may be longer there (the first rows are taken), so a model pre-trained at length
  512 fine-tunes at 128. The source run's own head is left behind.
  """
  if hf.is_checkpoint(path):
    source_config, loaded = hf.load(os.fspath(path))
    step, source_head = None, ()
    if config is not None:
      _check_hf_source(config, source_config, path)
  else:
    try:
      source_config, loaded, step = checkpoints.restore_params(path)
    except UserError as e:
      raise UserError(f"config.init_from: {e}") from None
    source_head = trainer.parts(source_config).objective.fresh_params
  flat_loaded = flax.traverse_util.flatten_dict(jax.device_get(loaded), sep="/")
  m = source_config.model
  source_model = f"mixer={m.mixer}, num_layers={m.num_layers}, reversible={m.reversible}, d_model={m.d_model}"
  flat_params = flax.traverse_util.flatten_dict(params, sep="/")
  unused = sorted(n for n in flat_loaded if n.split("/")[0] not in source_head + optional and n not in flat_params)
  if unused:
    raise UserError(
      f"config.init_from: this model has no parameter {unused[0]} of {path} ({source_model}): the encoders must match"
    )
  out, kept_new = {}, set()
  for name, value in flat_params.items():
    top = name.split("/")[0]
    if top in fresh or (top in optional and name not in flat_loaded):
      out[name] = value
      kept_new.add(top)
      continue
    if name not in flat_loaded:
      raise UserError(
        f"config.init_from: {path} has no parameter {name} (it trained {source_model}): the encoders must match"
      )
    old = np.asarray(flat_loaded[name])
    if name == "pos_embed" and old.shape[1:] == value.shape[1:] and len(old) >= len(value):
      old = old[: len(value)]
    if old.shape != value.shape:
      raise UserError(
        f"config.init_from: parameter {name} has shape {old.shape} in {path} (it trained "
        f"{source_model}), {value.shape} here: the encoders must match"
      )
    out[name] = old.astype(value.dtype)
  logging.info(
    "fine-tuning from %s%s: encoder loaded, new: %s",
    path,
    "" if step is None else f" (step {step})",
    ", ".join(sorted(kept_new)) or "nothing",
  )
  return flax.traverse_util.unflatten_dict(out, sep="/")

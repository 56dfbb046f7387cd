"""A run's config from its config.json, including runs written by older versions of efftx.

Fields added since a run was written take their defaults; a config.json from before mixers declared their own
options (mixer options in config.model) is converted.
"""

from __future__ import annotations

import ml_collections

from efftx.config import default_config

# Options that lived in config.model before mixers declared their own (config.json of older runs): those of the
# run's mixer move to config.mixer (renamed where a name changed), the others had no effect and are dropped.
_OLD_MODEL_FIELDS = (
  "num_heads",
  "attention_dropout",
  "attention_impl",
  "attention_chunk",
  "window",
  "aft_bias_dim",
  "aft_factorized",
  "kernel_size",
  "lsh_buckets",
  "lsh_hashes",
  "lsh_chunk",
  "lsh_seed",
  "fourier_impl",
)
_RENAMED = {("linear", "attention_chunk"): "chunk"}


def from_saved(saved: dict) -> ml_collections.ConfigDict:
  """The config of a run from its config.json, with fields added since then at their defaults. A config.json
  written before mixers declared their options (flat config.model) is converted: the run's mixer options move to
  config.mixer, and an option its mixer did not have then (attention dropout of local and lsh) is 0, as it was."""
  model = dict(saved.get("model", {}))
  mixer = model.get("mixer", "attention")
  config = default_config(mixer)
  if "mixer" not in saved:
    old = {k: model.pop(k) for k in _OLD_MODEL_FIELDS if k in model}
    options = {}
    for name in config.mixer:
      old_name = next((o for (m, o), n in _RENAMED.items() if m == mixer and n == name), name)
      if old_name in old and not (name == "attention_dropout" and mixer != "attention"):
        options[name] = old[old_name]
      elif name == "attention_dropout":
        options[name] = 0.0  # only attention applied it then
    saved = {**saved, "model": model, "mixer": options}
  config.update(saved)
  return config

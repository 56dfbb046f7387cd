"""Masked-LM (BERT's, FNet's pre-training) on any text task: 15 % of the real tokens are chosen, 80 / 10 / 10
become [MASK] / a random token / stay; the model predicts the originals at the chosen positions, reading both
sides (not causal)."""

from __future__ import annotations

import dataclasses

import numpy as np

from efftx.errors import UserError
from efftx.objectives.lm import PerPosition


def mask_for_mlm(
  example: dict[str, np.ndarray],
  rng: np.random.Generator,
  *,
  mask_id: int,
  random_ids: tuple[int, int],
  special_ids: tuple[int, ...] = (),
  rate: float = 0.15,
) -> dict[str, np.ndarray]:
  """BERT's masked-LM corruption: `rate` of the real tokens, special tokens excepted, are chosen (at least one);
  of those 80 % become mask_id, 10 % a random id in [random_ids[0], random_ids[1]), 10 % stay. Targets are the
  original tokens at the chosen positions."""
  tokens_L, mask_L = example["tokens"], example["mask"]
  real = np.flatnonzero(mask_L & ~np.isin(tokens_L, special_ids))
  chosen = np.zeros(tokens_L.shape, bool)
  if len(real):
    num = max(1, int(round(rate * len(real))))
    chosen[rng.choice(real, size=num, replace=False)] = True
  action_L = rng.random(tokens_L.shape)
  corrupted_L = tokens_L.copy()
  corrupted_L[chosen & (action_L < 0.8)] = mask_id
  to_random = chosen & (action_L >= 0.8) & (action_L < 0.9)
  corrupted_L[to_random] = rng.integers(random_ids[0], random_ids[1], size=int(to_random.sum()))
  return {"tokens": corrupted_L, "mask": mask_L, "targets": tokens_L, "weights": chosen.astype(np.float32)}


@dataclasses.dataclass(frozen=True)
class _MaskForMlm:
  """mask_for_mlm as a grain random map (a seeded generator per element)."""

  mask_id: int
  random_ids: tuple[int, int]
  special_ids: tuple[int, ...]

  def __call__(self, example: dict[str, np.ndarray], rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = mask_for_mlm(
      {"tokens": example["tokens"], "mask": example["mask"]},
      rng,
      mask_id=self.mask_id,
      random_ids=self.random_ids,
      special_ids=self.special_ids,
    )
    if "token_types" in example:  # a tokenizer's sentence pairs keep their segments
      out["token_types"] = example["token_types"]
    return out


class MaskedLM(PerPosition):
  def check(self, config, task) -> None:
    if task.mask_id is None:
      raise UserError(
        f"task '{config.data.task}' has no text to mask: masked-LM needs a text task "
        "(bytes, imdb_bytes, glue) and, with config.data.tokenizer, a tokenizer with a [MASK] token"
      )
    if config.model.causal:
      raise UserError("masked-LM reads both sides of a token: set config.model.causal=False")
    super().check(config, task)

  def corrupt(self, ds, task, seed: int):
    return ds.random_map(_MaskForMlm(task.mask_id, task.random_ids, task.special_ids), seed=seed)

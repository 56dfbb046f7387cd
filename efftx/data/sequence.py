"""Turning token ids into the fixed-length arrays every task yields: padding, truncation, next-token targets.

An encoded example is a dict of numpy arrays of length max_len:
  "tokens" int32, "mask" bool (True at real tokens), "token_types" int32 where a checkpoint's tokenizer gave them
  (segment A 0, B 1), and either "label" int32[] (classification) or
  "targets" int32 and "weights" float32 (per-position prediction: the loss counts positions with weight > 0).
A task whose loss looks at a few known positions (MQAR's queries) adds "positions" int32 (K) and gives "targets"
and "weights" at those K positions only: the model computes logits there alone.
"""

from __future__ import annotations

import numpy as np

from efftx.errors import UserError


def pad_to(
  ids: np.ndarray, max_len: int, truncate: bool | None, what: str, pad_id: int = 0
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, mask) of length max_len, padded with pad_id. Longer inputs are cut if `truncate`, else refused with a
  clear error (truncate=None: the task's examples are never cut, e.g. images)."""
  ids = np.asarray(ids, np.int32)
  if len(ids) > max_len:
    if truncate is None:
      raise UserError(
        f"{what} has {len(ids)} tokens, more than config.model.max_len={max_len}; these examples "
        f"are never cut: set max_len to at least {len(ids)}"
      )
    if not truncate:
      raise UserError(
        f"{what} has {len(ids)} tokens, more than config.model.max_len={max_len} "
        "(raise max_len, or set config.data.truncate=True to cut examples)"
      )
    ids = ids[:max_len]
  tokens_L = np.full((max_len,), pad_id, np.int32)
  tokens_L[: len(ids)] = ids
  mask_L = np.zeros((max_len,), bool)
  mask_L[: len(ids)] = True
  return tokens_L, mask_L


def next_token(tokens_L: np.ndarray, mask_L: np.ndarray) -> dict[str, np.ndarray]:
  """Causal LM example: position t predicts token t+1 (the last real token predicts nothing)."""
  targets_L = np.zeros_like(tokens_L)
  targets_L[:-1] = tokens_L[1:]
  weights_L = np.zeros(tokens_L.shape, np.float32)
  weights_L[:-1] = mask_L[1:]
  return {"tokens": tokens_L, "mask": mask_L, "targets": targets_L, "weights": weights_L}

"""Tasks: a TFDS builder (prepared as array_record), its vocabulary and labels, and its encoder.

`TASKS[config.data.task]` names the task; `config.data.variant` picks the builder config (e.g. ListOps "small").
The grain pipeline that reads them is `efftx.data.pipeline`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from efftx.data import listops


@dataclasses.dataclass(frozen=True)
class Task:
  builder: type                      # a tfds.core.GeneratorBasedBuilder
  vocab_size: int                    # token ids are in [0, vocab_size); 0 is padding
  num_classes: int                   # classes for "classify"; unused for "lm"
  objective: str                     # "classify" (one label per sequence) or "lm" (next token)
  # (raw TFDS example, max_len) -> {"tokens": int32[L], "mask": bool[L], "label": int32[]}
  encode: Callable[[dict, int], dict[str, np.ndarray]]


def _encode_listops(example: dict, max_len: int) -> dict[str, np.ndarray]:
  tokens_L, mask_L = listops.encode(example["source"], max_len)
  return {"tokens": tokens_L, "mask": mask_L, "label": np.int32(example["label"])}


TASKS = {
    "listops": Task(
        builder=listops.ListOps, vocab_size=len(listops.VOCAB), num_classes=listops.NUM_CLASSES,
        objective="classify", encode=_encode_listops),
}

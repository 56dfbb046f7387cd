"""Tasks: a TFDS builder (prepared as array_record), its vocabulary and labels, and its encoder.

`TASKS[config.data.task]` names the task; `config.data.variant` picks the builder config (e.g. ListOps "small").
The grain pipeline that reads them is `efftx.data.pipeline`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from efftx.data import byte_text
from efftx.data import listops


@dataclasses.dataclass(frozen=True)
class Task:
  builder: type                      # a tfds.core.GeneratorBasedBuilder
  vocab_size: int                    # token ids are in [0, vocab_size); 0 is padding
  num_classes: int                   # classes for "classify"; unused for "lm"
  objective: str                     # "classify" (one label per sequence) or "lm" (next token)
  # (raw TFDS example, max_len) -> {"tokens": int32[L], "mask": bool[L]} (+ "label": int32[] to classify)
  encode: Callable[[dict, int], dict[str, np.ndarray]]
  # LM tasks, for sampling: text -> token ids, and token ids -> text
  tokenize: Callable[[bytes], np.ndarray] | None = None
  detokenize: Callable[[np.ndarray], str] | None = None
  token_unit: str = "token"          # LM metrics are bits per <token_unit>
  max_len: int | None = None         # the longest sequence an example holds, if the task has such a limit


def _encode_listops(example: dict, max_len: int) -> dict[str, np.ndarray]:
  tokens_L, mask_L = listops.encode(example["source"], max_len)
  return {"tokens": tokens_L, "mask": mask_L, "label": np.int32(example["label"])}


def _encode_byte_text(example: dict, max_len: int) -> dict[str, np.ndarray]:
  tokens_L, mask_L = byte_text.encode_text(np.asarray(example["bytes"]).tobytes(), max_len)
  return {"tokens": tokens_L, "mask": mask_L}


TASKS = {
    "listops": Task(
        builder=listops.ListOps, vocab_size=len(listops.VOCAB), num_classes=listops.NUM_CLASSES,
        objective="classify", encode=_encode_listops),
    "bytes": Task(
        builder=byte_text.ByteText, vocab_size=byte_text.VOCAB_SIZE, num_classes=0, objective="lm",
        encode=_encode_byte_text, tokenize=byte_text.tokenize, detokenize=byte_text.decode_tokens,
        token_unit="byte", max_len=byte_text.RECORD_LEN),
}

"""Objectives: what the model predicts and how it is scored. `OBJECTIVES[name]` is an `Objective`.

A run's objective is `config.data.objective`, or the task's own when that is "" (`for_run`). Each objective owns
its head (the parameters on top of the encoder), its loss sums and metrics, the batch keys it reads, its checks
against the task and model, and any corruption of the input it needs (masked-LM). Adding one is one file here
plus one line below.
"""

from __future__ import annotations

from efftx.errors import UserError
from efftx.objectives.base import Objective
from efftx.objectives.classify import Classify
from efftx.objectives.lm import NextToken
from efftx.objectives.mlm import MaskedLM

OBJECTIVES: dict[str, Objective] = {
  "classify": Classify(),
  "lm": NextToken(),
  "mlm": MaskedLM(),
}


def for_run(config, task) -> Objective:
  """The objective of a run: config.data.objective, or the task's own when that is ""; checked against the
  task and the model config (raises UserError)."""
  name = config.data.objective or task.objective
  if name not in OBJECTIVES:
    raise UserError(
      f"config.data.objective='{name}' is not an objective; choose from: '' (the task's own), {', '.join(OBJECTIVES)}"
    )
  objective = OBJECTIVES[name]
  objective.check(config, task)
  return objective

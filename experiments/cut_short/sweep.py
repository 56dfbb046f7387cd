"""Runs cut short on purpose, to show that the convergence test (`stats.settled`) says "not settled" for runs
that demonstrably have not converged.

    python -m efftx.sweep experiments/cut_short/sweep.py --workdir=/tmp/efftx/cut_short --parallel=2

The vision study's setting (configs/vision.py: Fashion-MNIST in 4 × 4 patches, 4 layers × 128, batch 64, AdamW
1e-3, warm-up then cosine decay to 0) for attention and AFT-full, seeds 0–2, trained 200 steps instead of 1,000:
the whole schedule (warm-up 40 steps, cosine decay to 0 at step 200) shrunk by five, evaluated every 40 steps. The
same seeds ran 1,000 steps at the same rate in the vision study's one-rate design
(experiments/vision/runs/cpu-one-rate/); those are the longer runs these are judged against. 6 runs, about a
quarter of an hour on 2 cores. No claim of a paper is tested here: the one claim below is the test's answer on
AFT-full − attention, shown in the table; tests/test_sweep_stats.py reads these records.
"""

from efftx.sweep import grid
from efftx.sweep import stats

CONFIG = "configs/vision.py"
METRIC = "eval_accuracy"
GOAL = "max"
SOURCE = "none: a check of efftx's convergence test, not a paper's claim"
BASELINE = {"aft_full": "attention", "attention": "attention"}
SHORT = {"total_steps": 200, "optim.warmup_steps": 40, "eval_every": 40, "log_every": 10, "checkpoint_every": 100}


# The vision study's tolerance (its SETTLED_WITHIN): 1 accuracy point.
SETTLED_WITHIN = 0.01
DESIGN = {"cpu": 3, "paper": 3}  # seeds 0–2, one rate: nothing is searched (the grid is the same at both scales)


def points(scale):
  groups = {m: {"arg": f"mixer={m}", "overrides": SHORT} for m in ("attention", "aft_full")}
  return grid(groups, seeds=(0, 1, 2), learning_rates=(1e-3,))


def claim(rows, scale):
  """AFT-full against attention, judged as the vision study judges it: only once the paired difference has settled
  over the last fifth of training (stats.settled_between, counted in learning rate). These runs are cut short, so
  the verdict says whether the test noticed."""
  row = {r["group"]: r for r in rows}
  d = stats.between(row["aft_full"], row["attention"])
  ok, why = stats.regime(True, "", stats.settled_between(row["aft_full"], row["attention"], SETTLED_WITHIN))
  return [
    stats.judge(
      "aft_full against attention, trained 200 steps (a fifth of the vision study's schedule)",
      "— (a check of the convergence test, not a paper's claim)",
      f"aft_full − attention: {d.text(3) if d else '—'}",
      d,
      0.0,
      ok,
      why,
    )
  ]

"""The convergence test on runs cut short on purpose: prints, for AFT-full − attention on the 200-step runs
(runs/cpu/), its move over the last fifth counted in steps and counted in learning rate, each with the test's
answer, and the difference at the end of the 200-step runs against the end of the 1,000-step runs of the same
seeds (experiments/vision/runs/cpu-one-rate/).

    PYTHONPATH=. python experiments/cut_short/check.py
"""

import json
import pathlib

from efftx.sweep import stats

HERE = pathlib.Path(__file__).parent
LONG = HERE.parent / "vision" / "runs" / "cpu-one-rate"
WITHIN = 0.01  # the vision study's tolerance (SETTLED_WITHIN): 1 accuracy point


def read(path: pathlib.Path) -> tuple[list, list]:
  """A record's validation-accuracy curve and logged learning rates, each [(step, value)]."""
  rows = json.loads(path.read_text())["metrics"]
  accuracy = [(r["step"], r["eval_accuracy"]) for r in rows if "eval_accuracy" in r]
  rates = [(r["step"], r["learning_rate"]) for r in rows if "learning_rate" in r]
  return accuracy, rates


def main():
  mixers = ("attention", "aft_full")
  short = {m: {s: read(HERE / "runs" / "cpu" / f"{m}-lr0.001-seed{s}.json") for s in range(3)} for m in mixers}
  long = {m: {s: read(LONG / f"{m}-seed{s}.json") for s in range(3)} for m in mixers}
  curves = {m: {s: c for s, (c, _) in seeds.items()} for m, seeds in short.items()}
  start = min(stats.learning_fraction_step(r) for seeds in short.values() for _, r in seeds.values())
  for name, at in (("in steps", None), ("in learning rate", start)):
    ok, why = stats.settled(curves["aft_full"], curves["attention"], WITHIN, at)
    print(f"last fifth counted {name}: {'settled' if ok else 'not settled'}: {why}")
  runs = (("short", short), ("long", long))
  end = {k: {m: {s: seeds[s][0][-1][1] for s in seeds} for m, seeds in group.items()} for k, group in runs}
  for k, steps in (("short", 200), ("long", 1_000)):
    d = stats.paired(end[k]["aft_full"], end[k]["attention"])
    means = {m: sum(v.values()) / len(v) for m, v in end[k].items()}
    print(
      f"{steps:>5} steps: attention {means['attention']:.4f}, aft_full {means['aft_full']:.4f}, difference {d.text(3)}"
    )
  gap = {k: {s: end[k]["aft_full"][s] - end[k]["attention"][s] for s in range(3)} for k in end}
  moved = stats.paired(gap["long"], gap["short"])
  print(f"the difference at 1,000 steps minus at 200, paired by seed: {moved.text(3)}")


if __name__ == "__main__":
  main()
